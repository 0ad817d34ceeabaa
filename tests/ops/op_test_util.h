// Helpers shared by the op tests: seeded random data, dtype rounding, and the error measure.
//
// Error measure: max |got - want| / max |want| over the whole output (the inf-norm relative
// error). Element-wise relative error is meaningless where outputs cancel to near zero, and
// the outputs' scale is what a later layer sees.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/half.h"
#include "core/tensor.h"
#include "strata/types.h"

namespace strata::testing {

inline constexpr double kF32Tol = 1e-5;

// Uniform values in [lo, hi), never all zero, from a fixed seed.
inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  if (n > 0) v[0] = v[0] == 0.0f ? 0.5f : v[0];
  return v;
}

inline std::vector<int32_t> random_ints(size_t n, uint32_t seed, int32_t lo, int32_t hi_incl) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi_incl);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(gen);
  return v;
}

// Values stored in dtype dt (f32, f16 or bf16) as raw bytes, plus the f32 values they round to.
struct TypedBuffer {
  DType dtype = DType::kF32;
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // what the stored values are, exactly
  void* data() { return bytes.data(); }
};

inline TypedBuffer make_typed(const std::vector<float>& src, DType dt) {
  TypedBuffer b;
  b.dtype = dt;
  b.values.resize(src.size());
  b.bytes.resize(static_cast<size_t>(dtype_bytes(dt, static_cast<int64_t>(src.size()))));
  for (size_t i = 0; i < src.size(); ++i) {
    if (dt == DType::kF32) {
      reinterpret_cast<float*>(b.bytes.data())[i] = src[i];
      b.values[i] = src[i];
    } else if (dt == DType::kF16) {
      const uint16_t h = f32_to_f16(src[i]);
      reinterpret_cast<uint16_t*>(b.bytes.data())[i] = h;
      b.values[i] = f16_to_f32(h);
    } else if (dt == DType::kBF16) {
      const uint16_t h = f32_to_bf16(src[i]);
      reinterpret_cast<uint16_t*>(b.bytes.data())[i] = h;
      b.values[i] = bf16_to_f32(h);
    } else {
      ADD_FAILURE() << "make_typed: unsupported dtype " << dtype_name(dt);
      return b;
    }
  }
  return b;
}

// max |got - want| / max |want|
inline double rel_err(const float* got, const double* want, size_t n) {
  double diff = 0.0;
  double scale = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff = std::max(diff, std::abs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return scale > 0.0 ? diff / scale : diff;
}

inline double rel_err(const std::vector<float>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  return rel_err(got.data(), want.data(), std::min(got.size(), want.size()));
}

// A strided 2-D view [rows, cols] at column `col0` of a [rows, row_stride] buffer.
inline Tensor strided_view(void* data, DType dt, int64_t rows, int64_t cols, int64_t row_stride,
                           int64_t col0 = 0) {
  Tensor t = Tensor::make(data, dt, {rows, row_stride});
  return t.slice_cols(col0, col0 + cols);
}

}  // namespace strata::testing
