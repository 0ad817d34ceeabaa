// rms_norm and layer_norm against double references: odd hidden sizes, strided input rows,
// in-place use, f16/bf16 weights, Gemma's (1 + w) offset, layer_norm with and without bias.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "op_test_util.h"
#include "ops/reference.h"

namespace strata {
namespace {

using testing::kF32Tol;
using testing::make_typed;
using testing::random_floats;
using testing::rel_err;

struct NormCase {
  int64_t n;
  int64_t hidden;
  DType w_dtype;
  int64_t x_pad = 0;  // extra floats per x row (x is a strided view)
  bool in_place = false;
  float offset = 0.0f;  // rms_norm weight_offset
  bool bias = true;     // layer_norm
};

std::string case_name(const NormCase& c) {
  return "n" + std::to_string(c.n) + "_h" + std::to_string(c.hidden) + "_" +
         std::string(dtype_name(c.w_dtype)) + (c.x_pad ? "_strided" : "") +
         (c.in_place ? "_inplace" : "") + (c.offset != 0.0f ? "_offset" : "") +
         (c.bias ? "" : "_nobias");
}

const NormCase kCases[] = {
    {1, 72, DType::kF32},
    {7, 769, DType::kBF16, 5},
    {13, 1031, DType::kF16, 0, true},
    {3, 1031, DType::kF32, 1, true, 1.0f, false},
    {13, 72, DType::kBF16, 0, false, 1.0f, false},
    {7, 4096, DType::kF32, 3, false, 0.0f, true},
};

class NormTest : public ::testing::TestWithParam<NormCase> {};

TEST_P(NormTest, RmsNormMatchesReference) {
  const NormCase& c = GetParam();
  const int64_t stride = c.hidden + c.x_pad;
  const uint32_t seed = static_cast<uint32_t>(c.n * 131 + c.hidden);
  // Offset inputs (mean 0.7) so a wrong mean/variance formula shows.
  std::vector<float> x = random_floats(static_cast<size_t>(c.n * stride), seed, -0.3f, 1.7f);
  testing::TypedBuffer w =
      make_typed(random_floats(static_cast<size_t>(c.hidden), seed + 1), c.w_dtype);
  const float eps = 1e-5f;
  std::vector<double> want(static_cast<size_t>(c.n * c.hidden));
  for (int64_t r = 0; r < c.n; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < c.hidden; ++i) ss += double(x[r * stride + i]) * x[r * stride + i];
    const double inv = 1.0 / std::sqrt(ss / double(c.hidden) + eps);
    for (int64_t i = 0; i < c.hidden; ++i) {
      want[r * c.hidden + i] = x[r * stride + i] * inv * (double(w.values[i]) + c.offset);
    }
  }
  Tensor xt = testing::strided_view(x.data(), DType::kF32, c.n, c.hidden, stride);
  Tensor wt = Tensor::make(w.data(), c.w_dtype, {c.hidden});
  std::vector<float> out(static_cast<size_t>(c.n * c.hidden));
  Tensor ot = c.in_place ? xt : Tensor::make(out.data(), DType::kF32, {c.n, c.hidden});
  ASSERT_TRUE(ops::ref::rms_norm(xt, wt, eps, c.offset, ot).ok());
  if (c.in_place) {
    for (int64_t r = 0; r < c.n; ++r) {
      for (int64_t i = 0; i < c.hidden; ++i) out[r * c.hidden + i] = x[r * stride + i];
    }
  }
  EXPECT_LE(rel_err(out, want), kF32Tol);
}

TEST_P(NormTest, LayerNormMatchesReference) {
  const NormCase& c = GetParam();
  const int64_t stride = c.hidden + c.x_pad;
  const uint32_t seed = static_cast<uint32_t>(c.n * 131 + c.hidden + 7);
  std::vector<float> x = random_floats(static_cast<size_t>(c.n * stride), seed, 2.0f, 4.0f);
  testing::TypedBuffer w =
      make_typed(random_floats(static_cast<size_t>(c.hidden), seed + 1), c.w_dtype);
  testing::TypedBuffer b =
      make_typed(random_floats(static_cast<size_t>(c.hidden), seed + 2), c.w_dtype);
  const float eps = 1e-5f;
  std::vector<double> want(static_cast<size_t>(c.n * c.hidden));
  for (int64_t r = 0; r < c.n; ++r) {
    double mean = 0.0;
    for (int64_t i = 0; i < c.hidden; ++i) mean += x[r * stride + i];
    mean /= double(c.hidden);
    double var = 0.0;
    for (int64_t i = 0; i < c.hidden; ++i) {
      var += (x[r * stride + i] - mean) * (x[r * stride + i] - mean);
    }
    var /= double(c.hidden);
    const double inv = 1.0 / std::sqrt(var + eps);
    for (int64_t i = 0; i < c.hidden; ++i) {
      want[r * c.hidden + i] =
          (x[r * stride + i] - mean) * inv * w.values[i] + (c.bias ? double(b.values[i]) : 0.0);
    }
  }
  Tensor xt = testing::strided_view(x.data(), DType::kF32, c.n, c.hidden, stride);
  Tensor wt = Tensor::make(w.data(), c.w_dtype, {c.hidden});
  Tensor bt = c.bias ? Tensor::make(b.data(), c.w_dtype, {c.hidden}) : Tensor();
  std::vector<float> out(static_cast<size_t>(c.n * c.hidden));
  Tensor ot = c.in_place ? xt : Tensor::make(out.data(), DType::kF32, {c.n, c.hidden});
  ASSERT_TRUE(ops::ref::layer_norm(xt, wt, bt, eps, ot).ok());
  if (c.in_place) {
    for (int64_t r = 0; r < c.n; ++r) {
      for (int64_t i = 0; i < c.hidden; ++i) out[r * c.hidden + i] = x[r * stride + i];
    }
  }
  EXPECT_LE(rel_err(out, want), kF32Tol);
}

INSTANTIATE_TEST_SUITE_P(Shapes, NormTest, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return case_name(info.param); });

