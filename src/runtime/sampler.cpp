#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/status.h"

namespace strata {

namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

}  // namespace

Status validate_sampling(const SamplingParams& p) {
  auto finite = [](float v) { return std::isfinite(v); };
  if (!finite(p.temperature) || p.temperature < 0.0f) {
    return errorf(StatusCode::kInvalidArgument, "temperature must be a finite number >= 0");
  }
  if (p.top_k < 0) return errorf(StatusCode::kInvalidArgument, "top_k must be >= 0");
  if (!finite(p.top_p) || p.top_p <= 0.0f || p.top_p > 1.0f) {
    return errorf(StatusCode::kInvalidArgument, "top_p must be in (0, 1]");
  }
  if (!finite(p.min_p) || p.min_p < 0.0f || p.min_p > 1.0f) {
    return errorf(StatusCode::kInvalidArgument, "min_p must be in [0, 1]");
  }
  if (!finite(p.repetition_penalty) || p.repetition_penalty <= 0.0f) {
    return errorf(StatusCode::kInvalidArgument, "repetition_penalty must be > 0");
  }
  if (!finite(p.presence_penalty) || !finite(p.frequency_penalty) ||
      std::fabs(p.presence_penalty) > 2.0f || std::fabs(p.frequency_penalty) > 2.0f) {
    return errorf(StatusCode::kInvalidArgument,
                  "presence_penalty and frequency_penalty must be in [-2, 2]");
  }
  for (const auto& [id, bias] : p.logit_bias) {
    if (!std::isfinite(bias) && !(std::isinf(bias) && bias < 0)) {
      return errorf(StatusCode::kInvalidArgument, "logit_bias for token {} is not finite", id);
    }
  }
  return ok_status();
}

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

Sampler::Sampler(const SamplingParams& params) : params_(params) {
  uint64_t s = params.seed;
  for (uint64_t& w : state_) w = splitmix64(s);
}

uint64_t Sampler::next_u64() {
  const uint64_t result = rotl(state_[1] * 5, 7) * 9;
  const uint64_t t = state_[1] << 17;
  state_[2] ^= state_[0];
  state_[3] ^= state_[1];
  state_[1] ^= state_[2];
  state_[0] ^= state_[3];
  state_[2] ^= t;
  state_[3] = rotl(state_[3], 45);
  return result;
}

float Sampler::next_uniform() {
  return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f);
}

int32_t Sampler::sample(float* logits, int64_t vocab, std::span<const int32_t> prompt,
                        std::span<const int32_t> generated) {
  const SamplingParams& p = params_;
  for (const auto& [id, bias] : p.logit_bias) {
    if (id >= 0 && id < vocab) logits[id] += bias;
  }
  if (p.repetition_penalty != 1.0f) {
    auto penalize = [&](int32_t id) {
      if (id < 0 || id >= vocab) return;
      float& l = logits[id];
      l = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
    };
    // Each distinct token once: mark with a sign-free pass over a seen-list.
    std::vector<int32_t> seen(prompt.begin(), prompt.end());
    seen.insert(seen.end(), generated.begin(), generated.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t id : seen) penalize(id);
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    counts_.assign(static_cast<size_t>(vocab), 0);
    for (int32_t id : generated) {
      if (id >= 0 && id < vocab) ++counts_[static_cast<size_t>(id)];
    }
    for (int64_t i = 0; i < vocab; ++i) {
      const int32_t c = counts_[static_cast<size_t>(i)];
      if (c > 0) logits[i] -= p.presence_penalty + p.frequency_penalty * static_cast<float>(c);
    }
  }
  if (p.temperature <= 0.0f || p.top_k == 1) return argmax(logits, vocab);

  candidates_.resize(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) {
    candidates_[static_cast<size_t>(i)] = {logits[i] / p.temperature, static_cast<int32_t>(i)};
  }
  auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  size_t n = candidates_.size();
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) {
    std::nth_element(candidates_.begin(), candidates_.begin() + p.top_k, candidates_.end(),
                     by_logit);
    n = static_cast<size_t>(p.top_k);
  }
  std::sort(candidates_.begin(), candidates_.begin() + static_cast<ptrdiff_t>(n), by_logit);
  // Softmax over the survivors (probabilities stored in .logit from here on).
  const float max_logit = candidates_[0].logit;
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const float e = std::exp(candidates_[i].logit - max_logit);
    candidates_[i].logit = e;
    sum += e;
  }
  for (size_t i = 0; i < n; ++i)
    candidates_[i].logit = static_cast<float>(candidates_[i].logit / sum);
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      cum += candidates_[i].logit;
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
  }
  if (p.min_p > 0.0f) {
    const float threshold = p.min_p * candidates_[0].logit;
    size_t keep = 1;
    while (keep < n && candidates_[keep].logit >= threshold) ++keep;
    n = keep;
  }
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) total += candidates_[i].logit;
  const double r = static_cast<double>(next_uniform()) * total;
  double acc = 0.0;
  for (size_t i = 0; i < n; ++i) {
    acc += candidates_[i].logit;
    if (r < acc) return candidates_[i].id;
  }
  return candidates_[n - 1].id;
}

}  // namespace strata
