// Causal attention over the paged KV cache on the CPU. One OpenMP work item is a token, a KV
// head and a subgroup of the query heads that share it (GQA/MQA), so each K and V row is read
// once for the whole subgroup. The item walks its sequence's cached positions [lo, p] a run of
// slots at a time (a run never crosses a cache block, so its K/V rows are contiguous): scores
// for the run, then one online-softmax update per head (running max m, running sum l,
// rescaled accumulator), so the cost is one pass over K and V and the memory is O(head_dim)
// whatever the context length.
//
// NOTE: groups are split into subgroups only when there are too few items for the threads
// (a one-token decode step with one KV head); then the subgroups re-read the KV head.
#include <omp.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <limits>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/simd_math.h"
#include "backends/cpu/spin_pool.h"
#include "core/status.h"

namespace strata::cpu {
namespace {

constexpr int64_t kRun = 64;          // scores held at once per head
constexpr int64_t kMaxHeads = 8;      // query heads per work item
constexpr int64_t kMaxHeadDim = 512;  // accumulators on the stack: kMaxHeads x kMaxHeadDim

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// One work item: token t, query heads [h0, h0 + nh) of kv_head. Inlined into the two
// variants below, so its loops are vectorized for the ISA of each.
using ItemShape = AttentionItems::Shape;

// What one work item covers: query heads [h0, h0 + nh) of token t (kv_head's subgroup sub) over
// the cached positions [lo, pos].
struct ItemSpan {
  int64_t h0, nh, pos, lo;
  const float* q;        // the nh heads, hd apart
  const int32_t* table;  // the token's sequence's block table
};

inline ItemSpan item_span(const AttentionKernelParams& p, const ItemShape& sh, int64_t t,
                          int64_t kv_head, int64_t sub) {
  ItemSpan s;
  s.h0 = kv_head * sh.group + sub * sh.per;
  s.nh = std::min(sh.per, (kv_head + 1) * sh.group - s.h0);
  s.q = p.q + t * p.q_stride + s.h0 * sh.hd;
  s.pos = p.token_pos[t];
  s.lo = p.sliding_window > 0 ? std::max<int64_t>(0, s.pos - p.sliding_window + 1) : 0;
  s.table = p.cache.block_tables + p.token_seq[t] * p.cache.max_blocks_per_seq;
  return s;
}

// The run of cached positions from `start` that one pass holds: at most kRun, never past pos,
// and past the end of its cache block only while the next block lies right after it in the pool
// (as a fresh cache hands a sequence its blocks), so its K and V rows stay slot_stride apart. The
// runs depend on positions and block tables only, not on the thread count.
struct Run {
  int64_t len;
  const float* k;  // kv_head's K row of the run's first position
  const float* v;
};

inline Run run_at(const PagedKvParams& c, const ItemShape& sh, const ItemSpan& s, int64_t kv_head,
                  int64_t start) {
  const int64_t in_block = start % c.block_size;
  const int64_t end = std::min(start + kRun, s.pos + 1);
  // Through the next blocks while each lies right after the last in the pool.
  int64_t b = start / c.block_size, stop = (b + 1) * c.block_size;
  while (stop < end && s.table[b + 1] == s.table[b] + 1) {
    ++b;
    stop += c.block_size;
  }
  const int64_t len = std::min(stop, end) - start;
  const int64_t slot0 =
      static_cast<int64_t>(s.table[start / c.block_size]) * c.block_size + in_block;
  return {len, c.k_cache + slot0 * sh.slot_stride + kv_head * sh.hd,
          c.v_cache + slot0 * sh.slot_stride + kv_head * sh.hd};
}

// One head's online-softmax step over a run's scores s[0, len): the running max m and sum l move
// to include them, what acc[0, hd) accumulated under the old max is rescaled, and s becomes the
// run's weights exp(s - m). Inlined into each work item, so it is compiled for the item's ISA.
__attribute__((always_inline)) inline void softmax_run(float* s, int64_t len, float* m, double* l,
                                                       float* acc, int64_t hd) {
  float run_max = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < len; ++j) run_max = std::max(run_max, s[j]);
  if (run_max > *m) {  // rescale what was accumulated under the old max
    const float r = std::exp(*m - run_max);
    *l *= r;
#pragma omp simd
    for (int64_t d = 0; d < hd; ++d) acc[d] *= r;
    *m = run_max;
  }
  for (int64_t j = 0; j < len; ++j) {
    s[j] = std::exp(s[j] - *m);
    *l += s[j];
  }
}

__attribute__((always_inline)) inline void attention_item(const AttentionKernelParams& p,
                                                          const ItemShape& sh, int64_t t,
                                                          int64_t kv_head, int64_t sub) {
  const int64_t hd = sh.hd, slot_stride = sh.slot_stride;
  const bool capped = sh.capped;
  const float inv_cap = sh.inv_cap;
  const ItemSpan span = item_span(p, sh, t, kv_head, sub);
  const int64_t h0 = span.h0, nh = span.nh, pos = span.pos;
  const float* q = span.q;

  float acc[kMaxHeads][kMaxHeadDim];
  float scores[kMaxHeads][kRun];
  float m[kMaxHeads];
  double l[kMaxHeads];
  for (int64_t h = 0; h < nh; ++h) {
    for (int64_t d = 0; d < hd; ++d) acc[h][d] = 0.0f;
    m[h] = -std::numeric_limits<float>::infinity();
    l[h] = 0.0;
  }

  for (int64_t start = span.lo; start <= pos;) {
    const Run run = run_at(p.cache, sh, span, kv_head, start);
    const int64_t len = run.len;
    const float* k = run.k;
    const float* v = run.v;

    for (int64_t j = 0; j < len; ++j) {
      const float* kj = k + j * slot_stride;
      for (int64_t h = 0; h < nh; ++h) {
        const float* qh = q + h * hd;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t d = 0; d < hd; ++d) s += qh[d] * kj[d];
        s *= p.scale;
        if (capped) s = p.logit_softcap * std::tanh(s * inv_cap);
        scores[h][j] = s;
      }
    }
    for (int64_t h = 0; h < nh; ++h) softmax_run(scores[h], len, &m[h], &l[h], acc[h], hd);
    for (int64_t j = 0; j < len; ++j) {
      const float* vj = v + j * slot_stride;
      for (int64_t h = 0; h < nh; ++h) {
        const float w = scores[h][j];
        float* a = acc[h];
#pragma omp simd
        for (int64_t d = 0; d < hd; ++d) a[d] += w * vj[d];
      }
    }
    start += len;
  }
  for (int64_t h = 0; h < nh; ++h) {
    float* out = p.out + t * p.out_stride + (h0 + h) * hd;
    const float inv_l = static_cast<float>(1.0 / l[h]);
    for (int64_t d = 0; d < hd; ++d) out[d] = acc[h][d] * inv_l;
  }
}

