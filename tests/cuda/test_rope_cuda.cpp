// strata::cuda::rope against its CPU twin: head_dim 12, 64, 80, 128 with 3 heads, rotary_dim equal
// to and smaller than head_dim (partial rotary), both pair styles, 1/7/33 tokens at positions up
// to 1e5, attention_factor != 1, and padded strides (odd ones take the scalar path).
// Tolerance: 1e-5 relative + 1e-6 absolute. Angles and sincos are double on both sides and the
// rotation rounds like the CPU's (no FMA contraction), so results are nearly always bit-equal;
// the margin covers a cos/sin that rounds to the other neighbouring float.
#include <gtest/gtest.h>

#include <cmath>
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

struct Case {
  int64_t head_dim;
  int64_t rotary_dim;
  int64_t head_pad;  // head_stride = head_dim + head_pad
};

class RopeCudaTest : public testutil::CudaTest {};

TEST_F(RopeCudaTest, MatchesCpuTwin) {
  const std::vector<Case> cases = {{12, 12, 0},  {12, 8, 0},    {12, 6, 0},  {64, 64, 0},
                                   {64, 32, 0},  {80, 80, 0},   {80, 32, 0}, {128, 128, 0},
                                   {128, 64, 0}, {128, 128, 4}, {64, 64, 1}, {80, 20, 3}};
  const int64_t n_heads = 3;
  const cudaStream_t st = ctx().stream;
  for (const Case& c : cases) {
    for (int64_t n_tokens : {1, 7, 33}) {
      for (bool neox : {true, false}) {
        SCOPED_TRACE("head_dim " + std::to_string(c.head_dim) + " rotary " +
                     std::to_string(c.rotary_dim) + " pad " + std::to_string(c.head_pad) +
                     " tokens " + std::to_string(n_tokens) + (neox ? " neox" : " gptj"));
        std::mt19937 rng(
            static_cast<uint32_t>(c.head_dim * 97 + c.rotary_dim * 5 + n_tokens + neox));
        const int64_t head_stride = c.head_dim + c.head_pad;
        const int64_t token_stride = n_heads * head_stride + c.head_pad;
        std::vector<float> x =
            testutil::random_floats(static_cast<size_t>(n_tokens * token_stride), rng, -2, 2);
        std::vector<int32_t> pos(static_cast<size_t>(n_tokens));
        std::uniform_int_distribution<int32_t> pos_dist(0, 100000);
        for (int32_t& v : pos) v = pos_dist(rng);
        pos[0] = 0;
        std::vector<float> inv_freq(static_cast<size_t>(c.rotary_dim / 2));
        for (size_t i = 0; i < inv_freq.size(); ++i) {
          inv_freq[i] = static_cast<float>(
              1.0 / std::pow(10000.0, 2.0 * static_cast<double>(i) / c.rotary_dim));
        }
        DeviceArray<float> dx(x, st), dfreq(inv_freq, st);
        DeviceArray<int32_t> dpos(pos, st);
        RopeKernelParams p{.x = x.data(),
                           .token_stride = token_stride,
                           .head_stride = head_stride,
                           .n_tokens = n_tokens,
                           .n_heads = n_heads,
                           .head_dim = c.head_dim,
                           .positions = pos.data(),
                           .inv_freq = inv_freq.data(),
                           .rotary_dim = c.rotary_dim,
                           .neox_style = neox,
                           .attention_factor = neox ? 1.0f : 1.1f};
        ASSERT_TRUE(cpu::rope(p).ok());
        p.x = dx.get();
        p.positions = dpos.get();
        p.inv_freq = dfreq.get();
        const Status status = rope(ctx(), p);
        ASSERT_TRUE(status.ok()) << status.to_string();
        EXPECT_TRUE(all_close(dx.download(st), x, {1e-5, 1e-6}));
      }
    }
  }
}

TEST(RopeCudaArgs, RejectsBadArguments) {
  static float fake[64];
  static int32_t pos[2];
  RopeKernelParams p{.x = fake,
                     .token_stride = 16,
                     .head_stride = 8,
                     .n_tokens = 2,
                     .n_heads = 2,
                     .head_dim = 8,
                     .positions = pos,
                     .inv_freq = fake,
                     .rotary_dim = 7};
  EXPECT_EQ(rope(LaunchCtx{}, p).code(), StatusCode::kInvalidArgument);  // odd rotary_dim
  p.rotary_dim = 10;
  EXPECT_EQ(rope(LaunchCtx{}, p).code(), StatusCode::kInvalidArgument);  // > head_dim
  p.rotary_dim = 8;
  p.token_stride = 12;
  EXPECT_EQ(rope(LaunchCtx{}, p).code(), StatusCode::kInvalidArgument);  // heads overlap tokens
  p.token_stride = 16;
  p.positions = nullptr;
  EXPECT_EQ(rope(LaunchCtx{}, p).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::cuda
