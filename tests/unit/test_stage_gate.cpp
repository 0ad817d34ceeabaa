// StageGate (runtime/stage_gate.h): a stage's first pass of a shape runs with no other stage
// inside; passes of seen shapes run side by side; a stage waiting to run alone is not kept out
// by a stream of seen-shape passes.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "runtime/stage_gate.h"

namespace strata {
namespace {

using std::chrono::milliseconds;

// Stages run passes of a few shapes from threads; a pass records how many passes are inside at
// once. Every pass that ran alone must have seen only itself; each (stage, shape) runs alone
// exactly once.
TEST(StageGate, NewShapesRunAloneSeenShapesOverlap) {
  constexpr int kStages = 3, kPasses = 40;
  StageGate gate(kStages);
  std::atomic<int> inside{0}, max_inside{0}, alone_violations{0};
  std::vector<std::thread> threads;
  for (int s = 0; s < kStages; ++s) {
    threads.emplace_back([&, s] {
      for (int p = 0; p < kPasses; ++p) {
        const StageGate::Key key{p % 4, 1, s == kStages - 1 ? 1 : 0};
        const bool alone = gate.enter(s, key);
        const int now = ++inside;
        int m = max_inside.load();
        while (now > m && !max_inside.compare_exchange_weak(m, now)) {
        }
        if (alone && now != 1) ++alone_violations;
        std::this_thread::sleep_for(milliseconds(1));
        --inside;
        gate.leave(s, key, alone, true);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(alone_violations.load(), 0);
  EXPECT_EQ(gate.alone_passes(), kStages * 4) << "each stage's 4 shapes run alone once";
  EXPECT_GE(max_inside.load(), 2) << "seen shapes should run side by side";
}

// A failed pass does not count as seen: the shape runs alone again.
TEST(StageGate, FailedPassIsNotSeen) {
  StageGate gate(1);
  const StageGate::Key key{8, 8, 2};
  bool alone = gate.enter(0, key);
  EXPECT_TRUE(alone);
  gate.leave(0, key, alone, false);
  alone = gate.enter(0, key);
  EXPECT_TRUE(alone);
  gate.leave(0, key, alone, true);
  alone = gate.enter(0, key);
  EXPECT_FALSE(alone);
  gate.leave(0, key, alone, true);
}

// A stage waiting for a new shape gets in while another stage keeps running seen shapes.
TEST(StageGate, WaitingNewShapeIsNotStarved) {
  StageGate gate(2);
  const StageGate::Key seen{1, 1, 0}, fresh{2, 1, 1};
  bool a = gate.enter(0, seen);
  gate.leave(0, seen, a, true);
  std::atomic<bool> stop{false}, got_in{false};
  std::thread busy([&] {
    while (!stop) {
      const bool al = gate.enter(0, seen);
      std::this_thread::sleep_for(milliseconds(1));
      gate.leave(0, seen, al, true);
    }
  });
  std::thread fresh_stage([&] {
    const bool al = gate.enter(1, fresh);
    got_in = true;
    gate.leave(1, fresh, al, true);
  });
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!got_in && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  stop = true;
  busy.join();
  fresh_stage.join();
  EXPECT_TRUE(got_in.load());
}

// Only tensor-parallel stages on GPUs are gated; one-rank stages (and the CPU) pipeline freely.
// STRATA_PP_STAGE_GATE (env 0 / 1) forces the choice.
TEST(StageGate, OnlyTensorParallelStagesOnGpusAreGated) {
  EXPECT_TRUE(stages_gated(/*cuda=*/true, /*tp=*/2, /*env=*/-1));
  EXPECT_FALSE(stages_gated(true, 1, -1)) << "PP = N with one GPU per stage";
  EXPECT_FALSE(stages_gated(false, 2, -1));
  EXPECT_FALSE(stages_gated(false, 1, -1));
  EXPECT_TRUE(stages_gated(false, 1, 1));
  EXPECT_TRUE(stages_gated(true, 1, 1));
  EXPECT_FALSE(stages_gated(true, 2, 0));
}

}  // namespace
}  // namespace strata
