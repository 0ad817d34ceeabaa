// The grouped expert GEMMs for decode-size groups: SBI-GeMM (sbi_gemm.cuh) over the chosen
// experts. Grid (output-row blocks, min(n_experts, n_rows)): block (b, j) takes the j-th expert
// with rows (the offsets read on the device: each warp scans them with ballots, 32 experts per
// step, and all warps find the same one), so a decode step launches blocks only for as many
// experts as it has slots (8 at batch 1 with top-8, not 128) and streams only the chosen experts'
// weights, each once (per token slice of 8 NT rows; the host picks NT from the bound on a
// group's rows, so one slice in the usual case). Blocks past the last expert with rows exit.
// The weight rows are expert e's matrix of the stacked array (rows `k` elements apart); x rows
// are the group's rows of x_perm (gate/up) or act (down); out the same rows of act (bf16, SiLU *
// up in the epilogue: gated) or y_perm (f32). Included by moe_sbi_{bf16,i8,fp8}.cu.
#pragma once

#include "backends/cuda/kernels/moe_experts.h"
#include "backends/cuda/kernels/sbi_gemm.cuh"

namespace strata::cuda::sbi {

// The j-th expert (in index order) with a non-empty row range, or -1. Every warp computes it
// from the same offsets, so the result is the same in all of the block's warps.
__device__ __forceinline__ int active_expert(const int32_t* offsets, int n_experts, int j) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  for (int base = 0; base < n_experts; base += kWarpSize) {
    const int e = base + lane;
    const bool has_rows = e < n_experts && offsets[e + 1] > offsets[e];
    unsigned bits = __ballot_sync(0xffffffffu, has_rows);
    const int count = __popc(bits);
    if (j < count) {
      for (int i = 0; i < j; ++i) bits &= bits - 1u;  // drop the j lower experts with rows
      return base + __ffs(bits) - 1;
    }
    j -= count;
  }
  return -1;
}

template <WFormat F, int T, int NT>
__global__ void __launch_bounds__(kThreads, Shape<F, T, NT>::kMinBlocks)
    moe_sbi_kernel(const MoeSbiArgs g) {
  const int e = active_expert(g.offsets, g.n_experts, static_cast<int>(blockIdx.y));
  if (e < 0) return;  // block-uniform: fewer experts have rows than the grid has slots
  const int r0 = max(g.offsets[e], 0);
  const int r1 = min(g.offsets[e + 1], g.n_rows);
  if (r1 <= r0) return;
  Args a = g.base;
  a.w = g.base.w + static_cast<int64_t>(e) * g.w_expert_bytes;
  a.w_scale = g.base.w_scale != nullptr ? g.base.w_scale + static_cast<int64_t>(e) * g.scale_expert
                                        : nullptr;
  const int64_t out_elem = g.base.out_bf16 ? 2 : 4;
  for (int t0 = r0; t0 < r1; t0 += 8 * NT) {
    a.x = g.base.x + static_cast<int64_t>(t0) * g.base.x_stride;
    a.out =
        static_cast<char*>(g.base.out) + static_cast<int64_t>(t0) * g.base.out_stride * out_elem;
    a.n_tokens = min(8 * NT, r1 - t0);
    sbi_gemm_block<F, T, NT>(a, static_cast<int>(blockIdx.x));
    __syncthreads();  // the next slice reuses the shared reduction buffer
  }
}

// The compiled shapes: gated gate/up (2 tiles: one gate, one up) and down (1 tile), NT 8-token
// tiles (1, 2, 4, 8).
template <WFormat F>
Status moe_sbi_launch(const LaunchCtx& ctx, const MoeSbiArgs& g, int n_tiles) {
  const int tiles = g.base.gated ? 2 : 1;
  const int out_tiles = 1;
  // At most one expert per row has rows: n_rows bounds the experts with rows.
  const int slots = g.n_experts < g.n_rows ? g.n_experts : g.n_rows;
  const dim3 grid(static_cast<unsigned>(ceil_div(g.base.m, 16 * out_tiles)),
                  static_cast<unsigned>(slots));
  switch (tiles * 100 + n_tiles) {
    case 101:
      moe_sbi_kernel<F, 1, 1><<<grid, kThreads, 0, ctx.stream>>>(g);
      break;
    case 102:
      moe_sbi_kernel<F, 1, 2><<<grid, kThreads, 0, ctx.stream>>>(g);
      break;
    case 104:
      moe_sbi_kernel<F, 1, 4><<<grid, kThreads, 0, ctx.stream>>>(g);
      break;
    case 108:
      moe_sbi_kernel<F, 1, 8><<<grid, kThreads, 0, ctx.stream>>>(g);
      break;
    case 201:
      moe_sbi_kernel<F, 2, 1><<<grid, kThreads, 0, ctx.stream>>>(g);
      break;
    case 202:
      moe_sbi_kernel<F, 2, 2><<<grid, kThreads, 0, ctx.stream>>>(g);
      break;
    case 204:
      moe_sbi_kernel<F, 2, 4><<<grid, kThreads, 0, ctx.stream>>>(g);
      break;
    case 208:
      moe_sbi_kernel<F, 2, 8><<<grid, kThreads, 0, ctx.stream>>>(g);
      break;
    default:
      return invalid_argument("moe_experts",
                              "no SBI kernel for " + std::to_string(n_tiles) + " token tiles");
  }
  return kernel_launch_status("moe_sbi_kernel");
}

}  // namespace strata::cuda::sbi
