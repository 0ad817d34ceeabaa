// SBI-GeMM (DeepSpeed-Inference's small-batch GEMM, Aminabadi et al. 2022, Sec. III-C): out =
// x[n, k] @ W[m, k]^T for few tokens, where the weights dominate the traffic. The kernel streams
// W once, straight from global memory into tensor-core fragments (no shared-memory staging, no
// second weight layout: W stays the row-major matrix cuBLASLt reads too), with the few tokens as
// the mma's 8-wide n side. Included by kernels/sbi_gemm_{bf16,i8,fp8}.cu, one weight format each
// (small translation units for 2-core CI). Host entry points: kernels/sbi_gemm.cu.
//
// Work split:
//   block  - `T` 16-row weight tiles (out_tiles = T output m-tiles, or T/2 gate tiles paired
//            with T/2 up tiles when gated) x NT 8-token tiles (all n_tokens <= 8 NT tokens);
//   warp   - 8 warps split k: warp w takes 64-k (bf16) / 128-k (8-bit) chunks w, w+8, w+16, ...
//            Interleaved rather than contiguous ranges, so the block's warps read neighbouring
//            chunks of the same rows at the same time (one DRAM page stream per row) and the
//            k tail lands on one warp;
//   lane   - loads 16-byte pieces of its rows g and g+8 (sbi_fragments.h: piece layout, k
//            permutation) and the matching x pieces of token g of every n-tile.
// Each iteration of a warp issues all its weight loads (U chunks x T tiles x 4 loads of 16
// bytes) before the first mma, so 4..16 loads per lane are in flight. Weights load with
// ld.global.nc.L1::no_allocate (streamed once; they must not evict x, which every block re-reads
// and which stays in L1/L2). Partial sums of the 8 warps meet in shared memory (fixed order: no
// atomics, deterministic), then all threads run the epilogue: * w_scale[row], + bias[row],
// silu(gate) * up, + out, f32 or bf16 store.
//
// Tails: a chunk past k (or its part) loads zeros for both W and x; tokens past n_tokens and rows
// past m are zero registers, never loaded (predicated loads), never stored; whole tiles or
// n-tiles past the end skip their mma too (warp-uniform branches).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/gpu_linear_internal.h"
#include "backends/cuda/kernels/sbi_fragments.h"

