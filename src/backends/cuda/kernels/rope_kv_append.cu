// Fused RoPE + KV-cache append (Deep-Fusion, DeepSpeed-Inference III-B): reads token t's row of
// the fused QKV GEMM's f32 output [q (n_heads heads) | k (n_heads_kv) | v (n_heads_kv)], rotates
// the first rotary_dim dims of every q and k head by position token_pos[t], and writes q as bf16
// to q_out (the attention kernel's input) and k, v as bf16 into the token's slot of the paged
// cache. One pass over the row instead of rope + convert + kv_append.
// CPU twin: src/backends/cpu/fused_bf16.cpp (same RopeKvAppendParams).
//
// Layout: qkv f32 [n_tokens, (n_heads + 2 n_heads_kv) * head_dim] with token stride qkv_stride
// (heads contiguous); q_out bf16 [n_tokens, n_heads, head_dim] with token stride q_out_stride;
// caches bf16 [n_blocks, block_size, n_heads_kv, head_dim]; token_seq, token_pos, block_tables
// int32 and inv_freq f32 are device arrays. Pairs are (i, i + rotary_dim/2) in neox style and
// (2i, 2i + 1) otherwise; dims past rotary_dim (and all of v) are only rounded.
//
// NOTE: the slot of a token (block table lookup) is device data, so it is checked here and not
// on the host (that would need a sync, which a CUDA graph forbids): a token whose sequence,
// position or block is invalid writes nothing to the cache, as in the twin; its q row is still
// written. No allocation or sync anywhere: the launch can be captured in a CUDA graph.
//
// Angles: as rope.cu, the cos/sin table of the token's position is built in double (position *
// inv_freq is exact in double and reaches 1e5 radians, where an f32 angle is off by ~1e-2) and
// rounded to f32, which gives the twin's table except when the double sincos (2 ulp) and the
// host's straddle an f32 rounding midpoint, a ~1e-8 chance per entry. The cost is rotary_dim/2
// double sincos per token (64 for head_dim 128), spread over the block's threads: negligible in
// decode and a small part of a 16k-token prefill step, so no f32 range-reduced variant.
// The rotation uses __fmul_rn/__fsub_rn (no FMA contraction), so it rounds exactly as the twin.
//
// One block per token: its threads fill a shared cos/sin table, then (1) rotate every (head,
// pair group) of q and k, (2) round the pass-through dims [rotary_dim, head_dim) of each head,
// (3) round v into the cache.
// Variants (template parameters):
//   kNeox - the pair layout.
//   kVec  - 16-byte loads / 8-byte bf16 stores: 4 pairs per item in neox style (x[i..i+3] and
//           x[i+half..i+half+3]), 2 in GPT-J style (x[2i..2i+3]), 4 dims per pass-through and v
//           item. Used when head_dim % 4 == 0, rotary_dim % 8 (neox) or % 4 (GPT-J) == 0, the
//           strides are multiples of 4 and the pointers aligned; the scalar variant takes any
//           shape (e.g. head_dim 12 with rotary_dim 6).
#include <algorithm>
#include <cstdint>
#include <string>

#include "backends/cuda/bf16.cuh"
#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"

namespace strata::cuda {
namespace {

// Launched with PDL only for prefill-sized batches: on an H100 it took Llama-3-8B prefill 1x2048
// from 567 to 607 TFLOP/s (the kernel starts while the GEMM before it drains), while for decode
// steps PDL on the small kernels made a step slower (5.81 -> 6.63 ms at batch 1).
constexpr int64_t kPdlMinTokens = 16;

constexpr const char* kOp = "rope_kv_append";
constexpr int64_t kMaxRotaryDim = 1024;  // as rope.cu and the CPU twin
constexpr int kMaxThreads = 256;
constexpr int kVecWidth = 4;
constexpr int64_t kNormHeadsPerBlock = 4;

__device__ __forceinline__ void rotate(float& a, float& b, float c, float s) {
  const float a0 = a;
  a = __fsub_rn(__fmul_rn(a0, c), __fmul_rn(b, s));
  b = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a0, s));
}

