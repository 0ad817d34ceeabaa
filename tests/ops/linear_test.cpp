// ops::ref::linear and every CPU variant of it (scalar, AVX2, AVX-512 where the CPU has them)
// against a double-precision reference, on awkward shapes: k and m not multiples of any vector
// width, token counts on both sides of the GEMV/GEMM switch, k-blocks with tails, strided
// weight rows (a column slice of a wider matrix), f16/bf16 weights and biases.
#include <gtest/gtest.h>

#include <string>

#include "backends/cpu/cpu_kernels.h"
#include "op_test_util.h"
#include "ops/reference.h"

namespace strata {
namespace {

using testing::kF32Tol;
using testing::make_typed;
using testing::random_floats;
using testing::rel_err;

struct LinearCase {
  int64_t n;
  int64_t k;
  int64_t m;
  DType w_dtype;
  int64_t w_col0 = 0;   // > 0: w is columns [w_col0, w_col0 + k) of a wider matrix
  int64_t w_extra = 0;  // extra columns after the slice
  bool bias = false;
  DType bias_dtype = DType::kF32;
};

std::string case_name(const LinearCase& c) {
  return "n" + std::to_string(c.n) + "_k" + std::to_string(c.k) + "_m" + std::to_string(c.m) + "_" +
         std::string(dtype_name(c.w_dtype)) + (c.w_col0 || c.w_extra ? "_strided" : "") +
         (c.bias ? "_bias" : "");
}

const LinearCase kCases[] = {
    {1, 72, 176, DType::kF32},
    {1, 1031, 769, DType::kBF16, 0, 0, true, DType::kBF16},
    {1, 769, 72, DType::kF16, 5, 11},
    {1, 1, 33, DType::kF32, 0, 0, true},
    {2, 72, 33, DType::kBF16},
    {3, 769, 176, DType::kF32, 0, 0, true},
    {4, 1031, 72, DType::kBF16, 3, 0},
    {5, 72, 769, DType::kF32},
    {7, 1031, 176, DType::kF32, 7, 9, true},
    {7, 769, 33, DType::kBF16, 0, 0, true, DType::kF16},
    {8, 256, 64, DType::kF32},
    {13, 769, 176, DType::kF16, 0, 0, true},
    {13, 72, 1031, DType::kBF16, 11, 1},
    {17, 1031, 769, DType::kF32},
    {64, 769, 97, DType::kBF16, 0, 0, true},
    {70, 513, 300, DType::kF32, 1, 2},
    {129, 72, 40, DType::kF16},
    // k past the GEMV k-chunk (1024 f32 / 2048 16-bit) and the GEMM k-block (2048)
    {3, 2333, 37, DType::kF32, 0, 0, true},
    {9, 4500, 41, DType::kBF16, 2, 5},
    {40, 2049, 70, DType::kF16, 0, 0, true},
    // more tokens than one GEMM token chunk holds at this k (packed x is capped at 8 MiB)
    {600, 4500, 41, DType::kF32, 0, 0, true},
};

// The expected output in double from the stored (rounded) weight values.
std::vector<double> reference(const LinearCase& c, const std::vector<float>& x,
                              const std::vector<float>& w_vals, int64_t w_stride,
                              const std::vector<float>& b_vals) {
  std::vector<double> out(static_cast<size_t>(c.n * c.m));
  for (int64_t i = 0; i < c.n; ++i) {
    for (int64_t j = 0; j < c.m; ++j) {
      double acc = c.bias ? b_vals[static_cast<size_t>(j)] : 0.0;
      for (int64_t kk = 0; kk < c.k; ++kk) {
        acc += static_cast<double>(x[static_cast<size_t>(i * c.k + kk)]) *
               w_vals[static_cast<size_t>(j * w_stride + c.w_col0 + kk)];
      }
      out[static_cast<size_t>(i * c.m + j)] = acc;
    }
  }
  return out;
}

class LinearTest : public ::testing::TestWithParam<LinearCase> {};

TEST_P(LinearTest, MatchesDoubleReferenceOnEveryVariant) {
  const LinearCase& c = GetParam();
  const int64_t w_stride = c.w_col0 + c.k + c.w_extra;
  const uint32_t seed = static_cast<uint32_t>(c.n * 7919 + c.k * 31 + c.m);
  std::vector<float> x = random_floats(static_cast<size_t>(c.n * c.k), seed);
  testing::TypedBuffer w =
      make_typed(random_floats(static_cast<size_t>(c.m * w_stride), seed + 1), c.w_dtype);
  testing::TypedBuffer b =
      make_typed(random_floats(static_cast<size_t>(c.m), seed + 2), c.bias_dtype);
  const std::vector<double> want = reference(c, x, w.values, w_stride, b.values);

  Tensor xt = Tensor::make(x.data(), DType::kF32, {c.n, c.k});
  Tensor wt = testing::strided_view(w.data(), c.w_dtype, c.m, c.k, w_stride, c.w_col0);
  Tensor bt = c.bias ? Tensor::make(b.data(), c.bias_dtype, {c.m}) : Tensor();

  {
    std::vector<float> out(static_cast<size_t>(c.n * c.m), -7.0f);
    Tensor ot = Tensor::make(out.data(), DType::kF32, {c.n, c.m});
    ASSERT_TRUE(ops::ref::linear(xt, wt, bt, ot).ok());
    EXPECT_LE(rel_err(out, want), kF32Tol) << "ops::ref::linear";
  }
  struct Variant {
    cpu::CpuIsa isa;
    cpu::LinearPath path;
    const char* name;
  };
  const Variant kVariants[] = {
      {cpu::CpuIsa::kScalar, cpu::LinearPath::kAuto, "scalar"},
      {cpu::CpuIsa::kAvx2, cpu::LinearPath::kGemv, "avx2 gemv"},
      {cpu::CpuIsa::kAvx2, cpu::LinearPath::kGemm, "avx2 gemm"},
      {cpu::CpuIsa::kAvx512, cpu::LinearPath::kGemv, "avx512 gemv"},
      {cpu::CpuIsa::kAvx512, cpu::LinearPath::kGemm, "avx512 gemm"},
  };
  for (const Variant& v : kVariants) {
    if (!cpu::cpu_supports(v.isa)) continue;
    // A wider out buffer checks the out row stride and that nothing past m is written.
    const int64_t out_stride = c.m + 3;
    std::vector<float> out(static_cast<size_t>(c.n * out_stride), -7.0f);
    const LinearParams p{.x = x.data(),
                         .x_stride = c.k,
                         .w = wt.data,
                         .w_dtype = c.w_dtype,
                         .w_stride = w_stride,
                         .bias = c.bias ? b.data() : nullptr,
                         .bias_dtype = c.bias_dtype,
                         .out = out.data(),
                         .out_stride = out_stride,
                         .n_tokens = c.n,
                         .in_features = c.k,
                         .out_features = c.m};
    ASSERT_TRUE(cpu::linear_with_isa(p, v.isa, v.path).ok()) << v.name;
    std::vector<float> packed(static_cast<size_t>(c.n * c.m));
    for (int64_t i = 0; i < c.n; ++i) {
      for (int64_t j = 0; j < c.m; ++j) {
        packed[static_cast<size_t>(i * c.m + j)] = out[static_cast<size_t>(i * out_stride + j)];
      }
      for (int64_t j = c.m; j < out_stride; ++j) {
        ASSERT_EQ(out[static_cast<size_t>(i * out_stride + j)], -7.0f)
            << v.name << " wrote past out_features in row " << i;
      }
    }
    EXPECT_LE(rel_err(packed, want), kF32Tol) << v.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearTest, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return case_name(info.param); });

TEST(LinearTest, EmptyBatchIsANoOp) {
  std::vector<float> w = random_floats(72 * 16, 1);
  float x = 1.0f;
  float out = 3.0f;
  Tensor xt = Tensor::make(&x, DType::kF32, {0, 72});
  Tensor wt = Tensor::make(w.data(), DType::kF32, {16, 72});
  Tensor ot = Tensor::make(&out, DType::kF32, {0, 16});
  EXPECT_TRUE(ops::ref::linear(xt, wt, Tensor(), ot).ok());
  EXPECT_EQ(out, 3.0f);
}

TEST(LinearTest, ShapeMismatchesAreErrors) {
  std::vector<float> x = random_floats(3 * 64, 2);
  std::vector<float> w = random_floats(176 * 72, 3);
  std::vector<float> out(3 * 176);
  Tensor xt = Tensor::make(x.data(), DType::kF32, {3, 64});
  Tensor wt = Tensor::make(w.data(), DType::kF32, {176, 72});
  Tensor ot = Tensor::make(out.data(), DType::kF32, {3, 176});
  Status s = ops::ref::linear(xt, wt, Tensor(), ot);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "linear: x is [3, 64] but w is [176, 72]");

