// strata::cuda::layer_norm against its CPU twin: hidden 72, 769, 1031, 4096, 5125; 1/7/33
// tokens; weight dtypes f32/f16/bf16; no bias, a bias of the weight's dtype and one of another
// dtype; in place; padded strides.
// Tolerance: |gpu - cpu| <= 5e-6 + 1e-5 |cpu|. The GPU accumulates mean and variance in f32 (the
// CPU in double) and may fuse the final multiply-add; with the bias added, outputs near zero are
// the difference of terms up to ~4, so the error there is absolute: a few ulp of 4 (~5e-7 each).
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

constexpr testutil::Tol kTol{1e-5, 5e-6};

struct Case {
  int64_t n_tokens;
  int64_t hidden;
  DType weight_dtype;
  int bias;  // 0 none, 1 the weight's dtype, 2 f32 with a 16-bit weight (or bf16 with f32)
  bool in_place;
  int64_t pad = 0;
};

class LayerNormCudaTest : public testutil::CudaTest {};

TEST_F(LayerNormCudaTest, MatchesCpuTwin) {
  std::vector<Case> cases;
  for (int64_t hidden : {72, 769, 1031, 4096, 5125}) {
    for (int64_t n_tokens : {1, 7, 33}) {
      for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
        for (int bias : {0, 1, 2}) {
          cases.push_back({n_tokens, hidden, dt, bias, (hidden + n_tokens + bias) % 2 == 0});
        }
      }
    }
  }
  cases.push_back({5, 4096, DType::kBF16, 1, false, 4});
  cases.push_back({5, 4096, DType::kF16, 2, true, 8});
  cases.push_back({6, 768, DType::kF32, 1, false, 3});
  const cudaStream_t st = ctx().stream;
  for (const Case& c : cases) {
    SCOPED_TRACE("tokens " + std::to_string(c.n_tokens) + " hidden " + std::to_string(c.hidden) +
                 " weight " + std::string(dtype_name(c.weight_dtype)) + " bias " +
                 std::to_string(c.bias) + (c.in_place ? " in place" : "") + " pad " +
                 std::to_string(c.pad));
    std::mt19937 rng(static_cast<uint32_t>(c.hidden * 131 + c.n_tokens * 7 + c.bias));
    const int64_t stride = c.hidden + c.pad;
    std::vector<float> x = random_floats(static_cast<size_t>(c.n_tokens * stride), rng, -2, 2);
    for (size_t i = 0; i < x.size(); i += 3) x[i] += 0.75f;  // a non-zero mean
    const std::vector<uint8_t> w = testutil::random_typed(c.weight_dtype, c.hidden, rng, -1.5, 1.5);
    const DType bias_dtype =
        c.bias == 2 ? (c.weight_dtype == DType::kF32 ? DType::kBF16 : DType::kF32) : c.weight_dtype;
    const std::vector<uint8_t> b = testutil::random_typed(bias_dtype, c.hidden, rng, -1, 1);
    std::vector<float> out(x.size(), testutil::kNaN);

    DeviceArray<float> dx(x, st), dout(out.size());
    DeviceArray<uint8_t> dw(w, st), db(b, st);
    dout.poison(st);
    LayerNormParams p{.x = x.data(),
                      .weight = w.data(),
                      .weight_dtype = c.weight_dtype,
                      .bias = c.bias ? b.data() : nullptr,
                      .bias_dtype = bias_dtype,
                      .out = c.in_place ? x.data() : out.data(),
                      .n_tokens = c.n_tokens,
                      .hidden = c.hidden,
                      .x_stride = stride,
                      .out_stride = stride,
                      .eps = 1e-5f};
    ASSERT_TRUE(cpu::layer_norm(p).ok());
    const std::vector<float>& ref = c.in_place ? x : out;
    ASSERT_EQ(testutil::nan_in_view(ref, c.n_tokens, c.hidden, stride), 0u);
    p.x = dx.get();
    p.weight = dw.get();
    p.bias = c.bias ? db.get() : nullptr;
    p.out = c.in_place ? dx.get() : dout.get();
    const Status status = layer_norm(ctx(), p);
    ASSERT_TRUE(status.ok()) << status.to_string();
    EXPECT_TRUE(all_close((c.in_place ? dx : dout).download(st), ref, kTol));
  }
}

TEST(LayerNormCudaArgs, RejectsBadArguments) {
  static float fake[16];
  LayerNormParams p{.x = fake,
                    .weight = fake,
                    .out = fake,
                    .n_tokens = 2,
                    .hidden = 8,
                    .x_stride = 8,
                    .out_stride = 16};
  EXPECT_EQ(layer_norm(LaunchCtx{}, p).code(), StatusCode::kInvalidArgument);  // in place, strides
  p.out_stride = 8;
  p.weight_dtype = DType::kFP8E4M3;
  EXPECT_EQ(layer_norm(LaunchCtx{}, p).code(), StatusCode::kUnimplemented);
  p.weight_dtype = DType::kF32;
  p.bias = fake;
  p.bias_dtype = DType::kI32;
  EXPECT_EQ(layer_norm(LaunchCtx{}, p).code(), StatusCode::kUnimplemented);
  p.bias = nullptr;
  p.weight = nullptr;
  EXPECT_EQ(layer_norm(LaunchCtx{}, p).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::cuda
