// FlashAttention-2-style causal attention for many queries per sequence (prefill, chunked
// prefill) over the bf16 paged KV cache, varlen layout (VarlenAttentionParams, CPU twin
// src/backends/cpu/varlen_attention.cpp).
//
// One CTA of 4 warps per (query head, query tile, sequence); grid (n_heads, q tiles of the
// longest sequence, n_seqs). Heads are the fastest grid dimension so the query heads of a GQA
// group, which read the same K/V, run at the same time and share those reads in L2; q tiles are
// walked last-first so the longest (causal) tiles start first. A tile past its sequence's query
// count exits at once. Each warp owns 16 * kMT query rows; the query tile is 64 * kMT rows.
// kMT = 2 halves the shared-memory reads per MMA (K and V fragments feed two m16 tiles), which
// bound mma.sync attention on H100; kMT = 1 keeps Q in registers and makes twice the CTAs, for
// batches too small to fill the GPU with 128-row tiles.
//
// Per K/V tile of 64 keys (walked from the diagonal down to the window start):
//   S = Q K^T with mma.sync m16n8k16 (bf16 in, f32 out; fragments by ldmatrix from swizzled
//   shared memory), optional softcap tanh, causal / sliding-window mask on the diagonal and
//   window-edge tiles only, online softmax in f32 on log2e-prescaled scores (one FFMA + ex2 per
//   score, FlashAttention-2), then O += P V with P rounded to bf16 in registers (the S
//   accumulator layout of two n8 tiles is the A fragment layout of one k16 step) and V fragments
//   by ldmatrix.trans. K/V tiles are gathered with cp.async from the block table (a 64-key tile
//   may span several cache blocks: each key's block is looked up) into a double buffer: tile
//   i+1 loads while tile i computes. Warps whose rows see none of a tile's keys skip it.
//
// Invalid device data (a block id outside the pool, counts beyond the host bounds) gives NaN
// output rows instead of an out-of-bounds read, as in kernels/attention.cu.
#include <algorithm>
#include <cstdint>
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/kernels/flash_common.cuh"
#include "backends/cuda/kernels/flash_tiles.h"