// NOTE: the file is built for the baseline ISA; the AVX2 + FMA variant lets the compiler use
// 8-wide FMAs in the dot products and accumulations (picked at run time, cpu_features.cpp).
__attribute__((noinline)) void item_generic(const AttentionKernelParams& p, const ItemShape& sh,
                                            int64_t t, int64_t kv_head, int64_t sub) {
  attention_item(p, sh, t, kv_head, sub);
}

#if defined(__x86_64__)
#define STRATA_AVX2_FMA __attribute__((target("avx2,fma")))

// softmax_run with 8-wide exps (simd::exp_ps, within 2 ulp of std::exp): the run's weights are
// summed in f32 lanes, then added to the double running sum once per run.
STRATA_AVX2_FMA inline void softmax_run_avx2(float* s, int64_t len, float* m, double* l, float* acc,
                                             int64_t hd) {
  int64_t j = 0;
  __m256 vmax = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (; j + 8 <= len; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + j));
  float run_max = simd::hmax_ps(vmax);
  for (; j < len; ++j) run_max = std::max(run_max, s[j]);
  if (run_max > *m) {  // rescale what was accumulated under the old max
    const float r = std::exp(*m - run_max);
    *l *= r;
    const __m256 rv = _mm256_set1_ps(r);
    int64_t d = 0;
    for (; d + 8 <= hd; d += 8)
      _mm256_storeu_ps(acc + d, _mm256_mul_ps(rv, _mm256_loadu_ps(acc + d)));
    for (; d < hd; ++d) acc[d] *= r;
    *m = run_max;
  }
  const __m256 mv = _mm256_set1_ps(*m);
  __m256 sum = _mm256_setzero_ps();
  for (j = 0; j + 8 <= len; j += 8) {
    const __m256 e = simd::exp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
    _mm256_storeu_ps(s + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  double tail = 0.0;
  for (; j < len; ++j) {
    s[j] = std::exp(s[j] - *m);
    tail += s[j];
  }
  *l += static_cast<double>(simd::hsum_ps(sum)) + tail;
}

// Eight dot products' vectors to their eight sums (lane i: the sum of a[i]).
STRATA_AVX2_FMA inline __m256 hsum8(const __m256* a) {
  const __m256 s0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 s1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  // s0's low 128 bits hold a[0..3]'s low-half sums, its high 128 bits their high-half sums.
  return _mm256_add_ps(_mm256_permute2f128_ps(s0, s1, 0x20), _mm256_permute2f128_ps(s0, s1, 0x31));
}

// out[0, kN) += w[j] * v[j * stride + 8 c] over j < len, the kN accumulators in registers.
template <int kN>
STRATA_AVX2_FMA inline void accumulate_v(float* out, const float* scores, const float* v,
                                         int64_t stride, int64_t len) {
  __m256 o[kN];
  for (int c = 0; c < kN; ++c) o[c] = _mm256_loadu_ps(out + 8 * c);
  for (int64_t j = 0; j < len; ++j) {
    const __m256 w = _mm256_set1_ps(scores[j]);
    const float* vj = v + j * stride;
    for (int c = 0; c < kN; ++c) o[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vj + 8 * c), o[c]);
  }
  for (int c = 0; c < kN; ++c) _mm256_storeu_ps(out + 8 * c, o[c]);
}

