// Element-wise and row ops against double references: gated activations over strided views of
// a fused gate/up buffer, in-place activations, add (aliased and strided), scale, softcap,
// softmax, argmax, and the (vocab-sharded) embedding lookup.
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

double act_ref(Activation a, double x) {
  switch (a) {
    case Activation::kSilu:
      return x / (1.0 + std::exp(-x));
    case Activation::kGeluTanh:
      return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    case Activation::kGeluErf:
      return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case Activation::kRelu:
      return x > 0 ? x : 0.0;
  }
  return 0.0;
}

const char* act_name(Activation a) {
  switch (a) {
    case Activation::kSilu:
      return "silu";
    case Activation::kGeluTanh:
      return "gelu_tanh";
    case Activation::kGeluErf:
      return "gelu_erf";
    case Activation::kRelu:
      return "relu";
  }
  return "?";
}

struct ActCase {
  Activation act;
  int64_t n;
  int64_t ffn;
};

class ActTest : public ::testing::TestWithParam<ActCase> {};

TEST_P(ActTest, GatedMatchesReference) {
  const ActCase& c = GetParam();
  // gate = columns [0, ffn), up = columns [ffn, 2 ffn) of the fused [n, 2 ffn] projection.
  std::vector<float> fused = random_floats(static_cast<size_t>(c.n * 2 * c.ffn), 11, -6.0f, 6.0f);
  Tensor gate = testing::strided_view(fused.data(), DType::kF32, c.n, c.ffn, 2 * c.ffn, 0);
  Tensor up = testing::strided_view(fused.data(), DType::kF32, c.n, c.ffn, 2 * c.ffn, c.ffn);
  std::vector<float> out(static_cast<size_t>(c.n * c.ffn));
  Tensor ot = Tensor::make(out.data(), DType::kF32, {c.n, c.ffn});
  ASSERT_TRUE(ops::ref::gated_act(gate, up, c.act, ot).ok());
  std::vector<double> want(out.size());
  for (int64_t r = 0; r < c.n; ++r) {
    for (int64_t i = 0; i < c.ffn; ++i) {
      want[r * c.ffn + i] =
          act_ref(c.act, fused[r * 2 * c.ffn + i]) * fused[r * 2 * c.ffn + c.ffn + i];
    }
  }
  EXPECT_LE(rel_err(out, want), kF32Tol) << act_name(c.act);
}

TEST_P(ActTest, InPlaceMatchesReference) {
  const ActCase& c = GetParam();
  std::vector<float> x = random_floats(static_cast<size_t>(c.n * c.ffn), 12, -6.0f, 6.0f);
  std::vector<double> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = act_ref(c.act, x[i]);
  Tensor xt = Tensor::make(x.data(), DType::kF32, {c.n, c.ffn});
  ASSERT_TRUE(ops::ref::act(xt, c.act).ok());
  EXPECT_LE(rel_err(x, want), kF32Tol) << act_name(c.act);
}

INSTANTIATE_TEST_SUITE_P(
    Acts, ActTest,
    ::testing::Values(ActCase{Activation::kSilu, 7, 1031}, ActCase{Activation::kGeluTanh, 13, 769},
                      ActCase{Activation::kGeluErf, 1, 72}, ActCase{Activation::kRelu, 7, 72}),
    [](const auto& info) {
      return std::string(act_name(info.param.act)) + "_n" + std::to_string(info.param.n);
    });

TEST(ElementwiseTest, AddStridedAndAliased) {
  const int64_t n = 7, h = 769;
  std::vector<float> a = random_floats(static_cast<size_t>(n * (h + 3)), 21);
  std::vector<float> b = random_floats(static_cast<size_t>(n * h), 22);
  std::vector<double> want(static_cast<size_t>(n * h));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < h; ++i) want[r * h + i] = double(a[r * (h + 3) + i]) + b[r * h + i];
  }
  Tensor at = testing::strided_view(a.data(), DType::kF32, n, h, h + 3);
  Tensor bt = Tensor::make(b.data(), DType::kF32, {n, h});
  ASSERT_TRUE(ops::ref::add(at, bt, bt).ok());  // out aliases b: the residual update
  EXPECT_LE(rel_err(b, want), kF32Tol);
}

TEST(ElementwiseTest, ScaleSoftcapSoftmaxArgmax) {
  const int64_t n = 3, v = 1031;
  std::vector<float> x = random_floats(static_cast<size_t>(n * v), 31, -40.0f, 40.0f);
  Tensor xt = Tensor::make(x.data(), DType::kF32, {n, v});

  std::vector<double> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = double(x[i]) * 0.125;
  ASSERT_TRUE(ops::ref::scale(xt, 0.125f).ok());
  EXPECT_LE(rel_err(x, want), kF32Tol);

  for (size_t i = 0; i < x.size(); ++i) want[i] = 3.0 * std::tanh(double(x[i]) / 3.0);
  ASSERT_TRUE(ops::ref::softcap(xt, 3.0f).ok());
  EXPECT_LE(rel_err(x, want), kF32Tol);

  x[static_cast<size_t>(1 * v + 500)] = 9.0f;  // row 1's argmax
  x[static_cast<size_t>(2 * v + 7)] = 9.0f;    // row 2: ties go to the first
  x[static_cast<size_t>(2 * v + 900)] = 9.0f;
  std::vector<int32_t> idx(n, -1);
  Tensor it = Tensor::make(idx.data(), DType::kI32, {n});
  ASSERT_TRUE(ops::ref::argmax(xt, it).ok());
  for (int64_t r = 0; r < n; ++r) {
    int64_t best = 0;
    for (int64_t i = 1; i < v; ++i) {
      if (x[r * v + i] > x[r * v + best]) best = i;
    }
    EXPECT_EQ(idx[r], best) << "row " << r;
  }
  EXPECT_EQ(idx[1], 500);
  EXPECT_EQ(idx[2], 7);

  for (int64_t r = 0; r < n; ++r) {
    double mx = -1e300, sum = 0.0;
    for (int64_t i = 0; i < v; ++i) mx = std::max(mx, double(x[r * v + i]));
    for (int64_t i = 0; i < v; ++i) sum += std::exp(double(x[r * v + i]) - mx);
    for (int64_t i = 0; i < v; ++i) want[r * v + i] = std::exp(double(x[r * v + i]) - mx) / sum;
  }
  ASSERT_TRUE(ops::ref::softmax(xt).ok());
  EXPECT_LE(rel_err(x, want), kF32Tol);
}

