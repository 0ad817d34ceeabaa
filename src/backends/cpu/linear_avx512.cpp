// AVX-512 variants of the CPU linear kernel (see linear_impl.h for the two paths).
//
// GEMV: tiles of T tokens x R weight rows (T, R <= 4) with T*R zmm accumulators (k unrolled
// when T*R is small, so at least 8 FMA chains are in flight), 16 k-values per step; the k
// tail uses masked loads. k is split into chunks whose 4 weight rows take 16 KiB, which stay
// in L1 while every token group passes over them. f16 converts with vcvtph2ps, bf16 by
// widening to 32 bits and shifting left by 16.
// GEMM: MR = 8 tokens x NR = 32 outputs (16 zmm accumulators); per k-step two weight vectors
// and eight broadcast x values feed 16 FMAs. The packers convert and transpose 16 x 16 blocks
// in registers. Blocking (see GemmBlocking): one 32-row panel x kc 2048 while x is small,
// 256 rows x kc 256 when x is large.
// NOTE: GCC 12's avx512fintrin.h initializes its "undefined" vectors from themselves, which
// -Wuninitialized reports at every use; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>

#include "backends/cpu/linear_impl.h"

#define STRATA_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))

namespace strata::cpu::linear_detail {
namespace {

constexpr int64_t kMr = 8;
constexpr __mmask16 kMrMask = (1u << kMr) - 1u;
constexpr int64_t kNr = 32;
constexpr int64_t kKc = 2048;
constexpr int64_t kNcMax = 32;
constexpr int64_t kKcLargeX = 256;
constexpr int64_t kNcMaxLargeX = 256;
constexpr int64_t kGemvMaxTokensF32 = 16;
constexpr int64_t kGemvMaxTokens16Bit = 32;
// GEMV k-chunk: 4 weight rows of one chunk take kGemvWTileBytes (they stay in L1 while every
// token group passes over them).
constexpr int64_t kGemvWTileBytes = 16384;
constexpr bool kPf = false;

// 16 weights w[i .. i+16) as f32; lanes outside `mask` are zero and not read.
template <DType DT>
STRATA_AVX512 inline __m512 load16(const char* w, int64_t i, __mmask16 mask) {
  if constexpr (DT == DType::kF32) {
    return _mm512_maskz_loadu_ps(mask, reinterpret_cast<const float*>(w) + i);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, reinterpret_cast<const uint16_t*>(w) + i);
    if constexpr (DT == DType::kF16) {
      return _mm512_cvtph_ps(h);
    } else {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}

template <DType DT>
STRATA_AVX512 inline __m512 load16(const char* w, int64_t i) {
  if constexpr (DT == DType::kF32) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(w) + i);
  } else {
    const __m256i h = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(reinterpret_cast<const uint16_t*>(w) + i));
    if constexpr (DT == DType::kF16) {
      return _mm512_cvtph_ps(h);
    } else {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}

STRATA_AVX512 inline __mmask16 tail_mask(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1u);
}

// ---- GEMV -----------------------------------------------------------------------------------

// out[i0 .. i0+T, j0 .. j0+R] (+)= x[:, k0:k1] . w[:, k0:k1] for T tokens and R weight rows
// (stores on the first k-chunk, adds after). While it runs it prefetches the same columns of
// the rows at w_next into L2: the tile this thread reads next, far enough ahead to hide DRAM
// latency whatever the row length.
template <DType DT, int T, int R>
STRATA_AVX512 void gemv_tile(const LinearParams& p, int64_t i0, int64_t j0, int64_t k0, int64_t k1,
                             const char* w_next) {
  // Small tiles unroll k so that at least 8 independent FMA chains hide the FMA latency.
  constexpr int U = T * R >= 8 ? 1 : (T * R >= 4 ? 2 : 4);
  constexpr int64_t kStepBytes = 16 * U * elem_bytes<DT>();
  const int64_t row_bytes = p.w_stride * elem_bytes<DT>();
  const float* x[T];
  const char* w[R];
  for (int t = 0; t < T; ++t) x[t] = p.x + (i0 + t) * p.x_stride;
  for (int r = 0; r < R; ++r) w[r] = row_ptr<DT>(p, j0 + r);
  __m512 acc[U][T][R];
  for (int u = 0; u < U; ++u)
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r) acc[u][t][r] = _mm512_setzero_ps();
  const auto step = [&](int u, int64_t kk, __mmask16 m, bool masked)
      __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,f16c"))) {
    __m512 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = masked ? load16<DT>(w[r], kk, m) : load16<DT>(w[r], kk);
    for (int t = 0; t < T; ++t) {
      const __m512 xv = masked ? _mm512_maskz_loadu_ps(m, x[t] + kk) : _mm512_loadu_ps(x[t] + kk);
      for (int r = 0; r < R; ++r) acc[u][t][r] = _mm512_fmadd_ps(xv, wv[r], acc[u][t][r]);
    }
  };
  int64_t kk = k0;
  for (; kk + 16 * U <= k1; kk += 16 * U) {
    if (w_next) {
      for (int r = 0; r < R; ++r) {
        for (int64_t b = 0; b < kStepBytes; b += 64) {
          _mm_prefetch(w_next + r * row_bytes + kk * elem_bytes<DT>() + b, _MM_HINT_T1);
        }
      }
    }
    for (int u = 0; u < U; ++u) step(u, kk + 16 * u, 0, false);
  }
  for (; kk + 16 <= k1; kk += 16) step(0, kk, 0, false);
  if (kk < k1) step(0, kk, tail_mask(k1 - kk), true);
  for (int t = 0; t < T; ++t) {
    float* out = p.out + (i0 + t) * p.out_stride + j0;
    for (int r = 0; r < R; ++r) {
      __m512 sum = acc[0][t][r];
      for (int u = 1; u < U; ++u) sum = _mm512_add_ps(sum, acc[u][t][r]);
      const float v = _mm512_reduce_add_ps(sum);
      out[r] = k0 == 0 ? v : out[r] + v;
    }
  }
}

