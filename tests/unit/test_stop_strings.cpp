// Stop-string helpers of the serving loop: what to hold back and where a stop string starts.
#include <gtest/gtest.h>

#include "serving/engine_loop.h"

namespace strata {
namespace {

TEST(StopStrings, HoldbackIsTheLongestSuffixThatStartsAStop) {
  const std::vector<std::string> stops = {"END", "\n\n"};
  EXPECT_EQ(stop_holdback("hello", stops), 0u);
  EXPECT_EQ(stop_holdback("hello E", stops), 1u);
  EXPECT_EQ(stop_holdback("hello EN", stops), 2u);
  EXPECT_EQ(stop_holdback("line\n", stops), 1u);
  EXPECT_EQ(stop_holdback("EN", stops), 2u);
}

TEST(StopStrings, FindsTheEarliestStop) {
  const std::vector<std::string> stops = {"END", "\n\n"};
  EXPECT_EQ(find_stop("abc\n\nxEND", stops), 3u);
  EXPECT_EQ(find_stop("abcEND\n\n", stops), 3u);
  EXPECT_EQ(find_stop("abc", stops), std::string::npos);
}

TEST(LatencyHistogram, CumulativeBuckets) {
  const double bounds[] = {0.1, 1.0};
  LatencyHistogram h(bounds);
  h.observe(0.05);
  h.observe(0.5);
  h.observe(5.0);
  EXPECT_EQ(h.buckets, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(h.count, 3);
  EXPECT_DOUBLE_EQ(h.sum, 5.55);
}

}  // namespace
}  // namespace strata