namespace strata::cuda {
namespace {

using namespace flash;

// D: head_dim; kWarps warps of 16 * kMT query rows each; kBN keys per K/V tile.
template <int D, int kWarps, int kMT, int kBN>
struct PrefillCfg {
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kBlockM = 16 * kMT * kWarps;  // query rows per CTA
  static constexpr int kQElems = kBlockM * D;
  static constexpr int kKVElems = kBN * D;  // one K or V buffer
  static constexpr size_t kSmemBytes =
      size_t{kQElems + 4 * kKVElems} * sizeof(uint16_t) + 2 * kBN * sizeof(int64_t);
};

template <int D>
__device__ void write_nan_rows(uint16_t* out, int64_t stride, int rows) {
  for (int i = static_cast<int>(threadIdx.x); i < rows * D; i += static_cast<int>(blockDim.x)) {
    out[(i / D) * stride + i % D] = bf16_nan();
  }
}

template <int D, int kWarps, int kMT, int kBN>
__global__ void __launch_bounds__(kWarps* kWarpSize)
    flash_prefill_kernel(const __grid_constant__ VarlenAttentionParams p) {
  using Cfg = PrefillCfg<D, kWarps, kMT, kBN>;
  constexpr int kThreads = Cfg::kThreads;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = kBN;
  constexpr int kChunks = D / 8;                    // 16-byte chunks per row
  constexpr int kRowsPerPass = kThreads / kChunks;  // rows one pass of the CTA copies
  constexpr int kNT = kBlockN / 8;                  // n8 tiles of S
  constexpr int kDT = D / 8;                        // n8 tiles of O
  constexpr int kRowBytes = D * 2;
  extern __shared__ __align__(1024) uint16_t smem[];
  uint16_t* s_q = smem;                                                  // [kBlockM][D]
  uint16_t* s_k = s_q + Cfg::kQElems;                                    // [2][kBlockN][D]
  uint16_t* s_v = s_k + 2 * Cfg::kKVElems;                               // [2][kBlockN][D]
  int64_t* s_off = reinterpret_cast<int64_t*>(s_v + 2 * Cfg::kKVElems);  // [2][kBlockN]

  const PagedKvBf16Params& c = p.cache;
  const int h = static_cast<int>(blockIdx.x);
  const int m_block = static_cast<int>(gridDim.y - 1 - blockIdx.y);
  const int s = static_cast<int>(blockIdx.z);
  const SeqView sv = seq_view(p, s);
  const int r0 = m_block * kBlockM;
  if (r0 >= sv.n_q) return;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int n_rows = min(kBlockM, sv.n_q - r0);
  uint16_t* out = p.out + int64_t{sv.q0 + r0} * p.out_stride + int64_t{h} * D;
  // The ldmatrix addressing below XORs absolute shared addresses, which needs the tiles 1024-byte
  // aligned (extern __align__(1024) asks for it); should a toolchain ever not honour it, the
  // output is NaN rather than silently wrong.
  if (sv.bad || smem_u32(smem) % 1024 != 0) {
    write_nan_rows<D>(out, p.out_stride, n_rows);
    return;
  }

  const int p_first = sv.kv_len - sv.n_q + r0;  // position of the tile's first query
  const int p_last = p_first + n_rows - 1;
  const int lo = window_start(p_first, p.sliding_window);  // first key any row reads
  const int n_last = p_last / kBlockN;
  const int n_tiles = n_last - lo / kBlockN + 1;
  const int kv_head = h / static_cast<int>(p.n_heads / c.n_heads_kv);
  bool bad_block = false;

  // Thread i < kBlockN: the element offset in the caches of key n * kBlockN + i of this KV
  // head, or -1 (zero-filled) for keys outside [lo, kv_len): those are masked for every row, and
  // their blocks may be gone. Kept in shared memory so the copy loop holds no per-thread state
  // through the main loop (registers are the limit of the kMT = 2 tiles).
  auto fill_offsets = [&](int n, int64_t* dst) {
    if (tid < kBlockN) {
      const int key = n * kBlockN + tid;
      int64_t at = -1;
      if (key >= lo && key < sv.kv_len) {
        const int slot = kv_slot(c, c.block_tables + int64_t{s} * c.max_blocks_per_seq, key);
        bad_block |= slot < 0;
        if (slot >= 0) at = (int64_t{slot} * c.n_heads_kv + kv_head) * D;
      }
      dst[tid] = at;
    }
  };
  // Thread tid copies chunk tid % kChunks of rows tid / kChunks + i * kRowsPerPass: the rows
  // differ by multiples of 8, so they share one swizzle and the destinations are one base plus
  // constants (no per-row addresses live through the main loop).
  auto load_kv = [&](int stage) {
    const int64_t* offsets = s_off + stage * kBlockN + tid / kChunks;
    const uint32_t dst =
        smem_u32(s_k) + stage * Cfg::kKVElems * 2 + swizzle<D>(tid / kChunks, tid % kChunks) * 2;
    const int chunk_elems = (tid % kChunks) * 8;
#pragma unroll
    for (int i = 0; i < kBlockN / kRowsPerPass; ++i) {
      const int64_t at = offsets[i * kRowsPerPass];
      const int64_t src = (at >= 0 ? at : 0) + chunk_elems;
      const int bytes = at >= 0 ? 16 : 0;
      const uint32_t d = dst + i * kRowsPerPass * kRowBytes;
      cp_async_16(d, c.k_cache + src, bytes);
      cp_async_16(d + 2 * Cfg::kKVElems * 2, c.v_cache + src, bytes);  // s_v = s_k + 2 buffers
    }
  };

  {  // Q tile (rows past the sequence's queries zero-filled), then the first K/V tile.
    const int chunk = tid % kChunks;
    const uint16_t* q_base = p.q + int64_t{sv.q0 + r0} * p.q_stride + int64_t{h} * D + chunk * 8;
#pragma unroll
    for (int i = 0; i < kBlockM / kRowsPerPass; ++i) {
      const int row = tid / kChunks + i * kRowsPerPass;
      const bool valid = row < n_rows;
      cp_async_16(smem_u32(s_q + swizzle<D>(row, chunk)), q_base + (valid ? row * p.q_stride : 0),
                  valid ? 16 : 0);
    }
  }
  fill_offsets(n_last, s_off);
  __syncthreads();
  load_kv(0);
  cp_async_commit();

  const bool capped = p.logit_softcap > 0.0f;
  const float pre_cap = capped ? p.scale / p.logit_softcap : 0.0f;
  // exp(x - m) = exp2(x * scale_log2 - m * scale_log2) with x the score before scaling (after
  // tanh when capped): the running max is kept on unscaled scores, scale > 0 keeps the order.
  const float scale_log2 = (capped ? p.logit_softcap : p.scale) * kLog2e;
  const int window = static_cast<int>(p.sliding_window);
  const int g = lane / 4;   // fragment row (and +8)
  const int t4 = lane % 4;  // fragment column pair
  const int warp_row0 = warp * 16 * kMT;
  const int warp_pos_lo = p_first + warp_row0;
  const int warp_pos_hi = warp_pos_lo + 16 * kMT - 1;

  float o[kMT][kDT][4];
  float row_max[kMT][2];
  float row_sum[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int dn = 0; dn < kDT; ++dn) o[mt][dn][0] = o[mt][dn][1] = o[mt][dn][2] = o[mt][dn][3] = 0;
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.0f;
  }
  uint32_t qf[kMT == 1 ? D / 16 : 1][4];  // Q fragments, in registers when kMT == 1