// Cache slot of position `pos` of sequence `seq`, or -1 when the sequence, position or block is
// invalid (the twin's kv_slot).
__device__ __forceinline__ int64_t kv_slot(const PagedKvBf16Params& c, int64_t seq, int64_t pos) {
  if (seq < 0 || seq >= c.n_seqs || pos < 0 || pos / c.block_size >= c.max_blocks_per_seq) {
    return -1;
  }
  const int64_t block = c.block_tables[seq * c.max_blocks_per_seq + pos / c.block_size];
  if (block < 0 || block >= c.n_blocks) return -1;
  return block * c.block_size + pos % c.block_size;
}

template <bool kNeox, bool kVec>
__global__ void __launch_bounds__(kMaxThreads) rope_kv_append_kernel(const RopeKvAppendParams p) {
  pdl_trigger();                    // single-wave kernel: let the next (PDL) kernel start
  pdl_wait();                       // launched with PDL: qkv comes from the kernel before
  extern __shared__ float table[];  // cos [half], then sin [half]
  const PagedKvBf16Params& c = p.cache;
  const int half = static_cast<int>(p.rotary_dim / 2);
  float* cos_t = table;
  float* sin_t = table + half;
  const int64_t t = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x);
  const int n_threads = static_cast<int>(blockDim.x);
  const int d = static_cast<int>(c.head_dim);
  const int n_q = static_cast<int>(p.n_heads);
  const int n_kv = static_cast<int>(c.n_heads_kv);

  const int64_t pos = p.token_pos[t];
  const int64_t slot = kv_slot(c, p.token_seq[t], pos);
  // Heads written: all of q, then k's when the slot is valid. Head h reads qkv row offset h * d.
  const int n_rot_heads = slot >= 0 ? n_q + n_kv : n_q;
  const float* row = p.qkv + t * p.qkv_stride;
  uint16_t* q_dst = p.q_out + t * p.q_out_stride;
  uint16_t* k_dst = c.k_cache + (slot >= 0 ? slot : 0) * n_kv * d;
  uint16_t* v_dst = c.v_cache + (slot >= 0 ? slot : 0) * n_kv * d;

  if (half > 0) {
    const double pos_d = static_cast<double>(pos);
    for (int i = tid; i < half; i += n_threads) {
      double s;
      double co;
      sincos(pos_d * static_cast<double>(p.inv_freq[i]), &s, &co);
      cos_t[i] = __fmul_rn(static_cast<float>(co), p.attention_factor);
      sin_t[i] = __fmul_rn(static_cast<float>(s), p.attention_factor);
    }
    __syncthreads();
  }

  // (1) rotated dims: items of kPairs pairs.
  constexpr int kPairs = kVec ? (kNeox ? 4 : 2) : 1;
  const int items_per_head = half / kPairs;
  for (int item = tid; item < n_rot_heads * items_per_head; item += n_threads) {
    const int h = item / items_per_head;
    const int i = (item % items_per_head) * kPairs;  // first pair of this item
    const float* x = row + h * d;
    uint16_t* dst = h < n_q ? q_dst + h * d : k_dst + (h - n_q) * d;
    if constexpr (kNeox) {
      Packed<float, kPairs> a = load_packed<float, kPairs>(x + i);
      Packed<float, kPairs> b = load_packed<float, kPairs>(x + i + half);
#pragma unroll
      for (int k = 0; k < kPairs; ++k) rotate(a.v[k], b.v[k], cos_t[i + k], sin_t[i + k]);
      store_bf16<kPairs>(dst + i, a.v);
      store_bf16<kPairs>(dst + i + half, b.v);
    } else if constexpr (kVec) {
      Packed<float, 2 * kPairs> v = load_packed<float, 2 * kPairs>(x + 2 * i);
#pragma unroll
      for (int k = 0; k < kPairs; ++k) {
        rotate(v.v[2 * k], v.v[2 * k + 1], cos_t[i + k], sin_t[i + k]);
      }
      store_bf16<2 * kPairs>(dst + 2 * i, v.v);
    } else {  // odd strides: no 8-byte access
      float a = x[2 * i];
      float b = x[2 * i + 1];
      rotate(a, b, cos_t[i], sin_t[i]);
      dst[2 * i] = bf16_bits(a);
      dst[2 * i + 1] = bf16_bits(b);
    }
  }

  // (2) pass-through dims [rotary_dim, d) of each written head, and (3) v.
  constexpr int kW = kVec ? kVecWidth : 1;
  const int rot = 2 * half;
  const int pass_per_head = (d - rot) / kW;
  for (int item = tid; item < n_rot_heads * pass_per_head; item += n_threads) {
    const int h = item / pass_per_head;
    const int j = rot + (item % pass_per_head) * kW;
    uint16_t* dst = h < n_q ? q_dst + h * d : k_dst + (h - n_q) * d;
    store_bf16<kW>(dst + j, load_packed<float, kW>(row + h * d + j).v);
  }
  if (slot >= 0) {
    const float* v = row + (n_q + n_kv) * d;
    for (int j = tid * kW; j < n_kv * d; j += n_threads * kW) {
      store_bf16<kW>(v_dst + j, load_packed<float, kW>(v + j).v);
    }
  }
}

