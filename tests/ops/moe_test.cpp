// Mixture-of-experts ops (ops::moe_route / moe_offsets / moe_permute / moe_experts / moe_combine /
// sigmoid_gate_add) against naive per-token references written here: softmax in double, top-k
// by a stable sort, each token's chosen experts run one at a time on its own row. Awkward
// shapes: odd hidden sizes, k = 1 and k = E, ties in the logits, experts that get no token.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/half.h"
#include "op_test_util.h"
#include "ops/ops.h"

namespace strata {
namespace {

using testing::random_floats;
using testing::random_ints;

Tensor t2(void* p, DType dt, int64_t r, int64_t c) {
  return Tensor::make(p, dt, {r, c});
}

struct RefRoute {
  std::vector<int32_t> ids;
  std::vector<double> w;
};

RefRoute ref_route(const std::vector<float>& logits, int64_t n, int64_t E, int64_t k, bool renorm) {
  RefRoute r;
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> p(static_cast<size_t>(E));
    double m = -INFINITY, s = 0.0;
    for (int64_t e = 0; e < E; ++e) m = std::max(m, static_cast<double>(logits[t * E + e]));
    for (int64_t e = 0; e < E; ++e) s += p[e] = std::exp(logits[t * E + e] - m);
    for (double& v : p) v /= s;
    std::vector<int32_t> idx(static_cast<size_t>(E));
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
    double sum = 0.0;
    for (int64_t j = 0; j < k; ++j) sum += p[idx[j]];
    for (int64_t j = 0; j < k; ++j) {
      r.ids.push_back(idx[j]);
      r.w.push_back(renorm ? p[idx[j]] / sum : p[idx[j]]);
    }
  }
  return r;
}

struct RouteCase {
  int64_t n, E, k;
  bool renorm;
};

class MoeRoute : public ::testing::TestWithParam<RouteCase> {};

TEST_P(MoeRoute, MatchesSortedSoftmax) {
  const auto [n, E, k, renorm] = GetParam();
  std::vector<float> logits = random_floats(static_cast<size_t>(n * E), 11, -3.0f, 3.0f);
  // Ties: token 0 all equal (picks 0..k-1), token 1 has a tie between its two best experts.
  for (int64_t e = 0; e < E; ++e) logits[e] = 0.25f;
  if (n > 1 && E > 2) logits[E + E - 1] = logits[E + 1] = 5.0f;
  std::vector<int32_t> ids(static_cast<size_t>(n * k), -1);
  std::vector<float> w(static_cast<size_t>(n * k), -1.0f);
  ops::Context ctx{Device::cpu()};
  Tensor lt = t2(logits.data(), DType::kF32, n, E), it = t2(ids.data(), DType::kI32, n, k),
         wt = t2(w.data(), DType::kF32, n, k);
  ASSERT_TRUE(ops::moe_route(ctx, lt, {k, renorm}, it, wt).ok());
  const RefRoute r = ref_route(logits, n, E, k, renorm);
  EXPECT_EQ(ids, r.ids);
  EXPECT_LE(testing::rel_err(w, r.w), 1e-6);
  for (int64_t j = 0; j < k; ++j) EXPECT_EQ(ids[j], j) << "all-equal logits pick the lowest ids";
  if (n > 1 && E > 2) {
    EXPECT_EQ(ids[k], 1);
    if (k > 1) EXPECT_EQ(ids[k + 1], E - 1);
  }
  if (renorm) {
    for (int64_t t = 0; t < n; ++t) {
      double s = 0.0;
      for (int64_t j = 0; j < k; ++j) s += w[t * k + j];
      EXPECT_NEAR(s, 1.0, 1e-6);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MoeRoute,
                         ::testing::Values(RouteCase{37, 7, 2, true}, RouteCase{37, 7, 2, false},
                                           RouteCase{5, 8, 1, false}, RouteCase{5, 8, 1, true},
                                           RouteCase{9, 5, 5, true}, RouteCase{9, 5, 5, false},
                                           RouteCase{1, 60, 4, false}));

TEST(MoeRoute, RejectsTopKAboveExperts) {
  std::vector<float> logits(12, 0.0f), w(15);
  std::vector<int32_t> ids(15);
  ops::Context ctx{Device::cpu()};
  Tensor lt = t2(logits.data(), DType::kF32, 3, 4), it = t2(ids.data(), DType::kI32, 3, 5),
         wt = t2(w.data(), DType::kF32, 3, 5);
  const Status s = ops::moe_route(ctx, lt, {5, true}, it, wt);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("top-k 5"), std::string::npos) << s.to_string();
}

// A gated SiLU expert on one row, in double.
std::vector<double> expert_ref(const std::vector<float>& x, const std::vector<float>& g,
                               const std::vector<float>& u, const std::vector<float>& d, int64_t H,
                               int64_t F) {
  std::vector<double> a(static_cast<size_t>(F)), y(static_cast<size_t>(H), 0.0);
  for (int64_t f = 0; f < F; ++f) {
    double gs = 0.0, us = 0.0;
    for (int64_t i = 0; i < H; ++i) {
      gs += static_cast<double>(g[f * H + i]) * x[i];
      us += static_cast<double>(u[f * H + i]) * x[i];
    }
    a[f] = gs / (1.0 + std::exp(-gs)) * us;
  }
  for (int64_t i = 0; i < H; ++i) {
    for (int64_t f = 0; f < F; ++f) y[i] += static_cast<double>(d[i * F + f]) * a[f];
  }
  return y;
}

struct BlockCase {
  int64_t n, E, k, H, F;
  bool starve;  // route no token to the odd experts
};

class MoeBlock : public ::testing::TestWithParam<BlockCase> {};

// route -> offsets -> permute -> experts -> combine equals, per token, the weighted sum of its
// chosen experts run on its own row.
TEST_P(MoeBlock, GroupedExpertsMatchPerTokenReference) {
  const auto [n, E, k, H, F, starve] = GetParam();
  ops::Context ctx{Device::cpu()};
  std::vector<float> x = random_floats(static_cast<size_t>(n * H), 1);
  std::vector<float> logits = random_floats(static_cast<size_t>(n * E), 2, -2.0f, 2.0f);
  if (starve) {
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t e = 1; e < E; e += 2) logits[t * E + e] = -30.0f;
    }
  }
  std::vector<std::vector<float>> g, u, d;
  std::vector<ops::LinearWeight> gate_up(static_cast<size_t>(E)), down(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    g.push_back(
        random_floats(static_cast<size_t>(F * H), 100 + static_cast<uint32_t>(e), -0.3f, 0.3f));
    u.push_back(
        random_floats(static_cast<size_t>(F * H), 200 + static_cast<uint32_t>(e), -0.3f, 0.3f));
    d.push_back(
        random_floats(static_cast<size_t>(H * F), 300 + static_cast<uint32_t>(e), -0.3f, 0.3f));
  }
  for (int64_t e = 0; e < E; ++e) {
    gate_up[e].add(t2(g[e].data(), DType::kF32, F, H));
    gate_up[e].add(t2(u[e].data(), DType::kF32, F, H));
    down[e].add(t2(d[e].data(), DType::kF32, H, F));
  }
  const int64_t S = n * k;
  std::vector<int32_t> ids(S), offsets(E + 1), perm(S);
  std::vector<float> w(S), xp(S * H), scratch(S * 2 * F), act(S * F), yp(S * H);
  std::vector<float> out(n * H, 0.5f);  // accumulate onto 0.5
  Tensor lt = t2(logits.data(), DType::kF32, n, E), it = t2(ids.data(), DType::kI32, n, k),
         wt = t2(w.data(), DType::kF32, n, k), ot = t2(offsets.data(), DType::kI32, 1, E + 1),
         xt = t2(x.data(), DType::kF32, n, H), xpt = t2(xp.data(), DType::kF32, S, H),
         pt = t2(perm.data(), DType::kI32, 1, S), st = t2(scratch.data(), DType::kF32, S, 2 * F),
         at = t2(act.data(), DType::kF32, S, F), ypt = t2(yp.data(), DType::kF32, S, H),
         outt = t2(out.data(), DType::kF32, n, H);
  ASSERT_TRUE(ops::moe_route(ctx, lt, {k, true}, it, wt).ok());
  ASSERT_TRUE(ops::moe_offsets(ctx, it, E, ot).ok());
  ASSERT_TRUE(ops::moe_permute(ctx, xt, it, ot, xpt, pt).ok());
  const ops::MoeExperts ex{gate_up.data(), down.data(), E};
  ASSERT_TRUE(ops::moe_experts(ctx, xpt, ot, ex, Activation::kSilu, st, at, ypt).ok());
  ASSERT_TRUE(ops::moe_combine(ctx, ypt, pt, wt, outt, /*accumulate=*/true).ok());

