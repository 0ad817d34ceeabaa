// Hugging Face config.json -> ModelConfig for the decoder families strata runs.
//
// Both config styles seen in the wild are read: the classic top-level `rope_theta` +
// `rope_scaling` (`type` or `rope_type`), and transformers 5's `rope_parameters` dict.
#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/status.h"
#include "io/safetensors.h"

namespace strata {

namespace {

using nlohmann::json;

std::string printable(const std::string& text) {
  return printable_for_message(text, 80);
}

// Reads typed fields from one JSON object, remembering the first error with the field name.
class Fields {
 public:
  Fields(const json& obj, std::string source) : obj_(obj), source_(std::move(source)) {}

  bool has(const char* key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }

  int64_t int_or(const char* key, int64_t fallback) {
    if (!has(key)) return fallback;
    const json& v = obj_.at(key);
    // NOTE: every integer a config holds is a size or an id; bounding them here keeps the
    // arithmetic on them (4 * hidden, head_dim * rotary fraction) free of overflow.
    constexpr int64_t kMaxInt = int64_t{1} << 40;
    if (v.is_number_integer() && !v.is_number_unsigned() &&
        (v.get<int64_t>() > kMaxInt || v.get<int64_t>() < -kMaxInt)) {
      fail(key, "an integer of magnitude at most 2^40");
      return fallback;
    }
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(kMaxInt)) {
      fail(key, "an integer of magnitude at most 2^40");
      return fallback;
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::floor(d) == d && std::fabs(d) <= 1099511627776.0) return static_cast<int64_t>(d);
    }
    fail(key, "an integer");
    return fallback;
  }
  int64_t required_int(const char* key) {
    if (!has(key)) {
      if (status_.ok())
        status_ = errorf(StatusCode::kInvalidArgument, "{}: missing field '{}'", source_, key);
      return 0;
    }
    return int_or(key, 0);
  }
  double num_or(const char* key, double fallback) {
    if (!has(key)) return fallback;
    const json& v = obj_.at(key);
    // Bounded so that narrowing to float (theta, eps, scaling factors) stays defined.
    if (v.is_number() && std::fabs(v.get<double>()) <= 1e30) return v.get<double>();
    fail(key, "a number of magnitude at most 1e30");
    return fallback;
  }
  bool bool_or(const char* key, bool fallback) {
    if (!has(key)) return fallback;
    const json& v = obj_.at(key);
    if (v.is_boolean()) return v.get<bool>();
    fail(key, "true or false");
    return fallback;
  }
  std::string string_or(const char* key, const std::string& fallback) {
    if (!has(key)) return fallback;
    const json& v = obj_.at(key);
    if (v.is_string()) return v.get<std::string>();
    fail(key, "a string");
    return fallback;
  }
  const Status& status() const { return status_; }
  void set_error(Status s) {
    if (status_.ok()) status_ = std::move(s);
  }

 private:
  void fail(const char* key, const char* expected) {
    if (status_.ok()) {
      status_ = errorf(StatusCode::kInvalidArgument, "{}: field '{}' must be {}, got {}", source_,
                       key, expected, obj_.at(key).dump().substr(0, 40));
    }
  }
  const json& obj_;
  std::string source_;
  Status status_;
};

Result<ops::Activation> parse_activation(const std::string& name, const std::string& source) {
  if (name == "silu" || name == "swish") return ops::Activation::kSilu;
  if (name == "gelu_new" || name == "gelu_pytorch_tanh" || name == "gelu_fast" ||
      name == "gelu_tanh") {
    return ops::Activation::kGeluTanh;
  }
  if (name == "gelu" || name == "gelu_python") return ops::Activation::kGeluErf;
  if (name == "relu") return ops::Activation::kRelu;
  return errorf(StatusCode::kUnimplemented, "{}: unsupported activation '{}'", source,
                printable(name));
}

