// The grouped expert GEMMs for decode-size groups: SBI-GeMM (sbi_gemm.cuh) over every expert at
// once. Grid (output-row blocks, n_experts): block (b, e) reads expert e's row range
// [offsets[e], offsets[e + 1]) on the device and exits at once when it is empty, so a decode
// step streams only the weights of the experts its tokens chose, each once (per token slice of
// 8 NT rows; the host picks NT from the bound on a group's rows, so one slice in the usual case).
// The weight rows are expert e's matrix of the stacked array (rows `k` elements apart); x rows
// are the group's rows of x_perm (gate/up) or act (down); out the same rows of act (bf16, SiLU *
// up in the epilogue: gated) or y_perm (f32). Included by moe_sbi_{bf16,i8,fp8}.cu.
#pragma once

#include "backends/cuda/kernels/moe_experts.h"
#include "backends/cuda/kernels/sbi_gemm.cuh"

namespace strata::cuda::sbi {

template <WFormat F, int T, int NT>
__global__ void __launch_bounds__(kThreads, Shape<F, T, NT>::kMinBlocks)
    moe_sbi_kernel(const MoeSbiArgs g) {
  const int e = static_cast<int>(blockIdx.y);
  const int r0 = max(g.offsets[e], 0);
  const int r1 = min(g.offsets[e + 1], g.n_rows);
  if (r1 <= r0) return;  // block-uniform: an expert no token chose
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
  const dim3 grid(static_cast<unsigned>(ceil_div(g.base.m, 16 * out_tiles)),
                  static_cast<unsigned>(g.n_experts));
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
