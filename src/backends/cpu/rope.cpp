// Rotary position embedding on the CPU, in place. Per token the cos/sin table of its position
// is computed once (angle in double: position * inv_freq reaches 1e5+ radians, where an f32
// product would already be off by ~1e-2) and applied to every head. The pairs rotated are
// (i, i + rotary_dim/2) in neox style (HF rotate_half) and (2i, 2i + 1) otherwise (GPT-J);
// dims past rotary_dim pass through unchanged.
#include <cmath>

#include "backends/cpu/cpu_kernels.h"
#include "core/status.h"

namespace strata::cpu {
namespace {

constexpr int64_t kMaxRotaryDim = 1024;

}  // namespace

Status rope(const RopeKernelParams& p) {
  if (p.rotary_dim <= 0 || p.rotary_dim % 2 != 0 || p.rotary_dim > p.head_dim ||
      p.rotary_dim > kMaxRotaryDim) {
    return errorf(StatusCode::kInvalidArgument,
                  "rope: rotary_dim {} must be even, in (0, head_dim {}] and <= {}", p.rotary_dim,
                  p.head_dim, kMaxRotaryDim);
  }
  const int64_t half = p.rotary_dim / 2;
#pragma omp parallel for schedule(static) if (p.n_tokens * p.n_heads * p.rotary_dim >= \
                                              kParallelMinElems)
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    float cos_t[kMaxRotaryDim / 2];
    float sin_t[kMaxRotaryDim / 2];
    const double pos = p.positions[t];
    for (int64_t i = 0; i < half; ++i) {
      const double angle = pos * static_cast<double>(p.inv_freq[i]);
      cos_t[i] = static_cast<float>(std::cos(angle)) * p.attention_factor;
      sin_t[i] = static_cast<float>(std::sin(angle)) * p.attention_factor;
    }
    for (int64_t h = 0; h < p.n_heads; ++h) {
      float* x = p.x + t * p.token_stride + h * p.head_stride;
      if (p.neox_style) {
        for (int64_t i = 0; i < half; ++i) {
          const float a = x[i];
          const float b = x[i + half];
          x[i] = a * cos_t[i] - b * sin_t[i];
          x[i + half] = b * cos_t[i] + a * sin_t[i];
        }
      } else {
        for (int64_t i = 0; i < half; ++i) {
          const float a = x[2 * i];
          const float b = x[2 * i + 1];
          x[2 * i] = a * cos_t[i] - b * sin_t[i];
          x[2 * i + 1] = b * cos_t[i] + a * sin_t[i];
        }
      }
    }
  }
  return ok_status();
}

}  // namespace strata::cpu