TEST(NormTest, ShapeMismatchesAreErrors) {
  std::vector<float> x = random_floats(7 * 72, 1);
  std::vector<float> out(7 * 72);
  std::vector<float> w = random_floats(72, 2);
  Tensor xt = Tensor::make(x.data(), DType::kF32, {7, 72});
  Tensor w71 = Tensor::make(w.data(), DType::kF32, {71});
  Tensor w72 = Tensor::make(w.data(), DType::kF32, {72});
  Tensor ot = Tensor::make(out.data(), DType::kF32, {7, 72});
  Tensor o_bad = Tensor::make(out.data(), DType::kF32, {6, 72});
  Status s = ops::ref::rms_norm(xt, w71, 1e-5f, 0.0f, ot);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "rms_norm: weight is [71] but must be 72 contiguous values");
  EXPECT_FALSE(ops::ref::rms_norm(xt, w72, 1e-5f, 0.0f, o_bad).ok());
  EXPECT_FALSE(ops::ref::layer_norm(xt, w72, w71, 1e-5f, ot).ok());
  EXPECT_FALSE(ops::ref::layer_norm(xt, w72, Tensor(), 1e-5f, o_bad).ok());
  Tensor w_i32 = Tensor::make(w.data(), DType::kI32, {72});
  EXPECT_FALSE(ops::ref::rms_norm(xt, w_i32, 1e-5f, 0.0f, ot).ok());
  Tensor x_bf16 = Tensor::make(x.data(), DType::kBF16, {7, 72});
  EXPECT_FALSE(ops::ref::layer_norm(x_bf16, w72, Tensor(), 1e-5f, ot).ok());
  // A column view whose inner dim is not contiguous.
  Tensor xt_t = xt;
  xt_t.stride = {1, 7};
  xt_t.shape = {72, 7};
  Tensor o_t = Tensor::make(out.data(), DType::kF32, {72, 7});
  Tensor w7 = Tensor::make(w.data(), DType::kF32, {7});
  EXPECT_FALSE(ops::ref::rms_norm(xt_t, w7, 1e-5f, 0.0f, o_t).ok());
  EXPECT_FALSE(ops::ref::rms_norm(Tensor(), w72, 1e-5f, 0.0f, ot).ok());
}

}  // namespace
}  // namespace strata
