// Parameter structs shared by a kernel's CPU twin (strata::cpu::<op>) and its CUDA version
// (strata::cuda::<op>). Raw pointers plus sizes: backends know nothing of Tensor or models.
// Shape comments name the dimensions (docs/glossary.md).
#pragma once

#include <cstdint>

#include "strata/types.h"

namespace strata {

// out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * (weight[:] + weight_offset)
struct RmsNormParams {
  const float* x = nullptr;       // [n_tokens, hidden], row stride x_stride
  const void* weight = nullptr;   // [hidden], dtype weight_dtype
  DType weight_dtype = DType::kF32;
  float* out = nullptr;           // [n_tokens, hidden], row stride out_stride (may alias x)
  int64_t n_tokens = 0;
  int64_t hidden = 0;
  int64_t x_stride = 0;
  int64_t out_stride = 0;
  float eps = 1e-6f;
  float weight_offset = 0.0f;
};

}  // namespace strata
