// The CPU twins of the GPU linear layer's A8W8 path (int8 weights above the SBI crossover:
// per-token int8 activations, an int8 x int8 -> int32 GEMM, the scales in the epilogue):
//   - cpu::quantize_activations_i8: the scale rule (max|x| / 127, 1 for a zero row), every
//     element within half a quantization step, |q| <= 127 with the largest element at +-127,
//     strided rows whose padding is left alone;
//   - cpu::gpu_linear_a8w8 against an independent f32 reference (cpu::linear on the bf16 x and
//     the dequantized weights) within the error int8 activations imply: each x[t, i] moves by at
//     most x_scale[t] / 2, so |out - ref| <= x_scale[t] / 2 * sum_i |w[m, i]| (+ f32 summation
//     slack, + half a bf16 ulp for bf16 out); and exactly (up to f32 rounding) when x is already
//     on the int8 grid;
//   - ops routing: the op table (tests/backend_ops) covers ops::linear picking this twin.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "core/half.h"
#include "op_test_util.h"

namespace strata {
namespace {

using testing::random_floats;

// ---- quantize_activations_i8 ----------------------------------------------------------------

TEST(QuantizeActivationsI8Twin, WithinHalfAStepAndScaleRule) {
  const int64_t n = 6, k = 301, x_stride = k + 5, q_stride = k + 11;
  std::vector<float> src = random_floats(static_cast<size_t>(n * k), 7, -4.0f, 4.0f);
  for (int64_t i = 0; i < k; ++i) src[static_cast<size_t>(1 * k + i)] *= 1e-5f;  // tiny token
  for (int64_t i = 0; i < k; ++i) src[static_cast<size_t>(3 * k + i)] = 0.0f;    // zero token
  src[static_cast<size_t>(4 * k + 17)] = 300.0f;  // an outlier flattens its token's resolution
  std::vector<uint16_t> x(static_cast<size_t>(n * x_stride), f32_to_bf16(1e30f));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < k; ++i)
      x[static_cast<size_t>(t * x_stride + i)] = f32_to_bf16(src[static_cast<size_t>(t * k + i)]);
  }
  constexpr int8_t kFill = 0x55;
  std::vector<int8_t> q(static_cast<size_t>(n * q_stride), kFill);
  std::vector<float> scale(static_cast<size_t>(n), -1.0f);
  ASSERT_TRUE(
      cpu::quantize_activations_i8(x.data(), x_stride, n, k, q.data(), q_stride, scale.data())
          .ok());
  for (int64_t t = 0; t < n; ++t) {
    float amax = 0.0f;
    int qmax = 0;
    for (int64_t i = 0; i < k; ++i)
      amax = std::max(amax, std::fabs(bf16_to_f32(x[static_cast<size_t>(t * x_stride + i)])));
    const float s = scale[static_cast<size_t>(t)];
    EXPECT_EQ(s, amax > 0.0f ? amax / 127.0f : 1.0f) << "token " << t;
    for (int64_t i = 0; i < k; ++i) {
      const double v = bf16_to_f32(x[static_cast<size_t>(t * x_stride + i)]);
      const int qi = q[static_cast<size_t>(t * q_stride + i)];
      qmax = std::max(qmax, std::abs(qi));
      ASSERT_GE(qi, -127);
      ASSERT_LE(std::fabs(v - double{s} * qi), (0.5 + 1e-4) * s) << "token " << t << " i " << i;
    }
    EXPECT_EQ(qmax, amax > 0.0f ? 127 : 0) << "token " << t;
    for (int64_t i = k; i < q_stride; ++i)
      ASSERT_EQ(q[static_cast<size_t>(t * q_stride + i)], kFill) << "wrote into the padding";
  }
}

TEST(QuantizeActivationsI8Twin, TiesRoundToEven) {
  // amax 127 gives scale 1 exactly, so x / scale = x: halves must round to even.
  const std::vector<float> vals = {127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f};
  const std::vector<int> want = {127, 0, 2, 2, 0, -2, -2, 126};
  std::vector<uint16_t> x(vals.size());
  for (size_t i = 0; i < vals.size(); ++i) x[i] = f32_to_bf16(vals[i]);
  std::vector<int8_t> q(vals.size());
  float s = 0.0f;
  const auto k = static_cast<int64_t>(vals.size());
  ASSERT_TRUE(cpu::quantize_activations_i8(x.data(), k, 1, k, q.data(), k, &s).ok());
  EXPECT_EQ(s, 1.0f);
  for (size_t i = 0; i < vals.size(); ++i) EXPECT_EQ(int{q[i]}, want[i]) << vals[i];
}

// ---- gpu_linear_a8w8 ------------------------------------------------------------------------

struct A8W8Case {
  int64_t n, k, m;
  bool bias = false;
  bool accumulate = false;
  DType out_dtype = DType::kF32;
  int64_t pad = 0;
  bool on_grid = false;  // x already on each token's int8 grid: quantization is exact
};