// All tokens against R weight rows from j0, k-chunk [k0, k1).
template <DType DT, int R>
STRATA_AVX512 void gemv_rows(const LinearParams& p, int64_t j0, int64_t k0, int64_t k1,
                             const char* w_next) {
  int64_t i = 0;
  for (; i + 4 <= p.n_tokens; i += 4, w_next = nullptr) {
    gemv_tile<DT, 4, R>(p, i, j0, k0, k1, w_next);
  }
  switch (p.n_tokens - i) {
    case 3:
      gemv_tile<DT, 3, R>(p, i, j0, k0, k1, w_next);
      break;
    case 2:
      gemv_tile<DT, 2, R>(p, i, j0, k0, k1, w_next);
      break;
    case 1:
      gemv_tile<DT, 1, R>(p, i, j0, k0, k1, w_next);
      break;
    default:
      break;
  }
}

// Rows [j0, j1): k-chunk by k-chunk, so the chunk of x (all tokens) stays in L1/L2 while
// every row group of the range passes over it.
template <DType DT>
STRATA_AVX512 void gemv_dt(const LinearParams& p, int64_t j0, int64_t j1) {
  const int64_t k = p.in_features;
  constexpr int64_t kc = kGemvWTileBytes / (4 * elem_bytes<DT>());
  for (int64_t k0 = 0;; k0 += kc) {
    const int64_t k1 = std::min(k, k0 + kc);
    int64_t j = j0;
    for (; j + 4 <= j1; j += 4) {
      // Next tile: the next row group, else the first of the next k-chunk.
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
STRATA_AVX512 inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  __m512 u[16];
  for (int g = 0; g < 4; ++g) {
    const __m512d a = _mm512_castps_pd(t[4 * g]);
    const __m512d b = _mm512_castps_pd(t[4 * g + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * g + 2]);
    const __m512d d = _mm512_castps_pd(t[4 * g + 3]);
    u[4 * g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  // u[4g + c] lane L holds rows 4g..4g+3 of column 4L + c.
  for (int c = 0; c < 4; ++c) {
    const __m512 x0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);
    const __m512 x1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xee);
    const __m512 y0 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
    const __m512 y1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xee);
    r[c] = _mm512_shuffle_f32x4(x0, y0, 0x88);
    r[4 + c] = _mm512_shuffle_f32x4(x0, y0, 0xdd);
    r[8 + c] = _mm512_shuffle_f32x4(x1, y1, 0x88);
    r[12 + c] = _mm512_shuffle_f32x4(x1, y1, 0xdd);
  }
}

template <DType DT>
STRATA_AVX512 void pack_w_dt(const LinearParams& p, int64_t j0, int64_t nj, int64_t k0, int64_t kc,
                             float* dst, int64_t next_j0, int64_t next_k0) {
  for (int64_t q = 0; q * kNr < nj; ++q) {
    float* d = dst + q * kc * kNr;
    const char* rows[kNr];
    const char* next[kNr];
    // Prefetch one panel ahead: the next panel of this block, else the first of the next.
    const bool last_panel = (q + 1) * kNr >= nj;
    const int64_t pf_j0 = last_panel ? next_j0 : j0 + (q + 1) * kNr;
    const int64_t pf_k0 = last_panel ? next_k0 : k0;
    const int64_t pf_rows = last_panel ? p.out_features - next_j0 : nj - (q + 1) * kNr;
    for (int64_t i = 0; i < kNr; ++i) {
      const int64_t row = q * kNr + i;
      rows[i] = row < nj ? row_ptr<DT>(p, j0 + row) : nullptr;
      next[i] = pf_j0 >= 0 && i < pf_rows ? row_ptr<DT>(p, pf_j0 + i) + pf_k0 * elem_bytes<DT>()
                                          : nullptr;
    }
    for (int64_t kk = 0; kk < kc; kk += 16) {
      const int64_t len = kc - kk < 16 ? kc - kk : 16;
      const __mmask16 m = tail_mask(len);
      for (int64_t half = 0; half < 2; ++half) {
        __m512 r[16];
        for (int64_t i = 0; i < 16; ++i) {
          const int64_t c = half * 16 + i;
          if (next[c]) _mm_prefetch(next[c] + kk * elem_bytes<DT>(), _MM_HINT_T1);
          r[i] = rows[c] ? load16<DT>(rows[c], k0 + kk, m) : _mm512_setzero_ps();
        }
        transpose16(r);
        for (int64_t i = 0; i < len; ++i) _mm512_store_ps(d + (kk + i) * kNr + half * 16, r[i]);
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

// x rows i0..i0+kMr (fewer when ni runs out): kMr rows x 16 k-values are transposed as a
// 16 x 16 block whose other rows are zero, and the first kMr lanes of each result are stored.
STRATA_AVX512 void pack_x(const LinearParams& p, int64_t i0, int64_t ni, int64_t k0, int64_t kc,
                          float* dst) {
  for (int64_t q = 0; q * kMr < ni; ++q) {
    float* d = dst + q * kc * kMr;
    for (int64_t kk = 0; kk < kc; kk += 16) {
      const int64_t len = kc - kk < 16 ? kc - kk : 16;
      const __mmask16 m = tail_mask(len);
      __m512 r[16];
      for (int64_t i = 0; i < 16; ++i) {
        const int64_t row = q * kMr + i;
        r[i] = i < kMr && row < ni
                   ? _mm512_maskz_loadu_ps(m, p.x + (i0 + row) * p.x_stride + k0 + kk)
                   : _mm512_setzero_ps();
      }
      transpose16(r);
      for (int64_t i = 0; i < len; ++i) _mm512_mask_storeu_ps(d + (kk + i) * kMr, kMrMask, r[i]);
    }
  }
}

STRATA_AVX512 void micro(int64_t kc, const float* xp, const float* wp, float* c, int64_t ldc,
                         int64_t mr_valid, int64_t nr_valid) {
  __m512 acc[kMr][2];
  for (int r = 0; r < kMr; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < kc; ++kk) {
    const __m512 w0 = _mm512_load_ps(wp + kk * kNr);
    const __m512 w1 = _mm512_load_ps(wp + kk * kNr + 16);
    const float* xk = xp + kk * kMr;
    for (int r = 0; r < kMr; ++r) {
      const __m512 xb = _mm512_set1_ps(xk[r]);
      acc[r][0] = _mm512_fmadd_ps(xb, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(xb, w1, acc[r][1]);
    }
  }
  if (mr_valid == kMr && nr_valid == kNr) {
    for (int r = 0; r < kMr; ++r) {
      float* cr = c + r * ldc;
      _mm512_storeu_ps(cr, _mm512_add_ps(_mm512_loadu_ps(cr), acc[r][0]));
      _mm512_storeu_ps(cr + 16, _mm512_add_ps(_mm512_loadu_ps(cr + 16), acc[r][1]));
    }
    return;
  }
  const __mmask16 m0 = tail_mask(nr_valid);
  const __mmask16 m1 = nr_valid > 16 ? tail_mask(nr_valid - 16) : static_cast<__mmask16>(0);
  for (int r = 0; r < mr_valid; ++r) {
    float* cr = c + r * ldc;
    _mm512_mask_storeu_ps(cr, m0, _mm512_add_ps(_mm512_maskz_loadu_ps(m0, cr), acc[r][0]));
    _mm512_mask_storeu_ps(cr + 16, m1,
                          _mm512_add_ps(_mm512_maskz_loadu_ps(m1, cr + 16), acc[r][1]));
  }
}

}  // namespace

const IsaKernels& avx512_kernels() {
  static const IsaKernels kKernels{
      .gemv = gemv,
      .gemv_max_tokens_f32 = kGemvMaxTokensF32,
      .gemv_max_tokens_16bit = kGemvMaxTokens16Bit,
      .gemm = {.mr = kMr,
               .nr = kNr,
               .small_x = {.kc = kKc, .nc_max = kNcMax},
               .large_x = {.kc = kKcLargeX, .nc_max = kNcMaxLargeX},
               .pack_x = pack_x,
               .pack_w = pack_w,
               .micro = micro},
  };
  return kKernels;
}

}  // namespace strata::cpu::linear_detail
