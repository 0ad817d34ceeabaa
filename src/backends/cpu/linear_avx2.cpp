// AVX2/FMA/F16C variants of the CPU linear kernel (see linear_impl.h for the two paths).
//
// GEMV: tiles of T tokens x R weight rows (T <= 2, R <= 4: AVX2 has 16 ymm registers) with
// 8 k-values per step, k unrolled for small tiles and split into chunks as in the AVX-512
// variant; the k tail (< 8 values) is finished in scalar code after the horizontal sums. f16
// converts with vcvtph2ps, bf16 by widening to 32 bits and shifting left by 16.
// GEMM: MR = 6 tokens x NR = 16 outputs (12 ymm accumulators); per k-step two weight vectors
// and six broadcast x values feed 12 FMAs. The weight packer transposes 8 x 8 blocks in
// registers; partial tiles go through a small buffer.
#include <immintrin.h>

#include <algorithm>

#include "backends/cpu/linear_impl.h"

#define STRATA_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace strata::cpu::linear_detail {
namespace {

constexpr int64_t kMr = 6;
constexpr int64_t kNr = 16;
constexpr int64_t kKc = 256;
constexpr int64_t kNcMax = 256;
constexpr int64_t kGemvMaxTokensF32 = 8;
constexpr int64_t kGemvMaxTokens16Bit = 16;
constexpr int64_t kGemvWTileBytes = 16384;

// 8 weights w[i .. i+8) as f32.
template <DType DT>
STRATA_AVX2 inline __m256 load8(const char* w, int64_t i) {
  if constexpr (DT == DType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(w) + i);
  } else {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(w) + i));
    if constexpr (DT == DType::kF16) {
      return _mm256_cvtph_ps(h);
    } else {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}

STRATA_AVX2 inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// ---- GEMV -----------------------------------------------------------------------------------

// out[i0 .. i0+T, j0 .. j0+R] (+)= x[:, k0:k1] . w[:, k0:k1] (stores on the first k-chunk,
// adds after), prefetching the same columns of the rows at w_next (the next tile) into L2.
template <DType DT, int T, int R>
STRATA_AVX2 void gemv_tile(const LinearParams& p, int64_t i0, int64_t j0, int64_t k0, int64_t k1,
                           const char* w_next) {
  // Small tiles unroll k so that at least 8 independent FMA chains hide the FMA latency.
  constexpr int U = T * R >= 8 ? 1 : (T * R >= 4 ? 2 : 4);
  constexpr int64_t kStepBytes = 8 * U * elem_bytes<DT>();
  const int64_t row_bytes = p.w_stride * elem_bytes<DT>();
  const float* x[T];
  const char* w[R];
  for (int t = 0; t < T; ++t) x[t] = p.x + (i0 + t) * p.x_stride;
  for (int r = 0; r < R; ++r) w[r] = row_ptr<DT>(p, j0 + r);
  __m256 acc[U][T][R];
  for (int u = 0; u < U; ++u)
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r) acc[u][t][r] = _mm256_setzero_ps();
  int64_t kk = k0;
  for (; kk + 8 * U <= k1; kk += 8 * U) {
    if (w_next) {
      for (int r = 0; r < R; ++r) {
        for (int64_t b = 0; b < kStepBytes; b += 64) {
          _mm_prefetch(w_next + r * row_bytes + kk * elem_bytes<DT>() + b, _MM_HINT_T1);
        }
      }
    }
    for (int u = 0; u < U; ++u) {
      __m256 wv[R];
      for (int r = 0; r < R; ++r) wv[r] = load8<DT>(w[r], kk + 8 * u);
      for (int t = 0; t < T; ++t) {
        const __m256 xv = _mm256_loadu_ps(x[t] + kk + 8 * u);
        for (int r = 0; r < R; ++r) acc[u][t][r] = _mm256_fmadd_ps(xv, wv[r], acc[u][t][r]);
      }
    }
  }
  for (; kk + 8 <= k1; kk += 8) {
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = load8<DT>(w[r], kk);
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_loadu_ps(x[t] + kk);
      for (int r = 0; r < R; ++r) acc[0][t][r] = _mm256_fmadd_ps(xv, wv[r], acc[0][t][r]);
    }
  }
  for (int t = 0; t < T; ++t) {
    float* out = p.out + (i0 + t) * p.out_stride + j0;
    for (int r = 0; r < R; ++r) {
      __m256 sum = acc[0][t][r];
      for (int u = 1; u < U; ++u) sum = _mm256_add_ps(sum, acc[u][t][r]);
      float v = hsum(sum);
      for (int64_t i = kk; i < k1; ++i) v += x[t][i] * load1<DT>(w[r], i);
      out[r] = k0 == 0 ? v : out[r] + v;
    }
  }
}

