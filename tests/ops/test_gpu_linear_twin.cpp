// cpu::gpu_linear (the CPU twin of the GPU executor's linear layer) against the f32 reference
// cpu::linear, and cpu::quantize_rows (the twin of the load-time weight quantization):
//   - bf16 weights: cpu::linear on the same bf16 values (x rounded to bf16 first), so only the
//     summation order differs;
//   - int8 / fp8 weights: cpu::linear on the dequantized f32 weights scale[m] * q[m, k];
//   - bias, accumulate into f32 out, bf16 out (one rounding of the f32 result), padded strides,
//     gated_silu against two linears composed with silu(gate) * up;
//   - quantize_rows: per-element round-trip error bounds, the scale rule, zero rows;
//   - f32_to_fp8e4m3 (core/half.h): every code round-trips, ties go to even, saturation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "core/half.h"
#include "op_test_util.h"

namespace strata {
namespace {

using testing::random_floats;

constexpr double kTol = 1e-5;  // f32, different summation order, relative to max |ref|

struct TwinCase {
  int64_t n;
  int64_t k;
  int64_t m;
  DType w_dtype;
  bool bias = false;
  bool accumulate = false;
  bool gated = false;
  DType out_dtype = DType::kF32;
  int64_t pad = 0;  // extra elements at the end of every x, w and out row
};

std::string case_name(const ::testing::TestParamInfo<TwinCase>& info) {
  const TwinCase& c = info.param;
  std::string s = "n" + std::to_string(c.n) + "_k" + std::to_string(c.k) + "_m" +
                  std::to_string(c.m) + "_" + std::string(dtype_name(c.w_dtype)) + "_" +
                  std::string(dtype_name(c.out_dtype));
  if (c.bias) s += "_bias";
  if (c.accumulate) s += "_acc";
  if (c.gated) s += "_gated";
  if (c.pad) s += "_pad" + std::to_string(c.pad);
  return s;
}

// A weight matrix [rows, k] with row stride `stride` in w_dtype, plus its exact f32 values
// (dequantized for int8/fp8) with row stride k.
struct Weights {
  std::vector<uint8_t> bytes;
  std::vector<float> scale;  // per row; empty for bf16
  std::vector<float> values;
};

Weights make_weights(DType dt, int64_t rows, int64_t k, int64_t stride, uint32_t seed) {
  const std::vector<float> src = random_floats(static_cast<size_t>(rows * k), seed);
  std::vector<uint16_t> bf(static_cast<size_t>(rows * k));
  for (size_t i = 0; i < bf.size(); ++i) bf[i] = f32_to_bf16(src[i]);
  Weights w;
  w.values.resize(bf.size());
  if (dt == DType::kBF16) {
    w.bytes.assign(static_cast<size_t>(rows * stride * 2), 0);
    auto* dst = reinterpret_cast<uint16_t*>(w.bytes.data());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < k; ++c) {
        const uint16_t h = bf[static_cast<size_t>(r * k + c)];
        dst[r * stride + c] = h;
        w.values[static_cast<size_t>(r * k + c)] = bf16_to_f32(h);
      }
    }
    return w;
  }
  std::vector<uint8_t> q(static_cast<size_t>(rows * k));
  w.scale.resize(static_cast<size_t>(rows));
  EXPECT_TRUE(cpu::quantize_rows(bf.data(), rows, k, dt, q.data(), w.scale.data()).ok());
  w.bytes.assign(static_cast<size_t>(rows * stride), 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const uint8_t b = q[static_cast<size_t>(r * k + c)];
      w.bytes[static_cast<size_t>(r * stride + c)] = b;
      const float qv =
          dt == DType::kI8 ? static_cast<float>(static_cast<int8_t>(b)) : fp8e4m3_to_f32(b);
      w.values[static_cast<size_t>(r * k + c)] = w.scale[static_cast<size_t>(r)] * qv;
    }
  }
  return w;
}

// cpu::linear over rows [row0, row0 + m) of the f32 weights: out[t, j] (dense [n, m]).
std::vector<float> ref_linear(const std::vector<float>& x, int64_t n, int64_t k, const Weights& w,
                              int64_t row0, int64_t m, const float* bias) {
  std::vector<float> out(static_cast<size_t>(n * m));
  const LinearParams p{.x = x.data(),
                       .x_stride = k,
                       .w = w.values.data() + row0 * k,
                       .w_dtype = DType::kF32,
                       .w_stride = k,
                       .bias = bias ? bias + row0 : nullptr,
                       .bias_dtype = DType::kF32,
                       .out = out.data(),
                       .out_stride = m,
                       .n_tokens = n,
                       .in_features = k,
                       .out_features = m};
  EXPECT_TRUE(cpu::linear(p).ok());
  return out;
}

