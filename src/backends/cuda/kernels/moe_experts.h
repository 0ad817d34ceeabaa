// Internal plumbing of the grouped expert MLP (cuda::moe_experts in kernels/moe_experts.cu):
// the arguments of its two kernel families, shared by moe_sbi*.cu and moe_gemm.cu. Not part of
// the backend's API (cuda_kernels.h is).
#pragma once

#include <cstdint>

#include "backends/cuda/gpu_linear_internal.h"
#include "backends/cuda/launch_ctx.h"
#include "strata/status.h"
#include "strata/types.h"

namespace strata::cuda {

// Groups of at most this many rows (the host bound MoeExpertsParams::max_rows_per_expert) run
// on the SBI kernels (one 64-token slice per expert), larger ones on the tiled GEMM.
constexpr int64_t kMoeSbiMaxRows = 64;

namespace sbi {

// One grouped SBI launch: `base` is an SBI launch for expert 0 (x, out: row 0 of x_perm / act /
// y_perm; w, w_scale: expert 0's matrix and scales); each block moves them to its expert and
// token slice.
struct MoeSbiArgs {
  Args base;
  const int32_t* offsets = nullptr;  // [n_experts + 1], device
  int n_rows = 0;                    // rows of x / out (bounds the offsets)
  int n_experts = 0;
  int64_t w_expert_bytes = 0;  // from one expert's matrix to the next
  int64_t scale_expert = 0;    // scales per expert (the matrix's rows)
};

// kernels/moe_sbi_{bf16,i8,fp8}.cu: n_tiles = 8-token tiles per slice (1, 2, 4 or 8).
Status moe_sbi_bf16(const LaunchCtx& ctx, const MoeSbiArgs& g, int n_tiles);
Status moe_sbi_i8(const LaunchCtx& ctx, const MoeSbiArgs& g, int n_tiles);
Status moe_sbi_fp8(const LaunchCtx& ctx, const MoeSbiArgs& g, int n_tiles);

}  // namespace sbi

// kernels/moe_gemm.cu: the tiled tensor-core GEMM over variable groups (prefill). out rows r of
// expert e = x rows r through expert e's [m (2 m gated), k] matrix; gated: bf16
// silu(gate * s) * (up * s'), else f32 or (out_bf16) bf16 (acc * s).
struct MoeGemmArgs {
  const uint16_t* x = nullptr;  // bf16 [n_rows, k], row stride k
  const uint8_t* w = nullptr;   // expert 0's [rows, k] matrix
  int64_t w_row_bytes = 0;
  int64_t w_expert_bytes = 0;
  const float* w_scale = nullptr;  // expert 0's per-row scales, or null (bf16)
  int64_t scale_expert = 0;
  void* out = nullptr;    // [n_rows, m]: bf16 (gated or out_bf16) or f32, row stride m
  bool out_bf16 = false;  // not gated: out rounded to bf16 (else f32)
  const int32_t* offsets = nullptr;
  int n_rows = 0;
  int n_experts = 0;
  int k = 0;
  int m = 0;  // output columns (the gate rows when gated)
  bool gated = false;
};
Status moe_gemm(const LaunchCtx& ctx, const MoeGemmArgs& a, DType w_dtype);

#ifdef __CUDACC__
// The expert and row range of row tile `tile` of a tiled grouped GEMM (kRows rows a tile, tiles
// numbered expert by expert, the launch's grid.x bounds them by ceil(n_rows / kRows) +
// n_experts): false past the last tile (block-uniform). Rows [r0, r1) of expert e, r1 its end.
template <int kRows>
__device__ __forceinline__ bool moe_row_tile(const MoeGemmArgs& a, int tile, int& e, int& r0,
                                             int& r1) {
  for (e = 0; e < a.n_experts; ++e) {
    const int b = max(a.offsets[e], 0);
    const int c = min(a.offsets[e + 1], a.n_rows);
    const int tiles = c > b ? (c - b + kRows - 1) / kRows : 0;
    if (tile < tiles) {
      r0 = b + tile * kRows;
      r1 = c;
      return true;
    }
    tile -= tiles;
  }
  return false;
}
#endif
// kernels/moe_gemm_bf16.cu: the same for bf16 weights (no scales) on a pipelined tile (cp.async
// stages, ldmatrix fragments, 128 x 128 blocks).
Status moe_gemm_bf16(const LaunchCtx& ctx, const MoeGemmArgs& a);

}  // namespace strata::cuda