// All tokens against R weight rows from j0, k-chunk [k0, k1).
template <DType DT, int R>
STRATA_AVX2 void gemv_rows(const LinearParams& p, int64_t j0, int64_t k0, int64_t k1,
                           const char* w_next) {
  int64_t i = 0;
  for (; i + 2 <= p.n_tokens; i += 2, w_next = nullptr) {
    gemv_tile<DT, 2, R>(p, i, j0, k0, k1, w_next);
  }
  if (i < p.n_tokens) gemv_tile<DT, 1, R>(p, i, j0, k0, k1, w_next);
}

// Rows [j0, j1), k-chunk by k-chunk (see linear_avx512.cpp).
template <DType DT>
STRATA_AVX2 void gemv_dt(const LinearParams& p, int64_t j0, int64_t j1) {
  const int64_t k = p.in_features;
  constexpr int64_t kc = kGemvWTileBytes / (4 * elem_bytes<DT>());
  for (int64_t k0 = 0;; k0 += kc) {
    const int64_t k1 = std::min(k, k0 + kc);
    int64_t j = j0;
    for (; j + 4 <= j1; j += 4) {
      const char* next = j + 8 <= j1 ? row_ptr<DT>(p, j + 4)
                         : k1 < k    ? row_ptr<DT>(p, j0) + kc * elem_bytes<DT>()
                                     : nullptr;
      gemv_rows<DT, 4>(p, j, k0, k1, next);
    }
    for (; j < j1; ++j) gemv_rows<DT, 1>(p, j, k0, k1, nullptr);
    if (k1 >= k) break;
  }
}

void gemv(const LinearParams& p, int64_t j0, int64_t j1) {
  // The driver sends only these dtypes (it answers the others itself).
  if (p.w_dtype == DType::kF32) return gemv_dt<DType::kF32>(p, j0, j1);
  if (p.w_dtype == DType::kF16) return gemv_dt<DType::kF16>(p, j0, j1);
  if (p.w_dtype == DType::kBF16) return gemv_dt<DType::kBF16>(p, j0, j1);
}

// ---- GEMM -----------------------------------------------------------------------------------

// In place: r[i] lane j  ->  r[j] lane i.
STRATA_AVX2 inline void transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]);
  const __m256 t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]);
  const __m256 t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]);
  const __m256 t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]);
  const __m256 t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44);
  const __m256 s1 = _mm256_shuffle_ps(t0, t2, 0xee);
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44);
  const __m256 s3 = _mm256_shuffle_ps(t1, t3, 0xee);
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44);
  const __m256 s5 = _mm256_shuffle_ps(t4, t6, 0xee);
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44);
  const __m256 s7 = _mm256_shuffle_ps(t5, t7, 0xee);
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

template <DType DT>
STRATA_AVX2 void pack_w_dt(const LinearParams& p, int64_t j0, int64_t nj, int64_t k0, int64_t kc,
                           float* dst, int64_t next_j0, int64_t next_k0) {
  const int64_t kc8 = kc / 8 * 8;
  for (int64_t q = 0; q * kNr < nj; ++q) {
    float* d = dst + q * kc * kNr;
    for (int64_t half = 0; half < 2; ++half) {
      const char* rows[8];
      const char* next[8];
      for (int64_t i = 0; i < 8; ++i) {
        const int64_t row = q * kNr + half * 8 + i;
        rows[i] = row < nj ? row_ptr<DT>(p, j0 + row) : nullptr;
        next[i] = next_j0 >= 0 && next_j0 + row < p.out_features
                      ? row_ptr<DT>(p, next_j0 + row) + next_k0 * elem_bytes<DT>()
                      : nullptr;
      }
      for (int64_t kk = 0; kk < kc8; kk += 8) {
        __m256 r[8];
        for (int64_t i = 0; i < 8; ++i) {
          if (next[i] && kk * elem_bytes<DT>() % 64 == 0) {
            _mm_prefetch(next[i] + kk * elem_bytes<DT>(), _MM_HINT_T1);
          }
          r[i] = rows[i] ? load8<DT>(rows[i], k0 + kk) : _mm256_setzero_ps();
        }
        transpose8(r);
        for (int64_t i = 0; i < 8; ++i) _mm256_store_ps(d + (kk + i) * kNr + half * 8, r[i]);
      }
      for (int64_t kk = kc8; kk < kc; ++kk) {
        for (int64_t i = 0; i < 8; ++i) {
          d[kk * kNr + half * 8 + i] = rows[i] ? load1<DT>(rows[i], k0 + kk) : 0.0f;
        }
      }
    }
  }
}

