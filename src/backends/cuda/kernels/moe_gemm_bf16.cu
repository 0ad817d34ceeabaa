// The grouped expert GEMM for large groups (prefill) with bf16 weights: the same contract as
// moe_gemm.cu (kernels/moe_experts.h, MoeGemmArgs; out rows r of expert e = x rows r through
// expert e's matrix, the group sizes read on the device), with a pipelined tile:
//   block 128 rows x 128 weight rows x 64 k, 8 warps of 64 x 32 (4 x 4 mma.m16n8k16), three
//   shared-memory stages filled by cp.async (16-byte chunks XOR-swizzled by row, as the flash
//   kernels' tiles: flash_common.cuh), fragments read with ldmatrix.
// Gated: the block's 128 weight rows interleave gate and up rows 8 at a time (rows 16 i + 0..7:
// gate of columns c0 + 8 i + 0..7; rows 16 i + 8..15: up of the same columns), so each thread's
// accumulators hold the gate and up sums of the same outputs: 64 output columns a block, written
// as bf16 silu(gate) * up. Otherwise 128 output columns, f32.
// Rows past an expert's end, weight rows past m and k past the end load zeros (cp.async's
// zero fill) and are not stored. k must be a multiple of 8 and rows 16-byte aligned (checked by
// moe_experts.cu). Summation: f32 mma accumulators in k order, as moe_gemm.cu.
#include <cstdint>
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/flash_common.cuh"
#include "backends/cuda/kernels/moe_experts.h"

namespace strata::cuda {
namespace {

using flash::cp_async_16;
using flash::ldmatrix_x4;
using flash::mma_bf16;
using flash::smem_u32;

constexpr int kBM = 128;  // x rows (tokens) per block
constexpr int kBN = 128;  // weight rows per block
constexpr int kBK = 64;   // k per stage: rows of 128 bytes, 8 chunks
constexpr int kStages = 3;
constexpr int kThreads = 256;
constexpr int kTileElems = kBM * kBK;  // one operand's tile (kBN == kBM)
constexpr size_t kSmemBytes = size_t{kStages} * 2 * kTileElems * sizeof(uint16_t);

// Element offset of (row, chunk) in a swizzled tile of 64-wide rows.
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * kBK + ((chunk ^ (row & 7)) * 8);
}

template <bool kGated>
__global__ void __launch_bounds__(kThreads) moe_gemm_bf16_kernel(const MoeGemmArgs a) {
  extern __shared__ __align__(16) uint16_t smem[];  // [kStages][2][kBM * kBK]: x tile, w tile

  // This block's expert and row tile (tiles numbered expert by expert).
  int e = 0;
  int r0 = 0;
  int r1 = 0;
  if (!moe_row_tile<kBM>(a, static_cast<int>(blockIdx.x), e, r0, r1)) return;  // block-uniform
  const uint16_t* w =
      reinterpret_cast<const uint16_t*>(a.w + static_cast<int64_t>(e) * a.w_expert_bytes);
  const int64_t w_ld = a.w_row_bytes / 2;
  // Output columns of the block: kBN (plain) or kBN / 2 (gated: gate and up rows interleaved).
  const int c0 = static_cast<int>(blockIdx.y) * (kGated ? kBN / 2 : kBN);

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int wm = warp / 4;  // rows wm * 64 .. + 64 of the tile
  const int wn = warp % 4;  // weight rows wn * 32 .. + 32

  // Weight row of tile row j, or -1 past the matrix.
  auto w_row = [&](int j) -> int64_t {
    if constexpr (kGated) {
      const int col = c0 + (j / 16) * 8 + j % 8;
      return col < a.m ? col + ((j / 8) % 2 == 1 ? a.m : 0) : -1;
    } else {
      return c0 + j < a.m ? c0 + j : -1;
    }
  };
  // Each thread's 4 chunks of each operand: chunk q = tid + i * kThreads of 1,024 (row q / 8).
  int64_t x_src[4];
  int64_t w_src[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int q = tid + i * kThreads;
    const int row = q / 8;
    x_src[i] = r0 + row < r1 ? static_cast<int64_t>(r0 + row) * a.k : -1;
    const int64_t wr = w_row(row);
    w_src[i] = wr >= 0 ? wr * w_ld : -1;
  }
  const uint32_t smem0 = smem_u32(smem);
  auto load = [&](int stage, int k0) {
    const uint32_t xs = smem0 + static_cast<uint32_t>(stage * 2 * kTileElems * 2);
    const uint32_t ws = xs + static_cast<uint32_t>(kTileElems * 2);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int q = tid + i * kThreads;
      const int row = q / 8, c = q % 8;
      const int kk = k0 + c * 8;
      const uint32_t off = static_cast<uint32_t>(swz(row, c) * 2);
      const bool kin = kk < a.k;
      cp_async_16(xs + off, x_src[i] >= 0 && kin ? a.x + x_src[i] + kk : a.x,
                  x_src[i] >= 0 && kin ? 16 : 0);
      cp_async_16(ws + off, w_src[i] >= 0 && kin ? w + w_src[i] + kk : w,
                  w_src[i] >= 0 && kin ? 16 : 0);
    }
  };