// One run of keys for NH heads of one KV group at once (the heads' q at q, hd apart; scores,
// m, l and acc indexed by head): every K and V vector is loaded once for all NH heads.
//   Scores: KB keys per pass, NH x KB accumulators, summed across lanes eight at a time (hsum8,
//   whose order of additions is the same in every slot: a score's bits do not depend on NH, so
//   on how many heads an item holds, which attention_items picks from the thread count).
//   Values: C of the hd / 8 accumulator vectors per head in registers per pass over the keys.
// The online softmax of each head is softmax_run_avx2, as before.
template <int NH>
STRATA_AVX2_FMA void run_heads(const AttentionKernelParams& p, const ItemShape& sh, const float* q,
                               const float* k, const float* v, int64_t len, float (*scores)[kRun],
                               float* m, double* l, float (*acc)[kMaxHeadDim]) {
  constexpr int KB = NH == 1 ? 8 : NH == 2 ? 4 : NH == 3 ? 3 : 2;
  constexpr int C = NH == 1 ? 8 : NH == 4 ? 2 : 4;
  const int64_t hd = sh.hd, ss = sh.slot_stride, nvec = hd / 8;
  int64_t j = 0;
  for (; j + KB <= len; j += KB) {
    __m256 a[NH * KB];
    for (int i = 0; i < NH * KB; ++i) a[i] = _mm256_setzero_ps();
    for (int64_t v8 = 0; v8 < nvec; ++v8) {
      __m256 qv[NH];
      for (int h = 0; h < NH; ++h) qv[h] = _mm256_loadu_ps(q + h * hd + 8 * v8);
      for (int kk = 0; kk < KB; ++kk) {
        const __m256 kv = _mm256_loadu_ps(k + (j + kk) * ss + 8 * v8);
        for (int h = 0; h < NH; ++h) a[h * KB + kk] = _mm256_fmadd_ps(qv[h], kv, a[h * KB + kk]);
      }
    }
    alignas(32) float sums[(NH * KB + 7) / 8 * 8];
    for (int g = 0; g < NH * KB; g += 8) {
      __m256 blk[8];
      for (int i = 0; i < 8; ++i) blk[i] = g + i < NH * KB ? a[g + i] : _mm256_setzero_ps();
      _mm256_store_ps(sums + g, hsum8(blk));
    }
    for (int h = 0; h < NH; ++h) {
      for (int kk = 0; kk < KB; ++kk) scores[h][j + kk] = sums[h * KB + kk];
    }
  }
  for (; j < len; ++j) {  // the last len % KB keys, one at a time, summed as above
    const float* kj = k + j * ss;
    __m256 a[8];
    for (int i = 0; i < 8; ++i) a[i] = _mm256_setzero_ps();
    for (int h = 0; h < NH; ++h) {
      for (int64_t v8 = 0; v8 < nvec; ++v8) {
        a[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * hd + 8 * v8), _mm256_loadu_ps(kj + 8 * v8),
                               a[h]);
      }
    }
    alignas(32) float sums[8];
    _mm256_store_ps(sums, hsum8(a));
    for (int h = 0; h < NH; ++h) scores[h][j] = sums[h];
  }
  for (int h = 0; h < NH; ++h) {
    j = 0;
    if (!sh.capped) {
      const __m256 sv = _mm256_set1_ps(p.scale);
      for (; j + 8 <= len; j += 8) {
        _mm256_storeu_ps(&scores[h][j], _mm256_mul_ps(sv, _mm256_loadu_ps(&scores[h][j])));
      }
    }
    for (; j < len; ++j) {
      float sc = scores[h][j] * p.scale;
      if (sh.capped) sc = p.logit_softcap * std::tanh(sc * sh.inv_cap);
      scores[h][j] = sc;
    }
    softmax_run_avx2(scores[h], len, &m[h], &l[h], acc[h], hd);
  }
  int64_t c0 = 0;
  for (; c0 + C <= nvec; c0 += C) {
    __m256 o[NH][C];
    for (int h = 0; h < NH; ++h) {
      for (int c = 0; c < C; ++c) o[h][c] = _mm256_loadu_ps(acc[h] + 8 * (c0 + c));
    }
    for (int64_t jj = 0; jj < len; ++jj) {
      const float* vj = v + jj * ss + 8 * c0;
      __m256 w[NH];
      for (int h = 0; h < NH; ++h) w[h] = _mm256_broadcast_ss(&scores[h][jj]);
      for (int c = 0; c < C; ++c) {
        const __m256 vv = _mm256_loadu_ps(vj + 8 * c);
        for (int h = 0; h < NH; ++h) o[h][c] = _mm256_fmadd_ps(w[h], vv, o[h][c]);
      }
    }
    for (int h = 0; h < NH; ++h) {
      for (int c = 0; c < C; ++c) _mm256_storeu_ps(acc[h] + 8 * (c0 + c), o[h][c]);
    }
  }
  for (; c0 < nvec; ++c0) {
    for (int h = 0; h < NH; ++h) {
      accumulate_v<1>(acc[h] + 8 * c0, scores[h], v + 8 * c0, ss, len);
    }
  }
}