  // Per-lane ldmatrix addresses at k step 0 / m tile 0 / key 0 / stage 0. Every row a lane
  // addresses is (lane & 7) plus a multiple of 8, so its swizzle is chunk ^ (lane & 7); k step
  // ks (chunk 2 ks + bit) is then one XOR with ks * 32 bytes, and the tiles' 1024-byte alignment
  // keeps that XOR inside the row. Row offsets (multiples of 16 rows) are plain additions.
  // Q / A fragment: rows (lane & 15), chunk lane / 16.
  const uint32_t q_addr =
      smem_u32(s_q) + (warp_row0 + (lane & 15)) * kRowBytes + ((lane / 16) ^ (lane & 7)) * 16;
  // K / B fragments of two n8 tiles: keys (lane & 7) + 8 (lane / 16), chunk (lane / 8) & 1.
  const uint32_t k_addr = smem_u32(s_k) + ((lane & 7) + (lane / 16) * 8) * kRowBytes +
                          (((lane / 8) & 1) ^ (lane & 7)) * 16;
  // V^T / B fragments (ldmatrix.trans): keys (lane & 15), chunk lane / 16.
  const uint32_t v_addr = smem_u32(s_v) + (lane & 15) * kRowBytes + ((lane / 16) ^ (lane & 7)) * 16;

  for (int it = 0; it < n_tiles; ++it) {
    const int n = n_last - it;
    const int stage = it & 1;
    if (it + 1 < n_tiles) fill_offsets(n - 1, s_off + (stage ^ 1) * kBlockN);
    cp_async_wait<0>();
    __syncthreads();  // tile `it` landed; every warp is done with the other buffer
    if (it + 1 < n_tiles) load_kv(stage ^ 1);
    cp_async_commit();
    if constexpr (kMT == 1) {
      if (it == 0) {
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
          ldmatrix_x4(qf[ks], q_addr ^ (ks * 32));
        }
      }
    }
    const int key0 = n * kBlockN;
    if (key0 > warp_pos_hi || (window > 0 && key0 + kBlockN - 1 < warp_pos_lo - window + 1)) {
      continue;  // every key of the tile is masked for this warp's rows
    }
    const uint32_t tk = k_addr + stage * Cfg::kKVElems * 2;
    const uint32_t tv = v_addr + stage * Cfg::kKVElems * 2;

