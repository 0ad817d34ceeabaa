// The activation formulas of the CPU kernels, shared by activation.cpp and its bf16 twin
// fused_bf16.cpp so both compute them operation for operation.
#pragma once

#include <cmath>

#include "backends/kernel_params.h"

namespace strata::cpu {

inline constexpr float kSqrt2OverPi = 0.7978845608028654f;
inline constexpr float kInvSqrt2 = 0.7071067811865476f;

template <Activation A>
inline float apply_activation(float x) {
  if constexpr (A == Activation::kSilu) {
    return x / (1.0f + std::exp(-x));
  } else if constexpr (A == Activation::kGeluTanh) {
    return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
  } else if constexpr (A == Activation::kGeluErf) {
    return 0.5f * x * (1.0f + std::erf(x * kInvSqrt2));
  } else {
    return x > 0.0f ? x : 0.0f;
  }
}

}  // namespace strata::cpu