// The work item with AVX2 intrinsics for head_dim a multiple of 8 (the compiled loops of
// attention_item kept each score's 8-lane sum and each accumulator update in memory: a
// store-to-load chain per key and head, ~70% of the item's time in a decode step). The item's
// heads go through run_heads up to four at a time, so each K and V vector loaded serves all of
// them. Same online softmax as attention_item; only the f32 summation order differs.
STRATA_AVX2_FMA void item_avx2_hd8(const AttentionKernelParams& p, const ItemShape& sh, int64_t t,
                                   int64_t kv_head, int64_t sub) {
  const int64_t hd = sh.hd;
  const ItemSpan span = item_span(p, sh, t, kv_head, sub);
  const int64_t h0 = span.h0, nh = span.nh, pos = span.pos;
  const float* q = span.q;

  alignas(32) float acc[kMaxHeads][kMaxHeadDim];
  float scores[kMaxHeads][kRun];
  float m[kMaxHeads];
  double l[kMaxHeads];
  for (int64_t h = 0; h < nh; ++h) {
    for (int64_t d = 0; d < hd; ++d) acc[h][d] = 0.0f;
    m[h] = -std::numeric_limits<float>::infinity();
    l[h] = 0.0;
  }
  for (int64_t start = span.lo; start <= pos;) {
    const Run run = run_at(p.cache, sh, span, kv_head, start);
    for (int64_t h = 0; h < nh;) {
      const int64_t n = std::min<int64_t>(4, nh - h);
      const float* qh = q + h * hd;
      switch (n) {
        case 1:
          run_heads<1>(p, sh, qh, run.k, run.v, run.len, scores + h, m + h, l + h, acc + h);
          break;
        case 2:
          run_heads<2>(p, sh, qh, run.k, run.v, run.len, scores + h, m + h, l + h, acc + h);
          break;
        case 3:
          run_heads<3>(p, sh, qh, run.k, run.v, run.len, scores + h, m + h, l + h, acc + h);
          break;
        default:
          run_heads<4>(p, sh, qh, run.k, run.v, run.len, scores + h, m + h, l + h, acc + h);
          break;
      }
      h += n;
    }
    start += run.len;
  }
  for (int64_t h = 0; h < nh; ++h) {
    float* out = p.out + t * p.out_stride + (h0 + h) * hd;
    const float inv_l = static_cast<float>(1.0 / l[h]);
    for (int64_t d = 0; d < hd; ++d) out[d] = acc[h][d] * inv_l;
  }
}

