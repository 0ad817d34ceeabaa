// Params of the mixture-of-experts kernels (CPU twins in backends/cpu/moe.cpp; a CUDA launcher
// takes the same structs). The MoE block of a layer, per step of n tokens, E experts, top-k:
//
//   logits [n, E] = h Wg^T                       (ops::linear)
//   ids, w [n, k] = top-k(softmax(logits))       moe_route   (optionally renormalised)
//   offsets [E + 1]                              moe_offsets (count per expert, prefix sum)
//   x_perm [n k, H], perm [n k]                  moe_permute (rows expert-contiguous)
//   y_perm [n k, H] = expert_e MLP over its rows (ops::moe_experts: grouped GEMMs)
//   out [n, H] (+)= sum_j w[t, j] y_perm[row of (t, j)]   moe_combine
//
// Layouts: every array is row-major and contiguous; a slot (t, j) is token t's j-th choice,
// index t * k + j. perm[r] = the slot whose token was copied to permuted row r; rows of one
// expert are [offsets[e], offsets[e + 1]), in increasing slot order (a stable permutation, so
// the result does not depend on the thread count).
#pragma once

#include <cstdint>

#include "strata/types.h"

namespace strata {

// Router: probabilities = softmax over all E logits (f32); the k largest (ties: the lower expert
// index first), in decreasing order; with `renormalize` the k weights are divided by their sum
// (Mixtral, Qwen3-MoE / OLMoE with norm_topk_prob), else they are the softmax probabilities
// (Qwen2-MoE without norm_topk_prob).
struct MoeRouteParams {
  const float* logits = nullptr;  // [n_tokens, n_experts], row stride logits_stride
  int64_t logits_stride = 0;
  int32_t* topk_ids = nullptr;  // [n_tokens, k]
  float* topk_w = nullptr;      // [n_tokens, k]
  int64_t n_tokens = 0;
  int64_t n_experts = 0;
  int64_t k = 0;
  bool renormalize = false;
};

// offsets[0] = 0, offsets[e + 1] = offsets[e] + (number of slots routed to expert e).
struct MoeOffsetsParams {
  const int32_t* topk_ids = nullptr;  // [n_slots]
  int64_t n_slots = 0;
  int64_t n_experts = 0;
  int32_t* offsets = nullptr;  // [n_experts + 1]
};

// x_perm[r, :] = x[perm[r] / k, :] with the rows of expert e at [offsets[e], offsets[e + 1]).
// x and x_perm share a dtype (f32 or bf16: the copy is exact).
struct MoePermuteParams {
  const void* x = nullptr;  // [n_tokens, hidden], row stride x_stride
  int64_t x_stride = 0;
  DType dtype = DType::kF32;
  const int32_t* topk_ids = nullptr;  // [n_tokens, k]
  const int32_t* offsets = nullptr;   // [n_experts + 1]
  int64_t n_tokens = 0;
  int64_t k = 0;
  int64_t n_experts = 0;
  int64_t hidden = 0;
  void* x_perm = nullptr;   // [n_tokens k, hidden] contiguous
  int32_t* perm = nullptr;  // [n_tokens k]
};

// out[t, :] (+)= sum over j in [0, k) of topk_w[t, j] * y_perm[row(t, j), :], summed in slot
// order in f32 (row(t, j) = the r with perm[r] = t k + j).
struct MoeCombineParams {
  const float* y_perm = nullptr;  // [n_tokens k, hidden] contiguous
  const int32_t* perm = nullptr;  // [n_tokens k]
  const float* topk_w = nullptr;  // [n_tokens, k]
  float* out = nullptr;           // [n_tokens, hidden], row stride out_stride
  int64_t out_stride = 0;
  int64_t n_tokens = 0;
  int64_t k = 0;
  int64_t hidden = 0;
  bool accumulate = false;
};

// The Qwen2-MoE shared expert's gate: out[t, :] += sigmoid(gate[t]) * y[t, :].
struct SigmoidGateAddParams {
  const float* y = nullptr;  // [n_tokens, hidden], row stride y_stride
  int64_t y_stride = 0;
  const float* gate = nullptr;  // [n_tokens], element stride gate_stride
  int64_t gate_stride = 1;
  float* out = nullptr;  // [n_tokens, hidden], row stride out_stride
  int64_t out_stride = 0;
  int64_t n_tokens = 0;
  int64_t hidden = 0;
};

}  // namespace strata
