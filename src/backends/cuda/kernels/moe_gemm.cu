// The grouped expert GEMM for large groups (prefill): out[r, :] = x[r, :] W_e^T over the rows
// r of each expert e, with the group sizes read on the device (kernels/moe_experts.h,
// MoeGemmArgs). A plain tensor-core tile kernel, written to be right first: 64 rows x 64 output
// columns x 32 k per step, 4 warps of 32 x 32 (2 x 4 mma.m16n8k16 bf16 tiles, f32 accumulation);
// the next k step's global loads are issued into registers before the current step's mma (one
// shared buffer, two barriers per step). Gated: each block also multiplies the up rows (m + j)
// of the same columns and writes bf16 silu(gate s_j) * (up s_{m+j}); otherwise f32 acc * s_j.
//
// Grid: x = ceil(n_rows / 64) + n_experts row tiles (a host-known bound on sum_e ceil(count_e /
// 64)), y = ceil(m / 64). Block x walks the offsets to find its expert and tile (tiles numbered
// expert by expert); blocks past the last tile exit. A tile's rows stop at its expert's end:
// the next expert's rows are never written by it.
//
// Weights: bf16 (16-byte loads of 8 k), or int8 / fp8 (16-byte loads of 16 k converted to bf16
// exactly on the way into shared memory, sbi_fragments.h; the per-row scale in the epilogue).
// k must be a multiple of 8 (bf16) or 16 (8-bit) and rows 16-byte aligned (checked by the
// launcher in moe_experts.cu); k, rows and columns past the ends load zeros / are not stored.
//
// Shared rows are 40 bf16 (80 bytes): 16-byte aligned for the stores, and the 8 rows x 4 words
// of a fragment load fall on 32 distinct banks.
#include <cstdint>
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/moe_experts.h"
#include "backends/cuda/kernels/sbi_gemm.cuh"

namespace strata::cuda {
namespace {

using sbi::WFormat;

constexpr int kBM = 64;
constexpr int kBN = 64;
constexpr int kBK = 32;
constexpr int kLd = kBK + 8;  // shared row length (bf16 elements)
constexpr int kThreads = 128;

// 16 8-bit weights -> 16 bf16 in k order (two 16-byte vectors).
template <WFormat F>
__device__ __forceinline__ void widen16(const uint4 q, uint4& lo, uint4& hi) {
  const uint32_t in[4] = {q.x, q.y, q.z, q.w};
  uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t p02;
    uint32_t p13;
    if constexpr (F == WFormat::kI8) {
      sbi::i8x4_to_bf16(in[i], p02, p13);
    } else {
      sbi::fp8x4_to_bf16(in[i], p02, p13);
    }
    out[2 * i] = __byte_perm(p02, p13, 0x5410);      // {e0, e1}
    out[2 * i + 1] = __byte_perm(p02, p13, 0x7632);  // {e2, e3}
  }
  lo = make_uint4(out[0], out[1], out[2], out[3]);
  hi = make_uint4(out[4], out[5], out[6], out[7]);
}

__device__ __forceinline__ uint32_t lds32(const uint16_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

template <WFormat F, bool kGated>
__global__ void __launch_bounds__(kThreads) moe_gemm_kernel(const MoeGemmArgs a) {
  constexpr int kMats = kGated ? 2 : 1;
  constexpr bool k8bit = F != WFormat::kBf16;
  // Per thread and k step: x 2 vectors; weights 2 vectors of 8 k (bf16) or 1 of 16 k per matrix.
  constexpr int kWLoads = k8bit ? 1 : 2;
  __shared__ __align__(16) uint16_t xs[kBM][kLd];
  __shared__ __align__(16) uint16_t ws[kMats][kBN][kLd];

  // This block's expert and row tile.
  int e = 0;
  int r0 = 0;
  int r1 = 0;
  if (!moe_row_tile<kBM>(a, static_cast<int>(blockIdx.x), e, r0, r1)) return;  // block-uniform
  const int n0 = static_cast<int>(blockIdx.y) * kBN;
  const uint8_t* w = a.w + static_cast<int64_t>(e) * a.w_expert_bytes;
  const float* scale =
      a.w_scale != nullptr ? a.w_scale + static_cast<int64_t>(e) * a.scale_expert : nullptr;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int g = lane / 4;
  const int t = lane % 4;
  const int wm = warp / 2;  // rows wm * 32 .. + 32 of the tile
  const int wn = warp % 2;  // columns wn * 32 .. + 32

  uint4 xr[2];
  uint4 wr[kMats][kWLoads];
  // Global -> registers for the k step at k0 (zeros past the rows, columns or k).
  auto load = [&](int k0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int idx = tid + i * kThreads;  // 64 rows x 4 pieces of 8 k
      const int row = idx / 4;
      const int kk = k0 + (idx % 4) * 8;
      xr[i] = make_uint4(0, 0, 0, 0);
      if (r0 + row < r1 && kk < a.k) {
        xr[i] = *reinterpret_cast<const uint4*>(a.x + static_cast<int64_t>(r0 + row) * a.k + kk);
      }
    }
#pragma unroll
    for (int mat = 0; mat < kMats; ++mat) {
#pragma unroll
      for (int i = 0; i < kWLoads; ++i) {
        const int idx = tid + i * kThreads;
        const int row = k8bit ? idx / 2 : idx / 4;  // 64 rows x 2 pieces of 16 k / 4 of 8 k
        const int kk = k0 + (k8bit ? (idx % 2) * 16 : (idx % 4) * 8);
        wr[mat][i] = make_uint4(0, 0, 0, 0);
        if (n0 + row < a.m && kk < a.k) {
          const int64_t wrow = n0 + row + (mat == 1 ? a.m : 0);
          wr[mat][i] = __ldg(reinterpret_cast<const uint4*>(
              w + wrow * a.w_row_bytes + static_cast<int64_t>(kk) * (k8bit ? 1 : 2)));
        }
      }
    }
  };
  // Registers -> shared.
  auto store = [&]() {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int idx = tid + i * kThreads;
      *reinterpret_cast<uint4*>(&xs[idx / 4][(idx % 4) * 8]) = xr[i];
    }
#pragma unroll
    for (int mat = 0; mat < kMats; ++mat) {
#pragma unroll
      for (int i = 0; i < kWLoads; ++i) {
        const int idx = tid + i * kThreads;
        if constexpr (k8bit) {
          uint4 lo;
          uint4 hi;
          widen16<F>(wr[mat][i], lo, hi);
          *reinterpret_cast<uint4*>(&ws[mat][idx / 2][(idx % 2) * 16]) = lo;
          *reinterpret_cast<uint4*>(&ws[mat][idx / 2][(idx % 2) * 16 + 8]) = hi;
        } else {
          *reinterpret_cast<uint4*>(&ws[mat][idx / 4][(idx % 4) * 8]) = wr[mat][i];
        }
      }
    }
  };