// rope_scaling / rope_parameters object -> RopeScaling.
Status parse_rope_scaling(const json& obj, const std::string& source, RopeScaling* out) {
  if (!obj.is_object()) {
    return errorf(StatusCode::kInvalidArgument, "{}: field 'rope_scaling' must be an object",
                  source);
  }
  Fields f(obj, source);
  std::string type = f.string_or("rope_type", f.string_or("type", "default"));
  if (type == "default") {
    out->type = RopeScalingType::kNone;
  } else if (type == "linear") {
    out->type = RopeScalingType::kLinear;
  } else if (type == "llama3") {
    out->type = RopeScalingType::kLlama3;
  } else {
    return errorf(StatusCode::kUnimplemented, "{}: unsupported rope scaling type '{}'", source,
                  printable(type));
  }
  out->factor = static_cast<float>(f.num_or("factor", 1.0));
  out->low_freq_factor = static_cast<float>(f.num_or("low_freq_factor", 1.0));
  out->high_freq_factor = static_cast<float>(f.num_or("high_freq_factor", 4.0));
  out->original_max_position_embeddings = f.int_or("original_max_position_embeddings", 8192);
  STRATA_RETURN_IF_ERROR(f.status());
  if (out->type != RopeScalingType::kNone && !(out->factor > 0.0f)) {
    return errorf(StatusCode::kInvalidArgument, "{}: rope scaling factor must be > 0", source);
  }
  if (out->type == RopeScalingType::kLlama3 &&
      (!(out->high_freq_factor > out->low_freq_factor) || out->low_freq_factor <= 0.0f ||
       out->original_max_position_embeddings <= 0)) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: llama3 rope scaling needs high_freq_factor > low_freq_factor > 0", source);
  }
  return ok_status();
}

void parse_eos(const json& root, ModelConfig* c) {
  if (!root.contains("eos_token_id")) return;
  const json& e = root.at("eos_token_id");
  if (e.is_number_integer()) {
    c->eos_token_ids.push_back(e.get<int64_t>());
  } else if (e.is_array()) {
    for (const json& x : e) {
      if (x.is_number_integer()) c->eos_token_ids.push_back(x.get<int64_t>());
    }
  }
}

