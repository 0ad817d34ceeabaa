// ops::ref::rope against a double reference: both pairings (neox rotate_half and GPT-J
// interleaved), partial rotary dims, odd head dims, q as a strided view of a fused qkv row,
// large positions, and the yarn attention factor.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "op_test_util.h"
#include "ops/reference.h"

namespace strata {
namespace {

using testing::kF32Tol;
using testing::random_floats;
using testing::random_ints;
using testing::rel_err;

struct RopeCase {
  int64_t n_tokens;
  int64_t n_heads;
  int64_t head_dim;
  int64_t rotary_dim;
  bool neox;
  int64_t token_pad = 0;  // x is a view into rows of n_heads * head_dim + token_pad floats
  float attention_factor = 1.0f;
};

std::string case_name(const RopeCase& c) {
  return "t" + std::to_string(c.n_tokens) + "_h" + std::to_string(c.n_heads) + "_d" +
         std::to_string(c.head_dim) + "_r" + std::to_string(c.rotary_dim) +
         (c.neox ? "_neox" : "_gptj") + (c.token_pad ? "_strided" : "") +
         (c.attention_factor != 1.0f ? "_af" : "");
}

const RopeCase kCases[] = {
    {1, 3, 12, 12, true},          {7, 3, 24, 24, false},
    {13, 3, 80, 20, true, 2 * 80},  // NeoX rotary_pct 0.25, q inside a qkv row
    {13, 1, 80, 80, false, 5},     {7, 2, 24, 8, false, 0, 1.25f},  // partial rotary, interleaved
    {1, 3, 80, 64, true, 3, 0.9f},
};

class RopeTest : public ::testing::TestWithParam<RopeCase> {};

TEST_P(RopeTest, MatchesDoubleReference) {
  const RopeCase& c = GetParam();
  const int64_t row = c.n_heads * c.head_dim + c.token_pad;
  const uint32_t seed = static_cast<uint32_t>(c.n_tokens * 17 + c.head_dim * 3 + c.rotary_dim);
  std::vector<float> x = random_floats(static_cast<size_t>(c.n_tokens * row), seed);
  const std::vector<float> x0 = x;
  std::vector<int32_t> pos = random_ints(static_cast<size_t>(c.n_tokens), seed + 1, 0, 40000);
  pos[0] = 0;
  const int64_t half = c.rotary_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] = static_cast<float>(1.0 / std::pow(10000.0, 2.0 * i / double(c.rotary_dim)));
  }

  std::vector<double> want(x0.begin(), x0.end());
  for (int64_t t = 0; t < c.n_tokens; ++t) {
    for (int64_t h = 0; h < c.n_heads; ++h) {
      const int64_t base = t * row + h * c.head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const double angle = double(pos[t]) * double(inv_freq[i]);
        const double cs = std::cos(angle) * c.attention_factor;
        const double sn = std::sin(angle) * c.attention_factor;
        const int64_t a = c.neox ? base + i : base + 2 * i;
        const int64_t b = c.neox ? base + i + half : base + 2 * i + 1;
        want[a] = x0[a] * cs - double(x0[b]) * sn;
        want[b] = x0[b] * cs + double(x0[a]) * sn;
      }
    }
  }

  Tensor xt;
  xt.data = x.data();
  xt.dtype = DType::kF32;
  xt.ndim = 3;
  xt.shape = {c.n_tokens, c.n_heads, c.head_dim, 0};
  xt.stride = {row, c.head_dim, 1, 0};
  const ops::ref::RopeParams params{.rotary_dim = c.rotary_dim,
                               .neox_style = c.neox,
                               .inv_freq = inv_freq.data(),
                               .attention_factor = c.attention_factor};
  ASSERT_TRUE(ops::ref::rope(xt, pos.data(), params).ok());
  EXPECT_LE(rel_err(x.data(), want.data(), x.size()), kF32Tol);
  // The padding between token rows (the k/v part of a qkv row) is untouched.
  for (int64_t t = 0; t < c.n_tokens; ++t) {
    for (int64_t i = c.n_heads * c.head_dim; i < row; ++i)
      ASSERT_EQ(x[t * row + i], x0[t * row + i]);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RopeTest, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return case_name(info.param); });

TEST(RopeTest, BadArgumentsAreErrors) {
  std::vector<float> x = random_floats(2 * 3 * 12, 1);
  std::vector<float> inv_freq(6, 1.0f);
  std::vector<int32_t> pos = {0, 1};
  Tensor xt = Tensor::make(x.data(), DType::kF32, {2, 3, 12});
  Status s = ops::ref::rope(xt, pos.data(), {.rotary_dim = 14, .inv_freq = inv_freq.data()});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "rope: rotary_dim 14 must be even and in (0, head_dim 12] (x is [2, 3, 12])");
  EXPECT_FALSE(ops::ref::rope(xt, pos.data(), {.rotary_dim = 7, .inv_freq = inv_freq.data()}).ok());
  EXPECT_FALSE(ops::ref::rope(xt, pos.data(), {.rotary_dim = 12, .inv_freq = nullptr}).ok());
  EXPECT_FALSE(ops::ref::rope(xt, nullptr, {.rotary_dim = 12, .inv_freq = inv_freq.data()}).ok());
  Tensor x2 = Tensor::make(x.data(), DType::kF32, {2, 36});
  EXPECT_FALSE(ops::ref::rope(x2, pos.data(), {.rotary_dim = 12, .inv_freq = inv_freq.data()}).ok());
}

}  // namespace
}  // namespace strata
