// GGUF block formats on the GPU: the decode kernel (out = x @ W^T for up to 64 tokens, W in a
// block format, read once) and the dequantizer to bf16 the prefill path runs before cuBLASLt.
// Included by kernels/gguf_{q8_0,q4_0,q4_k,q5_k,q6_k}.cu, one format each (small translation
// units for 2-core CI). Host entry points: kernels/gguf_linear.cu. Layouts and values:
// gguf_fragments.h.
//
// Decode: SBI-GeMM's structure (sbi_gemm.cuh) with a chunk of 256 values: a block has T 16-row
// tiles (T = 2 pairs a gate tile with an up tile) x NT 8-token tiles; its 8 warps take chunks
// w, w + 8, ... of k; lane (g, t) issues all its 16-byte weight loads of rows g and g + 8 of each
// tile for the chunk first (Lane<F>::kLoads per row: 3..5), then per run of 16 k builds the run's
// scale S and min M (bf16x2), loads 16 x values per token tile, and per k-step turns 4 quants of
// each row into bf16 weights in registers (two fma.rn.bf16x2: q exactly, then q * S - M) for one
// mma.m16n8k16 per tile and token tile. Above 16 tokens (4 or 8 token tiles) the run's weights
// are built first and each token tile then loads its x words in turn, to bound the registers.
// Partial sums meet in shared memory and the epilogue is SBI's (sbi_reduce_store: bias, gated silu,
// accumulate, f32 or bf16 out). Needs 16-byte aligned weight rows (row bytes a multiple of 16,
// which all formats give when k is a multiple of 2048; Q4_K and Q5_K always) and k a multiple of
// 256; the host routes everything else through the dequantizer.
//
// Dequantizer: thread (row, chunk, t) computes lane t's 64 values of the chunk with the same
// functions and stores them as bf16: bit-identical weights for decode and prefill. Any row
// alignment (2-byte loads where the rows are not 16-byte aligned).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/gpu_linear_internal.h"
#include "backends/cuda/kernels/gguf_fragments.h"
#include "backends/cuda/kernels/sbi_gemm.cuh"

namespace strata::cuda::gguf {

using sbi::kThreads;
using sbi::kWarps;

// 16 bytes at p (16-byte aligned when `aligned`, else 2-byte aligned).
template <bool kStream>
__device__ __forceinline__ uint4 load16(const uint8_t* p, bool aligned) {
  if (aligned) {
    if constexpr (kStream) {
      return sbi::ld_weights16(p);
    } else {
      return __ldg(reinterpret_cast<const uint4*>(p));
    }
  }
  const auto* h = reinterpret_cast<const unsigned short*>(p);
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[i] = uint32_t{__ldg(h + 2 * i)} | uint32_t{__ldg(h + 2 * i + 1)} << 16;
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Row r's lane loads for chunk c (and the Q6_K d).
template <DType F, bool kStream>
__device__ __forceinline__ void load_lane(const uint8_t* row, int64_t k, int64_t c, int t,
                                          bool aligned, uint32_t (&w)[Lane<F>::kLoads][4],
                                          uint32_t& d16) {
#pragma unroll
  for (int l = 0; l < Lane<F>::kLoads; ++l) {
    const uint4 v = load16<kStream>(row + Lane<F>::load_offset(k, c, t, l), aligned);
    w[l][0] = v.x;
    w[l][1] = v.y;
    w[l][2] = v.z;
    w[l][3] = v.w;
  }
  d16 = 0;
  if constexpr (Lane<F>::kD16) {
    d16 = __ldg(reinterpret_cast<const unsigned short*>(row + Lane<F>::d16_offset(k, c)));
  }
}

// Token `tok`'s 16 x values from column kx as 8 words (two 16-byte loads), zeros past the last
// token: the B side of one 8-token tile for a run.
__device__ __forceinline__ void x_words(const sbi::Args& a, int tok, int kx, uint32_t (&xw)[8]) {
  uint4 v0 = make_uint4(0, 0, 0, 0), v1 = v0;
  if (tok < a.n_tokens) {
    const auto* xp = reinterpret_cast<const uint4*>(a.x + tok * a.x_stride + kx);
    v0 = __ldg(xp);
    v1 = __ldg(xp + 1);
  }
  xw[0] = v0.x;
  xw[1] = v0.y;
  xw[2] = v0.z;
  xw[3] = v0.w;
  xw[4] = v1.x;
  xw[5] = v1.y;
  xw[6] = v1.z;
  xw[7] = v1.w;
}

template <DType F, int T, int NT>
__global__ void __launch_bounds__(kThreads, (T == 1 && NT <= 4) ? 2 : 1)
    gguf_gemv_kernel(const sbi::Args a) {
  using L = Lane<F>;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int g = lane / 4;
  const int t = lane % 4;
  const int out_tiles = a.gated ? T / 2 : T;
  const int row0 = static_cast<int>(blockIdx.x) * 16 * out_tiles;

  const uint8_t* rows[T][2];
  bool row_ok[T][2];
  bool tile_on[T];
#pragma unroll
  for (int i = 0; i < T; ++i) {
    const bool up = a.gated && i >= T / 2;
    const int tile_row = row0 + 16 * (up ? i - T / 2 : i);
    tile_on[i] = tile_row < a.m;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = tile_row + g + 8 * h;
      row_ok[i][h] = r < a.m;
      rows[i][h] =
          a.w + static_cast<int64_t>(row_ok[i][h] ? r + (up ? a.m : 0) : 0) * a.w_stride_bytes;
    }
  }

  float acc[NT][T][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int i = 0; i < T; ++i) {
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[nt][i][v] = 0.0f;
    }
  }
  const int n_chunks = a.k / kChunk;
  pdl_wait();