// The mixture-of-experts families: Llama-style attention (Qwen2-MoE with q/k/v biases, Qwen3-MoE
// with per-head q/k norms, OLMoE with q/k norms over the whole projection) and a router over
// experts in the sparse layers.
Status parse_moe(const json& root, Fields& f, const std::string& source, ModelConfig* out) {
  ModelConfig& c = *out;
  const std::string& a = c.architecture;
  const bool mixtral = a == "MixtralForCausalLM", qwen2 = a == "Qwen2MoeForCausalLM",
             qwen3 = a == "Qwen3MoeForCausalLM", olmoe = a == "OlmoeForCausalLM";
  c.family = ArchFamily::kMoe;
  c.vocab = f.required_int("vocab_size");
  c.hidden = f.required_int("hidden_size");
  c.n_layers = f.required_int("num_hidden_layers");
  c.n_heads = f.required_int("num_attention_heads");
  c.n_heads_kv = f.int_or("num_key_value_heads", c.n_heads);
  c.max_position_embeddings = f.int_or("max_position_embeddings", 4096);
  c.norm = NormType::kRmsNorm;
  c.norm_eps = static_cast<float>(f.num_or("rms_norm_eps", olmoe ? 1e-5 : 1e-6));
  c.gated_mlp = true;
  c.qkv_bias = qwen2 ? f.bool_or("qkv_bias", true) : f.bool_or("attention_bias", false);
  c.o_bias = !qwen2 && f.bool_or("attention_bias", false);
  c.qk_norm = qwen3;
  c.qk_norm_full = olmoe;
  c.tie_word_embeddings = f.bool_or("tie_word_embeddings", false);
  c.pos_embedding = PosEmbedding::kRope;
  c.rope_neox_style = true;
  STRATA_ASSIGN_OR_RETURN(c.activation,
                          parse_activation(f.string_or("hidden_act", "silu"), source));
  if (c.activation != ops::Activation::kSilu) {
    return errorf(StatusCode::kUnimplemented, "{}: field 'hidden_act' must be silu for {}", source,
                  a);
  }
  const bool sliding = mixtral ? true : f.bool_or("use_sliding_window", false);
  if (sliding && f.has("sliding_window")) c.sliding_window = f.int_or("sliding_window", 0);
  if (olmoe && f.has("clip_qkv")) {
    return errorf(StatusCode::kUnimplemented, "{}: field 'clip_qkv' is not supported", source);
  }
  // Mixtral names it num_local_experts, the others num_experts (transformers 5 also writes
  // num_local_experts for Qwen3-MoE).
  const char* experts_key = f.has("num_experts") ? "num_experts" : "num_local_experts";
  c.n_experts = f.required_int(experts_key);
  c.n_experts_used = f.required_int("num_experts_per_tok");
  c.ffn_dim = f.required_int("intermediate_size");
  c.expert_ffn_dim = (qwen2 || qwen3) ? f.required_int("moe_intermediate_size") : c.ffn_dim;
  c.moe_renormalize = mixtral ? true : f.bool_or("norm_topk_prob", false);
  if (qwen2) c.shared_expert_ffn_dim = f.int_or("shared_expert_intermediate_size", 0);
  STRATA_RETURN_IF_ERROR(f.status());
  if (c.n_experts < 1 || c.n_experts > 4096) {
    return errorf(StatusCode::kInvalidArgument, "{}: field '{}' = {} is out of range (1..4096)",
                  source, experts_key, c.n_experts);
  }
  if (c.n_experts_used < 1 || c.n_experts_used > c.n_experts) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: field 'num_experts_per_tok' = {} must be in [1, {}] ({} experts)", source,
                  c.n_experts_used, c.n_experts, experts_key);
  }
  if (c.expert_ffn_dim < 1 || c.expert_ffn_dim > (int64_t{1} << 20)) {
    return errorf(StatusCode::kInvalidArgument, "{}: field '{}' = {} is out of range", source,
                  (qwen2 || qwen3) ? "moe_intermediate_size" : "intermediate_size",
                  c.expert_ffn_dim);
  }
  if (c.shared_expert_ffn_dim < 0 || c.shared_expert_ffn_dim > (int64_t{1} << 20)) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: field 'shared_expert_intermediate_size' = {} is out of range", source,
                  c.shared_expert_ffn_dim);
  }
  // Sparse layers: every decoder_sparse_step-th layer not listed in mlp_only_layers.
  const int64_t n_layers = std::clamp<int64_t>(c.n_layers, 0, 4096);
  c.layer_is_moe.assign(static_cast<size_t>(n_layers), true);
  if (qwen2 || qwen3) {
    const int64_t step = f.int_or("decoder_sparse_step", 1);
    STRATA_RETURN_IF_ERROR(f.status());
    if (step < 1) {
      return errorf(StatusCode::kInvalidArgument,
                    "{}: field 'decoder_sparse_step' = {} must be >= 1", source, step);
    }
    for (int64_t l = 0; l < n_layers; ++l)
      c.layer_is_moe[static_cast<size_t>(l)] = (l + 1) % step == 0;
    if (f.has("mlp_only_layers")) {
      const json& m = root.at("mlp_only_layers");
      if (!m.is_array()) {
        return errorf(StatusCode::kInvalidArgument,
                      "{}: field 'mlp_only_layers' must be a list of layer indices", source);
      }
      for (const json& v : m) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= n_layers) {
          return errorf(StatusCode::kInvalidArgument,
                        "{}: field 'mlp_only_layers' holds {}, not a layer index below {}", source,
                        v.dump().substr(0, 20), n_layers);
        }
        c.layer_is_moe[static_cast<size_t>(v.get<int64_t>())] = false;
      }
    }
  }
  return ok_status();
}

}  // namespace

const std::vector<std::string>& supported_hf_architectures() {
  static const std::vector<std::string> kArchs = {
      "LlamaForCausalLM",    "MistralForCausalLM", "Qwen2ForCausalLM",   "GPT2LMHeadModel",
      "GPTNeoXForCausalLM",  "Gemma3ForCausalLM",  "MixtralForCausalLM", "Qwen2MoeForCausalLM",
      "Qwen3MoeForCausalLM", "OlmoeForCausalLM"};
  return kArchs;
}