// With q/k norms (Gemma-3 and other q/k-normed families): each q head (and, when the token has a
// cache slot, each k head) is first RMS-normalised over head_dim, x * inv_rms * (w + offset), as
// the twin computes it (its sum of squares in double, here a warp's f32 sum: the same few-ulp
// caveat as norm_bf16), then rotated and rounded like the plain kernel. Scalar accesses: these
// families are small (one warp per head for the norms, one thread per pair after). A token's
// heads are split over gridDim.y blocks (each computes the cos / sin table itself).
template <bool kNeox>
__global__ void __launch_bounds__(kMaxThreads)
    rope_kv_append_norm_kernel(const RopeKvAppendParams p) {
  pdl_trigger();
  pdl_wait();
  extern __shared__ float table[];  // cos [half], sin [half], inv_rms [n_heads + n_heads_kv]
  const PagedKvBf16Params& c = p.cache;
  const int half = static_cast<int>(p.rotary_dim / 2);
  float* cos_t = table;
  float* sin_t = table + half;
  float* inv_t = table + 2 * half;
  const int64_t t = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x);
  const int n_threads = static_cast<int>(blockDim.x);
  const int d = static_cast<int>(c.head_dim);
  const int n_q = static_cast<int>(p.n_heads);
  const int n_kv = static_cast<int>(c.n_heads_kv);
  const int64_t pos = p.token_pos[t];
  const int64_t slot = kv_slot(c, p.token_seq[t], pos);
  const int n_rot_heads = slot >= 0 ? n_q + n_kv : n_q;
  const float* row = p.qkv + t * p.qkv_stride;
  uint16_t* q_dst = p.q_out + t * p.q_out_stride;
  uint16_t* k_dst = c.k_cache + (slot >= 0 ? slot : 0) * n_kv * d;
  uint16_t* v_dst = c.v_cache + (slot >= 0 ? slot : 0) * n_kv * d;
  if (half > 0) {
    const double pos_d = static_cast<double>(pos);
    for (int i = tid; i < half; i += n_threads) {
      double s;
      double co;
      sincos(pos_d * static_cast<double>(p.inv_freq[i]), &s, &co);
      cos_t[i] = __fmul_rn(static_cast<float>(co), p.attention_factor);
      sin_t[i] = __fmul_rn(static_cast<float>(s), p.attention_factor);
    }
  }
  // This block's heads [h0, h1) of the token (blockIdx.y of gridDim.y groups), and its share of v.
  const int per_block =
      (n_q + n_kv + static_cast<int>(gridDim.y) - 1) / static_cast<int>(gridDim.y);
  const int h0 = static_cast<int>(blockIdx.y) * per_block;
  const int h1 = min(n_rot_heads, h0 + per_block);
  const int n_mine = max(h1 - h0, 0);
  const int lane = tid % kWarpSize, warp = tid / kWarpSize, n_warps = n_threads / kWarpSize;
  for (int h = h0 + warp; h < h1; h += n_warps) {
    const float* w = h < n_q ? p.q_norm : p.k_norm;
    const float* x = row + h * d;
    float ss = 0.0f;
    if (w != nullptr) {
      for (int i = lane; i < d; i += kWarpSize) ss += x[i] * x[i];
    }
    ss = warp_reduce_sum(ss);
    if (lane == 0) {
      inv_t[h] =
          w != nullptr ? 1.0f / sqrtf(__fadd_rn(ss / static_cast<float>(d), p.norm_eps)) : 1.0f;
    }
  }
  __syncthreads();
  // Element j of head h after its norm (f32, as the twin: (x * inv) * (w + offset)).
  auto value = [&](int h, int j) {
    const float* w = h < n_q ? p.q_norm : p.k_norm;
    const float x = row[h * d + j];
    return w != nullptr ? __fmul_rn(__fmul_rn(x, inv_t[h]), __fadd_rn(w[j], p.norm_weight_offset))
                        : x;
  };
  for (int item = tid; item < n_mine * half; item += n_threads) {
    const int h = h0 + item / half;
    const int i = item % half;
    const int ia = kNeox ? i : 2 * i;
    const int ib = kNeox ? i + half : 2 * i + 1;
    float a = value(h, ia);
    float b = value(h, ib);
    rotate(a, b, cos_t[i], sin_t[i]);
    uint16_t* dst = h < n_q ? q_dst + h * d : k_dst + (h - n_q) * d;
    dst[ia] = bf16_bits(a);
    dst[ib] = bf16_bits(b);
  }
  const int rot = 2 * half;
  for (int item = tid; item < n_mine * (d - rot); item += n_threads) {
    const int h = h0 + item / (d - rot);
    const int j = rot + item % (d - rot);
    uint16_t* dst = h < n_q ? q_dst + h * d : k_dst + (h - n_q) * d;
    dst[j] = bf16_bits(value(h, j));
  }
  if (slot >= 0) {
    const float* v = row + (n_q + n_kv) * d;
    const int chunk = (n_kv * d + static_cast<int>(gridDim.y) - 1) / static_cast<int>(gridDim.y);
    const int j1 = min(n_kv * d, (static_cast<int>(blockIdx.y) + 1) * chunk);
    for (int j = static_cast<int>(blockIdx.y) * chunk + tid; j < j1; j += n_threads) {
      v_dst[j] = bf16_bits(v[j]);
    }
  }
}

