// CPU twin of cuda::varlen_attention: causal attention over a bf16 paged KV cache in the
// variable-length layout (VarlenAttentionParams). A plain loop over (query token, query head):
// q and each K/V row are widened from bf16 to f32, the scores of the token's window go to a
// buffer, then a two-pass softmax (max, then exp and sum) and the weighted sum of V in f32; the
// output is rounded to bf16 once. The CUDA kernels round the softmax weights to bf16 before the
// P.V product (tensor-core inputs) and use exp2f on log2e-scaled scores, so they match this twin
// to bf16 precision, not bit for bit.
//
// Unlike the CUDA launchers, the twin can read cu_q, kv_len and the block tables, so it checks
// them all before computing: a cu_q that decreases, a sequence with more queries than cached
// positions or beyond the max_q_len / max_kv_len bounds is kInvalidArgument; a position whose
// block is past the block table or outside the pool is kOutOfRange.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "core/half.h"
#include "core/status.h"

namespace strata::cpu {
namespace {

constexpr const char* kOp = "varlen_attention";

Status check_shapes(const VarlenAttentionParams& p) {
  const PagedKvBf16Params& c = p.cache;
  if (c.n_heads_kv <= 0 || c.head_dim <= 0 || c.block_size <= 0 || c.n_blocks < 0 ||
      c.max_blocks_per_seq < 0) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: cache n_heads_kv {}, head_dim {}, block_size {} must be positive and "
                  "n_blocks {}, max_blocks_per_seq {} not negative",
                  kOp, c.n_heads_kv, c.head_dim, c.block_size, c.n_blocks, c.max_blocks_per_seq);
  }
  if (p.n_heads <= 0 || p.n_heads % c.n_heads_kv != 0) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: n_heads {} must be a positive multiple of n_heads_kv {}", kOp, p.n_heads,
                  c.n_heads_kv);
  }
  if (p.n_seqs < 0 || p.n_seqs != c.n_seqs) {
    return errorf(StatusCode::kInvalidArgument, "{}: n_seqs {} must equal cache.n_seqs {}", kOp,
                  p.n_seqs, c.n_seqs);
  }
  if (p.max_q_len < 0 || p.max_kv_len < 0) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: max_q_len {} and max_kv_len {} must not be "
                  "negative",
                  kOp, p.max_q_len, p.max_kv_len);
  }
  const int64_t row = p.n_heads * c.head_dim;
  if (p.q_stride < row || p.out_stride < row) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: q_stride {} and out_stride {} must be at least n_heads * head_dim = {}", kOp,
                  p.q_stride, p.out_stride, row);
  }
  if (!(p.scale > 0.0f) || !std::isfinite(p.scale)) {
    // The CUDA kernels track the running max of unscaled scores, which needs scale > 0.
    return errorf(StatusCode::kInvalidArgument, "{}: scale {} must be positive and finite", kOp,
                  p.scale);
  }
  if (p.sliding_window < 0 || !(p.logit_softcap >= 0.0f)) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: sliding_window {} and logit_softcap {} must not be negative", kOp,
                  p.sliding_window, p.logit_softcap);
  }
  if (p.n_seqs > 0 && (p.cu_q == nullptr || p.kv_len == nullptr)) {
    return errorf(StatusCode::kInvalidArgument, "{}: null cu_q or kv_len", kOp);
  }
  return ok_status();
}

// The first position query j (at position pos) attends to.
int64_t window_start(int64_t pos, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
}

