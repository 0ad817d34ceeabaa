#include "model/rope.h"

#include <cmath>
#include <numbers>

namespace strata {

std::vector<float> rope_inv_freq(int64_t rotary_dim, float theta, const RopeScaling& scaling) {
  if (rotary_dim <= 0) return {};
  const int64_t half = rotary_dim / 2;
  std::vector<float> out(static_cast<size_t>(half));
  const double factor = scaling.factor;
  const double orig_ctx = static_cast<double>(scaling.original_max_position_embeddings);
  const double low = scaling.low_freq_factor;
  const double high = scaling.high_freq_factor;
  for (int64_t i = 0; i < half; ++i) {
    double inv = 1.0 / std::pow(static_cast<double>(theta),
                                static_cast<double>(2 * i) / static_cast<double>(rotary_dim));
    switch (scaling.type) {
      case RopeScalingType::kNone:
        break;
      case RopeScalingType::kLinear:
        inv /= factor;
        break;
      case RopeScalingType::kLlama3: {
        const double wavelen = 2.0 * std::numbers::pi / inv;
        if (wavelen > orig_ctx / low) {
          inv /= factor;
        } else if (wavelen >= orig_ctx / high) {
          const double smooth = (orig_ctx / wavelen - low) / (high - low);
          inv = (1.0 - smooth) * inv / factor + smooth * inv;
        }
        break;
      }
    }
    out[static_cast<size_t>(i)] = static_cast<float>(inv);
  }
  return out;
}

}  // namespace strata