    float sc[kMT][kNT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
        sc[mt][nt][0] = sc[mt][nt][1] = sc[mt][nt][2] = sc[mt][nt][3] = 0;
    }
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        if constexpr (kMT == 1) {
#pragma unroll
          for (int i = 0; i < 4; ++i) a[mt][i] = qf[ks][i];
        } else {
          ldmatrix_x4(a[mt], (q_addr ^ (ks * 32)) + mt * 16 * kRowBytes);
        }
      }
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, (tk ^ (ks * 32)) + np * 16 * kRowBytes);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_bf16(sc[mt][2 * np], a[mt], b[0], b[1]);
          mma_bf16(sc[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }

    if (capped) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) sc[mt][nt][e] = tanhf(sc[mt][nt][e] * pre_cap);
        }
      }
    }
    // Only tiles that reach past the warp's first position (causal) or before its last row's
    // window start need the per-element mask.
    if (key0 + kBlockN - 1 > warp_pos_lo || (window > 0 && key0 < warp_pos_hi - window + 1)) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = key0 + nt * 8 + 2 * t4 + (e & 1);
            const int pr = warp_pos_lo + mt * 16 + (e / 2) * 8 + g;  // the element's row
            if (key > pr || (window > 0 && key <= pr - window)) sc[mt][nt][e] = -INFINITY;
          }
        }
      }
    }

    // Online softmax: a lane holds rows g and g + 8 of each m tile; the 4 lanes of a quad share
    // a row (xor 1, 2). row_sum stays a per-lane partial until the end.
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        float mx = row_max[mt][hr];
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
          mx = fmaxf(mx, fmaxf(sc[mt][nt][2 * hr], sc[mt][nt][2 * hr + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // A row with every key so far masked keeps max -inf: subtract 0 (its weights are 0).
        const float m_scaled = mx == -INFINITY ? 0.0f : mx * scale_log2;
        const float alpha = fast_exp2(row_max[mt][hr] * scale_log2 - m_scaled);
        row_max[mt][hr] = mx;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float w = fast_exp2(fmaf(sc[mt][nt][2 * hr + e], scale_log2, -m_scaled));
            sc[mt][nt][2 * hr + e] = w;
            sum += w;
          }
        }
        row_sum[mt][hr] = row_sum[mt][hr] * alpha + sum;
#pragma unroll
        for (int dn = 0; dn < kDT; ++dn) {
          o[mt][dn][2 * hr] *= alpha;
          o[mt][dn][2 * hr + 1] *= alpha;
        }
      }
    }

    // O += P V. P goes to bf16 A fragments first (the f32 scores die early: fewer registers),
    // then one k16 step (16 keys) at a time.
    uint32_t pa[kBlockN / 16][kMT][4];
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        pa[kk][mt][0] = pack_bf16(sc[mt][2 * kk][0], sc[mt][2 * kk][1]);
        pa[kk][mt][1] = pack_bf16(sc[mt][2 * kk][2], sc[mt][2 * kk][3]);
        pa[kk][mt][2] = pack_bf16(sc[mt][2 * kk + 1][0], sc[mt][2 * kk + 1][1]);
        pa[kk][mt][3] = pack_bf16(sc[mt][2 * kk + 1][2], sc[mt][2 * kk + 1][3]);
      }
    }
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, (tv ^ (dp * 32)) + kk * 16 * kRowBytes);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_bf16(o[mt][2 * dp], pa[kk][mt], b[0], b[1]);
          mma_bf16(o[mt][2 * dp + 1], pa[kk][mt], b[2], b[3]);
        }
      }
    }
  }

  cp_async_wait<0>();
  if (__syncthreads_or(bad_block)) {
    write_nan_rows<D>(out, p.out_stride, n_rows);
    return;
  }
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float l = row_sum[mt][hr];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = 1.0f / l;
      const int row = warp_row0 + mt * 16 + hr * 8 + g;
      if (row < n_rows) {
        uint16_t* dst = out + int64_t{row} * p.out_stride + 2 * t4;
#pragma unroll
        for (int dn = 0; dn < kDT; ++dn) {
          *reinterpret_cast<uint32_t*>(dst + dn * 8) =
              pack_bf16(o[mt][dn][2 * hr] * inv, o[mt][dn][2 * hr + 1] * inv);
        }
      }
    }
  }
}

