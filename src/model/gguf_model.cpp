#include "model/gguf_model.h"

#include <cmath>
#include <cstdlib>
#include <map>

#include "core/status.h"

namespace strata {

namespace {

// HF name suffix (after "model.layers.N.") -> GGUF name suffix (after "blk.N.").
const std::map<std::string, std::string>& layer_names(ArchFamily family) {
  static const std::map<std::string, std::string> kLlama = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.o_proj.bias", "attn_output.bias"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  static const std::map<std::string, std::string> kGemma3 = [] {
    std::map<std::string, std::string> m = kLlama;
    m["post_attention_layernorm.weight"] = "post_attention_norm.weight";
    m["pre_feedforward_layernorm.weight"] = "ffn_norm.weight";
    m["post_feedforward_layernorm.weight"] = "post_ffw_norm.weight";
    m["self_attn.q_norm.weight"] = "attn_q_norm.weight";
    m["self_attn.k_norm.weight"] = "attn_k_norm.weight";
    return m;
  }();
  return family == ArchFamily::kGemma3 ? kGemma3 : kLlama;
}

class GgufTensorSource final : public TensorSource {
 public:
  GgufTensorSource(std::shared_ptr<const GgufFile> file, ArchFamily family)
      : file_(std::move(file)), family_(family) {}

  bool has(const std::string& name) const override {
    const std::string g = translate(name);
    return !g.empty() && file_->find_tensor(g) != nullptr;
  }
  Result<Tensor> tensor(const std::string& name) const override {
    const std::string g = translate(name);
    if (g.empty() || !file_->find_tensor(g)) {
      return errorf(StatusCode::kNotFound, "{}: tensor '{}' (for {}) not found", file_->name(),
                    g.empty() ? name : g, name);
    }
    return file_->tensor(g);
  }
  std::string describe() const override { return file_->name(); }

 private:
  std::string translate(const std::string& hf) const {
    if (hf == "model.embed_tokens.weight") return "token_embd.weight";
    if (hf == "model.norm.weight") return "output_norm.weight";
    if (hf == "lm_head.weight") return "output.weight";
    const std::string prefix = "model.layers.";
    if (hf.rfind(prefix, 0) != 0) return "";
    const size_t dot = hf.find('.', prefix.size());
    if (dot == std::string::npos) return "";
    const std::string layer = hf.substr(prefix.size(), dot - prefix.size());
    const auto& names = layer_names(family_);
    auto it = names.find(hf.substr(dot + 1));
    if (it == names.end()) return "";
    return "blk." + layer + "." + it->second;
  }

  std::shared_ptr<const GgufFile> file_;
  ArchFamily family_;
};

}  // namespace

std::shared_ptr<TensorSource> make_gguf_tensor_source(std::shared_ptr<const GgufFile> file,
                                                      ArchFamily family) {
  return std::make_shared<GgufTensorSource>(std::move(file), family);
}