Status check_params(const RopeKvAppendParams& p) {
  const PagedKvBf16Params& c = p.cache;
  if (c.n_seqs <= 0 || c.n_blocks <= 0 || c.block_size <= 0 || c.max_blocks_per_seq <= 0 ||
      c.n_heads_kv <= 0 || c.head_dim <= 0) {
    return invalid_argument(kOp, "cache sizes (n_seqs " + std::to_string(c.n_seqs) + ", n_blocks " +
                                     std::to_string(c.n_blocks) + ", block_size " +
                                     std::to_string(c.block_size) + ", max_blocks_per_seq " +
                                     std::to_string(c.max_blocks_per_seq) + ", n_heads_kv " +
                                     std::to_string(c.n_heads_kv) + ", head_dim " +
                                     std::to_string(c.head_dim) + ") must be positive");
  }
  if (c.k_cache == nullptr || c.v_cache == nullptr || c.block_tables == nullptr) {
    return invalid_argument(kOp, "null k_cache, v_cache or block_tables");
  }
  // The kernel indexes a token's row with int: all heads of q, k and v must fit.
  if (p.n_heads <= 0 || (p.n_heads + 2 * c.n_heads_kv) * c.head_dim > INT32_MAX) {
    return invalid_argument(kOp, "n_heads " + std::to_string(p.n_heads) + " out of range");
  }
  if (p.rotary_dim < 0 || p.rotary_dim % 2 != 0 || p.rotary_dim > c.head_dim ||
      p.rotary_dim > kMaxRotaryDim) {
    return invalid_argument(
        kOp, "rotary_dim " + std::to_string(p.rotary_dim) + " must be even, in [0, head_dim " +
                 std::to_string(c.head_dim) + "] and <= " + std::to_string(kMaxRotaryDim));
  }
  if (p.n_tokens < 0 || p.n_tokens > INT32_MAX) {
    return invalid_argument(kOp, "n_tokens " + std::to_string(p.n_tokens) + " outside [0, 2^31)");
  }
  const int64_t row = (p.n_heads + 2 * c.n_heads_kv) * c.head_dim;
  if (p.qkv_stride < row) {
    return invalid_argument(kOp, "qkv_stride " + std::to_string(p.qkv_stride) +
                                     " smaller than the q, k and v heads (" + std::to_string(row) +
                                     ")");
  }
  if (p.q_out_stride < p.n_heads * c.head_dim) {
    return invalid_argument(kOp, "q_out_stride " + std::to_string(p.q_out_stride) +
                                     " smaller than n_heads * head_dim (" +
                                     std::to_string(p.n_heads * c.head_dim) + ")");
  }
  if (p.n_tokens > 0 && (p.qkv == nullptr || p.q_out == nullptr || p.token_seq == nullptr ||
                         p.token_pos == nullptr)) {
    return invalid_argument(kOp, "null qkv, q_out, token_seq or token_pos");
  }
  if (p.n_tokens > 0 && p.rotary_dim > 0 && p.inv_freq == nullptr) {
    return invalid_argument(kOp, "null inv_freq with rotary_dim " + std::to_string(p.rotary_dim));
  }
  return ok_status();
}