Result<ModelConfig> parse_hf_config(const std::string& json_text, const std::string& source) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return errorf(StatusCode::kInvalidArgument, "{}: not valid JSON", source);
  }
  if (!root.is_object()) {
    return errorf(StatusCode::kInvalidArgument, "{}: expected a JSON object", source);
  }
  ModelConfig c;
  if (root.contains("architectures") && root["architectures"].is_array() &&
      !root["architectures"].empty() && root["architectures"][0].is_string()) {
    c.architecture = root["architectures"][0].get<std::string>();
  } else if (root.contains("model_type") && root["model_type"].is_string()) {
    const std::string mt = root["model_type"].get<std::string>();
    if (mt == "llama")
      c.architecture = "LlamaForCausalLM";
    else if (mt == "mistral")
      c.architecture = "MistralForCausalLM";
    else if (mt == "qwen2")
      c.architecture = "Qwen2ForCausalLM";
    else if (mt == "gpt2")
      c.architecture = "GPT2LMHeadModel";
    else if (mt == "gpt_neox")
      c.architecture = "GPTNeoXForCausalLM";
    else if (mt == "gemma3_text")
      c.architecture = "Gemma3ForCausalLM";
    else if (mt == "mixtral")
      c.architecture = "MixtralForCausalLM";
    else if (mt == "qwen2_moe")
      c.architecture = "Qwen2MoeForCausalLM";
    else if (mt == "qwen3_moe")
      c.architecture = "Qwen3MoeForCausalLM";
    else if (mt == "olmoe")
      c.architecture = "OlmoeForCausalLM";
    else
      c.architecture = mt;
  } else {
    return errorf(StatusCode::kInvalidArgument, "{}: missing field 'architectures'", source);
  }

  Fields f(root, source);
  const std::string& a = c.architecture;
  if (a == "LlamaForCausalLM" || a == "MistralForCausalLM" || a == "Qwen2ForCausalLM") {
    c.family = ArchFamily::kLlama;
    c.vocab = f.required_int("vocab_size");
    c.hidden = f.required_int("hidden_size");
    c.n_layers = f.required_int("num_hidden_layers");
    c.n_heads = f.required_int("num_attention_heads");
    c.n_heads_kv = f.int_or("num_key_value_heads", c.n_heads);
    c.ffn_dim = f.required_int("intermediate_size");
    c.max_position_embeddings = f.int_or("max_position_embeddings", 2048);
    c.norm = NormType::kRmsNorm;
    c.norm_eps = static_cast<float>(f.num_or("rms_norm_eps", 1e-6));
    c.gated_mlp = true;
    const bool qwen = a == "Qwen2ForCausalLM";
    const bool attention_bias = f.bool_or("attention_bias", false);
    c.qkv_bias = qwen || attention_bias;
    c.o_bias = !qwen && attention_bias;
    c.mlp_bias = f.bool_or("mlp_bias", false);
    c.tie_word_embeddings = f.bool_or("tie_word_embeddings", false);
    c.pos_embedding = PosEmbedding::kRope;
    c.rope_neox_style = true;
    STRATA_ASSIGN_OR_RETURN(c.activation,
                            parse_activation(f.string_or("hidden_act", "silu"), source));
    const bool sliding = qwen ? f.bool_or("use_sliding_window", false) : true;
    if (sliding && f.has("sliding_window")) c.sliding_window = f.int_or("sliding_window", 0);
  } else if (a == "MixtralForCausalLM" || a == "Qwen2MoeForCausalLM" ||
             a == "Qwen3MoeForCausalLM" || a == "OlmoeForCausalLM") {
    STRATA_RETURN_IF_ERROR(parse_moe(root, f, source, &c));
  } else if (a == "GPT2LMHeadModel") {
    c.family = ArchFamily::kGpt2;
    c.vocab = f.required_int("vocab_size");
    c.hidden = f.required_int("n_embd");
    c.n_layers = f.required_int("n_layer");
    c.n_heads = f.required_int("n_head");
    c.n_heads_kv = c.n_heads;
    c.ffn_dim = f.int_or("n_inner", 4 * c.hidden);
    c.max_position_embeddings = f.int_or("n_positions", 1024);
    c.norm = NormType::kLayerNorm;
    c.norm_eps = static_cast<float>(f.num_or("layer_norm_epsilon", 1e-5));
    c.gated_mlp = false;
    c.qkv_bias = c.o_bias = c.mlp_bias = true;
    c.tie_word_embeddings = f.bool_or("tie_word_embeddings", true);
    c.pos_embedding = PosEmbedding::kLearned;
    STRATA_ASSIGN_OR_RETURN(
        c.activation, parse_activation(f.string_or("activation_function", "gelu_new"), source));
    if (f.bool_or("scale_attn_by_inverse_layer_idx", false) ||
        f.bool_or("reorder_and_upcast_attn", false)) {
      return errorf(StatusCode::kUnimplemented,
                    "{}: GPT-2 options scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn "
                    "are not supported",
                    source);
    }
  } else if (a == "GPTNeoXForCausalLM") {
    c.family = ArchFamily::kGptNeoX;
    c.vocab = f.required_int("vocab_size");
    c.hidden = f.required_int("hidden_size");
    c.n_layers = f.required_int("num_hidden_layers");
    c.n_heads = f.required_int("num_attention_heads");
    c.n_heads_kv = c.n_heads;
    c.ffn_dim = f.required_int("intermediate_size");
    c.max_position_embeddings = f.int_or("max_position_embeddings", 2048);
    c.norm = NormType::kLayerNorm;
    c.norm_eps = static_cast<float>(f.num_or("layer_norm_eps", 1e-5));
    c.gated_mlp = false;
    const bool bias = f.bool_or("attention_bias", true);
    c.qkv_bias = c.o_bias = bias;
    c.mlp_bias = true;
    c.parallel_block = f.bool_or("use_parallel_residual", true);
    c.tie_word_embeddings = f.bool_or("tie_word_embeddings", false);
    c.pos_embedding = PosEmbedding::kRope;
    c.rope_neox_style = true;
    STRATA_ASSIGN_OR_RETURN(c.activation,
                            parse_activation(f.string_or("hidden_act", "gelu"), source));
  } else if (a == "Gemma3ForCausalLM") {
    // Gemma-3 text models: (1 + w) RMSNorms before and after attention and MLP, per-head q/k
    // norms, GeGLU, sqrt(hidden) embedding scale, query scale query_pre_attn_scalar^-1/2, and
    // sliding-window layers (layer_types, or every layer but each sliding_window_pattern-th)
    // with their own rope base.
    c.family = ArchFamily::kGemma3;
    c.vocab = f.required_int("vocab_size");
    c.hidden = f.required_int("hidden_size");
    c.n_layers = f.required_int("num_hidden_layers");
    c.n_heads = f.required_int("num_attention_heads");
    c.n_heads_kv = f.int_or("num_key_value_heads", c.n_heads);
    c.ffn_dim = f.required_int("intermediate_size");
    c.max_position_embeddings = f.int_or("max_position_embeddings", 131072);
    c.norm = NormType::kRmsNorm;
    c.norm_eps = static_cast<float>(f.num_or("rms_norm_eps", 1e-6));
    c.norm_weight_offset = 1.0f;
    c.gated_mlp = true;
    c.qkv_bias = c.o_bias = f.bool_or("attention_bias", false);
    c.qk_norm = true;
    c.post_norms = true;
    c.tie_word_embeddings = f.bool_or("tie_word_embeddings", true);
    c.pos_embedding = PosEmbedding::kRope;
    c.rope_neox_style = true;
    c.embedding_scale = std::sqrt(static_cast<float>(c.hidden));
    STRATA_ASSIGN_OR_RETURN(
        c.activation,
        parse_activation(f.string_or("hidden_activation", "gelu_pytorch_tanh"), source));
    const double scalar = f.num_or("query_pre_attn_scalar", 256.0);
    if (!(scalar > 0.0)) {
      return errorf(StatusCode::kInvalidArgument, "{}: query_pre_attn_scalar must be > 0", source);
    }
    c.attn_scale = static_cast<float>(1.0 / std::sqrt(scalar));
    c.attn_logit_softcap = static_cast<float>(f.num_or("attn_logit_softcapping", 0.0));
    c.final_logit_softcap = static_cast<float>(f.num_or("final_logit_softcapping", 0.0));
    c.sliding_window = f.int_or("sliding_window", 4096);
    c.layer_is_sliding.assign(static_cast<size_t>(std::clamp<int64_t>(c.n_layers, 0, 4096)), true);
    if (f.has("layer_types")) {
      const json& lt = root.at("layer_types");
      if (!lt.is_array() || static_cast<int64_t>(lt.size()) != c.n_layers) {
        return errorf(StatusCode::kInvalidArgument,
                      "{}: field 'layer_types' must list one type per layer", source);
      }
      for (size_t l = 0; l < lt.size(); ++l) {
        const std::string t = lt[l].is_string() ? lt[l].get<std::string>() : "";
        if (t != "sliding_attention" && t != "full_attention") {
          return errorf(StatusCode::kInvalidArgument,
                        "{}: layer_types[{}] '{}' is not "
                        "sliding_attention or full_attention",
                        source, l, printable(t));
        }
        c.layer_is_sliding[l] = t == "sliding_attention";
      }
    } else {
      const int64_t pattern =
          f.int_or("sliding_window_pattern", f.int_or("_sliding_window_pattern", 6));
      if (pattern < 1) {
        return errorf(StatusCode::kInvalidArgument, "{}: sliding_window_pattern must be >= 1",
                      source);
      }
      for (int64_t l = 0; l < static_cast<int64_t>(c.layer_is_sliding.size()); ++l) {
        c.layer_is_sliding[static_cast<size_t>(l)] = (l + 1) % pattern != 0;
      }
    }
  } else {
    std::string list;
    for (const auto& s : supported_hf_architectures()) list += (list.empty() ? "" : ", ") + s;
    return errorf(StatusCode::kUnimplemented, "{}: unsupported architecture '{}' (supported: {})",
                  source, printable(a), list);
  }
  STRATA_RETURN_IF_ERROR(f.status());

  if (c.n_heads > 0) c.head_dim = f.int_or("head_dim", c.hidden / c.n_heads);
  STRATA_RETURN_IF_ERROR(f.status());

  // Rotary settings: classic keys first, then transformers 5 rope_parameters overriding.
  if (c.pos_embedding == PosEmbedding::kRope) {
    double theta = f.num_or("rope_theta", f.num_or("rotary_emb_base", 10000.0));
    double partial = f.num_or("partial_rotary_factor", f.num_or("rotary_pct", 1.0));
    if (f.has("rope_scaling")) {
      STRATA_RETURN_IF_ERROR(parse_rope_scaling(root.at("rope_scaling"), source, &c.rope_scaling));
    }
    // Gemma-3: the global (full-attention) layers use rope_theta and the scaling; the sliding
    // layers rope_local_base_freq without scaling (transformers 5: rope_parameters per layer type).
    double theta_local = f.num_or("rope_local_base_freq", 10000.0);
    if (f.has("rope_parameters")) {
      const json& rp = root.at("rope_parameters");
      const bool per_type = rp.is_object() && rp.contains("full_attention");
      const json& global = per_type ? rp.at("full_attention") : rp;
      STRATA_RETURN_IF_ERROR(parse_rope_scaling(global, source, &c.rope_scaling));
      Fields rf(global, source);
      theta = rf.num_or("rope_theta", theta);
      partial = rf.num_or("partial_rotary_factor", partial);
      STRATA_RETURN_IF_ERROR(rf.status());
      if (per_type && rp.contains("sliding_attention")) {
        const json& local = rp.at("sliding_attention");
        RopeScaling ls;
        STRATA_RETURN_IF_ERROR(parse_rope_scaling(local, source, &ls));
        if (ls.type != RopeScalingType::kNone) {
          return errorf(StatusCode::kUnimplemented,
                        "{}: rope scaling on sliding-attention layers is not supported", source);
        }
        Fields lf(local, source);
        theta_local = lf.num_or("rope_theta", theta_local);
        STRATA_RETURN_IF_ERROR(lf.status());
      }
    }
    STRATA_RETURN_IF_ERROR(f.status());
    if (!(theta > 0.0)) {
      return errorf(StatusCode::kInvalidArgument, "{}: rope_theta must be > 0", source);
    }
    if (!(partial > 0.0 && partial <= 1.0)) {
      return errorf(StatusCode::kInvalidArgument, "{}: rotary fraction must be in (0, 1]", source);
    }
    c.rope_theta = c.rope_theta_local = static_cast<float>(theta);
    if (c.family == ArchFamily::kGemma3) {
      if (!(theta_local > 0.0)) {
        return errorf(StatusCode::kInvalidArgument, "{}: rope_local_base_freq must be > 0", source);
      }
      c.rope_theta_local = static_cast<float>(theta_local);
    }
    c.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * partial);
  }

  const std::string dtype_name = f.string_or("torch_dtype", f.string_or("dtype", "float32"));
  STRATA_RETURN_IF_ERROR(f.status());
  if (!parse_dtype(dtype_name, &c.weight_dtype)) {
    return errorf(StatusCode::kUnimplemented, "{}: unsupported dtype '{}'", source,
                  printable(dtype_name));
  }
  c.bos_token_id = f.int_or("bos_token_id", -1);
  parse_eos(root, &c);
  STRATA_RETURN_IF_ERROR(f.status());
  STRATA_RETURN_IF_ERROR(c.validate(source));
  return c;
}