  // Offsets: the counts of a naive histogram; permuted rows expert-contiguous and stable.
  std::vector<int32_t> count(E, 0);
  for (int32_t e : ids) ++count[e];
  EXPECT_EQ(offsets[0], 0);
  for (int64_t e = 0; e < E; ++e)
    EXPECT_EQ(offsets[e + 1] - offsets[e], count[e]) << "expert " << e;
  if (starve) {
    for (int64_t e = 1; e < E; e += 2) EXPECT_EQ(count[e], 0);
  }
  // perm: slot -> row, rows numbered expert by expert, slots of one expert in increasing order.
  std::vector<int32_t> want_perm(static_cast<size_t>(S), -1);
  int32_t next_row = 0;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t s = 0; s < S; ++s) {
      if (ids[s] == e) want_perm[s] = next_row++;
    }
  }
  EXPECT_EQ(perm, want_perm);
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t i = 0; i < H; ++i) ASSERT_EQ(xp[perm[s] * H + i], x[(s / k) * H + i]);
  }
  std::vector<double> want(static_cast<size_t>(n * H), 0.5);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<float> row(x.begin() + t * H, x.begin() + (t + 1) * H);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[t * k + j];
      const std::vector<double> y = expert_ref(row, g[e], u[e], d[e], H, F);
      for (int64_t i = 0; i < H; ++i) want[t * H + i] += w[t * k + j] * y[i];
    }
  }
  EXPECT_LE(testing::rel_err(out, want), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Shapes, MoeBlock,
                         ::testing::Values(BlockCase{13, 6, 2, 37, 19, false},
                                           BlockCase{13, 6, 2, 37, 19, true},
                                           BlockCase{1, 8, 2, 48, 24, false},
                                           BlockCase{7, 4, 1, 33, 17, true},
                                           BlockCase{5, 3, 3, 29, 11, false}));