class GpuLinearTwinTest : public ::testing::TestWithParam<TwinCase> {};

TEST_P(GpuLinearTwinTest, MatchesF32Reference) {
  const TwinCase& c = GetParam();
  const uint32_t seed = static_cast<uint32_t>(c.n * 7919 + c.k * 31 + c.m);
  const int64_t rows = c.gated ? 2 * c.m : c.m;
  const int64_t x_stride = c.k + c.pad;
  const int64_t w_stride = c.k + c.pad;
  const int64_t out_stride = c.m + c.pad;

  // x in bf16 storage and the same values in f32 for the reference.
  const std::vector<float> x_src = random_floats(static_cast<size_t>(c.n * c.k), seed, -2.0f, 2.0f);
  std::vector<uint16_t> x_bf(static_cast<size_t>(c.n * x_stride), f32_to_bf16(-1.0f));
  std::vector<float> x_f(static_cast<size_t>(c.n * c.k));
  for (int64_t t = 0; t < c.n; ++t) {
    for (int64_t i = 0; i < c.k; ++i) {
      const uint16_t h = f32_to_bf16(x_src[static_cast<size_t>(t * c.k + i)]);
      x_bf[static_cast<size_t>(t * x_stride + i)] = h;
      x_f[static_cast<size_t>(t * c.k + i)] = bf16_to_f32(h);
    }
  }
  const Weights w = make_weights(c.w_dtype, rows, c.k, w_stride, seed + 1);
  const std::vector<float> bias = random_floats(static_cast<size_t>(rows), seed + 2);
  const std::vector<float> prior = random_floats(static_cast<size_t>(c.n * out_stride), seed + 3);

  // Expected values in double from the reference linear(s).
  std::vector<double> want(static_cast<size_t>(c.n * c.m));
  const float* b = c.bias ? bias.data() : nullptr;
  const std::vector<float> r0 = ref_linear(x_f, c.n, c.k, w, 0, c.m, b);
  std::vector<float> r1;
  if (c.gated) r1 = ref_linear(x_f, c.n, c.k, w, c.m, c.m, b);
  for (int64_t t = 0; t < c.n; ++t) {
    for (int64_t j = 0; j < c.m; ++j) {
      const size_t i = static_cast<size_t>(t * c.m + j);
      double v = r0[i];
      if (c.gated) v = v / (1.0 + std::exp(-v)) * r1[i];
      if (c.accumulate) v += prior[static_cast<size_t>(t * out_stride + j)];
      want[i] = v;
    }
  }

  GpuLinearParams p{.x = x_bf.data(),
                    .x_stride = x_stride,
                    .w = w.bytes.data(),
                    .w_dtype = c.w_dtype,
                    .w_stride = w_stride,
                    .w_scale = w.scale.empty() ? nullptr : w.scale.data(),
                    .bias = b,
                    .out_dtype = c.out_dtype,
                    .out_stride = out_stride,
                    .n_tokens = c.n,
                    .in_features = c.k,
                    .out_features = c.m,
                    .accumulate = c.accumulate,
                    .gated_silu = c.gated};
  std::vector<float> got(static_cast<size_t>(c.n * c.m));
  if (c.out_dtype == DType::kF32) {
    std::vector<float> out = prior;
    p.out = out.data();
    const Status st = cpu::gpu_linear(p);
    ASSERT_TRUE(st.ok()) << st.to_string();
    for (int64_t t = 0; t < c.n; ++t) {
      for (int64_t j = 0; j < c.m; ++j)
        got[static_cast<size_t>(t * c.m + j)] = out[static_cast<size_t>(t * out_stride + j)];
      for (int64_t j = c.m; j < out_stride; ++j) {
        ASSERT_EQ(out[static_cast<size_t>(t * out_stride + j)],
                  prior[static_cast<size_t>(t * out_stride + j)])
            << "wrote into the padding of out row " << t;
      }
    }
    EXPECT_LE(testing::rel_err(got, want), kTol);
  } else {
    const uint16_t fill = f32_to_bf16(-3.0f);
    std::vector<uint16_t> out(static_cast<size_t>(c.n * out_stride), fill);
    p.out = out.data();
    const Status st = cpu::gpu_linear(p);
    ASSERT_TRUE(st.ok()) << st.to_string();
    // One rounding of the f32 result: within half a bf16 ulp (2^-9 relative) of the reference,
    // plus the f32 tolerance.
    double scale = 0.0;
    for (double v : want) scale = std::max(scale, std::fabs(v));
    for (int64_t t = 0; t < c.n; ++t) {
      for (int64_t j = 0; j < c.m; ++j) {
        const double ref = want[static_cast<size_t>(t * c.m + j)];
        const double g = bf16_to_f32(out[static_cast<size_t>(t * out_stride + j)]);
        ASSERT_LE(std::fabs(g - ref), std::fabs(ref) * (1.0 / 256) + scale * kTol)
            << "token " << t << " row " << j;
      }
      for (int64_t j = c.m; j < out_stride; ++j)
        ASSERT_EQ(out[static_cast<size_t>(t * out_stride + j)], fill);
    }
  }
}