// cu_q and kv_len against each other and the bounds, then every block a query will read.
Status check_sequences(const VarlenAttentionParams& p) {
  const PagedKvBf16Params& c = p.cache;
  if (p.cu_q[0] != 0) {
    return errorf(StatusCode::kInvalidArgument, "{}: cu_q[0] is {}, not 0", kOp, p.cu_q[0]);
  }
  for (int64_t s = 0; s < p.n_seqs; ++s) {
    const int64_t n_q = int64_t{p.cu_q[s + 1]} - p.cu_q[s];
    const int64_t kv = p.kv_len[s];
    if (n_q < 0) {
      return errorf(StatusCode::kInvalidArgument,
                    "{}: cu_q decreases: cu_q[{}] = {} < cu_q[{}] = {}", kOp, s + 1, p.cu_q[s + 1],
                    s, p.cu_q[s]);
    }
    if (n_q > p.max_q_len || kv < 0 || kv > p.max_kv_len) {
      return errorf(StatusCode::kInvalidArgument,
                    "{}: sequence {} has {} queries and kv_len {}, outside the bounds max_q_len {} "
                    "and max_kv_len {}",
                    kOp, s, n_q, kv, p.max_q_len, p.max_kv_len);
    }
    if (n_q > kv) {
      return errorf(StatusCode::kInvalidArgument,
                    "{}: sequence {} has {} queries but only kv_len {} cached positions", kOp, s,
                    n_q, kv);
    }
  }
  const int64_t n_tokens = p.cu_q[p.n_seqs];
  if (n_tokens > 0 && (p.q == nullptr || p.out == nullptr || c.k_cache == nullptr ||
                       c.v_cache == nullptr || c.block_tables == nullptr)) {
    return errorf(StatusCode::kInvalidArgument, "{}: null q, out, cache or block table", kOp);
  }
  for (int64_t s = 0; s < p.n_seqs; ++s) {
    const int64_t n_q = int64_t{p.cu_q[s + 1]} - p.cu_q[s];
    if (n_q == 0) continue;
    const int64_t kv = p.kv_len[s];
    const int64_t lo = window_start(kv - n_q, p.sliding_window);
    for (int64_t b = lo / c.block_size; b <= (kv - 1) / c.block_size; ++b) {
      if (b >= c.max_blocks_per_seq) {
        return errorf(StatusCode::kOutOfRange,
                      "{}: sequence {} (kv_len {}) needs block {} but the block table holds {} "
                      "blocks of {}",
                      kOp, s, kv, b, c.max_blocks_per_seq, c.block_size);
      }
      const int64_t block = c.block_tables[s * c.max_blocks_per_seq + b];
      if (block < 0 || block >= c.n_blocks) {
        return errorf(StatusCode::kOutOfRange,
                      "{}: sequence {} block {} maps to pool block {} outside [0, {})", kOp, s, b,
                      block, c.n_blocks);
      }
    }
  }
  return ok_status();
}

}  // namespace

Status varlen_attention(const VarlenAttentionParams& p) {
  STRATA_RETURN_IF_ERROR(check_shapes(p));
  if (p.n_seqs == 0) return ok_status();
  STRATA_RETURN_IF_ERROR(check_sequences(p));
  const PagedKvBf16Params& c = p.cache;
  const int64_t n_tokens = p.cu_q[p.n_seqs];
  std::vector<int32_t> token_seq(static_cast<size_t>(n_tokens));
  for (int64_t s = 0; s < p.n_seqs; ++s) {
    for (int64_t t = p.cu_q[s]; t < p.cu_q[s + 1]; ++t) token_seq[t] = static_cast<int32_t>(s);
  }
  const int64_t hd = c.head_dim;
  const int64_t group = p.n_heads / c.n_heads_kv;
  const int64_t slot_stride = c.n_heads_kv * hd;  // elements between consecutive cache slots
  const bool capped = p.logit_softcap > 0.0f;

#pragma omp parallel
  {
    std::vector<float> q(static_cast<size_t>(hd));
    std::vector<float> acc(static_cast<size_t>(hd));
    std::vector<float> scores;
#pragma omp for collapse(2) schedule(dynamic, 4)
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t h = 0; h < p.n_heads; ++h) {
        const int64_t s = token_seq[t];
        const int64_t n_q = int64_t{p.cu_q[s + 1]} - p.cu_q[s];
        const int64_t pos = p.kv_len[s] - n_q + (t - p.cu_q[s]);
        const int64_t lo = window_start(pos, p.sliding_window);
        const int32_t* table = c.block_tables + s * c.max_blocks_per_seq;
        const int64_t head_offset = (h / group) * hd;
        auto slot_row = [&](int64_t j) {
          return (int64_t{table[j / c.block_size]} * c.block_size + j % c.block_size) *
                     slot_stride +
                 head_offset;
        };

        const uint16_t* qh = p.q + t * p.q_stride + h * hd;
        for (int64_t d = 0; d < hd; ++d) q[d] = bf16_to_f32(qh[d]);
        scores.resize(static_cast<size_t>(pos + 1 - lo));
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = lo; j <= pos; ++j) {
          const uint16_t* k = c.k_cache + slot_row(j);
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t d = 0; d < hd; ++d) dot += q[d] * bf16_to_f32(k[d]);
          float sc = dot * p.scale;
          if (capped) sc = p.logit_softcap * std::tanh(sc / p.logit_softcap);
          scores[j - lo] = sc;
          m = std::max(m, sc);
        }
        double l = 0.0;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = lo; j <= pos; ++j) {
          const float w = std::exp(scores[j - lo] - m);
          l += w;
          const uint16_t* v = c.v_cache + slot_row(j);
#pragma omp simd
          for (int64_t d = 0; d < hd; ++d) acc[d] += w * bf16_to_f32(v[d]);
        }
        uint16_t* out = p.out + t * p.out_stride + h * hd;
        const float inv_l = static_cast<float>(1.0 / l);
        for (int64_t d = 0; d < hd; ++d) out[d] = f32_to_bf16(acc[d] * inv_l);
      }
    }
  }
  return ok_status();
}

}  // namespace strata::cpu