namespace strata::cuda::sbi {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;

template <WFormat F, int T, int NT>
struct Shape {
  // Chunks per loop iteration: 2 when one tile's 4 weight loads per chunk would leave too few
  // loads in flight, as long as the x registers (more for 8-bit weights: 128 k per chunk) fit.
  static constexpr int kUnroll = (T == 1 && NT <= (F == WFormat::kBf16 ? 2 : 1)) ? 2 : 1;
  // Register budget: 3 blocks (24 warps, <= 80 registers) per SM for the smallest bf16 shapes, 2
  // (<= 128 registers) for the rest (checked with -Xptxas -v: no spills except the off-design
  // 2 x 8 tiles, gated with 33..64 tokens).
  static constexpr int kMinBlocks = F == WFormat::kBf16 && T * NT * kUnroll <= 2 ? 3 : 2;
};

// 16 bytes of weights, streamed: no L1 allocation, 256-byte L2 prefetch (the block's warps read
// the neighbouring bytes of the same rows right away).
__device__ __forceinline__ uint4 ld_weights16(const uint8_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ __forceinline__ uint2 ld_weights8(const uint8_t* p) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// d += A * B for one 16x8x16 bf16 tile, f32 accumulation.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Per-lane view of the block's rows and tokens, fixed for the whole k loop. Offsets rather than
// one pointer per row: the compiler keeps or recomputes the row pointers as registers allow.
template <int T>
struct LaneRows {
  const uint8_t* w;   // row g of the block's first tile, at this lane's piece offset
  int64_t w_tile;     // bytes from a tile to the next (16 rows)
  int64_t w_half;     // bytes from row g to row g+8
  int64_t w_up;       // bytes from a gate row to its up row (m rows); 0 when not gated
  uint32_t row_ok;    // bit 2i+h: row g+8h of tile i is < m (rows past m load nothing)
  bool tile_on[T];    // tile i has a row < m (warp-uniform)
  const uint16_t* x;  // token g of n-tile 0, at this lane's piece offset
  int64_t x_tile;     // elements from an n-tile to the next (8 tokens)
  int tokens_left;    // n_tokens - g: token g of n-tile nt exists iff 8 nt < tokens_left

  __device__ __forceinline__ const uint8_t* row(int i, int h, bool gated) const {
    const bool up = gated && i >= T / 2;
    return w + (up ? i - T / 2 : i) * w_tile + h * w_half + (up ? w_up : 0);
  }
};

// x pieces of one n-tile for U chunks from chunk c0 (zeros for a missing token or past k).
template <WFormat F, int U, bool kCheck>
__device__ __forceinline__ void sbi_load_x(const Args& a, int c0, int t, const uint16_t* x, bool on,
                                           uint32_t (&xv)[U][2][Geometry<F>::kXWords]) {
  using G = Geometry<F>;
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int kp = (c0 + kWarps * u) * G::kChunk + piece_k<F>(j, 0);
#pragma unroll
      for (int q = 0; q < G::kXWords / 4; ++q) {
        uint4 v = make_uint4(0, 0, 0, 0);
        if (on && (!kCheck || kp + t * G::kPiece + 8 * q + 8 <= a.k)) {
          v = __ldg(reinterpret_cast<const uint4*>(x + kp + 8 * q));
        }
        xv[u][j][4 * q + 0] = v.x;
        xv[u][j][4 * q + 1] = v.y;
        xv[u][j][4 * q + 2] = v.z;
        xv[u][j][4 * q + 3] = v.w;
      }
    }
  }
}

// mma of every tile (every tile with a row < m when kCheck) with one n-tile's B fragment.
template <int T, bool kCheck>
__device__ __forceinline__ void sbi_mma_tiles(const uint32_t (&af)[T][4], uint32_t b0, uint32_t b1,
                                              const bool (&tile_on)[T], float (&acc)[T][4]) {
#pragma unroll
  for (int i = 0; i < T; ++i) {
    if (!kCheck || tile_on[i]) mma_bf16(acc[i], af[i], b0, b1);
  }
}

