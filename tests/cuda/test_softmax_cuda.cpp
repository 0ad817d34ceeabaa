// strata::cuda::{softmax, argmax} against their CPU twins: widths 72, 769, 1031, 4096, 5125 and
// vocabulary rows 32000 / 151936; 1/7/33 rows; padded strides. argmax also on crafted rows: ties
// (first index wins), NaNs (never win), all -inf (index 0).
// Tolerance for softmax: 1e-4 relative. expf is within 2 ulp of the host's and the GPU sums in
// f32 (the CPU in double): ~1e-6 in practice; the margin keeps 150k-entry rows safe. argmax: exact.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
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

struct Shape {
  int64_t rows;
  int64_t cols;
  int64_t pad;
};

std::vector<Shape> shapes() {
  std::vector<Shape> s;
  for (int64_t cols : {72, 769, 1031, 4096, 5125}) {
    for (int64_t rows : {1, 7, 33}) s.push_back({rows, cols, 0});
  }
  s.push_back({2, 32000, 0});
  s.push_back({1, 151936, 0});
  s.push_back({5, 4096, 4});
  s.push_back({6, 768, 3});
  return s;
}

class SoftmaxCudaTest : public testutil::CudaTest {};

TEST_F(SoftmaxCudaTest, SoftmaxAndArgmaxMatchCpu) {
  const cudaStream_t st = ctx().stream;
  for (const Shape& s : shapes()) {
    SCOPED_TRACE("rows " + std::to_string(s.rows) + " cols " + std::to_string(s.cols) + " pad " +
                 std::to_string(s.pad));
    std::mt19937 rng(static_cast<uint32_t>(s.rows * 4099 + s.cols));
    const int64_t stride = s.cols + s.pad;
    std::vector<float> x = random_floats(static_cast<size_t>(s.rows * stride), rng, -8, 8);
    DeviceArray<float> dx(x, st);
    DeviceArray<int32_t> dbest(static_cast<size_t>(s.rows));
    dbest.poison(st);

    std::vector<int32_t> best(static_cast<size_t>(s.rows), -1);
    ArgmaxParams ap{
        .x = x.data(), .stride = stride, .rows = s.rows, .cols = s.cols, .out = best.data()};
    ASSERT_TRUE(cpu::argmax(ap).ok());
    ap.x = dx.get();
    ap.out = dbest.get();
    Status status = argmax(ctx(), ap);
    ASSERT_TRUE(status.ok()) << status.to_string();
    EXPECT_EQ(dbest.download(st), best);

    SoftmaxParams p{.x = x.data(), .stride = stride, .rows = s.rows, .cols = s.cols};
    ASSERT_TRUE(cpu::softmax(p).ok());
    p.x = dx.get();
    status = softmax(ctx(), p);
    ASSERT_TRUE(status.ok()) << status.to_string();
    EXPECT_TRUE(all_close(dx.download(st), x, {1e-4, 0.0}));
  }
}

TEST_F(SoftmaxCudaTest, ArgmaxTiesNanAndInfinities) {
  const cudaStream_t st = ctx().stream;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const int64_t cols = 1031;
  std::mt19937 rng(11);
  std::vector<float> x = random_floats(static_cast<size_t>(4 * cols), rng, -1, 1);
  x[700] = 5.0f;  // row 0: a tie between 700 and 900, the first wins
  x[900] = 5.0f;
  x[cols + 0] = nan;  // row 1: NaNs never win
  x[cols + 500] = nan;
  x[cols + 600] = 3.0f;
  for (int64_t i = 0; i < cols; ++i) x[static_cast<size_t>(2 * cols + i)] = -inf;  // row 2
  x[3 * cols + 1030] = inf;                                                        // row 3
  DeviceArray<float> dx(x, st);
  DeviceArray<int32_t> dbest(4);
  dbest.poison(st);
  std::vector<int32_t> best(4, -1);
  ArgmaxParams p{.x = x.data(), .stride = cols, .rows = 4, .cols = cols, .out = best.data()};
  ASSERT_TRUE(cpu::argmax(p).ok());
  EXPECT_EQ(best, (std::vector<int32_t>{700, 600, 0, 1030}));
  p.x = dx.get();
  p.out = dbest.get();
  ASSERT_TRUE(argmax(ctx(), p).ok());
  EXPECT_EQ(dbest.download(st), best);
}

TEST(SoftmaxCudaArgs, RejectsBadArguments) {
  static float fake[16];
  SoftmaxParams s{.x = fake, .stride = 3, .rows = 2, .cols = 4};
  EXPECT_EQ(softmax(LaunchCtx{}, s).code(), StatusCode::kInvalidArgument);
  ArgmaxParams a{.x = fake, .stride = 4, .rows = 2, .cols = 4, .out = nullptr};
  EXPECT_EQ(argmax(LaunchCtx{}, a).code(), StatusCode::kInvalidArgument);
  a.rows = 0;
  EXPECT_TRUE(argmax(LaunchCtx{}, a).ok());
}

}  // namespace
}  // namespace strata::cuda