std::vector<TwinCase> twin_cases() {
  std::vector<TwinCase> cases;
  for (DType dt : {DType::kBF16, DType::kI8, DType::kFP8E4M3}) {
    cases.push_back({1, 72, 17, dt});
    cases.push_back({3, 200, 15, dt, true});
    cases.push_back({17, 136, 33, dt, true, true});
    cases.push_back({5, 72, 31, dt, false, false, true});
    cases.push_back({4, 200, 16, dt, true, false, true, DType::kBF16});
    cases.push_back({9, 64, 40, dt, false, false, false, DType::kBF16, 8});
    cases.push_back({2, 1032, 24, dt, true, true, false, DType::kF32, 16});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuLinearTwinTest, ::testing::ValuesIn(twin_cases()), case_name);

TEST(GpuLinearTwin, ArgumentErrors) {
  uint16_t x[8] = {};
  uint8_t w[8] = {};
  float out[1] = {};
  float scale[1] = {1.0f};
  const GpuLinearParams ok{.x = x,
                           .x_stride = 8,
                           .w = w,
                           .w_dtype = DType::kI8,
                           .w_stride = 8,
                           .w_scale = scale,
                           .out = out,
                           .out_stride = 1,
                           .n_tokens = 1,
                           .in_features = 8,
                           .out_features = 1};
  EXPECT_TRUE(cpu::gpu_linear(ok).ok());
  GpuLinearParams p = ok;
  p.w_scale = nullptr;
  EXPECT_EQ(cpu::gpu_linear(p).code(), StatusCode::kInvalidArgument);
  p = ok;
  p.w_dtype = DType::kF16;
  EXPECT_EQ(cpu::gpu_linear(p).code(), StatusCode::kUnimplemented);
  p = ok;
  p.out_dtype = DType::kBF16;
  p.accumulate = true;
  const Status st = cpu::gpu_linear(p);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("accumulate"), std::string::npos) << st.message();
  p = ok;
  p.w_stride = 7;
  EXPECT_EQ(cpu::gpu_linear(p).code(), StatusCode::kInvalidArgument);
  p = ok;
  p.n_tokens = 0;
  p.x = nullptr;
  EXPECT_TRUE(cpu::gpu_linear(p).ok());
}

// ---- quantize_rows ------------------------------------------------------------------------

TEST(QuantizeRowsTwin, Int8RoundTripWithinHalfAStep) {
  const int64_t rows = 7;
  const int64_t cols = 301;
  std::vector<float> src = random_floats(static_cast<size_t>(rows * cols), 11, -3.0f, 3.0f);
  for (int64_t c = 0; c < cols; ++c) src[static_cast<size_t>(2 * cols + c)] *= 1e-4f;  // tiny row
  for (int64_t c = 0; c < cols; ++c) src[static_cast<size_t>(5 * cols + c)] = 0.0f;    // zero row
  std::vector<uint16_t> w(src.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(src[i]);
  std::vector<int8_t> q(w.size());
  std::vector<float> scale(static_cast<size_t>(rows));
  ASSERT_TRUE(cpu::quantize_rows(w.data(), rows, cols, DType::kI8, q.data(), scale.data()).ok());
  for (int64_t r = 0; r < rows; ++r) {
    const float s = scale[static_cast<size_t>(r)];
    float amax = 0.0f;
    int qmax = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      const float v = bf16_to_f32(w[i]);
      amax = std::max(amax, std::fabs(v));
      qmax = std::max(qmax, std::abs(static_cast<int>(q[i])));
      EXPECT_LE(std::fabs(v - s * q[i]), (0.5f + 1e-4f) * s) << "row " << r << " col " << c;
      EXPECT_NE(q[i], -128);
    }
    if (amax == 0.0f) {
      EXPECT_EQ(s, 1.0f);
      EXPECT_EQ(qmax, 0);
    } else {
      EXPECT_EQ(s, amax / 127.0f);
      EXPECT_EQ(qmax, 127) << "the largest weight maps to +-127";
    }
  }
}