template <bool kNeox>
Status launch(const LaunchCtx& ctx, const RopeKvAppendParams& p) {
  const PagedKvBf16Params& c = p.cache;
  const int64_t half = p.rotary_dim / 2;
  const int64_t pairs = kNeox ? 4 : 2;  // pairs per vector item
  const bool vec = c.head_dim % kVecWidth == 0 && half % pairs == 0 &&
                   p.qkv_stride % kVecWidth == 0 && p.q_out_stride % kVecWidth == 0 &&
                   is_aligned(p.qkv, 16) && is_aligned(p.q_out, 8) && is_aligned(c.k_cache, 8) &&
                   is_aligned(c.v_cache, 8);
  // Enough threads for the larger of the rotation items and the v items, in whole warps.
  const int64_t heads = p.n_heads + c.n_heads_kv;
  const int64_t rot_items = heads * (vec ? half / pairs : half);
  const int64_t v_items = c.n_heads_kv * c.head_dim / (vec ? kVecWidth : 1);
  const int threads = static_cast<int>(std::min<int64_t>(
      kMaxThreads, round_up<int64_t>(std::max({rot_items, v_items, half}), kWarpSize)));
  const size_t smem = static_cast<size_t>(p.rotary_dim) * sizeof(float);
  const dim3 grid(static_cast<unsigned>(p.n_tokens));
  if (vec) {
    (void)launch_pdl(ctx, p.n_tokens > kPdlMinTokens, rope_kv_append_kernel<kNeox, true>, grid,
                     dim3(threads), smem, p);
  } else {
    (void)launch_pdl(ctx, p.n_tokens > kPdlMinTokens, rope_kv_append_kernel<kNeox, false>, grid,
                     dim3(threads), smem, p);
  }
  return kernel_launch_status("rope_kv_append_kernel");
}

}  // namespace

Status rope_kv_append(const LaunchCtx& ctx, const RopeKvAppendParams& p) {
  STRATA_RETURN_IF_ERROR(check_params(p));
  if (p.n_tokens == 0) return ok_status();
  if (p.q_norm != nullptr || p.k_norm != nullptr) {
    const PagedKvBf16Params& c = p.cache;
    const int threads = kMaxThreads;
    const size_t smem =
        static_cast<size_t>(p.rotary_dim + p.n_heads + c.n_heads_kv) * sizeof(float);
    if (smem > 48 * 1024) {
      return invalid_argument(kOp, "too many heads for the q/k-norm kernel's shared table");
    }
    // kNormHeadsPerBlock heads per block: a decode token's 30-40 heads spread over ~10 SMs
    // instead of one block walking them all.
    const int64_t groups = ceil_div<int64_t>(p.n_heads + c.n_heads_kv, kNormHeadsPerBlock);
    const dim3 grid(static_cast<unsigned>(p.n_tokens), static_cast<unsigned>(groups));
    const bool pdl = p.n_tokens > kPdlMinTokens;
    if (p.neox_style) {
      (void)launch_pdl(ctx, pdl, rope_kv_append_norm_kernel<true>, grid, dim3(threads), smem, p);
    } else {
      (void)launch_pdl(ctx, pdl, rope_kv_append_norm_kernel<false>, grid, dim3(threads), smem, p);
    }
    return kernel_launch_status("rope_kv_append_norm_kernel");
  }
  return p.neox_style ? launch<true>(ctx, p) : launch<false>(ctx, p);
}

}  // namespace strata::cuda