TEST(ElementwiseTest, MismatchesAreErrors) {
  std::vector<float> a(72 * 7), b(72 * 7);
  Tensor at = Tensor::make(a.data(), DType::kF32, {7, 72});
  Tensor b6 = Tensor::make(b.data(), DType::kF32, {6, 72});
  Status s = ops::ref::add(at, b6, at);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "add: a is [7, 72] but b is [6, 72]");
  EXPECT_FALSE(ops::ref::gated_act(at, b6, Activation::kSilu, at).ok());
  EXPECT_FALSE(ops::ref::softcap(at, 0.0f).ok());
  std::vector<int32_t> idx(6);
  Tensor i6 = Tensor::make(idx.data(), DType::kI32, {6});
  EXPECT_FALSE(ops::ref::argmax(at, i6).ok());
  Tensor f6 = Tensor::make(b.data(), DType::kF32, {7});
  EXPECT_FALSE(ops::ref::argmax(at, f6).ok());
  Tensor a_i32 = Tensor::make(a.data(), DType::kI32, {7, 72});
  EXPECT_FALSE(ops::ref::act(a_i32, Activation::kRelu).ok());
  EXPECT_FALSE(ops::ref::scale(a_i32, 2.0f).ok());
  Tensor ac = at;
  ac.device = Device::cuda(0);
  EXPECT_EQ(ops::ref::scale(ac, 2.0f).code(), StatusCode::kUnimplemented);
  // Empty rows are no work, not a division by zero.
  Tensor empty = Tensor::make(a.data(), DType::kF32, {7, 0});
  EXPECT_TRUE(ops::ref::scale(empty, 2.0f).ok());
  EXPECT_TRUE(ops::ref::softmax(empty).ok());
}

struct EmbCase {
  DType dtype;
  int64_t vocab_offset;  // this shard holds rows [offset, offset + shard)
  int64_t shard;
  int64_t vocab;
  int64_t hidden;
};

class EmbeddingTest : public ::testing::TestWithParam<EmbCase> {};

TEST_P(EmbeddingTest, MatchesTableRows) {
  const EmbCase& c = GetParam();
  testing::TypedBuffer table =
      make_typed(random_floats(static_cast<size_t>(c.shard * c.hidden), 41), c.dtype);
  const std::vector<int32_t> ids =
      testing::random_ints(13, 42, 0, static_cast<int32_t>(c.vocab - 1));
  std::vector<float> out(static_cast<size_t>(13 * c.hidden), -5.0f);
  Tensor tt = Tensor::make(table.data(), c.dtype, {c.shard, c.hidden});
  Tensor ot = Tensor::make(out.data(), DType::kF32, {13, c.hidden});
  ASSERT_TRUE(ops::ref::embedding(tt, ids.data(), 13, c.vocab_offset, c.vocab, ot).ok());
  for (int64_t t = 0; t < 13; ++t) {
    const int64_t row = ids[t] - c.vocab_offset;
    for (int64_t i = 0; i < c.hidden; ++i) {
      const float want = row >= 0 && row < c.shard ? table.values[row * c.hidden + i] : 0.0f;
      ASSERT_EQ(out[t * c.hidden + i], want) << "token " << t << " id " << ids[t];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tables, EmbeddingTest,
                         ::testing::Values(EmbCase{DType::kF32, 0, 100, 100, 72},
                                           EmbCase{DType::kBF16, 0, 100, 100, 769},
                                           EmbCase{DType::kF16, 40, 30, 100, 72}),
                         [](const auto& info) {
                           return std::string(dtype_name(info.param.dtype)) + "_off" +
                                  std::to_string(info.param.vocab_offset);
                         });

TEST(EmbeddingTest, BadIdsAndShapesAreErrors) {
  std::vector<float> table(10 * 8), out(2 * 8);
  Tensor tt = Tensor::make(table.data(), DType::kF32, {10, 8});
  Tensor ot = Tensor::make(out.data(), DType::kF32, {2, 8});
  const int32_t bad[2] = {3, 10};
  Status s = ops::ref::embedding(tt, bad, 2, 0, 10, ot);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(s.message(), "embedding: token 1 has id 10 outside [0, 10)");
  const int32_t neg[2] = {3, -1};
  EXPECT_EQ(ops::ref::embedding(tt, neg, 2, 0, 10, ot).code(), StatusCode::kOutOfRange);
  const int32_t good[2] = {3, 4};
  Tensor o7 = Tensor::make(out.data(), DType::kF32, {2, 7});
  EXPECT_FALSE(ops::ref::embedding(tt, good, 2, 0, 10, o7).ok());
  EXPECT_FALSE(ops::ref::embedding(tt, good, 3, 0, 10, ot).ok());
  EXPECT_FALSE(ops::ref::embedding(tt, good, 2, 5, 10, ot).ok());  // shard past the vocab
  EXPECT_FALSE(ops::ref::embedding(tt, nullptr, 2, 0, 10, ot).ok());
}

}  // namespace
}  // namespace strata
