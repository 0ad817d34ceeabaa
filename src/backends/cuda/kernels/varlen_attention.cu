// varlen_attention: picks the kernel for a VarlenAttentionParams batch (CPU twin
// src/backends/cpu/varlen_attention.cpp): flash_decode (split-K) when every sequence has at
// most kDecodeMaxQ queries, flash_prefill (tensor-core tiles) otherwise. Both fall back to the
// generic kernel here for head dims other than 64 and 128 (the small test models have 12, 16,
// 24) or unaligned arguments. Also the host-side argument checks the three entry points share.
//
// The generic kernel: one warp per (query, head), 4 warps (4 heads) per block; grid
// (max_q_len, ceil(n_heads / 4), n_seqs), queries past a sequence's count exit at once. Lanes
// split head_dim (dims lane, lane + 32, ...: any head_dim <= 256, scalar bf16 loads), one warp
// sum per key, online softmax in f32. Correct and simple, not fast: each query head re-reads its
// KV head.
#include <cmath>
#include <cstdint>
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/kernels/flash_common.cuh"

namespace strata::cuda {
namespace {

using namespace flash;

constexpr int kMaxHeadDim = 256;
constexpr int kPerLane = kMaxHeadDim / kWarpSize;
constexpr int kGenericWarps = 4;
constexpr int64_t kDecodeMaxQ = 4;  // most queries per sequence that varlen_attention decodes

__global__ void __launch_bounds__(kGenericWarps* kWarpSize)
    varlen_generic_kernel(const __grid_constant__ VarlenAttentionParams p) {
  pdl_trigger();
  const PagedKvBf16Params& c = p.cache;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int h =
      static_cast<int>(blockIdx.y) * kGenericWarps + static_cast<int>(threadIdx.x) / kWarpSize;
  const int j = static_cast<int>(blockIdx.x);
  const int s = static_cast<int>(blockIdx.z);
  if (h >= p.n_heads) return;
  const SeqView sv = seq_view(p, s);
  if (j >= sv.n_q) return;
  const int hd = static_cast<int>(c.head_dim);
  uint16_t* out = p.out + int64_t{sv.q0 + j} * p.out_stride + int64_t{h} * hd;
  const int pos = sv.kv_len - sv.n_q + j;
  const int lo = window_start(pos, p.sliding_window);
  const int32_t* table = c.block_tables + int64_t{s} * c.max_blocks_per_seq;
  bool bad = sv.bad;
  // Every block the query reads, checked before any is read (a warp-uniform answer).
  for (int b = lo / static_cast<int>(c.block_size) + lane; !bad && b <= pos / c.block_size;
       b += kWarpSize) {
    if (kv_slot(c, table, b * static_cast<int>(c.block_size)) < 0) bad = true;
  }
  if (__any_sync(0xffffffffu, bad)) {
    for (int d = lane; d < hd; d += kWarpSize) out[d] = bf16_nan();
    return;
  }

  const int64_t kv_head = h / (p.n_heads / c.n_heads_kv);
  const int64_t slot_stride = c.n_heads_kv * hd;
  const uint16_t* q = p.q + int64_t{sv.q0 + j} * p.q_stride + int64_t{h} * hd;
  const bool capped = p.logit_softcap > 0.0f;
  float qr[kPerLane];
  float acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + i * kWarpSize;
    qr[i] = d < hd ? __bfloat162float(__ushort_as_bfloat16(q[d])) : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY;
  float l = 0.0f;
  for (int key = lo; key <= pos; ++key) {
    const int64_t row = int64_t{kv_slot(c, table, key)} * slot_stride + kv_head * hd;
    const uint16_t* k = c.k_cache + row;
    const uint16_t* v = c.v_cache + row;
    float part = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + i * kWarpSize;
      if (d < hd) part += qr[i] * __bfloat162float(__ushort_as_bfloat16(k[d]));
    }
    float sc = warp_reduce_sum(part) * p.scale;
    if (capped) sc = p.logit_softcap * tanhf(sc / p.logit_softcap);
    const float m_new = fmaxf(m, sc);
    const float rescale = expf(m - m_new);  // 0 for the first key (m = -inf)
    const float w = expf(sc - m_new);
    l = l * rescale + w;
    m = m_new;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + i * kWarpSize;
      const float vd = d < hd ? __bfloat162float(__ushort_as_bfloat16(v[d])) : 0.0f;
      acc[i] = acc[i] * rescale + w * vd;
    }
  }
  const float inv_l = 1.0f / l;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + i * kWarpSize;
    if (d < hd) out[d] = __bfloat16_as_ushort(__float2bfloat16_rn(acc[i] * inv_l));
  }
}

}  // namespace