// One loop iteration of a warp: U chunks starting at chunk c0. kCheck when a chunk of them is
// partial or past k or the block has rows past m: then loads are predicated on k and rows (the
// hot path has no predicates but the tokens'). All weight loads are issued first. When the
// x pieces of all n-tiles fit in ~32 registers they are loaded up front too and each k-step's A
// fragments serve every n-tile; otherwise (many tokens) the n-tiles go one after the other, each
// loading its x and rebuilding the A fragments (free for bf16, a conversion for 8-bit weights).
template <WFormat F, int T, int NT, int U, bool kCheck>
__device__ __forceinline__ void sbi_step(const Args& a, int c0, int t, const LaneRows<T>& r,
                                         float (&acc)[NT][T][4]) {
  using G = Geometry<F>;
  constexpr bool kXUpFront = NT * U * 2 * G::kXWords <= 32;
  uint32_t wv[U][T][2][2][4];  // chunk, tile, row g / g+8, piece, word
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int kp = (c0 + kWarps * u) * G::kChunk + piece_k<F>(j, 0);  // lane 0's piece
      const int k_lane = kp + t * G::kPiece;
#pragma unroll
      for (int i = 0; i < T; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint4 v = make_uint4(0, 0, 0, 0);
          if (!kCheck || (r.tile_on[i] && (r.row_ok >> (2 * i + h) & 1u))) {
            const uint8_t* p = r.row(i, h, a.gated) + static_cast<int64_t>(kp) * G::kElemBytes;
            if (!kCheck || k_lane + G::kPiece <= a.k) {
              v = ld_weights16(p);
            } else if (G::kElemBytes == 1 && k_lane + 8 <= a.k) {
              const uint2 half = ld_weights8(p);  // k % 16 == 8: the last piece is half
              v.x = half.x;
              v.y = half.y;
            }
          }
          wv[u][i][h][j][0] = v.x;
          wv[u][i][h][j][1] = v.y;
          wv[u][i][h][j][2] = v.z;
          wv[u][i][h][j][3] = v.w;
        }
      }
    }
  }
  if constexpr (kXUpFront) {
    uint32_t xv[NT][U][2][G::kXWords];  // n-tile, chunk, piece, word
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if (nt * 8 < a.n_tokens) {
        sbi_load_x<F, U, kCheck>(a, c0, t, r.x + nt * r.x_tile, 8 * nt < r.tokens_left, xv[nt]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int s = 0; s < G::kSteps; ++s) {
        uint32_t af[T][4];
#pragma unroll
        for (int i = 0; i < T; ++i) {
          a_pair<F>(wv[u][i][0], s, af[i][0], af[i][2]);  // row g
          a_pair<F>(wv[u][i][1], s, af[i][1], af[i][3]);  // row g+8
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if (nt * 8 >= a.n_tokens) continue;  // warp-uniform: no token in this n-tile
          uint32_t b0;
          uint32_t b1;
          b_pair<F>(xv[nt][u], s, b0, b1);
          sbi_mma_tiles<T, kCheck>(af, b0, b1, r.tile_on, acc[nt]);
        }
      }
    }
  } else {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if (nt * 8 >= a.n_tokens) continue;  // warp-uniform
      uint32_t xv[U][2][G::kXWords];
      sbi_load_x<F, U, kCheck>(a, c0, t, r.x + nt * r.x_tile, 8 * nt < r.tokens_left, xv);
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int s = 0; s < G::kSteps; ++s) {
          uint32_t af[T][4];
#pragma unroll
          for (int i = 0; i < T; ++i) {
            a_pair<F>(wv[u][i][0], s, af[i][0], af[i][2]);
            a_pair<F>(wv[u][i][1], s, af[i][1], af[i][3]);
          }
          uint32_t b0;
          uint32_t b1;
          b_pair<F>(xv[u], s, b0, b1);
          sbi_mma_tiles<T, kCheck>(af, b0, b1, r.tile_on, acc[nt]);
        }
      }
    }
  }
}

// Scale and bias of weight row `row`, the value before the activation.
__device__ __forceinline__ float sbi_pre(const Args& a, float v, int row) {
  if (a.w_scale) v *= a.w_scale[row];
  if (a.bias) v += a.bias[row];
  return v;
}