TEST(QuantizeRowsTwin, Fp8RoundTripWithinHalfAnUlp) {
  const int64_t rows = 5;
  const int64_t cols = 257;
  std::vector<float> src = random_floats(static_cast<size_t>(rows * cols), 12, -2.0f, 2.0f);
  // A wide dynamic range in row 1 so some q land in the e4m3 subnormals (|q| < 2^-6).
  for (int64_t c = 0; c < cols; c += 3) src[static_cast<size_t>(cols + c)] *= 1e-5f;
  for (int64_t c = 0; c < cols; ++c) src[static_cast<size_t>(3 * cols + c)] = 0.0f;
  std::vector<uint16_t> w(src.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(src[i]);
  std::vector<uint8_t> q(w.size());
  std::vector<float> scale(static_cast<size_t>(rows));
  ASSERT_TRUE(
      cpu::quantize_rows(w.data(), rows, cols, DType::kFP8E4M3, q.data(), scale.data()).ok());
  int subnormals = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float s = scale[static_cast<size_t>(r)];
    float qmax = 0.0f;
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      const float v = bf16_to_f32(w[i]);
      const float qv = fp8e4m3_to_f32(q[i]);
      ASSERT_FALSE(std::isnan(qv));
      qmax = std::max(qmax, std::fabs(qv));
      const float a = std::fabs(v / s);
      // Half an ulp of e4m3: 2^-4 relative in the normal range, 2^-10 absolute below 2^-6.
      const float bound = a >= 0.015625f ? a * 0.0625f : 0.0009765625f;
      EXPECT_LE(std::fabs(v / s - qv), bound * 1.0001f) << "row " << r << " col " << c;
      subnormals += (q[i] & 0x78) == 0 && (q[i] & 0x07) != 0;
    }
    if (r == 3) {
      EXPECT_EQ(s, 1.0f);
      EXPECT_EQ(qmax, 0.0f);
    } else {
      EXPECT_EQ(qmax, 448.0f) << "the largest weight maps to +-448";
    }
  }
  EXPECT_GT(subnormals, 0) << "the test meant to cover e4m3 subnormals";
}

TEST(QuantizeRowsTwin, ArgumentErrors) {
  uint16_t w[4] = {};
  int8_t q[4];
  float s[1];
  EXPECT_EQ(cpu::quantize_rows(w, 1, 4, DType::kBF16, q, s).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu::quantize_rows(w, 1, 0, DType::kI8, q, s).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu::quantize_rows(nullptr, 1, 4, DType::kI8, q, s).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(cpu::quantize_rows(nullptr, 0, 4, DType::kI8, nullptr, nullptr).ok());
}

// ---- f32_to_fp8e4m3 ------------------------------------------------------------------------

TEST(Fp8E4M3, EveryCodeRoundTrips) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;  // NaN
    const float v = fp8e4m3_to_f32(static_cast<uint8_t>(b));
    EXPECT_EQ(f32_to_fp8e4m3(v), b) << "code " << b << " value " << v;
  }
}

TEST(Fp8E4M3, TiesToEvenAndSaturation) {
  // Midpoints between neighbouring codes round to the even code (mantissa lsb 0).
  for (int b = 0; b < 0x7e; ++b) {
    const float lo = fp8e4m3_to_f32(static_cast<uint8_t>(b));
    const float hi = fp8e4m3_to_f32(static_cast<uint8_t>(b + 1));
    const float mid = 0.5f * (lo + hi);  // exact: both have few mantissa bits
    const int even = (b & 1) == 0 ? b : b + 1;
    EXPECT_EQ(f32_to_fp8e4m3(mid), even) << "between codes " << b << " and " << b + 1;
    EXPECT_EQ(f32_to_fp8e4m3(-mid), even | 0x80);
    EXPECT_EQ(f32_to_fp8e4m3(std::nextafter(mid, hi)), b + 1);
    EXPECT_EQ(f32_to_fp8e4m3(std::nextafter(mid, lo)), b);
  }
  EXPECT_EQ(f32_to_fp8e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(460.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(1e9f), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(f32_to_fp8e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(f32_to_fp8e4m3(1e-30f), 0x00);
  EXPECT_EQ(f32_to_fp8e4m3(-1e-30f), 0x80);
  EXPECT_EQ(f32_to_fp8e4m3(0.0009765625f), 0x00);  // 2^-10: half the smallest subnormal, to even
  EXPECT_EQ(f32_to_fp8e4m3(0.00097657f), 0x01);
}

}  // namespace
}  // namespace strata
