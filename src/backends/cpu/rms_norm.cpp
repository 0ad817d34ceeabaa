// RMSNorm on the CPU: one row per OpenMP iteration, f32 (double for the sum of squares).
#include <cmath>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/simd_math.h"
#include "core/half.h"

namespace strata::cpu {

float load_as_f32(const void* data, DType dt, int64_t i) {
  switch (dt) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::kFP8E4M3:
      return fp8e4m3_to_f32(static_cast<const uint8_t*>(data)[i]);
    case DType::kI8:
      return static_cast<float>(static_cast<const int8_t*>(data)[i]);
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      break;
  }
  return 0.0f;  // not a float type: callers check dtypes before calling
}

namespace {

// One row: the sum of squares in double, then x * inv * (w + offset) in f32.
void rms_row(const RmsNormParams& p, const float* x, float* out) {
  double ss = 0.0;
  for (int64_t i = 0; i < p.hidden; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv =
      1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(p.hidden)) + p.eps);
  if (p.weight_dtype == DType::kF32) {
    const auto* w = static_cast<const float*>(p.weight);
    for (int64_t i = 0; i < p.hidden; ++i) out[i] = x[i] * inv * (w[i] + p.weight_offset);
    return;
  }
  for (int64_t i = 0; i < p.hidden; ++i) {
    out[i] = x[i] * inv * (load_as_f32(p.weight, p.weight_dtype, i) + p.weight_offset);
  }
}

#if defined(__x86_64__)
// rms_row for f32 weights, 8 lanes: the squares summed in four double accumulators (so only the
// summation order differs from rms_row), the products as rms_row rounds them.
__attribute__((target("avx2,fma"))) void rms_row_avx2(const RmsNormParams& p, const float* x,
                                                      float* out) {
  const int64_t n = p.hidden;
  __m256d s0 = _mm256_setzero_pd(), s1 = s0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    s0 = _mm256_fmadd_pd(lo, lo, s0);
    s1 = _mm256_fmadd_pd(hi, hi, s1);
  }
  double ss = simd::hsum_pd(_mm256_add_pd(s0, s1));
  for (; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + p.eps);
  const auto* w = static_cast<const float*>(p.weight);
  const __m256 iv = _mm256_set1_ps(inv), off = _mm256_set1_ps(p.weight_offset);
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 xi = _mm256_mul_ps(_mm256_loadu_ps(x + i), iv);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(xi, _mm256_add_ps(_mm256_loadu_ps(w + i), off)));
  }
  for (; i < n; ++i) out[i] = x[i] * inv * (w[i] + p.weight_offset);
}
#endif

}  // namespace

void rms_norm_row(const RmsNormParams& p, const float* x, float* out) {
#if defined(__x86_64__)
  if (p.weight_dtype == DType::kF32 && cpu_supports(CpuIsa::kAvx2)) {
    rms_row_avx2(p, x, out);
    return;
  }
#endif
  rms_row(p, x, out);
}

Status rms_norm(const RmsNormParams& p) {
#pragma omp parallel for schedule(static) if (p.n_tokens * p.hidden >= kParallelMinElems)
  for (int64_t r = 0; r < p.n_tokens; ++r) {
    rms_norm_row(p, p.x + r * p.x_stride, p.out + r * p.out_stride);
  }
  return ok_status();
}

}  // namespace strata::cpu
