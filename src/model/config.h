// ModelConfig: everything the forward pass needs to know about an architecture, filled from a
// Hugging Face config.json (parse_hf_config) or GGUF metadata (io/gguf). One struct covers the
// decoder-only families strata runs; per-family differences are flags, not subclasses.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/ops.h"
#include "strata/status.h"
#include "strata/types.h"

namespace strata {

enum class ArchFamily { kLlama, kGpt2, kGptNeoX, kGemma3, kMoe };
enum class NormType { kRmsNorm, kLayerNorm };
enum class PosEmbedding { kRope, kLearned };
enum class RopeScalingType { kNone, kLinear, kLlama3 };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;                     // llama3
  float high_freq_factor = 4.0f;                    // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
};

struct ModelConfig {
  std::string architecture;  // "LlamaForCausalLM", ... as named in config.json / GGUF
  ArchFamily family = ArchFamily::kLlama;

  int64_t vocab = 0;
  int64_t hidden = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_heads_kv = 0;
  int64_t head_dim = 0;
  int64_t ffn_dim = 0;
  int64_t max_position_embeddings = 0;  // the model's context length

  NormType norm = NormType::kRmsNorm;
  float norm_eps = 1e-5f;
  float norm_weight_offset = 0.0f;  // Gemma: weights stored as (w - 1)
  ops::Activation activation = ops::Activation::kSilu;
  bool gated_mlp = true;        // SwiGLU/GeGLU vs plain up -> act -> down
  bool parallel_block = false;  // NeoX use_parallel_residual: x + attn(ln1 x) + mlp(ln2 x)
  bool qkv_bias = false;        // Qwen2 q/k/v bias; GPT-2 / NeoX biases on every linear
  bool o_bias = false;
  bool mlp_bias = false;
  bool tie_word_embeddings = false;
  bool qk_norm = false;          // Gemma-3 / Qwen3-MoE per-head q/k RMSNorm
  bool qk_norm_full = false;     // OLMoE: RMSNorm over the whole q / k projection
  bool post_norms = false;       // Gemma-3 post-attention / post-ffw norms
  float embedding_scale = 1.0f;  // Gemma: sqrt(hidden)

  PosEmbedding pos_embedding = PosEmbedding::kRope;
  float rope_theta = 10000.0f;
  float rope_theta_local = 10000.0f;  // Gemma-3 sliding layers
  int64_t rotary_dim = 0;             // partial rotary (NeoX rotary_pct); = head_dim otherwise
  bool rope_neox_style = true;        // HF rotate_half; false for GGUF-permuted llama weights
  RopeScaling rope_scaling;

  int64_t sliding_window = 0;          // 0 = none
  std::vector<bool> layer_is_sliding;  // per layer, when sliding_window > 0
  float attn_scale = 0.0f;             // 0 = 1/sqrt(head_dim)
  float attn_logit_softcap = 0.0f;     // tanh soft-capping of attention scores; 0 = off
  float final_logit_softcap = 0.0f;

  // Mixture of experts (family kMoe: Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE). A sparse layer's
  // MLP is a router over n_experts experts of expert_ffn_dim each, n_experts_used per token,
  // plus (Qwen2-MoE) a shared expert of shared_expert_ffn_dim behind a sigmoid gate; a dense
  // layer (layer_is_moe false) has the plain gated MLP of ffn_dim.
  int64_t n_experts = 0;  // 0: not a MoE model
  int64_t n_experts_used = 0;
  int64_t expert_ffn_dim = 0;
  int64_t shared_expert_ffn_dim = 0;  // 0: no shared expert
  bool moe_renormalize = false;       // top-k weights divided by their sum (norm_topk_prob)
  std::vector<bool> layer_is_moe;     // per layer, when n_experts > 0

  DType weight_dtype = DType::kF32;  // dtype of the checkpoint's weights (torch_dtype)

  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;

  // Parameter count implied by the shapes (embedding counted once when tied).
  int64_t parameter_count() const;
  // Parameters one token reads (the experts it is routed to, not all of them).
  int64_t active_parameter_count() const;
  bool is_moe() const { return n_experts > 0; }
  bool layer_moe(int64_t layer) const {
    return n_experts > 0 && layer >= 0 && layer < static_cast<int64_t>(layer_is_moe.size()) &&
           layer_is_moe[static_cast<size_t>(layer)];
  }
  Status validate(const std::string& source) const;
};

// Parse a Hugging Face config.json. `source` names the file in error messages.
Result<ModelConfig> parse_hf_config(const std::string& json_text, const std::string& source);

// Architectures parse_hf_config accepts, for error messages and `strata info`.
const std::vector<std::string>& supported_hf_architectures();

}  // namespace strata
