// The serving engine loop: one thread runs schedule -> swap copies -> one Model::forward over
// every scheduled token -> per-sequence sampling, stop checks and events, and sleeps on a
// condition variable when there is nothing to do. ServingEngine::create (strata/serving.h)
// builds it; this header holds the small pieces the loop is made of so they can be tested.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

// Prometheus-style latency histogram: cumulative counts per upper bound (seconds).
struct LatencyHistogram {
  std::vector<double> bounds;
  std::vector<int64_t> buckets;  // buckets[i]: observations <= bounds[i]
  double sum = 0;
  int64_t count = 0;

  explicit LatencyHistogram(std::span<const double> upper_bounds);
  void observe(double seconds);
};

// Default bucket bounds (seconds) for TTFT, TPOT and E2E latency.
std::span<const double> default_latency_buckets();

// Length of the longest suffix of `text` that is a proper prefix of one of `stops`: text the
// engine must hold back because the next tokens may complete a stop string.
size_t stop_holdback(std::string_view text, const std::vector<std::string>& stops);

// Position of the earliest stop string in `text`, or npos.
size_t find_stop(std::string_view text, const std::vector<std::string>& stops);

}  // namespace strata
