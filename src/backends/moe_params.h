// Params of the mixture-of-experts kernels (CPU twins in backends/cpu/moe.cpp; a CUDA launcher
// takes the same structs). The MoE block of a layer, per step of n tokens, E experts, top-k:
//
//   logits [n, E] = h Wg^T                       (ops::linear)
//   ids, w [n, k] = top-k(softmax(logits))       moe_route   (optionally renormalised)
//   offsets [E + 1]                              moe_offsets (count per expert, prefix sum)
//   x_perm [n k, H], perm [n k]                  moe_permute (rows expert-contiguous)
//   y_perm [n k, H] = expert_e MLP over its rows moe_experts (grouped GEMMs)
//   out [n, H] (+)= sum_j w[t, j] y_perm[perm[t k + j]]   moe_combine
//
// Layouts: every array is row-major and contiguous; a slot (t, j) is token t's j-th choice,
// index t * k + j. perm[s] = the permuted row that slot s was copied to; rows of one expert are
// [offsets[e], offsets[e + 1]), in increasing slot order (a stable permutation, so the result
// does not depend on the thread count or the device).
//
// NOTE: perm maps slot -> row (not row -> slot) so that both its users are conflict-free
// gathers/scatters on a GPU: the permute copy writes row perm[s] from token s / k, and the
// combine reads the k rows of token t at perm[t k + j], in slot order, with no inverse table.
#pragma once

#include <cstdint>

#include "strata/types.h"

namespace strata {

// Router: the k experts of the largest logits in decreasing order (ties: the lower expert index
// first; NaN ranks as -inf), each weighted by its softmax probability over all E logits (f32,
// max subtracted, the sum of the exponentials in double); with `renormalize` the k weights are
// divided by their sum taken in choice order (Mixtral, Qwen3-MoE / OLMoE with norm_topk_prob),
// else they are the probabilities (Qwen2-MoE without norm_topk_prob).
//
// NOTE: the choice compares logits, not probabilities: softmax is monotone, so it is the same
// choice wherever the rounded probabilities do not tie, and float comparisons are exact on every
// device, so the CPU twin and the CUDA kernel pick the same experts bit for bit (exp differs
// between libm and CUDA in the last ulp, which could flip near-ties of probabilities).
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

// x_perm[perm[s], :] = x[s / k, :] with the rows of expert e at [offsets[e], offsets[e + 1]).
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
  int32_t* perm = nullptr;  // [n_tokens k]: slot -> permuted row
};

// out[t, :] (+)= sum over j in [0, k) of topk_w[t, j] * y_perm[perm[t k + j], :], summed in slot
// order in f32, then added to out (the GPU may fuse each multiply-add: within one f32 ulp).
struct MoeCombineParams {
  const void* y_perm = nullptr;   // [n_tokens k, hidden] contiguous, y_dtype
  DType y_dtype = DType::kF32;    // kF32, or kBF16 (the device layout's expert outputs)
  const int32_t* perm = nullptr;  // [n_tokens k]: slot -> permuted row
  const float* topk_w = nullptr;  // [n_tokens, k]
  float* out = nullptr;           // [n_tokens, hidden], row stride out_stride
  int64_t out_stride = 0;
  int64_t n_tokens = 0;
  int64_t k = 0;
  int64_t hidden = 0;
  bool accumulate = false;
};