// The end of a block's work: the 8 warps' partial sums of its T tiles x NT n-tiles (acc, in the
// mma's C layout) meet in shared memory, then every thread runs the epilogue of the outputs it
// stores (rows row0 + [0, 16 out_tiles)). Every thread of the block must call it (barriers).
// Also the end of the GGUF block-format kernels (gguf_gemv.cuh).
template <int T, int NT>
__device__ __forceinline__ void sbi_reduce_store(const Args& a, const float (&acc)[NT][T][4],
                                                 int row0, int out_tiles) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  // Cross-warp sum in a fixed order: warps 4..7 park their sums, warps 0..3 add them and park
  // the result; then every thread adds the 4 parked partials of the outputs it stores.
  __shared__ float red[4][T][NT][4][kWarpSize];
  if (warp >= 4) {
#pragma unroll
    for (int i = 0; i < T; ++i) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int v = 0; v < 4; ++v) red[warp - 4][i][nt][v][lane] = acc[nt][i][v];
      }
    }
  }
  __syncthreads();
  if (warp < 4) {
#pragma unroll
    for (int i = 0; i < T; ++i) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          red[warp][i][nt][v][lane] += acc[nt][i][v];
        }
      }
    }
  }
  __syncthreads();

  // Epilogue, rows fastest so a token's 16 rows are one contiguous store.
  const int total = out_tiles * NT * 8 * 16;
  for (int e = static_cast<int>(threadIdx.x); e < total; e += kThreads) {
    const int r16 = e % 16;
    const int tok = (e / 16) % (NT * 8);
    const int tile = e / (16 * NT * 8);
    const int row = row0 + 16 * tile + r16;
    if (tok >= a.n_tokens || row >= a.m) continue;
    const int fl = (r16 % 8) * 4 + (tok % 8) / 2;  // the lane whose fragment holds (row, tok)
    const int fv = (r16 / 8) * 2 + tok % 2;        // and which of its 4 accumulators
    const int nt = tok / 8;
    float v = red[0][tile][nt][fv][fl] + red[1][tile][nt][fv][fl] + red[2][tile][nt][fv][fl] +
              red[3][tile][nt][fv][fl];
    v = sbi_pre(a, v, row);
    if (a.gated) {
      const int up = tile + T / 2;
      float u = red[0][up][nt][fv][fl] + red[1][up][nt][fv][fl] + red[2][up][nt][fv][fl] +
                red[3][up][nt][fv][fl];
      u = sbi_pre(a, u, a.m + row);
      v = v / (1.0f + expf(-v)) * u;
    }
    const int64_t o = tok * a.out_stride + row;
    if (a.out_bf16) {
      static_cast<__nv_bfloat16*>(a.out)[o] = __float2bfloat16_rn(v);
    } else {
      float* out = static_cast<float*>(a.out) + o;
      *out = a.accumulate ? *out + v : v;
    }
  }
}

// The work of block `block` (its output rows) of one SBI launch; every thread of the block
// must call it (it has barriers). The grouped expert kernel (moe_sbi.cuh) calls it once per
// token slice of an expert, with a barrier between calls (the shared reduction is reused).
template <WFormat F, int T, int NT>
__device__ __forceinline__ void sbi_gemm_block(const Args& a, int block) {
  using G = Geometry<F>;
  constexpr int U = Shape<F, T, NT>::kUnroll;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int g = lane / 4;
  const int t = lane % 4;
  const int out_tiles = a.gated ? T / 2 : T;
  const int row0 = block * 16 * out_tiles;  // first output row

  LaneRows<T> r;
  r.w = a.w + (row0 + g) * a.w_stride_bytes + t * 16;
  r.w_tile = 16 * a.w_stride_bytes;
  r.w_half = 8 * a.w_stride_bytes;
  r.w_up = a.gated ? a.m * a.w_stride_bytes : 0;
  r.row_ok = 0;
#pragma unroll
  for (int i = 0; i < T; ++i) {
    const int tile_row = row0 + 16 * (a.gated && i >= T / 2 ? i - T / 2 : i);
    r.tile_on[i] = tile_row < a.m;
#pragma unroll
    for (int h = 0; h < 2; ++h) r.row_ok |= (tile_row + g + 8 * h < a.m ? 1u : 0u) << (2 * i + h);
  }
  r.x = a.x + g * a.x_stride + t * G::kPiece;  // token g may not exist: then never loaded
  r.x_tile = 8 * a.x_stride;
  r.tokens_left = a.n_tokens - g;

  float acc[NT][T][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int i = 0; i < T; ++i) {
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[nt][i][v] = 0.0f;
    }
  }
  const int n_chunks = (a.k + G::kChunk - 1) / G::kChunk;
  const int n_full = a.k / G::kChunk;
  const bool rows_full = row0 + 16 * out_tiles <= a.m;  // every block but maybe the last

  // PDL: the weights never depend on the kernel before this one, so while it finishes, this
  // block pulls its first kPrefetch loop iterations of weights into L2; only then it waits for
  // the upstream results (x, and out when accumulating). Launched without PDL, the wait returns
  // at once and the prefetches only warm L2 for the loop below.
  if (rows_full && a.prefetch > 0 && t == 0) {
    // One prefetch per row and chunk (a chunk of a row is 128 bytes: the 4 lanes of a row
    // group share it), for the first a.prefetch iterations of this warp.
    for (int it = 0; it < a.prefetch; ++it) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = warp + kWarps * (U * it + u);
        if (c >= n_full) continue;
        const int kp = c * G::kChunk + piece_k<F>(0, 0);
#pragma unroll
        for (int i = 0; i < T; ++i) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint8_t* q = r.row(i, h, a.gated) + static_cast<int64_t>(kp) * G::kElemBytes;
            asm volatile("prefetch.global.L2 [%0];" ::"l"(q));
          }
        }
      }
    }
  }
  pdl_wait();

  for (int c0 = warp; c0 < n_chunks; c0 += kWarps * U) {
    if (rows_full && c0 + kWarps * (U - 1) < n_full) {
      sbi_step<F, T, NT, U, false>(a, c0, t, r, acc);
    } else {
      sbi_step<F, T, NT, U, true>(a, c0, t, r, acc);
    }
  }

  // This block's weights are read: the next PDL-launched kernel may start prefetching its own.
  pdl_trigger();

  sbi_reduce_store<T, NT>(a, acc, row0, out_tiles);
}