  Tensor x72 = Tensor::make(x.data(), DType::kF32, {2, 72});
  Tensor out_bad = Tensor::make(out.data(), DType::kF32, {2, 175});
  EXPECT_FALSE(ops::ref::linear(x72, wt, Tensor(), out_bad).ok());
  Tensor bias_bad = Tensor::make(x.data(), DType::kF32, {175});
  Tensor out_ok = Tensor::make(out.data(), DType::kF32, {2, 176});
  EXPECT_FALSE(ops::ref::linear(x72, wt, bias_bad, out_ok).ok());
  Tensor x_i32 = Tensor::make(x.data(), DType::kI32, {2, 72});
  EXPECT_FALSE(ops::ref::linear(x_i32, wt, Tensor(), out_ok).ok());
  // out aliasing x
  Tensor alias = Tensor::make(x.data(), DType::kF32, {1, 176});
  Tensor x1 = Tensor::make(x.data(), DType::kF32, {1, 72});
  EXPECT_FALSE(ops::ref::linear(x1, wt, Tensor(), alias).ok());
  // CUDA tensors have no kernel yet
  Tensor xc = xt, wc = Tensor::make(w.data(), DType::kF32, {176, 64}), oc = ot;
  xc.device = wc.device = oc.device = Device::cuda(0);
  EXPECT_EQ(ops::ref::linear(xc, wc, Tensor(), oc).code(), StatusCode::kUnimplemented);
  // mixed devices
  EXPECT_EQ(ops::ref::linear(xc, Tensor::make(w.data(), DType::kF32, {176, 64}), Tensor(), oc).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata
