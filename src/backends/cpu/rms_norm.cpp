// RMSNorm on the CPU: one row per OpenMP iteration, f32 (double for the sum of squares).
#include <cmath>

#include "backends/cpu/cpu_kernels.h"
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

Status rms_norm(const RmsNormParams& p) {
#pragma omp parallel for schedule(static) if (p.n_tokens * p.hidden >= kParallelMinElems)
  for (int64_t r = 0; r < p.n_tokens; ++r) {
    const float* x = p.x + r * p.x_stride;
    float* out = p.out + r * p.out_stride;
    double ss = 0.0;
    for (int64_t i = 0; i < p.hidden; ++i) ss += static_cast<double>(x[i]) * x[i];
    const float inv =
        1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(p.hidden)) + p.eps);
    for (int64_t i = 0; i < p.hidden; ++i) {
      out[i] = x[i] * inv * (load_as_f32(p.weight, p.weight_dtype, i) + p.weight_offset);
    }
  }
  return ok_status();
}

}  // namespace strata::cpu