int64_t ModelConfig::parameter_count() const {
  const int64_t q = n_heads * head_dim, kv = n_heads_kv * head_dim;
  int64_t per_layer = hidden * (q + 2 * kv) + q * hidden;  // attention
  per_layer += (gated_mlp ? 3 : 2) * hidden * ffn_dim;     // mlp (dense layers)
  per_layer += 2 * hidden;                                 // norms
  if (qkv_bias) per_layer += q + 2 * kv;
  if (o_bias) per_layer += hidden;
  if (mlp_bias) per_layer += (gated_mlp ? 2 : 1) * ffn_dim + hidden;
  if (norm == NormType::kLayerNorm) per_layer += 2 * hidden;
  if (qk_norm) per_layer += 2 * head_dim;
  if (qk_norm_full) per_layer += q + kv;
  int64_t total = n_layers * per_layer + vocab * hidden + hidden;
  // Sparse layers: the router and all experts (and the shared expert) replace the dense MLP.
  for (int64_t l = 0; l < n_layers; ++l) {
    if (!layer_moe(l)) continue;
    total -= 3 * hidden * ffn_dim;
    total += n_experts * (hidden + 3 * hidden * expert_ffn_dim);
    if (shared_expert_ffn_dim > 0) total += 3 * hidden * shared_expert_ffn_dim + hidden;
  }
  if (norm == NormType::kLayerNorm) total += hidden;
  if (!tie_word_embeddings) total += vocab * hidden;
  if (pos_embedding == PosEmbedding::kLearned) total += max_position_embeddings * hidden;
  return total;
}

