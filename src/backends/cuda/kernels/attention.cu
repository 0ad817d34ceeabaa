// Causal attention over the paged KV cache: each token t (sequence token_seq[t], position
// token_pos[t]) and query head h attends to its sequence's cached positions
// [max(0, p - sliding_window + 1), p] of KV head h / (n_heads / n_heads_kv) (GQA/MQA). Scores
// s = scale * q.k, then logit_softcap * tanh(s / logit_softcap) when logit_softcap > 0; softmax in
// f32 with a running max. CPU twin: src/backends/cpu/attention.cpp (same AttentionKernelParams).
// Prefill, chunked prefill and decode tokens of different sequences mix freely in one call.
//
// Layout: q, out f32 [n_tokens, n_heads, head_dim] with token strides q_stride / out_stride; caches
// f32 [n_blocks, block_size, n_heads_kv, head_dim] contiguous; position p of sequence s lives in
// block block_tables[s * max_blocks_per_seq + p / block_size], slot p % block_size.
//
// The simple, correct version: one block of kWarps warps per (token, query head). Warp w takes
// positions lo + w, lo + w + kWarps, ...: the warp's lanes split head_dim, one warp-shuffle sum
// gives the score, and each warp keeps its own online softmax (max m, sum l, accumulator in
// registers). At the end the warps' states are merged through shared memory. Query heads of a
// GQA group each re-read their KV head and decode uses only n_heads blocks per token: the fast
// version (FlashAttention-style tiles for prefill, split-K for decode) comes later.
//
// NOTE: the CPU twin checks every block a token reads and returns kOutOfRange. The tables are
// device data here (reading them would need a host sync, which a CUDA graph forbids), so each
// block checks its own token's blocks and writes a NaN output row when one is invalid.
//
// Variants (template parameters):
//   kVec - lanes own 4 consecutive dims (16-byte loads of q, K and V rows) when head_dim is a
//          multiple of 4 and the pointers and q_stride allow it; otherwise lane owns dims lane,
//          lane + 32, ... (scalar loads), for head_dims like 12 or 66.
#include <algorithm>
#include <cstdint>
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"

namespace strata::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kMaxHeadDim = 256;
constexpr int kPerLane = kMaxHeadDim / kWarpSize;  // head dims a lane owns at most

// The head dim that lane `lane` holds in register slot j.
template <bool kVec>
__device__ __forceinline__ int lane_dim(int lane, int j) {
  return kVec ? (j / 4) * (4 * kWarpSize) + 4 * lane + j % 4 : lane + kWarpSize * j;
}

// The lane's dims of a head_dim row into r[] (zeros past head_dim).
template <bool kVec>
__device__ __forceinline__ void load_row(const float* row, int lane, int hd, float (&r)[kPerLane]) {
  if constexpr (kVec) {
#pragma unroll
    for (int j = 0; j < kPerLane; j += 4) {
      const int d = lane_dim<true>(lane, j);
      Packed<float, 4> v{};
      if (d < hd) v = load_packed<float, 4>(row + d);
#pragma unroll
      for (int k = 0; k < 4; ++k) r[j + k] = v.v[k];
    }
  } else {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int d = lane_dim<false>(lane, j);
      r[j] = d < hd ? row[d] : 0.0f;
    }
  }
}

