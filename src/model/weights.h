// The weights of one decoder-only transformer as this rank holds them, as typed fields (no
// string maps): views into memory that a WeightStore owns (the memory-mapped checkpoint, copies
// re-laid-out at load, or device buffers). Shapes are this rank's shards after tensor-parallel
// sharding (Megatron: QKV and gate/up column-parallel, o and down row-parallel, embedding and LM
// head vocab-parallel).
//
// Two layouts hold the same model:
//   as stored  - the CPU reference: each linear layer's parts are views of the checkpoint's
//                tensors (q, k, v / gate, up as separate parts), any float or GGUF block dtype.
//   device     - what the GPU kernels read (and the CPU bf16 twins): one part per linear layer
//                (Q/K/V and gate/up concatenated), bf16 or int8 / fp8 with per-row f32 scales;
//                norms, biases and rope tables f32. Made by Model::to_device / Model::random.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"

namespace strata {

struct LayerWeights {
  ops::NormWeight attn_norm;  // input_layernorm / ln_1 [hidden]
  ops::LinearWeight qkv;      // [(hq + 2 hkv) head_dim, hidden]: q rows, then k, then v
  ops::LinearWeight o;        // [hidden, hq head_dim], row-parallel
  // per-head [head_dim] (Gemma-3, Qwen3-MoE), whole projection [hq head_dim] / [hkv head_dim]
  // (OLMoE), else undefined
  ops::NormWeight q_norm, k_norm;
  ops::NormWeight post_attn_norm;  // Gemma-3, else undefined
  ops::NormWeight ffn_norm;        // post_attention_layernorm / ln_2 [hidden]
  ops::LinearWeight gate_up;  // gated MLP: [gate; up] [2 ffn, hidden]; plain MLP: up [ffn, hidden]
  ops::LinearWeight down;     // [hidden, ffn], row-parallel
  ops::NormWeight post_ffn_norm;  // Gemma-3, else undefined

  // Sparse (mixture-of-experts) layers, instead of gate_up / down:
  ops::LinearWeight router;                       // [n_experts, hidden]
  std::vector<ops::LinearWeight> expert_gate_up;  // n_experts x [gate; up] [2 expert_ffn, hidden]
  std::vector<ops::LinearWeight> expert_down;     // n_experts x [hidden, expert_ffn]
  ops::LinearWeight
      shared_gate_up;             // Qwen2-MoE shared expert [2 shared_ffn, hidden], else undefined
  ops::LinearWeight shared_down;  // [hidden, shared_ffn]
  ops::LinearWeight shared_gate;  // [1, hidden]: sigmoid gate of the shared expert's output
};

struct ModelWeights {
  Tensor tok_embeddings;  // [vocab_local, hidden], rows [vocab_offset, +vocab_local)
  Tensor pos_embeddings;  // [max_positions, hidden] (learned positions) or undefined
  std::vector<LayerWeights> layers;
  ops::NormWeight final_norm;
  ops::LinearWeight lm_head;  // [vocab_local, hidden] (the embedding when tied)
  // Rotary inverse frequencies, f32 [rotary_dim / 2] (rope_scaling applied): global layers, and
  // Gemma-3's sliding (local) layers; undefined when unused.
  Tensor inv_freq;
  Tensor inv_freq_local;
};

}  // namespace strata