  for (int c = warp; c < n_chunks; c += kWarps) {
    uint32_t wv[T][2][L::kLoads][4];
    uint32_t d16[T][2];
#pragma unroll
    for (int i = 0; i < T; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (row_ok[i][h]) {
          load_lane<F, true>(rows[i][h], a.k, c, t, true, wv[i][h], d16[i][h]);
        } else {
#pragma unroll
          for (int l = 0; l < L::kLoads; ++l) {
#pragma unroll
            for (int q = 0; q < 4; ++q) wv[i][h][l][q] = 0;
          }
          d16[i][h] = 0;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRuns; ++r) {
      uint32_t S[T][2], M[T][2];
#pragma unroll
      for (int i = 0; i < T; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) L::scales(wv[i][h], d16[i][h], t, r, S[i][h], M[i][h]);
      }
      const int kx = c * kChunk + L::run_k(t, r);
      if constexpr (NT <= 2) {
        uint32_t xw[NT][8];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) x_words(a, 8 * nt + g, kx, xw[nt]);
#pragma unroll
        for (int s4 = 0; s4 < 4; ++s4) {
          const int s = 4 * r + s4;
          uint32_t af[T][4];
#pragma unroll
          for (int i = 0; i < T; ++i) {
            lane_a_pair<F>(wv[i][0], S[i][0], M[i][0], s, t, af[i][0], af[i][2]);  // row g
            lane_a_pair<F>(wv[i][1], S[i][1], M[i][1], s, t, af[i][1], af[i][3]);  // row g + 8
          }
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            if (nt * 8 >= a.n_tokens) continue;  // warp-uniform
            uint32_t b0, b1;
            x_pair(xw[nt], s, b0, b1);
#pragma unroll
            for (int i = 0; i < T; ++i) {
              if (tile_on[i]) sbi::mma_bf16(acc[nt][i], af[i], b0, b1);
            }
          }
        }
      } else {
        // 17-64 tokens: the run's 4 k-steps of weights are built once, then the 8-token tiles
        // take their turns, each one's x words loaded while the previous tile's mmas run (x is
        // not held for every tile at once).
        uint32_t af[4][T][4];
#pragma unroll
        for (int s4 = 0; s4 < 4; ++s4) {
#pragma unroll
          for (int i = 0; i < T; ++i) {
            lane_a_pair<F>(wv[i][0], S[i][0], M[i][0], 4 * r + s4, t, af[s4][i][0], af[s4][i][2]);
            lane_a_pair<F>(wv[i][1], S[i][1], M[i][1], 4 * r + s4, t, af[s4][i][1], af[s4][i][3]);
          }
        }
        uint32_t next[8];
        x_words(a, g, kx, next);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          uint32_t xw[8];
#pragma unroll
          for (int j = 0; j < 8; ++j) xw[j] = next[j];
          if (nt + 1 < NT) x_words(a, 8 * (nt + 1) + g, kx, next);
          if (nt * 8 >= a.n_tokens) continue;  // warp-uniform
#pragma unroll
          for (int s4 = 0; s4 < 4; ++s4) {
            uint32_t b0, b1;
            x_pair(xw, 4 * r + s4, b0, b1);
#pragma unroll
            for (int i = 0; i < T; ++i) {
              if (tile_on[i]) sbi::mma_bf16(acc[nt][i], af[s4][i], b0, b1);
            }
          }
        }
      }
    }
  }
  pdl_trigger();
  sbi::sbi_reduce_store<T, NT>(a, acc, row0, out_tiles);
}