// The bf16 layout (the GPU's, run by the CPU twins): bf16 activations permuted unchanged, each
// expert's [gate; up] as one bf16 part and down bf16 (here not stacked: the CPU twin runs them
// one group at a time), SiLU * up rounded to bf16 once whatever the group size; within bf16
// rounding of the f32 reference on the same (bf16-valued) weights.
TEST(MoeBlock, Bf16LayoutMatchesF32Reference) {
  const int64_t n = 29, E = 5, k = 2, H = 40, F = 24, S = n * k;
  ops::Context ctx{Device::cpu()};
  std::vector<float> x = random_floats(static_cast<size_t>(n * H), 7);
  for (float& v : x) v = bf16_to_f32(f32_to_bf16(v));
  std::vector<float> logits = random_floats(static_cast<size_t>(n * E), 8, -2.0f, 2.0f);
  for (int64_t t = 0; t < n; ++t) logits[t * E + 1] = t < 20 ? 9.0f : -9.0f;  // a large group
  std::vector<std::vector<float>> gu_f(E), d_f(E);
  std::vector<std::vector<uint16_t>> gu_b(E), d_b(E);
  std::vector<ops::LinearWeight> gu32(E), d32(E), gu16(E), d16(E);
  for (int64_t e = 0; e < E; ++e) {
    gu_f[e] =
        random_floats(static_cast<size_t>(2 * F * H), 40 + static_cast<uint32_t>(e), -0.3f, 0.3f);
    d_f[e] = random_floats(static_cast<size_t>(H * F), 60 + static_cast<uint32_t>(e), -0.3f, 0.3f);
    for (float& v : gu_f[e]) v = bf16_to_f32(f32_to_bf16(v));
    for (float& v : d_f[e]) v = bf16_to_f32(f32_to_bf16(v));
    for (float v : gu_f[e]) gu_b[e].push_back(f32_to_bf16(v));
    for (float v : d_f[e]) d_b[e].push_back(f32_to_bf16(v));
    gu32[e].add(t2(gu_f[e].data(), DType::kF32, 2 * F, H));
    d32[e].add(t2(d_f[e].data(), DType::kF32, H, F));
    gu16[e].add(t2(gu_b[e].data(), DType::kBF16, 2 * F, H));
    d16[e].add(t2(d_b[e].data(), DType::kBF16, H, F));
  }
  std::vector<uint16_t> xb;
  for (float v : x) xb.push_back(f32_to_bf16(v));
  std::vector<int32_t> ids(S), offsets(E + 1), perm(S);
  std::vector<float> w(S);
  Tensor lt = t2(logits.data(), DType::kF32, n, E), it = t2(ids.data(), DType::kI32, n, k),
         wt = t2(w.data(), DType::kF32, n, k), ot = t2(offsets.data(), DType::kI32, 1, E + 1),
         pt = t2(perm.data(), DType::kI32, 1, S);
  ASSERT_TRUE(ops::moe_route(ctx, lt, {k, false}, it, wt).ok());
  ASSERT_TRUE(ops::moe_offsets(ctx, it, E, ot).ok());
  ASSERT_GT(offsets[2] - offsets[1], 16) << "expert 1 gets a large group";
  auto run = [&](DType act, const void* xin, std::vector<ops::LinearWeight>& gu,
                 std::vector<ops::LinearWeight>& dn) {
    const int64_t eb = dtype_bytes(act, 1);
    std::vector<uint8_t> xp(S * H * eb), scratch(S * 2 * F * eb), a(S * F * eb);
    std::vector<float> yp(S * H), out(n * H, 0.0f);
    Tensor xt = Tensor::make(const_cast<void*>(xin), act, {n, H}),
           xpt = Tensor::make(xp.data(), act, {S, H}),
           st = Tensor::make(scratch.data(), act, {S, 2 * F}),
           at = Tensor::make(a.data(), act, {S, F}), ypt = t2(yp.data(), DType::kF32, S, H),
           outt = t2(out.data(), DType::kF32, n, H);
    EXPECT_TRUE(ops::moe_permute(ctx, xt, it, ot, xpt, pt).ok());
    const ops::MoeExperts ex{gu.data(), dn.data(), E};
    const Status s = ops::moe_experts(ctx, xpt, ot, ex, Activation::kSilu, st, at, ypt);
    EXPECT_TRUE(s.ok()) << s.to_string();
    EXPECT_TRUE(ops::moe_combine(ctx, ypt, pt, wt, outt, false).ok());
    return out;
  };
  const std::vector<float> ref = run(DType::kF32, x.data(), gu32, d32);
  const std::vector<float> twin = run(DType::kBF16, xb.data(), gu16, d16);
  std::vector<double> want(ref.begin(), ref.end());
  const double err = testing::rel_err(twin, want);
  EXPECT_LE(err, 2e-2);
  EXPECT_GT(err, 0.0) << "the bf16 path rounds the activation";
}