Result<ModelConfig> model_config_from_gguf(const GgufFile& f) {
  STRATA_ASSIGN_OR_RETURN(std::string arch, f.get_string("general.architecture"));
  ModelConfig c;
  if (arch == "llama") {
    c.family = ArchFamily::kLlama;
    c.architecture = "llama";
  } else if (arch == "gemma3") {
    c.family = ArchFamily::kGemma3;
    c.architecture = "gemma3";
  } else {
    return errorf(StatusCode::kUnimplemented,
                  "{}: unsupported GGUF architecture '{}' (supported: llama, gemma3)", f.name(),
                  arch);
  }
  const std::string a = arch + ".";
  auto req = [&](const char* key) { return f.get_int(a + key); };
  auto opt_int = [&](const char* key, int64_t fallback) -> Result<int64_t> {
    return f.has(a + key) ? f.get_int(a + key) : Result<int64_t>(fallback);
  };
  auto opt_float = [&](const char* key, double fallback) -> Result<double> {
    return f.has(a + key) ? f.get_float(a + key) : Result<double>(fallback);
  };
  STRATA_ASSIGN_OR_RETURN(c.hidden, req("embedding_length"));
  STRATA_ASSIGN_OR_RETURN(c.n_layers, req("block_count"));
  STRATA_ASSIGN_OR_RETURN(c.ffn_dim, req("feed_forward_length"));
  STRATA_ASSIGN_OR_RETURN(c.n_heads, req("attention.head_count"));
  STRATA_ASSIGN_OR_RETURN(c.n_heads_kv, opt_int("attention.head_count_kv", c.n_heads));
  STRATA_ASSIGN_OR_RETURN(c.max_position_embeddings, opt_int("context_length", 2048));
  if (c.n_heads <= 0) {
    return errorf(StatusCode::kInvalidArgument, "{}: {}attention.head_count must be > 0", f.name(),
                  a);
  }
  STRATA_ASSIGN_OR_RETURN(c.head_dim, opt_int("attention.key_length", c.hidden / c.n_heads));
  STRATA_ASSIGN_OR_RETURN(c.rotary_dim, opt_int("rope.dimension_count", c.head_dim));
  STRATA_ASSIGN_OR_RETURN(double theta, opt_float("rope.freq_base", 10000.0));
  // NaN, 0 or a negative base loads fine and generates garbage: refused, naming the key (the
  // config.json path refuses the same values).
  if (!(std::isfinite(theta) && theta > 0.0 && theta < 3.4e38)) {
    return errorf(StatusCode::kInvalidArgument, "{}: {}rope.freq_base = {} must be > 0", f.name(),
                  a, theta);
  }
  if (c.rotary_dim < 2 || c.rotary_dim % 2 != 0 || c.rotary_dim > c.head_dim) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: {}rope.dimension_count = {} must be even and in [2, head_dim {}]", f.name(),
                  a, c.rotary_dim, c.head_dim);
  }
  STRATA_ASSIGN_OR_RETURN(double eps, opt_float("attention.layer_norm_rms_epsilon", 1e-5));
  c.rope_theta = c.rope_theta_local = static_cast<float>(theta);
  c.norm_eps = static_cast<float>(eps);
  c.norm = NormType::kRmsNorm;
  c.gated_mlp = true;
  c.pos_embedding = PosEmbedding::kRope;
  if (f.has(a + "rope.scaling.type")) {
    STRATA_ASSIGN_OR_RETURN(std::string type, f.get_string(a + "rope.scaling.type"));
    STRATA_ASSIGN_OR_RETURN(double factor, opt_float("rope.scaling.factor", 1.0));
    if (type == "linear") {
      if (!(std::isfinite(factor) && factor > 0.0 && factor < 3.4e38)) {
        return errorf(StatusCode::kInvalidArgument, "{}: {}rope.scaling.factor = {} must be > 0",
                      f.name(), a, factor);
      }
      c.rope_scaling.type = RopeScalingType::kLinear;
      c.rope_scaling.factor = static_cast<float>(factor);
    } else if (type != "none") {
      return errorf(StatusCode::kUnimplemented, "{}: rope scaling '{}' is not supported", f.name(),
                    type);
    }
  }
  if (f.find_tensor("rope_freqs.weight")) {
    return errorf(StatusCode::kUnimplemented,
                  "{}: per-frequency rope factors (rope_freqs.weight) are not supported yet",
                  f.name());
  }
  if (c.family == ArchFamily::kLlama) {
    c.activation = ops::Activation::kSilu;
    c.rope_neox_style = false;  // Q/K rows were permuted for interleaved pairs by the converter
  } else {
    // Gemma-3: GeGLU, q/k RMSNorm, sandwich norms, sqrt(hidden) embedding scale, local (sliding)
    // layers with theta 10000 and a global layer every 6th, norm weights stored with the +1.
    c.activation = ops::Activation::kGeluTanh;
    c.rope_neox_style = true;
    c.qk_norm = true;
    c.post_norms = true;
    c.embedding_scale = std::sqrt(static_cast<float>(c.hidden));
    c.rope_theta_local = 10000.0f;
    STRATA_ASSIGN_OR_RETURN(c.sliding_window, opt_int("attention.sliding_window", 0));
    c.layer_is_sliding.resize(static_cast<size_t>(std::max<int64_t>(c.n_layers, 0)));
    for (int64_t l = 0; l < c.n_layers; ++l)
      c.layer_is_sliding[static_cast<size_t>(l)] = (l + 1) % 6 != 0;
    STRATA_ASSIGN_OR_RETURN(double softcap, opt_float("final_logit_softcapping", 0.0));
    c.final_logit_softcap = static_cast<float>(softcap);
  }
  // Vocabulary: the embedding's rows are authoritative.
  const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
  if (!emb)
    return errorf(StatusCode::kNotFound, "{}: tensor 'token_embd.weight' not found", f.name());
  c.vocab = emb->shape[0];
  c.tie_word_embeddings = f.find_tensor("output.weight") == nullptr;
  if (const GgufTensorInfo* q = f.find_tensor("blk.0.attn_q.weight")) {
    if (auto dt = dtype_from_ggml(q->ggml_type)) c.weight_dtype = *dt;
  }
  if (f.has("tokenizer.ggml.bos_token_id")) {
    STRATA_ASSIGN_OR_RETURN(c.bos_token_id, f.get_int("tokenizer.ggml.bos_token_id"));
  }
  if (f.has("tokenizer.ggml.eos_token_id")) {
    STRATA_ASSIGN_OR_RETURN(int64_t eos, f.get_int("tokenizer.ggml.eos_token_id"));
    c.eos_token_ids.push_back(eos);
  }
  STRATA_RETURN_IF_ERROR(c.validate(f.name()));
  return c;
}

}  // namespace strata