  float acc[4][4][4];
#pragma unroll
  for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[mi][ni][v] = 0.0f;
    }
  }

  const int n_k = (a.k + kBK - 1) / kBK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_k) load(s, s * kBK);
    flash::cp_async_commit();
  }
  for (int kt = 0; kt < n_k; ++kt) {
    flash::cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt % kStages has landed; stage (kt - 1) % kStages is free
    if (kt + kStages - 1 < n_k) load((kt + kStages - 1) % kStages, (kt + kStages - 1) * kBK);
    flash::cp_async_commit();
    const uint32_t xs = smem0 + static_cast<uint32_t>((kt % kStages) * 2 * kTileElems * 2);
    const uint32_t ws = xs + static_cast<uint32_t>(kTileElems * 2);
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t af[4][4];
#pragma unroll
      for (int mi = 0; mi < 4; ++mi) {
        const int row = wm * 64 + mi * 16 + lane % 16;
        ldmatrix_x4(af[mi], xs + static_cast<uint32_t>(swz(row, ks * 2 + lane / 16) * 2));
      }
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        uint32_t bf[4];  // b0, b1 of n-tile 2p, then of n-tile 2p + 1
        const int row = wn * 32 + p * 16 + lane % 8 + (lane / 16) * 8;
        ldmatrix_x4(bf, ws + static_cast<uint32_t>(swz(row, ks * 2 + (lane / 8) % 2) * 2));
#pragma unroll
        for (int mi = 0; mi < 4; ++mi) {
          mma_bf16(acc[mi][2 * p], af[mi], bf[0], bf[1]);
          mma_bf16(acc[mi][2 * p + 1], af[mi], bf[2], bf[3]);
        }
      }
    }
  }
  flash::cp_async_wait<0>();

  // Epilogue: accumulator v of (mi, ni) is tile row wm 64 + mi 16 + g + 8 (v / 2) and tile
  // weight row wn 32 + ni 8 + 2 t + v % 2.
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const int row = r0 + wm * 64 + mi * 16 + g + 8 * (v / 2);
      if (row >= r1) continue;
      if constexpr (kGated) {
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          const int col = c0 + (wn * 2 + p) * 8 + 2 * t + v % 2;
          if (col >= a.m) continue;
          const float y = acc[mi][2 * p][v];
          const float u = acc[mi][2 * p + 1][v];
          static_cast<__nv_bfloat16*>(a.out)[static_cast<int64_t>(row) * a.m + col] =
              __float2bfloat16_rn(y / (1.0f + expf(-y)) * u);
        }
      } else {
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          const int col = c0 + wn * 32 + ni * 8 + 2 * t + v % 2;
          if (col >= a.m) continue;
          const int64_t o = static_cast<int64_t>(row) * a.m + col;
          if (a.out_bf16) {
            static_cast<__nv_bfloat16*>(a.out)[o] = __float2bfloat16_rn(acc[mi][ni][v]);
          } else {
            static_cast<float*>(a.out)[o] = acc[mi][ni][v];
          }
        }
      }
    }
  }
}

template <bool kGated>
Status launch(const LaunchCtx& ctx, const MoeGemmArgs& a) {
  // Per call: the attribute is per device, and ranks of one process may drive several.
  const cudaError_t attr = cudaFuncSetAttribute(moe_gemm_bf16_kernel<kGated>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(kSmemBytes));
  if (attr != cudaSuccess) {
    return Status(StatusCode::kInternal, std::string("moe_gemm_bf16: shared memory attribute: ") +
                                             cudaGetErrorString(attr));
  }
  const int cols = kGated ? kBN / 2 : kBN;
  const dim3 grid(static_cast<unsigned>(ceil_div(a.n_rows, kBM) + a.n_experts),
                  static_cast<unsigned>(ceil_div(a.m, cols)));
  moe_gemm_bf16_kernel<kGated><<<grid, kThreads, kSmemBytes, ctx.stream>>>(a);
  return kernel_launch_status("moe_gemm_bf16_kernel");
}

}  // namespace

Status moe_gemm_bf16(const LaunchCtx& ctx, const MoeGemmArgs& a) {
  if (a.w_scale != nullptr || a.k % 8 != 0 || a.w_row_bytes % 16 != 0) {
    return invalid_argument("moe_gemm_bf16", "bf16 weights without scales, k a multiple of 8");
  }
  return a.gated ? launch<true>(ctx, a) : launch<false>(ctx, a);
}

}  // namespace strata::cuda