TEST(MoeCombine, OverwriteAndNonPermutation) {
  ops::Context ctx{Device::cpu()};
  // 2 tokens, k 2, hidden 3: perm (slot -> row) reversed.
  std::vector<float> yp = {1, 2, 3, 10, 20, 30, 100, 200, 300, 1000, 2000, 3000};
  std::vector<int32_t> perm = {3, 2, 1, 0};
  std::vector<float> w = {0.5f, 0.25f, 2.0f, 1.0f}, out(6, 7.0f);
  Tensor yt = t2(yp.data(), DType::kF32, 4, 3), pt = t2(perm.data(), DType::kI32, 1, 4),
         wt = t2(w.data(), DType::kF32, 2, 2), ot = t2(out.data(), DType::kF32, 2, 3);
  ASSERT_TRUE(ops::moe_combine(ctx, yt, pt, wt, ot, /*accumulate=*/false).ok());
  // token 0: slot 0 -> row 3, slot 1 -> row 2; token 1: slot 2 -> row 1, slot 3 -> row 0.
  const std::vector<float> want = {0.5f * 1000 + 0.25f * 100, 0.5f * 2000 + 0.25f * 200,
                                   0.5f * 3000 + 0.25f * 300, 2.0f * 10 + 1.0f * 1,
                                   2.0f * 20 + 1.0f * 2,      2.0f * 30 + 1.0f * 3};
  EXPECT_EQ(out, want);
  perm = {0, 0, 1, 2};
  EXPECT_FALSE(ops::moe_combine(ctx, yt, pt, wt, ot, false).ok());
}