int64_t ModelConfig::active_parameter_count() const {
  int64_t total = parameter_count();
  for (int64_t l = 0; l < n_layers; ++l) {
    if (layer_moe(l)) total -= (n_experts - n_experts_used) * 3 * hidden * expert_ffn_dim;
  }
  return total;
}

Status ModelConfig::validate(const std::string& source) const {
  auto positive = [&](int64_t v, const char* name, int64_t max) -> Status {
    if (v <= 0 || v > max) {
      return errorf(StatusCode::kInvalidArgument, "{}: field '{}' = {} is out of range (1..{})",
                    source, name, v, max);
    }
    return ok_status();
  };
  STRATA_RETURN_IF_ERROR(positive(vocab, "vocab_size", int64_t{1} << 24));
  STRATA_RETURN_IF_ERROR(positive(hidden, "hidden_size", int64_t{1} << 17));
  STRATA_RETURN_IF_ERROR(positive(n_layers, "num_hidden_layers", 4096));
  STRATA_RETURN_IF_ERROR(positive(n_heads, "num_attention_heads", 4096));
  STRATA_RETURN_IF_ERROR(positive(n_heads_kv, "num_key_value_heads", 4096));
  STRATA_RETURN_IF_ERROR(positive(head_dim, "head_dim", 4096));
  STRATA_RETURN_IF_ERROR(positive(ffn_dim, "intermediate_size", int64_t{1} << 20));
  STRATA_RETURN_IF_ERROR(
      positive(max_position_embeddings, "max_position_embeddings", int64_t{1} << 24));
  if (n_heads % n_heads_kv != 0) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                  source, n_heads, n_heads_kv);
  }
  if (pos_embedding == PosEmbedding::kRope) {
    // The rope kernels take rotary_dim even, in [2, head_dim] and at most 1024: checked here so
    // that `info` and the load fail, not the first forward pass.
    constexpr int64_t kMaxRotaryDim = 1024;
    if (rotary_dim < 2 || rotary_dim % 2 != 0 || rotary_dim > head_dim ||
        rotary_dim > kMaxRotaryDim) {
      return errorf(StatusCode::kInvalidArgument,
                    "{}: rotary dimension {} must be even and in [2, min(head_dim {}, {})]", source,
                    rotary_dim, head_dim, kMaxRotaryDim);
    }
    if (!(std::isfinite(rope_theta) && rope_theta > 0.0f) ||
        !(std::isfinite(rope_theta_local) && rope_theta_local > 0.0f)) {
      return errorf(StatusCode::kInvalidArgument, "{}: rope theta (base frequency) {} must be > 0",
                    source, rope_theta > 0.0f ? rope_theta_local : rope_theta);
    }
    if (rope_scaling.type != RopeScalingType::kNone &&
        !(std::isfinite(rope_scaling.factor) && rope_scaling.factor > 0.0f)) {
      return errorf(StatusCode::kInvalidArgument, "{}: rope scaling factor {} must be > 0", source,
                    rope_scaling.factor);
    }
  }
  if (bos_token_id < -1 || bos_token_id >= vocab) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: bos_token_id {} is outside the vocabulary [0, {})", source, bos_token_id,
                  vocab);
  }
  for (const int64_t id : eos_token_ids) {
    if (id < 0 || id >= vocab) {
      return errorf(StatusCode::kInvalidArgument,
                    "{}: eos_token_id {} is outside the vocabulary [0, {})", source, id, vocab);
    }
  }
  if (n_experts > 0) {
    if (n_experts_used < 1 || n_experts_used > n_experts) {
      return errorf(StatusCode::kInvalidArgument,
                    "{}: {} experts used per token must be in [1, {} experts]", source,
                    n_experts_used, n_experts);
    }
    // NOTE: bounds the expert arithmetic of parameter_count() (no overflow for any parsed
    // config); the largest published MoE layers hold ~2^32 expert weights.
    if (n_experts > 4096 || expert_ffn_dim > (int64_t{1} << 20) ||
        shared_expert_ffn_dim > (int64_t{1} << 20) ||
        n_experts * expert_ffn_dim * hidden > (int64_t{1} << 40)) {
      return errorf(StatusCode::kInvalidArgument,
                    "{}: {} experts of FFN size {} at hidden size {} are out of range", source,
                    n_experts, expert_ffn_dim, hidden);
    }
    if (expert_ffn_dim < 1 || static_cast<int64_t>(layer_is_moe.size()) != n_layers) {
      return errorf(StatusCode::kInvalidArgument,
                    "{}: a MoE model needs the expert FFN size and one sparse/dense flag per layer",
                    source);
    }
  }
  if (!(norm_eps >= 0.0f) || sliding_window < 0) {
    return errorf(StatusCode::kInvalidArgument, "{}: negative norm eps or sliding window", source);
  }
  return ok_status();
}

}  // namespace strata
