// Sampling parameters, per request. Defaults give plain multinomial sampling at T=1;
// temperature 0 means greedy.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace strata {

struct SamplingParams {
  float temperature = 1.0f;         // 0: greedy (argmax)
  int top_k = 0;                    // 0: off
  float top_p = 1.0f;               // 1: off
  float min_p = 0.0f;               // 0: off; drop tokens with p < min_p * p_max
  float repetition_penalty = 1.0f;  // HF style, over prompt + generated tokens; 1: off
  float presence_penalty = 0.0f;    // OpenAI style, over generated tokens
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;  // same seed + same inputs = same tokens
  std::vector<std::pair<int32_t, float>> logit_bias;
};

}  // namespace strata
