// Parameter structs shared by a kernel's CPU twin (strata::cpu::<op>) and its CUDA version
// (strata::cuda::<op>). Raw pointers plus sizes: backends know nothing of Tensor or models.
// Shape comments name the dimensions (docs/glossary.md).
#pragma once

#include <cstddef>
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

// out[t, r] = sum_i x[t, i] * W[r, i] (+ bias[r]) for a block-quantized weight W
// (strata::cpu::quant_linear). Weight rows are `weight_row_blocks` blocks apart (0: contiguous
// rows of in_features / block_size blocks), so a column slice of a larger matrix works too.
struct QuantLinearParams {
  const float* x = nullptr;        // [n_tokens, in_features], row stride x_stride
  const void* weight = nullptr;    // [out_features, in_features] of weight_dtype, blocks along i
  DType weight_dtype = DType::kQ4_1;
  const float* bias = nullptr;     // [out_features] or null
  float* out = nullptr;            // [n_tokens, out_features], row stride out_stride; not x
  int64_t n_tokens = 0;
  int64_t in_features = 0;         // multiple of the weight type's block size
  int64_t out_features = 0;
  int64_t x_stride = 0;            // elements; 0 means in_features
  int64_t out_stride = 0;          // elements; 0 means out_features
  int64_t weight_row_blocks = 0;   // blocks between weight rows; 0 means in_features / block
  // quant_linear_scratch_bytes(n_tokens, in_features) bytes for the quantized activations;
  // null (or too small) makes the call allocate its own (for tests; not in a decode step).
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  bool force_scalar = false;       // run the scalar kernels even where AVX2 exists (tests)
};

}  // namespace strata
