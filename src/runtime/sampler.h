// Token sampler: logit bias -> penalties -> temperature -> top-k -> softmax -> top-p -> min-p ->
// draw. Reproducible: the generator is our own xoshiro256** seeded through splitmix64, and the
// uniform draw uses 24 bits, so results do not depend on the standard library.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "strata/sampling.h"
#include "strata/status.h"

namespace strata {

Status validate_sampling(const SamplingParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // logits: [vocab] (modified in place). prompt / generated: token history for penalties.
  int32_t sample(float* logits, int64_t vocab, std::span<const int32_t> prompt,
                 std::span<const int32_t> generated);
  // Uniform in [0, 1).
  float next_uniform();

 private:
  uint64_t next_u64();
  SamplingParams params_;
  uint64_t state_[4];
  struct Candidate {
    float logit;
    int32_t id;
  };
  std::vector<Candidate> candidates_;  // reused across calls
  std::vector<int32_t> counts_;        // frequency of generated tokens, reused
};

// Index of the largest value (the first one on ties).
int32_t argmax(const float* x, int64_t n);

}  // namespace strata
