// Block-quantized linear with f32 activations: out[t, r] = sum_i x[t, i] * W[r, i] with W
// dequantized block by block in registers, so the result equals the f32 product over the
// dequantized weights up to f32 summation order (the int8-activation path of quant.cpp
// rounds x to 8 bits per element, which moved SmolLM2's logits by up to ~1.5).
//
// Variants: one token (decode) runs a fused unpack-and-FMA per block for Q4_1, Q4_0 and Q8_0
// (AVX2); several tokens dequantize each weight row once into an L1-resident f32 buffer and
// reuse it for every token; other types, or CPUs without AVX2, take the generic
// dequantize_row + dot path.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/quant.h"
#include "core/half.h"
#include "core/status.h"

namespace strata::cpu {

namespace {

#define STRATA_AVX2 __attribute__((target("avx2,fma,f16c")))

float dot_scalar(const float* a, const float* b, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float s = 0.0f;
  for (; i < n; ++i) s += a[i] * b[i];
  for (float v : acc) s += v;
  return s;
}

STRATA_AVX2 float hsum(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

STRATA_AVX2 float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  float s = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// 16 packed nibbles -> two vectors of 16 floats' worth (low nibbles = values 0..15, high
// nibbles = values 16..31), as 4 x 8 floats.
STRATA_AVX2 inline void unpack_nibbles(const uint8_t* qs, __m256 out[4]) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(q, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
  out[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
  out[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
  out[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
  out[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
}

// Fused dot of one quantized row with x (n = blocks * 32). xsum[b] = sum of x over block b
// (for the Q4_1 min term).
STRATA_AVX2 float row_dot_q4_1(const uint8_t* w, const float* x, const float* xsum, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  float macc = 0.0f;
  for (int64_t b = 0; b < nb; ++b, w += 20, x += 32) {
    uint16_t dh, mh;
    std::memcpy(&dh, w, 2);
    std::memcpy(&mh, w + 2, 2);
    __m256 q[4];
    unpack_nibbles(w + 4, q);
    __m256 s = _mm256_mul_ps(q[0], _mm256_loadu_ps(x));
    s = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(x + 8), s);
    s = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(x + 16), s);
    s = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(x + 24), s);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(dh)), s, acc);
    macc += _cvtsh_ss(mh) * xsum[b];
  }
  return hsum(acc) + macc;
}

STRATA_AVX2 float row_dot_q4_0(const uint8_t* w, const float* x, const float* xsum, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  const __m256 eight = _mm256_set1_ps(8.0f);
  for (int64_t b = 0; b < nb; ++b, w += 18, x += 32) {
    uint16_t dh;
    std::memcpy(&dh, w, 2);
    __m256 q[4];
    unpack_nibbles(w + 2, q);
    __m256 s = _mm256_mul_ps(_mm256_sub_ps(q[0], eight), _mm256_loadu_ps(x));
    s = _mm256_fmadd_ps(_mm256_sub_ps(q[1], eight), _mm256_loadu_ps(x + 8), s);
    s = _mm256_fmadd_ps(_mm256_sub_ps(q[2], eight), _mm256_loadu_ps(x + 16), s);
    s = _mm256_fmadd_ps(_mm256_sub_ps(q[3], eight), _mm256_loadu_ps(x + 24), s);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(dh)), s, acc);
  }
  (void)xsum;
  return hsum(acc);
}

STRATA_AVX2 float row_dot_q8_0(const uint8_t* w, const float* x, const float* xsum, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, w += 34, x += 32) {
    uint16_t dh;
    std::memcpy(&dh, w, 2);
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 18));
    __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q0)), _mm256_loadu_ps(x));
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q0, 8))),
                        _mm256_loadu_ps(x + 8), s);
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q1)), _mm256_loadu_ps(x + 16), s);
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q1, 8))),
                        _mm256_loadu_ps(x + 24), s);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(dh)), s, acc);
  }
  (void)xsum;
  return hsum(acc);
}

using RowDotFn = float (*)(const uint8_t*, const float*, const float*, int64_t);