template <DType F, int T, int NT>
Status gemv_run(const LaunchCtx& ctx, const sbi::Args& a) {
  const int out_tiles = a.gated ? T / 2 : T;
  const unsigned blocks = static_cast<unsigned>(ceil_div(a.m, 16 * out_tiles));
  (void)launch_pdl(ctx, true, gguf_gemv_kernel<F, T, NT>, dim3(blocks), dim3(kThreads), 0, a);
  return kernel_launch_status("gguf_gemv_kernel");
}

// Decode launch: gated -> 2 tiles (gate + up), else 1; 8-token tiles: 1, 2, 4 or 8 (up to 8, 16,
// 32 or 64 tokens).
template <DType F>
Status gemv_launch(const LaunchCtx& ctx, const sbi::Args& a) {
  if (a.n_tokens <= 8) return a.gated ? gemv_run<F, 2, 1>(ctx, a) : gemv_run<F, 1, 1>(ctx, a);
  if (a.n_tokens <= 16) return a.gated ? gemv_run<F, 2, 2>(ctx, a) : gemv_run<F, 1, 2>(ctx, a);
  if (a.n_tokens <= 32) return a.gated ? gemv_run<F, 2, 4>(ctx, a) : gemv_run<F, 1, 4>(ctx, a);
  return a.gated ? gemv_run<F, 2, 8>(ctx, a) : gemv_run<F, 1, 8>(ctx, a);
}

// out[r, :] = the bf16 weights of rows [0, rows) (row r at w + r * row_bytes), row stride
// out_stride elements. One thread per (row, chunk, lane share t).
template <DType F>
__global__ void __launch_bounds__(256)
    gguf_dequant_kernel(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t k,
                        __nv_bfloat16* out, int64_t out_stride) {
  using L = Lane<F>;
  const int64_t n_chunks = k / kChunk;
  const int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * n_chunks * 4) return;
  const int t = static_cast<int>(id % 4);
  const int64_t c = id / 4 % n_chunks;
  const int64_t r = id / 4 / n_chunks;
  const uint8_t* row = w + r * row_bytes;
  const bool aligned = is_aligned(row, 16);
  uint32_t wv[L::kLoads][4];
  uint32_t d16;
  load_lane<F, false>(row, k, c, t, aligned, wv, d16);
  auto* o = reinterpret_cast<uint32_t*>(out + r * out_stride + c * kChunk);
#pragma unroll
  for (int run = 0; run < kRuns; ++run) {
    uint32_t S, M;
    L::scales(wv, d16, t, run, S, M);
    uint32_t v[8];
#pragma unroll
    for (int s4 = 0; s4 < 4; ++s4) {
      uint32_t lo, hi;  // {e0, e2}, {e1, e3}
      lane_a_pair<F>(wv, S, M, 4 * run + s4, t, lo, hi);
      v[2 * s4] = prmt(lo, hi, 0x5410);      // {e0, e1}
      v[2 * s4 + 1] = prmt(lo, hi, 0x7632);  // {e2, e3}
    }
    uint32_t* dst = o + L::run_k(t, run) / 2;
    if (out_stride % 8 == 0 && is_aligned(out, 16)) {
      reinterpret_cast<uint4*>(dst)[0] = make_uint4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<uint4*>(dst)[1] = make_uint4(v[4], v[5], v[6], v[7]);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) dst[i] = v[i];
    }
  }
}

template <DType F>
Status dequant_launch(const LaunchCtx& ctx, const uint8_t* w, int64_t row_bytes, int64_t rows,
                      int64_t k, uint16_t* out, int64_t out_stride) {
  const int64_t threads = rows * (k / kChunk) * 4;
  if (threads == 0) return ok_status();
  const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(threads, 256));
  gguf_dequant_kernel<F><<<blocks, 256, 0, ctx.stream>>>(
      w, row_bytes, rows, k, reinterpret_cast<__nv_bfloat16*>(out), out_stride);
  return kernel_launch_status("gguf_dequant_kernel");
}

}  // namespace strata::cuda::gguf