void pack_w(const LinearParams& p, int64_t j0, int64_t nj, int64_t k0, int64_t kc, float* dst,
            int64_t next_j0, int64_t next_k0) {
  // The driver sends only these dtypes (it answers the others itself).
  if (p.w_dtype == DType::kF32) {
    return pack_w_dt<DType::kF32>(p, j0, nj, k0, kc, dst, next_j0, next_k0);
  }
  if (p.w_dtype == DType::kF16) {
    return pack_w_dt<DType::kF16>(p, j0, nj, k0, kc, dst, next_j0, next_k0);
  }
  if (p.w_dtype == DType::kBF16) {
    return pack_w_dt<DType::kBF16>(p, j0, nj, k0, kc, dst, next_j0, next_k0);
  }
}

void pack_x(const LinearParams& p, int64_t i0, int64_t ni, int64_t k0, int64_t kc, float* dst) {
  for (int64_t q = 0; q * kMr < ni; ++q) {
    float* d = dst + q * kc * kMr;
    for (int64_t r = 0; r < kMr; ++r) {
      const int64_t row = q * kMr + r;
      if (row < ni) {
        const float* x = p.x + (i0 + row) * p.x_stride + k0;
        for (int64_t kk = 0; kk < kc; ++kk) d[kk * kMr + r] = x[kk];
      } else {
        for (int64_t kk = 0; kk < kc; ++kk) d[kk * kMr + r] = 0.0f;
      }
    }
  }
}

STRATA_AVX2 void micro(int64_t kc, const float* xp, const float* wp, float* c, int64_t ldc,
                       int64_t mr_valid, int64_t nr_valid) {
  // NOTE: twelve named accumulators, not an array: GCC 12 kept an __m256 acc[6][2] in memory
  // and stored all twelve every k-step, which held this kernel to ~30% of the FMA peak.
  __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
  __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
  __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
  __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
  __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
  __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
  for (int64_t kk = 0; kk < kc; ++kk) {
    const __m256 w0 = _mm256_load_ps(wp + kk * kNr);
    const __m256 w1 = _mm256_load_ps(wp + kk * kNr + 8);
    const float* xk = xp + kk * kMr;
    __m256 xb = _mm256_broadcast_ss(xk + 0);
    c00 = _mm256_fmadd_ps(xb, w0, c00);
    c01 = _mm256_fmadd_ps(xb, w1, c01);
    xb = _mm256_broadcast_ss(xk + 1);
    c10 = _mm256_fmadd_ps(xb, w0, c10);
    c11 = _mm256_fmadd_ps(xb, w1, c11);
    xb = _mm256_broadcast_ss(xk + 2);
    c20 = _mm256_fmadd_ps(xb, w0, c20);
    c21 = _mm256_fmadd_ps(xb, w1, c21);
    xb = _mm256_broadcast_ss(xk + 3);
    c30 = _mm256_fmadd_ps(xb, w0, c30);
    c31 = _mm256_fmadd_ps(xb, w1, c31);
    xb = _mm256_broadcast_ss(xk + 4);
    c40 = _mm256_fmadd_ps(xb, w0, c40);
    c41 = _mm256_fmadd_ps(xb, w1, c41);
    xb = _mm256_broadcast_ss(xk + 5);
    c50 = _mm256_fmadd_ps(xb, w0, c50);
    c51 = _mm256_fmadd_ps(xb, w1, c51);
  }
  const __m256 acc[kMr][2] = {{c00, c01}, {c10, c11}, {c20, c21},
                              {c30, c31}, {c40, c41}, {c50, c51}};
  if (mr_valid == kMr && nr_valid == kNr) {
    for (int r = 0; r < kMr; ++r) {
      float* cr = c + r * ldc;
      _mm256_storeu_ps(cr, _mm256_add_ps(_mm256_loadu_ps(cr), acc[r][0]));
      _mm256_storeu_ps(cr + 8, _mm256_add_ps(_mm256_loadu_ps(cr + 8), acc[r][1]));
    }
    return;
  }
  alignas(32) float tile[kMr][kNr];
  for (int r = 0; r < kMr; ++r) {
    _mm256_store_ps(tile[r], acc[r][0]);
    _mm256_store_ps(tile[r] + 8, acc[r][1]);
  }
  for (int64_t r = 0; r < mr_valid; ++r) {
    for (int64_t col = 0; col < nr_valid; ++col) c[r * ldc + col] += tile[r][col];
  }
}

}  // namespace

const IsaKernels& avx2_kernels() {
  static const IsaKernels kKernels{
      .gemv = gemv,
      .gemv_max_tokens_f32 = kGemvMaxTokensF32,
      .gemv_max_tokens_16bit = kGemvMaxTokens16Bit,
      .gemm = {.mr = kMr,
               .nr = kNr,
               .small_x = {.kc = kKc, .nc_max = kNcMax},
               .large_x = {.kc = kKc, .nc_max = kNcMax},
               .pack_x = pack_x,
               .pack_w = pack_w,
               .micro = micro},
  };
  return kKernels;
}

}  // namespace strata::cpu::linear_detail