std::string a8w8_name(const ::testing::TestParamInfo<A8W8Case>& info) {
  const A8W8Case& c = info.param;
  std::string s = "n" + std::to_string(c.n) + "_k" + std::to_string(c.k) + "_m" +
                  std::to_string(c.m) + "_" + std::string(dtype_name(c.out_dtype));
  if (c.bias) s += "_bias";
  if (c.accumulate) s += "_acc";
  if (c.pad) s += "_pad" + std::to_string(c.pad);
  if (c.on_grid) s += "_ongrid";
  return s;
}

class A8W8TwinTest : public ::testing::TestWithParam<A8W8Case> {};

TEST_P(A8W8TwinTest, WithinInt8ActivationErrorOfF32Reference) {
  const A8W8Case& c = GetParam();
  const uint32_t seed = static_cast<uint32_t>(c.n * 131 + c.k * 7 + c.m);
  const int64_t x_stride = c.k + c.pad, w_stride = c.k + c.pad, out_stride = c.m + c.pad;

  // x: bf16, random; or on the grid: integers in [-127, 127] times 2^-3, with +-127 present.
  std::vector<float> xf = random_floats(static_cast<size_t>(c.n * c.k), seed, -2.0f, 2.0f);
  if (c.on_grid) {
    for (size_t i = 0; i < xf.size(); ++i) xf[i] = std::round(xf[i] * 63.5f) / 8.0f;
    for (int64_t t = 0; t < c.n; ++t) xf[static_cast<size_t>(t * c.k + t % c.k)] = 127.0f / 8.0f;
  }
  std::vector<uint16_t> x(static_cast<size_t>(c.n * x_stride), f32_to_bf16(1e30f));
  for (int64_t t = 0; t < c.n; ++t) {
    for (int64_t i = 0; i < c.k; ++i) {
      const uint16_t h = f32_to_bf16(xf[static_cast<size_t>(t * c.k + i)]);
      x[static_cast<size_t>(t * x_stride + i)] = h;
      xf[static_cast<size_t>(t * c.k + i)] = bf16_to_f32(h);
    }
  }
  // Weights: bf16 values quantized per row (the load-time rule), and their f32 values.
  const std::vector<float> wsrc = random_floats(static_cast<size_t>(c.m * c.k), seed + 1);
  std::vector<uint16_t> wb(wsrc.size());
  for (size_t i = 0; i < wb.size(); ++i) wb[i] = f32_to_bf16(wsrc[i]);
  std::vector<int8_t> wq(wb.size());
  std::vector<float> wscale(static_cast<size_t>(c.m));
  ASSERT_TRUE(cpu::quantize_rows(wb.data(), c.m, c.k, DType::kI8, wq.data(), wscale.data()).ok());
  std::vector<int8_t> w(static_cast<size_t>(c.m * w_stride), 0x55);
  std::vector<float> wf(static_cast<size_t>(c.m * c.k));
  for (int64_t j = 0; j < c.m; ++j) {
    for (int64_t i = 0; i < c.k; ++i) {
      const int8_t b = wq[static_cast<size_t>(j * c.k + i)];
      w[static_cast<size_t>(j * w_stride + i)] = b;
      wf[static_cast<size_t>(j * c.k + i)] = wscale[static_cast<size_t>(j)] * b;
    }
  }
  const std::vector<float> bias = random_floats(static_cast<size_t>(c.m), seed + 2);
  const std::vector<float> prior = random_floats(static_cast<size_t>(c.n * out_stride), seed + 3);

  // The reference: cpu::linear in f32 on bf16 x and the dequantized weights.
  std::vector<float> ref(static_cast<size_t>(c.n * c.m));
  const LinearParams lp{.x = xf.data(),
                        .x_stride = c.k,
                        .w = wf.data(),
                        .w_dtype = DType::kF32,
                        .w_stride = c.k,
                        .bias = c.bias ? bias.data() : nullptr,
                        .bias_dtype = DType::kF32,
                        .out = ref.data(),
                        .out_stride = c.m,
                        .n_tokens = c.n,
                        .in_features = c.k,
                        .out_features = c.m};
  ASSERT_TRUE(cpu::linear(lp).ok());

  GpuLinearParams p{.x = x.data(),
                    .x_stride = x_stride,
                    .w = w.data(),
                    .w_dtype = DType::kI8,
                    .w_stride = w_stride,
                    .w_scale = wscale.data(),
                    .bias = c.bias ? bias.data() : nullptr,
                    .out_dtype = c.out_dtype,
                    .out_stride = out_stride,
                    .n_tokens = c.n,
                    .in_features = c.k,
                    .out_features = c.m,
                    .accumulate = c.accumulate};
  ASSERT_TRUE(a8w8_eligible(p));
  const bool f32_out = c.out_dtype == DType::kF32;
  std::vector<float> out_f = prior;
  const uint16_t fill = f32_to_bf16(-3.0f);
  std::vector<uint16_t> out_b(static_cast<size_t>(c.n * out_stride), fill);
  p.out = f32_out ? static_cast<void*>(out_f.data()) : out_b.data();
  const Status st = cpu::gpu_linear_a8w8(p);
  ASSERT_TRUE(st.ok()) << st.to_string();

  double ref_max = 0.0;
  for (float v : ref) ref_max = std::max(ref_max, std::fabs(double{v}));
  double worst_ratio = 0.0;  // largest error / its bound, reported
  for (int64_t t = 0; t < c.n; ++t) {
    float amax = 0.0f;
    for (int64_t i = 0; i < c.k; ++i)
      amax = std::max(amax, std::fabs(xf[static_cast<size_t>(t * c.k + i)]));
    const double xs = amax / 127.0;
    for (int64_t j = 0; j < c.m; ++j) {
      double wabs = 0.0;
      for (int64_t i = 0; i < c.k; ++i) wabs += std::fabs(wf[static_cast<size_t>(j * c.k + i)]);
      double want = ref[static_cast<size_t>(t * c.m + j)];
      if (c.accumulate) want += prior[static_cast<size_t>(t * out_stride + j)];
      // The activation rounding (none on the grid), then f32 sums in two orders.
      double bound = (c.on_grid ? 0.0 : 0.5 * xs * wabs * (1 + 1e-3)) + 1e-5 * ref_max;
      double got = 0.0;
      if (f32_out) {
        got = out_f[static_cast<size_t>(t * out_stride + j)];
      } else {
        got = bf16_to_f32(out_b[static_cast<size_t>(t * out_stride + j)]);
        bound += std::fabs(want) / 256 + bound / 256;  // one bf16 rounding
      }
      ASSERT_LE(std::fabs(got - want), bound) << "token " << t << " row " << j;
      worst_ratio = std::max(worst_ratio, std::fabs(got - want) / bound);
    }
    for (int64_t j = c.m; j < out_stride; ++j) {
      if (f32_out) {
        ASSERT_EQ(out_f[static_cast<size_t>(t * out_stride + j)],
                  prior[static_cast<size_t>(t * out_stride + j)]);
      } else {
        ASSERT_EQ(out_b[static_cast<size_t>(t * out_stride + j)], fill);
      }
    }
  }
  RecordProperty("worst_error_over_bound", std::to_string(worst_ratio));
}