template <WFormat F, int T, int NT>
__global__ void __launch_bounds__(kThreads, Shape<F, T, NT>::kMinBlocks)
    sbi_gemm_kernel(const Args a) {
  sbi_gemm_block<F, T, NT>(a, static_cast<int>(blockIdx.x));
}

template <WFormat F, int T, int NT>
Status sbi_run(const LaunchCtx& ctx, const Args& a) {
  const int out_tiles = a.gated ? T / 2 : T;
  const unsigned blocks = static_cast<unsigned>(ceil_div(a.m, 16 * out_tiles));
  // Programmatic dependent launch: may overlap the tail of the previous kernel on the stream
  // (the kernel waits for its results with pdl_wait()).
  (void)launch_pdl(ctx, true, sbi_gemm_kernel<F, T, NT>, dim3(blocks), dim3(kThreads), 0, a);
  return kernel_launch_status("sbi_gemm_kernel");
}

// The compiled block shapes (tiles, n_tiles): tiles * n_tiles <= 16 keeps the accumulators and
// the shared-memory reduction (2 KiB per tile pair) in budget. Gated launches need even tiles.
template <WFormat F>
Status sbi_launch(const LaunchCtx& ctx, const Args& a, Config c) {
  if (!(a.gated && c.tiles % 2 != 0)) {
    switch (c.tiles * 100 + c.n_tiles) {
      case 101:
        return sbi_run<F, 1, 1>(ctx, a);
      case 201:
        return sbi_run<F, 2, 1>(ctx, a);
      case 401:
        return sbi_run<F, 4, 1>(ctx, a);
      case 102:
        return sbi_run<F, 1, 2>(ctx, a);
      case 202:
        return sbi_run<F, 2, 2>(ctx, a);
      case 104:
        return sbi_run<F, 1, 4>(ctx, a);
      case 204:
        return sbi_run<F, 2, 4>(ctx, a);
      case 108:
        return sbi_run<F, 1, 8>(ctx, a);
      case 208:
        return sbi_run<F, 2, 8>(ctx, a);
      default:
        break;
    }
  }
  return invalid_argument("sbi_gemm", "no kernel for " + std::to_string(c.tiles) +
                                          " weight tiles x " + std::to_string(c.n_tiles) +
                                          " token tiles" + (a.gated ? " (gated)" : ""));
}

}  // namespace strata::cuda::sbi