Status check_varlen(const char* op, const VarlenAttentionParams& p) {
  const PagedKvBf16Params& c = p.cache;
  if (c.n_heads_kv <= 0 || c.head_dim <= 0 || c.block_size <= 0 || c.n_blocks < 0 ||
      c.max_blocks_per_seq < 0) {
    return invalid_argument(
        op, "cache n_heads_kv " + std::to_string(c.n_heads_kv) + ", head_dim " +
                std::to_string(c.head_dim) + ", block_size " + std::to_string(c.block_size) +
                " must be positive and n_blocks " + std::to_string(c.n_blocks) +
                ", max_blocks_per_seq " + std::to_string(c.max_blocks_per_seq) + " not negative");
  }
  if (c.head_dim > kMaxHeadDim) {
    return Status(StatusCode::kUnimplemented, std::string(op) + ": head_dim " +
                                                  std::to_string(c.head_dim) + " exceeds " +
                                                  std::to_string(kMaxHeadDim));
  }
  if (p.n_heads <= 0 || p.n_heads % c.n_heads_kv != 0 || p.n_heads > 65535) {
    return invalid_argument(op, "n_heads " + std::to_string(p.n_heads) +
                                    " must be in [1, 65535] and a multiple of n_heads_kv " +
                                    std::to_string(c.n_heads_kv));
  }
  if (p.n_seqs < 0 || p.n_seqs > 65535 || p.n_seqs != c.n_seqs) {
    return invalid_argument(op, "n_seqs " + std::to_string(p.n_seqs) +
                                    " must be in [0, 65535] and equal cache.n_seqs " +
                                    std::to_string(c.n_seqs));
  }
  // Positions, slots (block * block_size + offset) and token indices are int32 in the kernels.
  if (p.max_q_len < 0 || p.max_kv_len < 0 || p.max_q_len > INT32_MAX / 2 ||
      p.max_kv_len > INT32_MAX / 2 || c.n_blocks * c.block_size > INT32_MAX) {
    return invalid_argument(op, "max_q_len " + std::to_string(p.max_q_len) + ", max_kv_len " +
                                    std::to_string(p.max_kv_len) + " or the pool's " +
                                    std::to_string(c.n_blocks) + " blocks of " +
                                    std::to_string(c.block_size) + " outside [0, 2^30)");
  }
  const int64_t row = p.n_heads * c.head_dim;
  if (p.q_stride < row || p.out_stride < row) {
    return invalid_argument(op,
                            "q_stride " + std::to_string(p.q_stride) + " and out_stride " +
                                std::to_string(p.out_stride) +
                                " must be at least n_heads * head_dim = " + std::to_string(row));
  }
  if (!(p.scale > 0.0f) || !std::isfinite(p.scale)) {
    // The kernels keep the running max of unscaled scores, which needs scale > 0.
    return invalid_argument(op,
                            "scale " + std::to_string(p.scale) + " must be positive and finite");
  }
  if (p.sliding_window < 0 || p.sliding_window > INT32_MAX || !(p.logit_softcap >= 0.0f)) {
    return invalid_argument(op, "sliding_window " + std::to_string(p.sliding_window) +
                                    " and logit_softcap " + std::to_string(p.logit_softcap) +
                                    " must not be negative");
  }
  if (p.n_seqs > 0 && p.max_q_len > 0 &&
      (p.q == nullptr || p.out == nullptr || p.cu_q == nullptr || p.kv_len == nullptr ||
       c.k_cache == nullptr || c.v_cache == nullptr || c.block_tables == nullptr)) {
    return invalid_argument(op, "null q, out, cu_q, kv_len, cache or block table");
  }
  return ok_status();
}

bool flash_supported(const VarlenAttentionParams& p) {
  const PagedKvBf16Params& c = p.cache;
  return (c.head_dim == 64 || c.head_dim == 128) && is_aligned(p.q, 16) && p.q_stride % 8 == 0 &&
         is_aligned(c.k_cache, 16) && is_aligned(c.v_cache, 16) && is_aligned(p.out, 4) &&
         p.out_stride % 2 == 0;
}

Status varlen_attention_generic(const LaunchCtx& ctx, const VarlenAttentionParams& p) {
  if (p.n_seqs == 0 || p.max_q_len == 0) return ok_status();
  const dim3 grid(static_cast<unsigned>(p.max_q_len),
                  static_cast<unsigned>(ceil_div<int64_t>(p.n_heads, kGenericWarps)),
                  static_cast<unsigned>(p.n_seqs));
  varlen_generic_kernel<<<grid, kGenericWarps * kWarpSize, 0, ctx.stream>>>(p);
  return kernel_launch_status("varlen_generic_kernel");
}

Status varlen_attention(const LaunchCtx& ctx, const VarlenAttentionParams& p) {
  STRATA_RETURN_IF_ERROR(check_varlen("varlen_attention", p));
  if (p.max_q_len <= kDecodeMaxQ) return flash_decode(ctx, p);
  return flash_prefill(ctx, p);
}

}  // namespace strata::cuda
