// The int8 GEMM micro-kernel in AVX2 (the panel layout and the math: quant_impl.h,
// quant_gemm_i8.cpp). 4 tokens x 8 rows at a time (the 8 x 16 tile in four passes over the
// packed panel, which stays in L1): per quad of k one 32-byte weight load (8 rows x 4 values)
// meets each token's 4 activation bytes broadcast, in one vpmaddubsw (u8 x i8 -> i16 pair
// sums) added into i16 sums; every kChunk quads the i16 sums widen to i32 by one vpmaddwd.
// kChunk keeps the i16 sums exact: each holds 2 kChunk products of u <= max_u and |q_a| <= 127
// (4-bit: 8 quads, 16 x 15 x 127 = 30480; 5-bit: 4 quads, 8 x 31 x 127 = 31496), and one
// vpmaddubsw pair (<= 2 x 31 x 127) never saturates. Then per 32-group and token
// acc += f32(isum) * dw * d_a + cw * s_a.
#include <immintrin.h>

#include "backends/cpu/quant_impl.h"

#if defined(STRATA_QUANT_HAVE_AVX2)

namespace strata::cpu::quant_detail {
namespace {

#define STRATA_AVX2 __attribute__((target("avx2,fma,f16c")))

STRATA_AVX2 inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

template <int kChunk>
STRATA_AVX2 void micro_4x8(int64_t ng, const uint8_t* wq, const float* wd, const float* wc,
                           const int8_t* aq, int64_t a_stride, const float* ad, const float* as,
                           int64_t ad_stride, float* c) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 f[4];
  for (int t = 0; t < 4; ++t) f[t] = _mm256_setzero_ps();
  for (int64_t g = 0; g < ng; ++g) {
    __m256i s32[4];
    for (int t = 0; t < 4; ++t) s32[t] = _mm256_setzero_si256();
    const int8_t* ag = aq + 32 * g;
#pragma GCC unroll 1
    for (int i0 = 0; i0 < 8; i0 += kChunk) {
      __m256i s16[4];
      for (int t = 0; t < 4; ++t) s16[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
      for (int i = i0; i < i0 + kChunk; ++i) {
        const __m256i w =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + (g * 8 + i) * kGemmRows * 4));
        for (int t = 0; t < 4; ++t) {
          s16[t] =
              _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(w, bcast4(ag + t * a_stride + 4 * i)));
        }
      }
      for (int t = 0; t < 4; ++t)
        s32[t] = _mm256_add_epi32(s32[t], _mm256_madd_epi16(s16[t], ones));
    }
    const __m256 dw = _mm256_loadu_ps(wd + g * kGemmRows);
    const __m256 cw = _mm256_loadu_ps(wc + g * kGemmRows);
    for (int t = 0; t < 4; ++t) {
      const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(ad[t * ad_stride + g]));
      f[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32[t]), scale, f[t]);
      f[t] = _mm256_fmadd_ps(cw, _mm256_set1_ps(as[t * ad_stride + g]), f[t]);
    }
  }
  for (int t = 0; t < 4; ++t) _mm256_storeu_ps(c + t * kGemmRows, f[t]);
}

// The 8 x 16 tile: token halves x row halves (row half h reads bytes 32 h of each quad).
template <int kChunk>
STRATA_AVX2 void micro(int64_t ng, const uint8_t* wq, const float* wd, const float* wc,
                       const int8_t* aq, int64_t a_stride, const float* ad, const float* as,
                       int64_t ad_stride, float* c) {
  for (int th = 0; th < 2; ++th) {
    for (int rh = 0; rh < 2; ++rh) {
      micro_4x8<kChunk>(ng, wq + 32 * rh, wd + 8 * rh, wc + 8 * rh, aq + 4 * th * a_stride,
                        a_stride, ad + 4 * th * ad_stride, as + 4 * th * ad_stride, ad_stride,
                        c + 4 * th * kGemmRows + 8 * rh);
    }
  }
}

}  // namespace

GemmI8MicroFn gemm_i8_micro_avx2(int max_u) {
  if (max_u <= 15) return micro<8>;
  if (max_u <= 31) return micro<4>;
  return nullptr;
}

}  // namespace strata::cpu::quant_detail

#endif  // STRATA_QUANT_HAVE_AVX2