template <int D, int kWarps, int kMT, int kBN>
Status launch(const LaunchCtx& ctx, const VarlenAttentionParams& p) {
  using Cfg = PrefillCfg<D, kWarps, kMT, kBN>;
  const auto kernel = flash_prefill_kernel<D, kWarps, kMT, kBN>;
  STRATA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Cfg::kSmemBytes)));
  const int64_t tiles = ceil_div<int64_t>(p.max_q_len, Cfg::kBlockM);
  if (tiles > 65535) {
    return invalid_argument("flash_prefill", "max_q_len " + std::to_string(p.max_q_len) +
                                                 " needs more than 65535 query tiles");
  }
  const dim3 grid(static_cast<unsigned>(p.n_heads), static_cast<unsigned>(tiles),
                  static_cast<unsigned>(p.n_seqs));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, ctx.stream>>>(p);
  return kernel_launch_status("flash_prefill_kernel");
}

template <int D>
Status launch_tile(const LaunchCtx& ctx, const VarlenAttentionParams& p, FlashPrefillTile tile) {
  switch (tile) {
    case FlashPrefillTile::kW4M64N64:
      return launch<D, 4, 1, 64>(ctx, p);
    case FlashPrefillTile::kW8M128N64:
      return launch<D, 8, 1, 64>(ctx, p);
    case FlashPrefillTile::kW4M128N32:
      return launch<D, 4, 2, 32>(ctx, p);
    case FlashPrefillTile::kW4M128N64:
      return launch<D, 4, 2, 64>(ctx, p);
    case FlashPrefillTile::kAuto:
      break;
  }
  // 128-row tiles when they alone give every SM two CTAs; 64-row tiles (twice the CTAs) for
  // short chunks and small batches. With 128 rows, 32 rows per warp halve the shared-memory
  // reads per MMA. Measured on H100 (bench_attention, 2026-11-22, d 128, 32/8 heads): 4 warps x
  // 128 rows x 64 keys was fastest at 1x2048 (254 vs 241 TFLOP/s for 32-key tiles) and 8x2048
  // (289 vs 266), although it spills 76 bytes at head_dim 128.
  const int64_t sms = ctx.sm_count > 0 ? ctx.sm_count : 132;
  const int64_t big_ctas = ceil_div<int64_t>(p.max_q_len, 128) * p.n_heads * p.n_seqs;
  if (big_ctas < 2 * sms) return launch<D, 4, 1, 64>(ctx, p);
  return launch<D, 4, 2, 64>(ctx, p);
}

}  // namespace

Status flash_prefill_tile(const LaunchCtx& ctx, const VarlenAttentionParams& p,
                          FlashPrefillTile tile) {
  STRATA_RETURN_IF_ERROR(check_varlen("flash_prefill", p));
  if (p.n_seqs == 0 || p.max_q_len == 0) return ok_status();
  if (!flash_supported(p)) return varlen_attention_generic(ctx, p);
  if (p.cache.head_dim == 64) return launch_tile<64>(ctx, p, tile);
  return launch_tile<128>(ctx, p, tile);
}

Status flash_prefill(const LaunchCtx& ctx, const VarlenAttentionParams& p) {
  return flash_prefill_tile(ctx, p, FlashPrefillTile::kAuto);
}

}  // namespace strata::cuda
