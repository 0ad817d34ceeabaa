// rope_inv_freq against the inverse frequencies Hugging Face transformers computes (default,
// linear and llama3 scaling). The constants come from tests/model/gen_rope_inv_freq.py; rerun
// it and paste its output to regenerate them.
#include <gtest/gtest.h>

#include <cmath>
#include <iterator>

#include "model/rope.h"

namespace strata {
namespace {

// clang-format off
// transformers 5.23.0, torch 2.15.0+cu132
constexpr float kDefault64[] = {1.0f, 0.749894202f, 0.562341332f, 0.421696514f, 0.316227764f, 0.237137362f, 0.177827939f, 0.133352146f, 0.100000001f, 0.0749894157f, 0.0562341288f, 0.0421696492f, 0.0316227786f, 0.0237137359f, 0.0177827943f, 0.0133352149f, 0.00999999978f, 0.00749894232f, 0.00562341325f, 0.00421696482f, 0.00316227786f, 0.00237137382f, 0.00177827943f, 0.00133352145f, 0.00100000005f, 0.000749894185f, 0.000562341302f, 0.000421696488f, 0.000316227786f, 0.000237137385f, 0.00017782794f, 0.00013335215f};
constexpr float kDefault20Theta1e6[] = {1.0f, 0.251188636f, 0.0630957335f, 0.0158489291f, 0.00398107152f, 0.00100000005f, 0.000251188554f, 6.30957438e-05f, 1.58489293e-05f, 3.98107295e-06f};
constexpr float kLinear24[] = {0.25f, 0.116039723f, 0.0538608618f, 0.0250000004f, 0.011603971f, 0.00538608711f, 0.00249999994f, 0.00116039743f, 0.000538608583f, 0.000250000012f, 0.000116039737f, 5.38608547e-05f};
constexpr float kLlama3_128[] = {1.0f, 0.814617217f, 0.663601279f, 0.540580988f, 0.440366626f, 0.358730227f, 0.292227834f, 0.238053814f, 0.193922758f, 0.157972813f, 0.128687382f, 0.10483095f, 0.0853971019f, 0.0695659518f, 0.0566696189f, 0.0461640507f, 0.0376060307f, 0.0306345206f, 0.0249554086f, 0.0203291047f, 0.0165604409f, 0.0134904198f, 0.0109895291f, 0.00895225909f, 0.00729266508f, 0.00594073068f, 0.00483942125f, 0.00394227589f, 0.00321144611f, 0.00216657063f, 0.00137189368f, 0.00085675146f, 0.000524846022f, 0.00031269365f, 0.000178507791f, 9.55621217e-05f, 7.78465546e-05f, 6.34151438e-05f, 5.16590699e-05f, 4.20823671e-05f, 3.42810235e-05f, 2.79259093e-05f, 2.2748929e-05f, 1.85316694e-05f, 1.50962178e-05f, 1.22976389e-05f, 1.00178686e-05f, 8.1607277e-06f, 6.64786967e-06f, 5.41546933e-06f, 4.41153452e-06f, 3.59371188e-06f, 2.92749974e-06f, 2.38479174e-06f, 1.94269251e-06f, 1.58255079e-06f, 1.28917316e-06f, 1.05018262e-06f, 8.55496921e-07f, 6.96902532e-07f, 5.6770881e-07f, 4.6246538e-07f, 3.7673226e-07f, 3.06892588e-07f};
constexpr float kLlama3_64[] = {1.0f, 0.663601279f, 0.440366626f, 0.292227834f, 0.193922758f, 0.128687382f, 0.0853971019f, 0.0566696189f, 0.0376060307f, 0.0249554086f, 0.0165604409f, 0.0109895291f, 0.00729266508f, 0.00483942125f, 0.00321144611f, 0.00129054801f, 0.000429556705f, 9.70828623e-05f, 1.94616387e-05f, 1.29147675e-05f, 8.57025589e-06f, 5.68723226e-06f, 3.77405445e-06f, 2.50446715e-06f, 1.66196742e-06f, 1.10288363e-06f, 7.31874934e-07f, 4.85673127e-07f, 3.22293289e-07f, 2.1387423e-07f, 1.41927202e-07f, 9.41830649e-08f};
// clang-format on

// HF computes in f32 and strata in double, rounded once: allow a few ulp.
constexpr double kTol = 4e-7;

template <size_t N>
void expect_matches(const std::vector<float>& got, const float (&want)[N]) {
  ASSERT_EQ(got.size(), N);
  for (size_t i = 0; i < N; ++i) {
    EXPECT_LE(std::abs(static_cast<double>(got[i]) - want[i]), kTol * std::abs(want[i]))
        << "inv_freq[" << i << "] = " << got[i] << ", HF has " << want[i];
  }
}

TEST(RopeInvFreqTest, DefaultMatchesTransformers) {
  expect_matches(rope_inv_freq(64, 10000.0f, RopeScaling{}), kDefault64);
  // Partial rotary (NeoX-style 20 of 80 dims) with a large theta.
  expect_matches(rope_inv_freq(20, 1000000.0f, RopeScaling{}), kDefault20Theta1e6);
}

TEST(RopeInvFreqTest, LinearMatchesTransformers) {
  const RopeScaling linear{.type = RopeScalingType::kLinear, .factor = 4.0f};
  expect_matches(rope_inv_freq(24, 10000.0f, linear), kLinear24);
}

TEST(RopeInvFreqTest, Llama3MatchesTransformers) {
  // Llama 3.1 8B.
  const RopeScaling llama31{.type = RopeScalingType::kLlama3,
                            .factor = 8.0f,
                            .low_freq_factor = 1.0f,
                            .high_freq_factor = 4.0f,
                            .original_max_position_embeddings = 8192};
  expect_matches(rope_inv_freq(128, 500000.0f, llama31), kLlama3_128);
  // Llama 3.2 1B: factor 32, head_dim 64.
  RopeScaling llama32 = llama31;
  llama32.factor = 32.0f;
  expect_matches(rope_inv_freq(64, 500000.0f, llama32), kLlama3_64);
}

TEST(RopeInvFreqTest, Llama3HasAllThreeBands) {
  // The 128-dim case above covers unchanged, smoothed and divided frequencies.
  const RopeScaling llama31{.type = RopeScalingType::kLlama3,
                            .factor = 8.0f,
                            .low_freq_factor = 1.0f,
                            .high_freq_factor = 4.0f,
                            .original_max_position_embeddings = 8192};
  const std::vector<float> plain = rope_inv_freq(128, 500000.0f, RopeScaling{});
  const std::vector<float> scaled = rope_inv_freq(128, 500000.0f, llama31);
  int unchanged = 0, divided = 0, smoothed = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    const double ratio = static_cast<double>(scaled[i]) / plain[i];
    if (std::abs(ratio - 1.0) < 1e-6) {
      ++unchanged;
    } else if (std::abs(ratio - 0.125) < 1e-6) {
      ++divided;
    } else {
      ++smoothed;
    }
  }
  EXPECT_GT(unchanged, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(smoothed, 0);
}

TEST(RopeInvFreqTest, EmptyForNoRotaryDims) {
  EXPECT_TRUE(rope_inv_freq(0, 10000.0f, RopeScaling{}).empty());
}

}  // namespace
}  // namespace strata