std::vector<A8W8Case> a8w8_cases() {
  return {
      {17, 72, 20},
      {18, 64, 4, true},
      {33, 200, 44, true, true},
      {100, 1028, 64, false, false, DType::kBF16, 8},
      {65, 136, 32, true, false, DType::kBF16},
      {21, 256, 48, true, true, DType::kF32, 12},
      {19, 128, 36, false, false, DType::kF32, 0, true},
      {40, 64, 8, true, true, DType::kF32, 4, true},
  };
}

INSTANTIATE_TEST_SUITE_P(Shapes, A8W8TwinTest, ::testing::ValuesIn(a8w8_cases()), a8w8_name);

TEST(A8W8Twin, ArgumentErrors) {
  uint16_t x[8] = {};
  int8_t w[32] = {};
  float out[4] = {};
  float scale[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  const GpuLinearParams ok{.x = x,
                           .x_stride = 8,
                           .w = w,
                           .w_dtype = DType::kI8,
                           .w_stride = 8,
                           .w_scale = scale,
                           .out = out,
                           .out_stride = 4,
                           .n_tokens = 1,
                           .in_features = 8,
                           .out_features = 4};
  GpuLinearParams p = ok;
  EXPECT_TRUE(cpu::gpu_linear_a8w8(p).ok());
  p.out_features = 2;  // not a multiple of 4: IMMA's rule, so no A8W8 path
  EXPECT_FALSE(a8w8_eligible(p));
  EXPECT_EQ(cpu::gpu_linear_a8w8(p).code(), StatusCode::kInvalidArgument);
  p = ok;
  p.w_dtype = DType::kFP8E4M3;
  EXPECT_EQ(cpu::gpu_linear_a8w8(p).code(), StatusCode::kInvalidArgument);
  p = ok;
  p.w_scale = nullptr;
  EXPECT_EQ(cpu::gpu_linear_a8w8(p).code(), StatusCode::kInvalidArgument);
  int8_t q[8];
  float s = 0.0f;
  EXPECT_EQ(cpu::quantize_activations_i8(x, 4, 1, 8, q, 8, &s).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu::quantize_activations_i8(nullptr, 8, 1, 8, q, 8, &s).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(cpu::quantize_activations_i8(nullptr, 8, 0, 8, nullptr, 8, nullptr).ok());
}

}  // namespace
}  // namespace strata