template <bool kVec>
__global__ void __launch_bounds__(kThreads) attention_kernel(const AttentionKernelParams p) {
  __shared__ float s_m[kWarps];
  __shared__ float s_l[kWarps];
  __shared__ float s_acc[kWarps][kMaxHeadDim];
  const PagedKvParams& c = p.cache;
  const int64_t t = blockIdx.x;
  const int64_t h = blockIdx.y;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int hd = static_cast<int>(c.head_dim);
  float* out = p.out + t * p.out_stride + h * hd;  // [head_dim]

  const int64_t seq = p.token_seq[t];
  const int64_t pos = p.token_pos[t];
  const int64_t lo = p.sliding_window > 0 ? max(int64_t{0}, pos - p.sliding_window + 1) : 0;
  int bad = seq < 0 || seq >= c.n_seqs || pos < 0 || pos / c.block_size >= c.max_blocks_per_seq;
  const int32_t* table = c.block_tables + (bad ? 0 : seq * c.max_blocks_per_seq);
  if (!bad) {
    for (int64_t b = lo / c.block_size + tid; b <= pos / c.block_size; b += kThreads) {
      if (table[b] < 0 || table[b] >= c.n_blocks) bad = 1;
    }
  }
  if (__syncthreads_or(bad)) {
    for (int d = tid; d < hd; d += kThreads) out[d] = __int_as_float(0x7fc00000);
    return;
  }

  const int64_t kv_head = h / (p.n_heads / c.n_heads_kv);
  const int64_t slot_stride = c.n_heads_kv * hd;  // floats between consecutive slots
  const bool capped = p.logit_softcap > 0.0f;
  const float inv_cap = capped ? 1.0f / p.logit_softcap : 0.0f;

  float q[kPerLane];
  load_row<kVec>(p.q + t * p.q_stride + h * hd, lane, hd, q);
  float acc[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) acc[j] = 0.0f;
  float m = -INFINITY;
  float l = 0.0f;

  for (int64_t j = lo + warp; j <= pos; j += kWarps) {
    const int64_t slot = int64_t{table[j / c.block_size]} * c.block_size + j % c.block_size;
    const int64_t offset = slot * slot_stride + kv_head * hd;
    float r[kPerLane];
    load_row<kVec>(c.k_cache + offset, lane, hd, r);
    float part = 0.0f;
#pragma unroll
    for (int d = 0; d < kPerLane; ++d) part += q[d] * r[d];
    float s = warp_reduce_sum(part) * p.scale;
    if (capped) s = p.logit_softcap * tanhf(s * inv_cap);
    const float m_new = fmaxf(m, s);
    const float rescale = expf(m - m_new);  // 0 on the first position (m = -inf)
    const float w = expf(s - m_new);
    l = l * rescale + w;
    m = m_new;
    load_row<kVec>(c.v_cache + offset, lane, hd, r);
#pragma unroll
    for (int d = 0; d < kPerLane; ++d) acc[d] = acc[d] * rescale + w * r[d];
  }

  // Merge the warps' (m, l, acc): a warp that saw no position has m = -inf and weight 0.
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int d = lane_dim<kVec>(lane, j);
    if (d < hd) s_acc[warp][d] = acc[j];
  }
  if (lane == 0) {
    s_m[warp] = m;
    s_l[warp] = l;
  }
  __syncthreads();
  float m_all = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, s_m[w]);
  float weight[kWarps];
  float l_all = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    weight[w] = expf(s_m[w] - m_all);
    l_all += s_l[w] * weight[w];
  }
  const float inv_l = 1.0f / l_all;
  for (int d = tid; d < hd; d += kThreads) {
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o += s_acc[w][d] * weight[w];
    out[d] = o * inv_l;
  }
}

Status check_params(const AttentionKernelParams& p) {
  const PagedKvParams& c = p.cache;
  STRATA_RETURN_IF_ERROR(check_paged_kv("attention", c));
  if (c.head_dim > kMaxHeadDim) {
    return Status(StatusCode::kUnimplemented, "attention: head_dim " + std::to_string(c.head_dim) +
                                                  " exceeds " + std::to_string(kMaxHeadDim));
  }
  if (p.n_heads <= 0 || p.n_heads > 65535 || p.n_heads % c.n_heads_kv != 0) {
    return invalid_argument("attention",
                            "n_heads " + std::to_string(p.n_heads) +
                                " must be in [1, 65535] and a multiple of n_heads_kv " +
                                std::to_string(c.n_heads_kv));
  }
  const int64_t row = p.n_heads * c.head_dim;
  STRATA_RETURN_IF_ERROR(check_matrix("attention", "q", p.q, p.n_tokens, row, p.q_stride));
  STRATA_RETURN_IF_ERROR(check_matrix("attention", "out", p.out, p.n_tokens, row, p.out_stride));
  if (p.n_tokens > 0 && (p.token_seq == nullptr || p.token_pos == nullptr)) {
    return invalid_argument("attention", "null token_seq or token_pos");
  }
  if (p.sliding_window < 0 || p.logit_softcap < 0.0f) {
    return invalid_argument(
        "attention", "sliding_window " + std::to_string(p.sliding_window) + " and logit_softcap " +
                         std::to_string(p.logit_softcap) + " must not be negative");
  }
  return ok_status();
}

}  // namespace

Status attention(const LaunchCtx& ctx, const AttentionKernelParams& p) {
  STRATA_RETURN_IF_ERROR(check_params(p));
  if (p.n_tokens == 0) return ok_status();
  const PagedKvParams& c = p.cache;
  const bool vec = c.head_dim % 4 == 0 && p.q_stride % 4 == 0 && is_aligned(p.q, 16) &&
                   is_aligned(c.k_cache, 16) && is_aligned(c.v_cache, 16);
  const dim3 grid(static_cast<unsigned>(p.n_tokens), static_cast<unsigned>(p.n_heads));
  if (vec) {
    attention_kernel<true><<<grid, kThreads, 0, ctx.stream>>>(p);
  } else {
    attention_kernel<false><<<grid, kThreads, 0, ctx.stream>>>(p);
  }
  return kernel_launch_status("attention_kernel");
}

}  // namespace strata::cuda