RowDotFn fused_row_dot(DType dt) {
  switch (dt) {
    case DType::kQ4_1:
      return row_dot_q4_1;
    case DType::kQ4_0:
      return row_dot_q4_0;
    case DType::kQ8_0:
      return row_dot_q8_0;
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kI8:
    case DType::kFP8E4M3:
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      break;
  }
  return nullptr;
}

}  // namespace

Status quant_linear_f32(const QuantLinearParams& p, int64_t x_stride, int64_t out_stride,
                        int64_t row_bytes) {
  const DTypeInfo& info = dtype_info(p.weight_dtype);
  const int64_t k = p.in_features;
  const int64_t nb = k / info.block_size;
  const bool avx2 = !p.force_scalar && cpu_supports(CpuIsa::kAvx2);
  const RowDotFn fused = avx2 && info.block_size == 32 ? fused_row_dot(p.weight_dtype) : nullptr;
  const auto* w = static_cast<const uint8_t*>(p.weight);
  auto dot = [avx2](const float* a, const float* b, int64_t n) {
    return avx2 ? dot_avx2(a, b, n) : dot_scalar(a, b, n);
  };

  if (p.n_tokens == 1 && fused != nullptr) {
    std::vector<float> xsum(static_cast<size_t>(nb));
    for (int64_t b = 0; b < nb; ++b) {
      float s = 0.0f;
      for (int j = 0; j < 32; ++j) s += p.x[b * 32 + j];
      xsum[static_cast<size_t>(b)] = s;
    }
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < p.out_features; ++r) {
      const float bias = p.bias != nullptr ? p.bias[r] : 0.0f;
      p.out[r] = fused(w + r * row_bytes, p.x, xsum.data(), nb) + bias;
    }
    return ok_status();
  }

  // Prefill-sized batches: dequantize panels of rows to f32 (in parallel) and run the f32
  // GEMM of linear.cpp on each panel, so every weight is unpacked once per call and the
  // multiply gets the register-blocked GEMM.
  constexpr int64_t kGemmTokens = 8;
  if (p.n_tokens >= kGemmTokens && !p.force_scalar) {
    const int64_t panel =
        std::max<int64_t>(16, std::min<int64_t>(256, (int64_t{1} << 20) / (4 * k)));
    std::vector<float> buf(static_cast<size_t>(panel * k));
    for (int64_t r0 = 0; r0 < p.out_features; r0 += panel) {
      const int64_t rows = std::min(panel, p.out_features - r0);
      Status st = ok_status();
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        Status s = dequantize_row(p.weight_dtype, w + (r0 + r) * row_bytes, buf.data() + r * k, k);
        if (!s.ok()) {
#pragma omp critical
          st = s;
        }
      }
      STRATA_RETURN_IF_ERROR(st);
      STRATA_RETURN_IF_ERROR(linear({.x = p.x,
                                     .x_stride = x_stride,
                                     .w = buf.data(),
                                     .w_dtype = DType::kF32,
                                     .w_stride = k,
                                     .bias = p.bias != nullptr ? p.bias + r0 : nullptr,
                                     .bias_dtype = DType::kF32,
                                     .out = p.out + r0,
                                     .out_stride = out_stride,
                                     .n_tokens = p.n_tokens,
                                     .in_features = k,
                                     .out_features = rows}));
    }
    return ok_status();
  }

  Status status = ok_status();
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(k));
    Status local = ok_status();
#pragma omp for schedule(static)
    for (int64_t r = 0; r < p.out_features; ++r) {
      if (!local.ok()) continue;
      local = dequantize_row(p.weight_dtype, w + r * row_bytes, row.data(), k);
      if (!local.ok()) continue;
      const float bias = p.bias != nullptr ? p.bias[r] : 0.0f;
      for (int64_t t = 0; t < p.n_tokens; ++t) {
        p.out[t * out_stride + r] = dot(p.x + t * x_stride, row.data(), k) + bias;
      }
    }
    if (!local.ok()) {
#pragma omp critical
      status = local;
    }
  }
  return status;
}

}  // namespace strata::cpu