  float acc[kMats][2][4][4];
#pragma unroll
  for (int mat = 0; mat < kMats; ++mat) {
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
#pragma unroll
        for (int v = 0; v < 4; ++v) acc[mat][mi][ni][v] = 0.0f;
      }
    }
  }

  load(0);
  for (int k0 = 0; k0 < a.k; k0 += kBK) {
    __syncthreads();  // the previous step's fragment reads are done
    store();
    __syncthreads();
    if (k0 + kBK < a.k) load(k0 + kBK);
#pragma unroll
    for (int ks = 0; ks < kBK; ks += 16) {
      uint32_t af[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        const int rb = wm * 32 + mi * 16;
        af[mi][0] = lds32(&xs[rb + g][ks + 2 * t]);
        af[mi][1] = lds32(&xs[rb + g + 8][ks + 2 * t]);
        af[mi][2] = lds32(&xs[rb + g][ks + 2 * t + 8]);
        af[mi][3] = lds32(&xs[rb + g + 8][ks + 2 * t + 8]);
      }
#pragma unroll
      for (int mat = 0; mat < kMats; ++mat) {
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          const int cb = wn * 32 + ni * 8;
          const uint32_t b0 = lds32(&ws[mat][cb + g][ks + 2 * t]);
          const uint32_t b1 = lds32(&ws[mat][cb + g][ks + 2 * t + 8]);
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) sbi::mma_bf16(acc[mat][mi][ni], af[mi], b0, b1);
        }
      }
    }
  }

  // Epilogue: accumulator v of tile (mi, ni) is row g + 8 (v / 2), column 2 t + (v % 2).
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const int row = r0 + wm * 32 + mi * 16 + g + 8 * (v / 2);
        const int col = n0 + wn * 32 + ni * 8 + 2 * t + v % 2;
        if (row >= r1 || col >= a.m) continue;
        float y = acc[0][mi][ni][v];
        if (scale != nullptr) y *= scale[col];
        if constexpr (kGated) {
          float u = acc[kMats - 1][mi][ni][v];
          if (scale != nullptr) u *= scale[a.m + col];
          y = y / (1.0f + expf(-y)) * u;
          static_cast<__nv_bfloat16*>(a.out)[static_cast<int64_t>(row) * a.m + col] =
              __float2bfloat16_rn(y);
        } else if (a.out_bf16) {
          static_cast<__nv_bfloat16*>(a.out)[static_cast<int64_t>(row) * a.m + col] =
              __float2bfloat16_rn(y);
        } else {
          static_cast<float*>(a.out)[static_cast<int64_t>(row) * a.m + col] = y;
        }
      }
    }
  }
}

template <WFormat F>
Status launch(const LaunchCtx& ctx, const MoeGemmArgs& a) {
  const dim3 grid(static_cast<unsigned>(ceil_div(a.n_rows, kBM) + a.n_experts),
                  static_cast<unsigned>(ceil_div(a.m, kBN)));
  if (a.gated) {
    moe_gemm_kernel<F, true><<<grid, kThreads, 0, ctx.stream>>>(a);
  } else {
    moe_gemm_kernel<F, false><<<grid, kThreads, 0, ctx.stream>>>(a);
  }
  return kernel_launch_status("moe_gemm_kernel");
}

}  // namespace

Status moe_gemm(const LaunchCtx& ctx, const MoeGemmArgs& a, DType w_dtype) {
  if (w_dtype == DType::kBF16) return launch<WFormat::kBf16>(ctx, a);
  if (w_dtype == DType::kI8) return launch<WFormat::kI8>(ctx, a);
  if (w_dtype == DType::kFP8E4M3) return launch<WFormat::kFp8>(ctx, a);
  return Status(StatusCode::kUnimplemented,
                "moe_gemm: weight dtype " + std::string(dtype_name(w_dtype)));
}

}  // namespace strata::cuda
