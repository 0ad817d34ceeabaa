// strata::cuda::{add, add_bias, scale, softcap} against their CPU twins on awkward widths (72,
// 769, 1031, 4096, 5125), 1/7/33 rows, padded strides, in place and every bias dtype.
// Tolerances: add, add_bias and scale are one f32 operation per element, so exact up to 1e-6
// relative; softcap goes through tanhf (device within 2 ulp of the host's): 1e-5 relative.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cuda/cuda_kernels.h"
#include "cuda_test_util.h"
#include "kernel_test_util.h"

namespace strata::cuda {
namespace {

using testutil::all_close;
using testutil::DeviceArray;
using testutil::random_floats;
using testutil::Tol;

constexpr Tol kExact{1e-6, 0.0};
constexpr Tol kSoftcapTol{1e-5, 0.0};

struct Shape {
  int64_t rows;
  int64_t cols;
  int64_t pad;  // stride = cols + pad
};

std::vector<Shape> shapes() {
  std::vector<Shape> s;
  for (int64_t cols : {72, 769, 1031, 4096, 5125}) {
    for (int64_t rows : {1, 7, 33}) s.push_back({rows, cols, 0});
  }
  s.push_back({5, 4096, 4});  // padded, still vectorizable
  s.push_back({6, 768, 3});   // padded, scalar
  return s;
}

std::string trace(const Shape& s) {
  return "rows " + std::to_string(s.rows) + " cols " + std::to_string(s.cols) + " pad " +
         std::to_string(s.pad);
}

class ElementwiseCudaTest : public testutil::CudaTest {};

TEST_F(ElementwiseCudaTest, AddMatchesCpu) {
  const cudaStream_t st = ctx().stream;
  // alias: 0 = separate out, 1 = out == a, 2 = out == b
  for (int alias = 0; alias < 3; ++alias) {
    for (const Shape& s : shapes()) {
      SCOPED_TRACE(trace(s) + " alias " + std::to_string(alias));
      std::mt19937 rng(static_cast<uint32_t>(s.rows * 7919 + s.cols + alias));
      const int64_t stride = s.cols + s.pad;
      const size_t n = static_cast<size_t>(s.rows * stride);
      std::vector<float> a = random_floats(n, rng, -3.0f, 3.0f);
      std::vector<float> b = random_floats(n, rng, -3.0f, 3.0f);
      std::vector<float> out(n, testutil::kNaN);
      float* ref_out = alias == 1 ? a.data() : alias == 2 ? b.data() : out.data();
      DeviceArray<float> da(a, st), db(b, st), dout(n);
      dout.poison(st);
      AddParams p{.a = a.data(),
                  .a_stride = stride,
                  .b = b.data(),
                  .b_stride = stride,
                  .out = ref_out,
                  .out_stride = stride,
                  .rows = s.rows,
                  .cols = s.cols};
      ASSERT_TRUE(cpu::add(p).ok());
      const std::vector<float>& ref = alias == 1 ? a : alias == 2 ? b : out;
      p.a = da.get();
      p.b = db.get();
      p.out = alias == 1 ? da.get() : alias == 2 ? db.get() : dout.get();
      const Status status = add(ctx(), p);
      ASSERT_TRUE(status.ok()) << status.to_string();
      const DeviceArray<float>& got = alias == 1 ? da : alias == 2 ? db : dout;
      EXPECT_TRUE(all_close(got.download(st), ref, kExact));
    }
  }
}

TEST_F(ElementwiseCudaTest, AddBiasMatchesCpu) {
  const cudaStream_t st = ctx().stream;
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (const Shape& s : shapes()) {
      SCOPED_TRACE(trace(s) + " bias " + std::string(dtype_name(dt)));
      std::mt19937 rng(static_cast<uint32_t>(s.rows * 31 + s.cols + static_cast<int>(dt)));
      const int64_t stride = s.cols + s.pad;
      std::vector<float> x = random_floats(static_cast<size_t>(s.rows * stride), rng, -3, 3);
      const std::vector<uint8_t> bias = testutil::random_typed(dt, s.cols, rng, -2, 2);
      DeviceArray<float> dx(x, st);
      DeviceArray<uint8_t> dbias(bias, st);
      AddBiasParams p{.x = x.data(),
                      .stride = stride,
                      .bias = bias.data(),
                      .bias_dtype = dt,
                      .rows = s.rows,
                      .cols = s.cols};
      ASSERT_TRUE(cpu::add_bias(p).ok());
      p.x = dx.get();
      p.bias = dbias.get();
      const Status status = add_bias(ctx(), p);
      ASSERT_TRUE(status.ok()) << status.to_string();
      EXPECT_TRUE(all_close(dx.download(st), x, kExact));
    }
  }
}

TEST_F(ElementwiseCudaTest, ScaleAndSoftcapMatchCpu) {
  const cudaStream_t st = ctx().stream;
  for (const Shape& s : shapes()) {
    SCOPED_TRACE(trace(s));
    std::mt19937 rng(static_cast<uint32_t>(s.rows * 131 + s.cols));
    const int64_t stride = s.cols + s.pad;
    const size_t n = static_cast<size_t>(s.rows * stride);
    std::vector<float> x = random_floats(n, rng, -60.0f, 60.0f);
    std::vector<float> y = x;
    DeviceArray<float> dx(x, st), dy(y, st);

    ScaleParams sp{.x = x.data(), .stride = stride, .rows = s.rows, .cols = s.cols, .s = 0.37f};
    ASSERT_TRUE(cpu::scale(sp).ok());
    sp.x = dx.get();
    Status status = scale(ctx(), sp);
    ASSERT_TRUE(status.ok()) << status.to_string();
    EXPECT_TRUE(all_close(dx.download(st), x, kExact)) << "scale";

    SoftcapParams cp{.x = y.data(), .stride = stride, .rows = s.rows, .cols = s.cols, .cap = 30.0f};
    ASSERT_TRUE(cpu::softcap(cp).ok());
    cp.x = dy.get();
    status = softcap(ctx(), cp);
    ASSERT_TRUE(status.ok()) << status.to_string();
    EXPECT_TRUE(all_close(dy.download(st), y, kSoftcapTol)) << "softcap";
  }
}

// ---- argument checks: no GPU needed, they fail before any CUDA call --------------------------

TEST(ElementwiseCudaArgs, RejectsBadArguments) {
  static float fake[8];
  AddParams a{.a = fake,
              .a_stride = 4,
              .b = fake,
              .b_stride = 4,
              .out = fake,
              .out_stride = 8,
              .rows = 2,
              .cols = 4};
  EXPECT_EQ(add(LaunchCtx{}, a).code(), StatusCode::kInvalidArgument);  // aliasing, other stride
  a.out_stride = 4;
  a.b_stride = 3;
  EXPECT_EQ(add(LaunchCtx{}, a).code(), StatusCode::kInvalidArgument);  // stride < cols
  AddBiasParams b{
      .x = fake, .stride = 4, .bias = fake, .bias_dtype = DType::kI8, .rows = 2, .cols = 4};
  EXPECT_EQ(add_bias(LaunchCtx{}, b).code(), StatusCode::kUnimplemented);
  b.bias = nullptr;
  EXPECT_EQ(add_bias(LaunchCtx{}, b).code(), StatusCode::kInvalidArgument);
  ScaleParams s{.x = nullptr, .stride = 4, .rows = 2, .cols = 4};
  EXPECT_EQ(scale(LaunchCtx{}, s).code(), StatusCode::kInvalidArgument);
  SoftcapParams c{.x = fake, .stride = 4, .rows = 2, .cols = 4, .cap = 0.0f};
  EXPECT_EQ(softcap(LaunchCtx{}, c).code(), StatusCode::kInvalidArgument);
  c.rows = 0;
  c.cap = 1.0f;
  EXPECT_TRUE(softcap(LaunchCtx{}, c).ok());  // nothing to do, nothing launched
}

}  // namespace
}  // namespace strata::cuda