// The grouped expert MLP of the device layout (bf16 activations): for each expert e with rows
// [offsets[e], offsets[e + 1]) of x_perm,
//   act[r, :]    = bf16(silu(x_perm[r] Wg_e^T * sg_e) * (x_perm[r] Wu_e^T * su_e))   f32 sums
//   y_perm[r, :] = (act[r] Wd_e^T) * sd_e                                f32, or rounded to bf16
// with gate_up_e = [Wg_e; Wu_e] ([2 F, H]) and down_e ([H, F]) bf16, or int8 / fp8 with one f32
// scale per row (s = 1 for bf16). The experts' matrices are stacked: expert e's gate/up starts
// e * gate_up_expert_stride elements after gate_up (rows `hidden` apart), its scales e * 2F after
// gate_up_scale; likewise down. One rounding point (act to bf16) whatever the group size, so
// the result does not depend on how the GPU splits the groups (SBI for decode, tiles for prefill).
struct MoeExpertsParams {
  const uint16_t* x_perm = nullptr;      // bf16 [n_rows, hidden] contiguous
  const int32_t* offsets = nullptr;      // [n_experts + 1]
  const void* gate_up = nullptr;         // [n_experts][2 ffn, hidden]
  const float* gate_up_scale = nullptr;  // [n_experts][2 ffn] (int8 / fp8), else null
  int64_t gate_up_expert_stride = 0;     // elements from one expert's gate/up to the next
  const void* down = nullptr;            // [n_experts][hidden, ffn]
  const float* down_scale = nullptr;     // [n_experts][hidden] (int8 / fp8), else null
  int64_t down_expert_stride = 0;        // elements from one expert's down to the next
  DType w_dtype = DType::kBF16;          // kBF16, kI8 or kFP8E4M3 (both matrices)
  uint16_t* act = nullptr;               // bf16 [n_rows, ffn] contiguous
  void* y_perm = nullptr;                // [n_rows, hidden] contiguous, y_dtype
  DType y_dtype = DType::kF32;           // kF32, or kBF16 (one more rounding; half the bytes)
  int64_t n_rows = 0;                    // rows of x_perm: >= offsets[n_experts] (device side)
  int64_t max_rows_per_expert = 0;       // host bound on any group: n_tokens (top-k is distinct)
  int64_t n_experts = 0;
  int64_t hidden = 0;
  int64_t ffn = 0;
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

// ---- The fixed-capacity expert-parallel exchange (model/moe_ep.h) -------------------------------
// ep ranks with El experts each (E = ep El); every rank sends every rank a block of C rows (the
// capacity: a chunk's worst case), so the exchange is a fixed-size all-to-all whose counts ride
// along in device memory. A chunk's permuted rows (grouped by expert, offsets [E + 1]) go out
// as the send buffer [ep, C, H]: block d holds the rows of rank d's experts in order, then
// padding. The plan (one kernel):
//   counts[d El + e]  = offsets[d El + e + 1] - offsets[d El + e]    (all 0 without offsets)
//   send_map[d C + i] = offsets[d El] + i for i < rows of block d, else -1
//   back_map[r]       = d C + r - offsets[d El] for permuted row r of rank d's experts
//   rows[d]           = min(offsets[(d + 1) El] - offsets[d El], C): the rows of block d
//                       (optional; the counted all-to-all's send counts)
// A block of more than C rows keeps its first C (the CPU twin reports kOutOfRange; the caller
// sizes C so that it cannot happen).
struct MoeEpSendPlanParams {
  const int32_t* offsets = nullptr;  // [ep El + 1], or null: the chunk has no rows
  int64_t ep = 0;
  int64_t experts_per_rank = 0;  // El
  int64_t capacity = 0;          // C
  int64_t n_rows = 0;            // the chunk's permuted rows (offsets[ep El]); 0 without offsets
  int32_t* counts = nullptr;     // [ep El]
  int32_t* send_map = nullptr;   // [ep C]
  int32_t* back_map = nullptr;   // [n_rows]
  int32_t* rows = nullptr;       // [ep], or null
};

// The receiving side: counts [ep, El] came from the sources (rank s's block of C rows holds its
// rows for local expert 0, then 1, ...). The rows are regrouped by local expert, sources in rank
// order within an expert (the order of the variable-split path):
//   offsets[e]     = sum over e' < e and every source of counts[s El + e']     (offsets [El + 1])
//   group_map[g]   = the received row (s C + i) of grouped row g; -1 for g >= offsets[El]
//   ungroup_map[s C + i] = the grouped row of received row i of source s; -1 for padding
//   rows[s]        = the rows of source s's block (its counts' sum, cut to C; optional: the
//                    counted all-to-all's receive counts)
// A source block claiming more than C rows is cut to C (kOutOfRange on the twin).
struct MoeEpRecvPlanParams {
  const int32_t* counts = nullptr;  // [ep El]
  int64_t ep = 0;
  int64_t experts_per_rank = 0;    // El
  int64_t capacity = 0;            // C
  int32_t* offsets = nullptr;      // [El + 1]
  int32_t* group_map = nullptr;    // [ep C]
  int32_t* ungroup_map = nullptr;  // [ep C]
  int32_t* rows = nullptr;         // [ep], or null
};

// dst[i, :] = src[map[i], :] for map[i] in [0, src_rows), else zeros (or, without zero_unmapped,
// left alone: padding that nothing reads): rows of row_bytes bytes (any dtype: the copy is
// exact), both contiguous.
struct GatherRowsParams {
  const void* src = nullptr;
  int64_t src_rows = 0;
  const int32_t* map = nullptr;  // [n_rows]
  void* dst = nullptr;
  int64_t n_rows = 0;
  int64_t row_bytes = 0;
  bool zero_unmapped = true;
};

// The expert-parallel exchange of one sparse layer, both ways, as device kernels that write into
// the peers' buffers (Communicator::expert_dispatch / expert_combine; the CUDA kernels:
// cuda::oneshot_expert_dispatch / oneshot_expert_combine in kernels/oneshot_expert.cu). Device
// pointers; every size the same on every rank, the row counts read on the device
// (graph-capturable).
//   dispatch: x holds this rank's rows grouped by global expert (offsets [E + 1]; null: this rank
//             has no rows); every owner's `grouped` receives the rows of its experts, grouped by
//             local expert, sources in rank order, each source's rows in its order (the layout
//             of model/moe_ep.cpp), with grouped_offsets [E / ranks + 1]; the count matrix
//             [ranks][E] and the ranks' buffer addresses [2 ranks] go to counts / tables for the
//             combine;
//   combine:  y's rows (the outputs of grouped) go back to their senders' y_back, in x's order.
// Rows are whole 16-byte vectors.
struct ExpertExchangeParams {
  int64_t experts = 0;                 // E over all ranks (E / ranks per rank, contiguous)
  int64_t capacity = 0;                // rows `grouped` (and y) holds
  int64_t x_row_bytes = 0;             // x and grouped
  int64_t y_row_bytes = 0;             // y and y_back
  const void* x = nullptr;             // this rank's rows grouped by global expert
  const int32_t* offsets = nullptr;    // [E + 1], or null
  void* grouped = nullptr;             // out (dispatch): the rows for this rank's experts
  int32_t* grouped_offsets = nullptr;  // out (dispatch): [E / ranks + 1]
  int32_t* counts = nullptr;           // scratch [ranks * E], dispatch to combine
  uint64_t* tables = nullptr;          // scratch [2 * ranks], dispatch to combine
  const void* y = nullptr;             // in (combine): grouped's outputs
  void* y_back = nullptr;              // out (combine): the outputs of x's rows, in x's order
};

}  // namespace strata
