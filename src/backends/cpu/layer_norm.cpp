// LayerNorm on the CPU: one row per OpenMP iteration. Mean and variance are accumulated in
// double over the row (two passes: mean first, then the centred squares, so a large mean does
// not cancel the variance away); the output is computed in f32.
#include <cmath>

#include "backends/cpu/cpu_kernels.h"

namespace strata::cpu {

Status layer_norm(const LayerNormParams& p) {
#pragma omp parallel for schedule(static) if (p.n_tokens * p.hidden >= kParallelMinElems)
  for (int64_t r = 0; r < p.n_tokens; ++r) {
    const float* x = p.x + r * p.x_stride;
    float* out = p.out + r * p.out_stride;
    double sum = 0.0;
    for (int64_t i = 0; i < p.hidden; ++i) sum += x[i];
    const double mean = sum / static_cast<double>(p.hidden);
    double ss = 0.0;
    for (int64_t i = 0; i < p.hidden; ++i) {
      const double d = x[i] - mean;
      ss += d * d;
    }
    const double var = ss / static_cast<double>(p.hidden);
    const float inv = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(p.eps)));
    const float mean_f = static_cast<float>(mean);
    for (int64_t i = 0; i < p.hidden; ++i) {
      const float b = p.bias ? load_as_f32(p.bias, p.bias_dtype, i) : 0.0f;
      out[i] = (x[i] - mean_f) * inv * load_as_f32(p.weight, p.weight_dtype, i) + b;
    }
  }
  return ok_status();
}

}  // namespace strata::cpu