__attribute__((noinline, target("avx2,fma"))) void item_avx2(const AttentionKernelParams& p,
                                                             const ItemShape& sh, int64_t t,
                                                             int64_t kv_head, int64_t sub) {
  if (sh.hd % 8 == 0) {
    item_avx2_hd8(p, sh, t, kv_head, sub);
    return;
  }
  attention_item(p, sh, t, kv_head, sub);
}
#endif

}  // namespace

Status attention_items(const AttentionKernelParams& p, int n_threads, AttentionItems* w) {
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
  // Heads per item: the whole group (at most kMaxHeads), halved while items are too few.
  int64_t per = std::min(group, kMaxHeads);
  while (per > 1 && p.n_tokens * c.n_heads_kv * ceil_div(group, per) < 2 * n_threads) {
    per = ceil_div(per, 2);
  }
  w->p = p;
  w->subgroups = ceil_div(group, per);
  w->per_token = c.n_heads_kv * w->subgroups;
  w->count = p.n_tokens * w->per_token;
  const bool capped = p.logit_softcap > 0.0f;
  w->shape = ItemShape{.group = group,
                       .per = per,
                       .hd = c.head_dim,
                       .slot_stride = c.n_heads_kv * c.head_dim,  // floats between slots
                       .capped = capped,
                       .inv_cap = capped ? 1.0f / p.logit_softcap : 0.0f};
  w->item = item_generic;
#if defined(__x86_64__)
  if (cpu_supports(CpuIsa::kAvx2)) w->item = item_avx2;
#endif
  return ok_status();
}

void run_attention_item(const AttentionItems& w, int64_t i) {
  const int64_t t = i / w.per_token, r = i % w.per_token;
  w.item(w.p, w.shape, t, r / w.subgroups, r % w.subgroups);
}

Status attention(const AttentionKernelParams& p) {
  AttentionItems w;
  STRATA_RETURN_IF_ERROR(attention_items(p, omp_get_max_threads(), &w));
  if (p.n_tokens == 1) {
    // One decode token (its linears run on the spinning pool too): the items there, one at a
    // time (spin_pool.h). Batches stay on OpenMP, as their linears do.
    parallel_for_dynamic(w.count, [&](int64_t i) { run_attention_item(w, i); });
    return ok_status();
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < w.count; ++i) run_attention_item(w, i);
  return ok_status();
}

}  // namespace strata::cpu