TEST(MoeOffsets, RejectsOutOfRangeExpert) {
  ops::Context ctx{Device::cpu()};
  std::vector<int32_t> ids = {0, 3, 1, 3}, off(5);
  Tensor it = t2(ids.data(), DType::kI32, 2, 2), ot = t2(off.data(), DType::kI32, 1, 5);
  ASSERT_TRUE(ops::moe_offsets(ctx, it, 4, ot).ok());
  EXPECT_EQ(off, (std::vector<int32_t>{0, 1, 2, 2, 4}));  // expert 2 empty
  Tensor small = t2(off.data(), DType::kI32, 1, 4);
  EXPECT_EQ(ops::moe_offsets(ctx, it, 3, small).code(), StatusCode::kOutOfRange);
}

// ops::moe_dispatch (route + offsets + permute in one call) against the naive router above and a
// stable grouping written here; and a clear error when offsets is sized for other experts.
TEST(MoeDispatch, MatchesReferenceRoutingAndStableLayout) {
  const int64_t n = 5, E = 7, k = 3, H = 13;
  std::vector<float> logits = random_floats(static_cast<size_t>(n * E), 41, -3, 3);
  logits[E + 2] = logits[E + 5];  // a tie in token 1: the lower index first
  const std::vector<float> x = random_floats(static_cast<size_t>(n * H), 42, -1, 1);
  std::vector<int32_t> ids(static_cast<size_t>(n * k)), off(static_cast<size_t>(E + 1)),
      perm(static_cast<size_t>(n * k));
  std::vector<float> w(static_cast<size_t>(n * k)), xp(static_cast<size_t>(n * k * H));
  ops::Context ctx{Device::cpu()};
  Tensor lt = t2(logits.data(), DType::kF32, n, E);
  Tensor xt = t2(const_cast<float*>(x.data()), DType::kF32, n, H);
  Tensor it = t2(ids.data(), DType::kI32, n, k), wt = t2(w.data(), DType::kF32, n, k);
  Tensor ot = t2(off.data(), DType::kI32, 1, E + 1), pt = t2(perm.data(), DType::kI32, 1, n * k);
  Tensor xpt = t2(xp.data(), DType::kF32, n * k, H);
  ASSERT_TRUE(ops::moe_dispatch(ctx, lt, {k, true}, xt, it, wt, ot, xpt, pt).ok());
  const RefRoute ref = ref_route(logits, n, E, k, true);
  EXPECT_EQ(ids, ref.ids);
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(w[i], ref.w[i], 1e-6) << i;
  // Stable grouping: expert by expert, slots in order within an expert.
  std::vector<int32_t> want_off(static_cast<size_t>(E + 1), 0);
  for (int32_t e : ref.ids) ++want_off[static_cast<size_t>(e) + 1];
  for (int64_t e = 0; e < E; ++e) want_off[e + 1] += want_off[e];
  EXPECT_EQ(off, want_off);
  std::vector<int32_t> next(want_off.begin(), want_off.end() - 1);
  for (int64_t s = 0; s < n * k; ++s) {
    const int32_t r = next[static_cast<size_t>(ref.ids[s])]++;
    EXPECT_EQ(perm[s], r) << "slot " << s;
    for (int64_t i = 0; i < H; ++i) EXPECT_EQ(xp[r * H + i], x[(s / k) * H + i]);
  }
  Tensor wrong = t2(off.data(), DType::kI32, 1, E);
  const Status bad = ops::moe_dispatch(ctx, lt, {k, true}, xt, it, wt, wrong, xpt, pt);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("offsets"), std::string::npos) << bad.to_string();
}

TEST(SigmoidGateAdd, MatchesReference) {
  ops::Context ctx{Device::cpu()};
  const int64_t n = 5, H = 7;
  std::vector<float> y = random_floats(n * H, 3), g = random_floats(n, 4, -4.0f, 4.0f),
                     out = random_floats(n * H, 5);
  std::vector<double> want(out.begin(), out.end());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < H; ++i) want[t * H + i] += y[t * H + i] / (1.0 + std::exp(-g[t]));
  }
  Tensor yt = t2(y.data(), DType::kF32, n, H), gt = t2(g.data(), DType::kF32, n, 1),
         ot = t2(out.data(), DType::kF32, n, H);
  ASSERT_TRUE(ops::sigmoid_gate_add(ctx, yt, gt, ot).ok());
  EXPECT_LE(testing::rel_err(out, want), 1e-6);
}

}  // namespace
}  // namespace strata
