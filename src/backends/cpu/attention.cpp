// Causal attention over the paged KV cache on the CPU, one (token, query head) pair per OpenMP
// iteration. Each pair walks its sequence's cached positions [lo, p] a run of slots at a time
// (a run never crosses a cache block, so its K/V rows are contiguous): scores for the run,
// then one online-softmax update (running max m, running sum l, rescaled accumulator), so the
// cost is one pass over K and V and the memory is O(head_dim) whatever the context length.
//
// NOTE: query heads of one GQA group each re-read their KV head; grouping them would save
// cache traffic on long contexts, but decode attention is small next to the linears on a CPU.
#include <algorithm>
#include <cmath>
#include <limits>

#include "backends/cpu/cpu_kernels.h"
#include "core/status.h"

namespace strata::cpu {
namespace {

constexpr int64_t kRun = 64;           // scores held at once
constexpr int64_t kMaxHeadDim = 1024;  // accumulator on the stack

}  // namespace

Status attention(const AttentionKernelParams& p) {
  const PagedKvParams& c = p.cache;
  if (c.head_dim > kMaxHeadDim) {
    return errorf(StatusCode::kUnimplemented, "attention: head_dim {} exceeds {}", c.head_dim,
                  kMaxHeadDim);
  }
  // Every block a token will read must exist: check them before the parallel part.
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    const int64_t seq = p.token_seq[t];
    const int64_t pos = p.token_pos[t];
    const int64_t lo = p.sliding_window > 0 ? std::max<int64_t>(0, pos - p.sliding_window + 1) : 0;
    STRATA_RETURN_IF_ERROR(check_kv_slot(c, "attention", t, seq, pos));
    for (int64_t q = lo; q < pos; q += c.block_size - q % c.block_size) {
      STRATA_RETURN_IF_ERROR(check_kv_slot(c, "attention", t, seq, q));
    }
  }
  const int64_t group = p.n_heads / c.n_heads_kv;
  const int64_t hd = c.head_dim;
  const int64_t slot_stride = c.n_heads_kv * hd;  // floats between consecutive slots
  const bool capped = p.logit_softcap > 0.0f;
  const float inv_cap = capped ? 1.0f / p.logit_softcap : 0.0f;

#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    for (int64_t h = 0; h < p.n_heads; ++h) {
      const float* q = p.q + t * p.q_stride + h * hd;
      float* out = p.out + t * p.out_stride + h * hd;
      const int64_t kv_head = h / group;
      const int64_t seq = p.token_seq[t];
      const int64_t pos = p.token_pos[t];
      const int64_t lo =
          p.sliding_window > 0 ? std::max<int64_t>(0, pos - p.sliding_window + 1) : 0;
      const int32_t* table = c.block_tables + seq * c.max_blocks_per_seq;

      float acc[kMaxHeadDim];
      float scores[kRun];
      for (int64_t d = 0; d < hd; ++d) acc[d] = 0.0f;
      float m = -std::numeric_limits<float>::infinity();
      double l = 0.0;

      for (int64_t start = lo; start <= pos;) {
        const int64_t in_block = start % c.block_size;
        const int64_t len = std::min({kRun, c.block_size - in_block, pos + 1 - start});
        const int64_t slot0 =
            static_cast<int64_t>(table[start / c.block_size]) * c.block_size + in_block;
        const float* k = c.k_cache + slot0 * slot_stride + kv_head * hd;
        const float* v = c.v_cache + slot0 * slot_stride + kv_head * hd;

        float run_max = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < len; ++j) {
          const float* kj = k + j * slot_stride;
          float s = 0.0f;
#pragma omp simd reduction(+ : s)
          for (int64_t d = 0; d < hd; ++d) s += q[d] * kj[d];
          s *= p.scale;
          if (capped) s = p.logit_softcap * std::tanh(s * inv_cap);
          scores[j] = s;
          run_max = std::max(run_max, s);
        }
        if (run_max > m) {  // rescale what was accumulated under the old max
          const float r = std::exp(m - run_max);
          l *= r;
#pragma omp simd
          for (int64_t d = 0; d < hd; ++d) acc[d] *= r;
          m = run_max;
        }
        for (int64_t j = 0; j < len; ++j) {
          const float w = std::exp(scores[j] - m);
          const float* vj = v + j * slot_stride;
          l += w;
#pragma omp simd
          for (int64_t d = 0; d < hd; ++d) acc[d] += w * vj[d];
        }
        start += len;
      }
      const float inv_l = static_cast<float>(1.0 / l);
      for (int64_t d = 0; d < hd; ++d) out[d] = acc[d] * inv_l;
    }
  }
  return ok_status();
}

}  // namespace strata::cpu
