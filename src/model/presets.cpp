// Model shapes by name (`strata bench --model-config NAME --load-format dummy`): the published
// configs of common checkpoints, so kernels and the executor can be measured at real sizes
// without downloading weights. Shapes match shared/bench/peer_torch.py's table.
#include <string>
#include <vector>

#include "core/status.h"
#include "model/presets.h"

namespace strata {

namespace {

struct Preset {
  const char* name;
  int64_t layers, hidden, heads, kv_heads, head_dim, ffn, vocab;
  float rope_theta;
  bool qkv_bias;
  bool tied;
};

// layers, hidden, heads, kv_heads, head_dim, ffn, vocab, rope_theta, qkv_bias, tied
constexpr Preset kPresets[] = {
    {"llama3-8b", 32, 4096, 32, 8, 128, 14336, 128256, 500000.0f, false, false},
    {"llama2-7b", 32, 4096, 32, 32, 128, 11008, 32000, 10000.0f, false, false},
    {"qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152064, 1000000.0f, true, false},
    {"llama3-70b", 80, 8192, 64, 8, 128, 28672, 128256, 500000.0f, false, false},
    {"llama3.2-1b", 16, 2048, 32, 8, 64, 8192, 128256, 500000.0f, false, true},
    // CodeLlama-34B (codellama/CodeLlama-34b-hf): 67.5 GB in bf16, the weight-streaming peer's.
    {"llama-34b", 48, 8192, 64, 8, 128, 22016, 32000, 1000000.0f, false, false},
};

// Mixture-of-experts shapes (config.json of Qwen/Qwen3-30B-A3B and
// mistralai/Mixtral-8x7B-v0.1): every layer sparse.
struct MoePreset {
  const char* name;
  const char* architecture;
  int64_t layers, hidden, heads, kv_heads, head_dim, expert_ffn, vocab, experts, top_k;
  float rope_theta, norm_eps;
  bool qk_norm, renormalize;
  int64_t context;
};

constexpr MoePreset kMoePresets[] = {
    {"qwen3-30b-a3b", "Qwen3MoeForCausalLM", 48, 2048, 32, 4, 128, 768, 151936, 128, 8, 1000000.0f,
     1e-6f, true, true, 40960},
    {"mixtral-8x7b", "MixtralForCausalLM", 32, 4096, 32, 8, 128, 14336, 32000, 8, 2, 1000000.0f,
     1e-5f, false, true, 32768},
};

}  // namespace

Result<ModelConfig> model_config_preset(const std::string& name) {
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    ModelConfig c;
    c.architecture = p.qkv_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
    c.family = ArchFamily::kLlama;
    c.vocab = p.vocab;
    c.hidden = p.hidden;
    c.n_layers = p.layers;
    c.n_heads = p.heads;
    c.n_heads_kv = p.kv_heads;
    c.head_dim = p.head_dim;
    c.ffn_dim = p.ffn;
    c.max_position_embeddings = 8192;
    c.norm = NormType::kRmsNorm;
    c.norm_eps = 1e-5f;
    c.activation = ops::Activation::kSilu;
    c.gated_mlp = true;
    c.qkv_bias = p.qkv_bias;
    c.tie_word_embeddings = p.tied;
    c.pos_embedding = PosEmbedding::kRope;
    c.rope_theta = p.rope_theta;
    c.rotary_dim = p.head_dim;
    c.weight_dtype = DType::kBF16;
    STRATA_RETURN_IF_ERROR(c.validate(std::string("model config ") + p.name));
    return c;
  }
  for (const MoePreset& p : kMoePresets) {
    if (name != p.name) continue;
    ModelConfig c;
    c.architecture = p.architecture;
    c.family = ArchFamily::kMoe;
    c.vocab = p.vocab;
    c.hidden = p.hidden;
    c.n_layers = p.layers;
    c.n_heads = p.heads;
    c.n_heads_kv = p.kv_heads;
    c.head_dim = p.head_dim;
    c.ffn_dim = p.expert_ffn;
    c.max_position_embeddings = p.context;
    c.norm = NormType::kRmsNorm;
    c.norm_eps = p.norm_eps;
    c.activation = ops::Activation::kSilu;
    c.gated_mlp = true;
    c.qk_norm = p.qk_norm;
    c.pos_embedding = PosEmbedding::kRope;
    c.rope_theta = p.rope_theta;
    c.rotary_dim = p.head_dim;
    c.weight_dtype = DType::kBF16;
    c.n_experts = p.experts;
    c.n_experts_used = p.top_k;
    c.expert_ffn_dim = p.expert_ffn;
    c.moe_renormalize = p.renormalize;
    c.layer_is_moe.assign(static_cast<size_t>(p.layers), true);
    STRATA_RETURN_IF_ERROR(c.validate(std::string("model config ") + p.name));
    return c;
  }
  std::string names;
  for (const Preset& p : kPresets) names += std::string(names.empty() ? "" : ", ") + p.name;
  for (const MoePreset& p : kMoePresets) names += std::string(", ") + p.name;
  return errorf(StatusCode::kNotFound, "unknown --model-config '{}' (known: {})", name, names);
}

}  // namespace strata
