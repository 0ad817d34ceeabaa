// strata::cuda::{gated_act, act} against their CPU twins for every activation on awkward widths
// (72, 769, 1031, 4096, 5125), 1/7/33 rows, gate/up as the two halves of one fused projection
// output (strided views), out == up in place, and odd padded strides.
// Tolerances (|gpu - cpu| <= atol + rtol |cpu|):
//   relu       1e-6 relative: one comparison and one multiply, exact.
//   silu       1e-5 relative: expf within 2 ulp of the host's, a few roundings after.
//   gelu_*     1e-4 relative + 1e-5 absolute: tanhf/erff within 2 ulp, but 1 + tanh(.) (1 + erf)
//              cancels for inputs near -4, where a 2-ulp difference near 1 becomes ~3e-3 of a
//              result of ~1e-4; absolutely that is below 1e-6 times |up| <= 2.
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

constexpr Activation kActs[] = {Activation::kSilu, Activation::kGeluTanh, Activation::kGeluErf,
                                Activation::kRelu};

Tol tol_for(Activation a) {
  switch (a) {
    case Activation::kSilu:
      return {1e-5, 0.0};
    case Activation::kGeluTanh:
    case Activation::kGeluErf:
      return {1e-4, 1e-5};
    case Activation::kRelu:
      return {1e-6, 0.0};
  }
  return {};
}

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
  s.push_back({6, 768, 3});  // odd stride: scalar path on a vector-friendly width
  return s;
}

class ActivationCudaTest : public testutil::CudaTest {};

TEST_F(ActivationCudaTest, GatedActMatchesCpu) {
  const cudaStream_t st = ctx().stream;
  for (Activation a : kActs) {
    for (const Shape& s : shapes()) {
      for (bool in_place : {false, true}) {
        SCOPED_TRACE("act " + std::to_string(static_cast<int>(a)) + " rows " +
                     std::to_string(s.rows) + " ffn " + std::to_string(s.cols) + " pad " +
                     std::to_string(s.pad) + (in_place ? " out==up" : ""));
        std::mt19937 rng(static_cast<uint32_t>(s.rows * 1009 + s.cols * 3 + in_place));
        // [rows, 2 * ffn + pad]: gate is the left half, up the right half (fused gate_up).
        const int64_t in_stride = 2 * s.cols + s.pad;
        const int64_t out_stride = in_place ? in_stride : s.cols + s.pad;
        std::vector<float> gu = random_floats(static_cast<size_t>(s.rows * in_stride), rng, -4, 4);
        for (int64_t r = 0; r < s.rows; ++r) {  // up in [-2, 2]
          for (int64_t c = 0; c < s.cols; ++c)
            gu[static_cast<size_t>(r * in_stride + s.cols + c)] *= 0.5f;
        }
        std::vector<float> out(static_cast<size_t>(s.rows * out_stride), testutil::kNaN);
        DeviceArray<float> dgu(gu, st);
        DeviceArray<float> dout(out.size());
        dout.poison(st);
        GatedActParams p{.gate = gu.data(),
                         .gate_stride = in_stride,
                         .up = gu.data() + s.cols,
                         .up_stride = in_stride,
                         .out = in_place ? gu.data() + s.cols : out.data(),
                         .out_stride = out_stride,
                         .n_tokens = s.rows,
                         .ffn_dim = s.cols,
                         .act = a};
        ASSERT_TRUE(cpu::gated_act(p).ok());
        p.gate = dgu.get();
        p.up = dgu.get() + s.cols;
        p.out = in_place ? dgu.get() + s.cols : dout.get();
        const Status status = gated_act(ctx(), p);
        ASSERT_TRUE(status.ok()) << status.to_string();
        if (in_place) {
          EXPECT_TRUE(all_close(dgu.download(st), gu, tol_for(a)));
        } else {
          EXPECT_TRUE(all_close(dout.download(st), out, tol_for(a)));
        }
      }
    }
  }
}

TEST_F(ActivationCudaTest, ActMatchesCpu) {
  const cudaStream_t st = ctx().stream;
  for (Activation a : kActs) {
    for (const Shape& s : shapes()) {
      SCOPED_TRACE("act " + std::to_string(static_cast<int>(a)) + " rows " +
                   std::to_string(s.rows) + " cols " + std::to_string(s.cols));
      std::mt19937 rng(static_cast<uint32_t>(s.rows * 17 + s.cols + static_cast<int>(a)));
      const int64_t stride = s.cols + s.pad;
      std::vector<float> x = random_floats(static_cast<size_t>(s.rows * stride), rng, -4, 4);
      DeviceArray<float> dx(x, st);
      ActParams p{.x = x.data(), .stride = stride, .rows = s.rows, .cols = s.cols, .act = a};
      ASSERT_TRUE(cpu::act(p).ok());
      p.x = dx.get();
      const Status status = act(ctx(), p);
      ASSERT_TRUE(status.ok()) << status.to_string();
      EXPECT_TRUE(all_close(dx.download(st), x, tol_for(a)));
    }
  }
}

TEST(ActivationCudaArgs, RejectsBadArguments) {
  static float fake[16];
  GatedActParams g{.gate = fake,
                   .gate_stride = 8,
                   .up = fake + 4,
                   .up_stride = 8,
                   .out = fake + 4,
                   .out_stride = 4,
                   .n_tokens = 2,
                   .ffn_dim = 4};
  EXPECT_EQ(gated_act(LaunchCtx{}, g).code(), StatusCode::kInvalidArgument);  // out==up, strides
  g.out_stride = 8;
  g.ffn_dim = 0;
  EXPECT_EQ(gated_act(LaunchCtx{}, g).code(), StatusCode::kInvalidArgument);
  ActParams a{.x = fake, .stride = 4, .rows = 2, .cols = 4, .act = static_cast<Activation>(99)};
  EXPECT_EQ(act(LaunchCtx{}, a).code(), StatusCode::kInvalidArgument);
  a.rows = -1;
  a.act = Activation::kSilu;
  EXPECT_EQ(act(LaunchCtx{}, a).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::cuda
