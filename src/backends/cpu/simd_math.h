// Vector math for the CPU kernels' AVX2 variants (functions carry target("avx2,fma"), so files
// built for the baseline ISA include this and call them only after cpu_supports(kAvx2)).
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

namespace strata::cpu::simd {

#define STRATA_SIMD_AVX2 __attribute__((target("avx2,fma"), always_inline)) inline

// e^x for 8 floats: x = n ln2 + r with |r| <= ln2 / 2, e^r from Cephes' degree-6 polynomial,
// 2^n through the exponent bits. Within 2 ulp of std::exp over the normal range; 0 below
// -87.33 (and for -inf), +inf above 88.72, NaN stays NaN.
STRATA_SIMD_AVX2 __m256 exp_ps(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.7228f);
  const __m256 lo = _mm256_set1_ps(-87.3365f);
  // min / max return their second operand when either is NaN: x second keeps a NaN.
  __m256 c = _mm256_max_ps(lo, _mm256_min_ps(hi, x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(c, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), c);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  const __m256 e = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0f));
  // 2^n for n in [-126, 128]: n = 128 (x near the top) goes through 2^127 * 2.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i big = _mm256_cmpgt_epi32(ni, _mm256_set1_epi32(127));
  const __m256i nh = _mm256_sub_epi32(ni, _mm256_and_si256(big, _mm256_set1_epi32(1)));
  const __m256 pow2 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(nh, _mm256_set1_epi32(127)), 23));
  __m256 y = _mm256_mul_ps(e, pow2);
  y = _mm256_blendv_ps(y, _mm256_add_ps(y, y), _mm256_castsi256_ps(big));
  // Below the smallest normal result: 0 (the clamp above kept n in range).
  return _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), y);
}

// Sum of the 8 lanes.
STRATA_SIMD_AVX2 float hsum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Max of the 8 lanes.
STRATA_SIMD_AVX2 float hmax_ps(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

STRATA_SIMD_AVX2 double hsum_pd(__m256d v) {
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

}  // namespace strata::cpu::simd

#endif  // __x86_64__
