// Sampler: each filter against the distribution it should leave, checked by drawing many
// samples (frequencies vs the renormalized softmax), plus reproducibility by seed.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "runtime/sampler.h"

namespace strata {
namespace {

std::vector<float> logits5() {
  return {2.0f, 1.0f, 0.5f, -1.0f, 3.0f};
}

std::vector<double> softmax(const std::vector<float>& l, double t = 1.0) {
  double mx = -1e30, sum = 0;
  for (float x : l) mx = std::max(mx, static_cast<double>(x) / t);
  std::vector<double> p;
  for (float x : l) p.push_back(std::exp(x / t - mx)), sum += p.back();
  for (double& x : p) x /= sum;
  return p;
}

// Empirical frequencies over n draws (the sampler mutates logits, so copy each time).
std::vector<double> frequencies(const SamplingParams& params, const std::vector<float>& l,
                                int n = 40000) {
  Sampler s(params);
  std::vector<double> f(l.size(), 0.0);
  for (int i = 0; i < n; ++i) {
    std::vector<float> x = l;
    f[static_cast<size_t>(s.sample(x.data(), static_cast<int64_t>(x.size()), {}, {}))] += 1.0 / n;
  }
  return f;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    // 40k draws: standard error <= 0.0025; allow 4 sigma.
    EXPECT_NEAR(got[i], want[i], 0.01) << "token " << i;
  }
}

TEST(Sampler, GreedyPicksTheArgmax) {
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler s(p);
  auto l = logits5();
  EXPECT_EQ(s.sample(l.data(), 5, {}, {}), 4);
}

TEST(Sampler, TemperatureScalesTheSoftmax) {
  SamplingParams p;
  p.temperature = 0.7f;
  p.seed = 1;
  expect_close(frequencies(p, logits5()), softmax(logits5(), 0.7));
}

TEST(Sampler, TopKKeepsTheKLargest) {
  SamplingParams p;
  p.top_k = 2;
  p.seed = 2;
  auto sm = softmax(logits5());
  const double z = sm[4] + sm[0];
  expect_close(frequencies(p, logits5()), {sm[0] / z, 0, 0, 0, sm[4] / z});
}

TEST(Sampler, TopPKeepsTheSmallestNucleus) {
  SamplingParams p;
  p.top_p = 0.8f;
  p.seed = 3;
  auto sm = softmax(logits5());  // sorted: 4 (0.61), 0 (0.22), 1 (0.08) ...
  ASSERT_LT(sm[4], 0.8);
  ASSERT_GE(sm[4] + sm[0], 0.8);
  const double z = sm[4] + sm[0];
  expect_close(frequencies(p, logits5()), {sm[0] / z, 0, 0, 0, sm[4] / z});
}

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheTop) {
  SamplingParams p;
  p.min_p = 0.1f;
  p.seed = 4;
  auto sm = softmax(logits5());
  std::vector<double> want(5, 0.0);
  double z = 0;
  for (int i = 0; i < 5; ++i) {
    if (sm[i] >= 0.1 * sm[4]) want[i] = sm[i], z += sm[i];
  }
  for (double& w : want) w /= z;
  expect_close(frequencies(p, logits5()), want);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  std::vector<float> l = {2.0f, 1.5f, -1.0f};
  const std::vector<int32_t> history = {0, 2, 0};
  EXPECT_EQ(s.sample(l.data(), 3, history, {}), 1);  // 2.0 -> 1.0 < 1.5
  EXPECT_FLOAT_EQ(l[0], 1.0f);
  EXPECT_FLOAT_EQ(l[1], 1.5f);
  EXPECT_FLOAT_EQ(l[2], -2.0f);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesUseGeneratedTokensOnly) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(p);
  std::vector<float> l = {1.0f, 1.0f, 1.0f};
  const std::vector<int32_t> prompt = {2};
  const std::vector<int32_t> generated = {0, 0, 1};
  s.sample(l.data(), 3, prompt, generated);
  EXPECT_FLOAT_EQ(l[0], 1.0f - 0.5f - 0.5f);
  EXPECT_FLOAT_EQ(l[1], 1.0f - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(l[2], 1.0f);
}

TEST(Sampler, LogitBiasCanForbidAToken) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.logit_bias = {{4, -INFINITY}};
  Sampler s(p);
  auto l = logits5();
  EXPECT_EQ(s.sample(l.data(), 5, {}, {}), 0);
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferentTokens) {
  auto draw = [](uint64_t seed) {
    SamplingParams p;
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) {
      auto l = logits5();
      out.push_back(s.sample(l.data(), 5, {}, {}));
    }
    return out;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

TEST(Sampler, ValidationRejectsBadValues) {
  SamplingParams p;
  p.temperature = NAN;
  EXPECT_FALSE(validate_sampling(p).ok());
  p = {};
  p.top_p = 0.0f;
  EXPECT_FALSE(validate_sampling(p).ok());
  p = {};
  p.top_k = -1;
  EXPECT_FALSE(validate_sampling(p).ok());
  p = {};
  p.min_p = 1.5f;
  EXPECT_FALSE(validate_sampling(p).ok());
  p = {};
  p.repetition_penalty = 0.0f;
  EXPECT_FALSE(validate_sampling(p).ok());
  EXPECT_TRUE(validate_sampling(SamplingParams{}).ok());
}

}  // namespace
}  // namespace strata
