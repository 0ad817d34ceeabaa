// Row-wise softmax and argmax on the CPU (sampling over logits). Softmax subtracts the row max
// and sums the exponentials in double, so a 150k-entry vocabulary row still sums to 1 within
// f32 rounding.
#include <cmath>
#include <limits>

#include "backends/cpu/cpu_kernels.h"

namespace strata::cpu {

Status softmax(const SoftmaxParams& p) {
#pragma omp parallel for schedule(static) if (p.rows > 1)
  for (int64_t r = 0; r < p.rows; ++r) {
    float* x = p.x + r * p.stride;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < p.cols; ++i) m = x[i] > m ? x[i] : m;
    double sum = 0.0;
    for (int64_t i = 0; i < p.cols; ++i) {
      x[i] = std::exp(x[i] - m);
      sum += x[i];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < p.cols; ++i) x[i] *= inv;
  }
  return ok_status();
}

Status argmax(const ArgmaxParams& p) {
#pragma omp parallel for schedule(static) if (p.rows > 1)
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * p.stride;
    int64_t best = 0;
    float best_v = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < p.cols; ++i) {
      if (x[i] > best_v) {
        best_v = x[i];
        best = i;
      }
    }
    p.out[r] = static_cast<int32_t>(best);
  }
  return ok_status();
}

}  // namespace strata::cpu
