#include "model/gguf_model.h"

#include <algorithm>
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
  // Mixture of experts (llama.cpp's names): the router, the experts stacked into 3-D tensors
  // [E, F, H] / [E, H, F] (no HF equivalent: the loader asks for these names), the shared expert.
  static const std::map<std::string, std::string> kMoe = [] {
    std::map<std::string, std::string> m = kLlama;
    m["self_attn.q_norm.weight"] = "attn_q_norm.weight";
    m["self_attn.k_norm.weight"] = "attn_k_norm.weight";
    m["mlp.gate.weight"] = "ffn_gate_inp.weight";
    m["mlp.gate_exps.weight"] = "ffn_gate_exps.weight";
    m["mlp.up_exps.weight"] = "ffn_up_exps.weight";
    m["mlp.down_exps.weight"] = "ffn_down_exps.weight";
    m["mlp.shared_expert.gate_proj.weight"] = "ffn_gate_shexp.weight";
    m["mlp.shared_expert.up_proj.weight"] = "ffn_up_shexp.weight";
    m["mlp.shared_expert.down_proj.weight"] = "ffn_down_shexp.weight";
    m["mlp.shared_expert_gate.weight"] = "ffn_gate_inp_shexp.weight";
    return m;
  }();
  if (family == ArchFamily::kMoe) return kMoe;
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
  std::vector<MappedRegion> mapped_regions() const override {
    const auto& m = file_->mapping();
    if (!m) return {};
    return {MappedRegion{m->path(), m->data(), m->size()}};
  }

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

namespace {

// <arch>.expert_count / expert_used_count / expert_feed_forward_length /
// expert_shared_feed_forward_length; a layer is sparse where blk.N.ffn_gate_inp exists.
Status moe_config_from_gguf(const GgufFile& f, const std::string& arch, ModelConfig* out) {
  ModelConfig& c = *out;
  const std::string a = arch + ".";
  auto opt_int = [&](const std::string& key, int64_t fallback) -> Result<int64_t> {
    return f.has(a + key) ? f.get_int(a + key) : Result<int64_t>(fallback);
  };
  STRATA_ASSIGN_OR_RETURN(c.n_experts, f.get_int(a + "expert_count"));
  STRATA_ASSIGN_OR_RETURN(c.n_experts_used, f.get_int(a + "expert_used_count"));
  STRATA_ASSIGN_OR_RETURN(c.expert_ffn_dim, opt_int("expert_feed_forward_length", c.ffn_dim));
  STRATA_ASSIGN_OR_RETURN(c.shared_expert_ffn_dim, opt_int("expert_shared_feed_forward_length", 0));
  if (c.n_experts < 1 || c.n_experts > 4096) {
    return errorf(StatusCode::kInvalidArgument, "{}: {}expert_count = {} is out of range (1..4096)",
                  f.name(), a, c.n_experts);
  }
  if (c.n_experts_used < 1 || c.n_experts_used > c.n_experts) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: {}expert_used_count = {} must be in [1, {}] ({}expert_count)", f.name(), a,
                  c.n_experts_used, c.n_experts, a);
  }
  if (c.shared_expert_ffn_dim > 0 && f.find_tensor("blk.0.ffn_gate_inp_shexp.weight") == nullptr) {
    // llama.cpp's qwen2moe always has the gate; without it the shared expert would be ungated.
    return errorf(StatusCode::kUnimplemented,
                  "{}: a shared expert without ffn_gate_inp_shexp is not supported", f.name());
  }
  // Renormalised top-k weights: Mixtral and Qwen3-MoE as llama.cpp runs them, unless the file
  // says otherwise.
  c.moe_renormalize = arch == "llama" || arch == "qwen3moe";
  if (f.has(a + "expert_weights_norm")) {
    STRATA_ASSIGN_OR_RETURN(c.moe_renormalize, f.get_bool(a + "expert_weights_norm"));
  }
  c.qk_norm = arch == "qwen3moe";
  c.qk_norm_full = arch == "olmoe";
  c.layer_is_moe.assign(static_cast<size_t>(std::clamp<int64_t>(c.n_layers, 0, 4096)), false);
  for (int64_t l = 0; l < static_cast<int64_t>(c.layer_is_moe.size()); ++l) {
    c.layer_is_moe[static_cast<size_t>(l)] =
        f.find_tensor("blk." + std::to_string(l) + ".ffn_gate_inp.weight") != nullptr;
  }
  return ok_status();
}

}  // namespace

Result<ModelConfig> model_config_from_gguf(const GgufFile& f) {
  STRATA_ASSIGN_OR_RETURN(std::string arch, f.get_string("general.architecture"));
  ModelConfig c;
  if (arch == "llama") {
    c.family = ArchFamily::kLlama;
    c.architecture = "llama";
  } else if (arch == "gemma3") {
    c.family = ArchFamily::kGemma3;
    c.architecture = "gemma3";
  } else if (arch == "qwen2moe" || arch == "qwen3moe" || arch == "olmoe") {
    c.family = ArchFamily::kMoe;
    c.architecture = arch;
  } else {
    return errorf(StatusCode::kUnimplemented,
                  "{}: unsupported GGUF architecture '{}' (supported: llama (and Mixtral), "
                  "gemma3, qwen2moe, qwen3moe, olmoe)",
                  f.name(), arch);
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
  const bool moe_arch = c.family == ArchFamily::kMoe || f.has(a + "expert_count");
  if (moe_arch && !f.has(a + "feed_forward_length")) {
    STRATA_ASSIGN_OR_RETURN(c.ffn_dim, req("expert_feed_forward_length"));
  } else {
    STRATA_ASSIGN_OR_RETURN(c.ffn_dim, req("feed_forward_length"));
  }
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
  if (c.family == ArchFamily::kLlama && moe_arch) c.family = ArchFamily::kMoe;  // Mixtral
  if (c.family == ArchFamily::kLlama || c.family == ArchFamily::kMoe) {
    c.activation = ops::Activation::kSilu;
    // llama (and Mixtral): Q/K rows were permuted for interleaved pairs by the converter; the
    // Qwen and OLMoE converters keep HF's rotate_half layout.
    c.rope_neox_style = arch != "llama";
    c.qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
    if (moe_arch) STRATA_RETURN_IF_ERROR(moe_config_from_gguf(f, arch, &c));
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
