// StageGate: pipeline stages as threads of one process run a pass of a shape the stage has not
// run before alone, and passes of shapes it has seen side by side.
//
// Why: on first use of a GEMM shape cuBLASLt may load a kernel library (cuLibraryLoadData). The
// load waits for every GPU of the process to go idle while holding a lock that every
// cublasLtMatmul of the process takes. With tensor-parallel stages on their own GPUs and passes
// in flight on several stages, another stage's GPU can sit in an NCCL all-reduce waiting for a
// rank whose host thread is blocked on that lock: it never goes idle, and the process hangs
// (seen on 4 x H200 with TP = 2 x PP = 2: host stacks in bench/results/2026-11-26-h200x4-s4/).
// Inside one tensor-parallel group the ranks run the same GEMMs at the same point, so the first
// rank to reach a new shape loads what it needs while its peers wait at the lock with drained
// streams (cuda/linear.cpp); only passes of other stages can be in the way, and this gate keeps
// them out while a stage meets a new shape.
// A stage must enter the gate only when its inputs are ready (the previous stage has finished the
// pass), so that a pass inside the gate never waits for another stage.
// Only tensor-parallel stages on GPUs need the gate (stages_gated()): one-rank stages have no
// device collective and pass hidden states through host memory, so every GPU's work ends
// without waiting for another GPU and a library load's wait for idle GPUs always ends. The gate
// costs them dearly: each new shape drains the pipeline while one stage runs its first pass of
// it. Llama-3-70B shape, PP = 4 on 4 x H200, bench-throughput 256 x 512 / 128: 691-711 output
// tok/s gated (116 of 6,180 stage passes alone, 31.3 s in them, bubble 57%) vs 1,073-1,149
// ungated (bubble 34-36%).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

namespace strata {

class StageGate {
 public:
  // The shape of a pass on one stage: its tokens, its result rows and what it returns
  // (0 hidden states to the next stage, 1 logits, 2 argmax ids).
  using Key = std::tuple<int64_t, int64_t, int>;

  explicit StageGate(int stages) : seen_(static_cast<size_t>(stages)) {}

  // Blocks until stage s may run a pass of `key`; true when it runs alone (a new shape).
  bool enter(int s, const Key& key) {
    std::unique_lock<std::mutex> lock(mu_);
    if (seen_[static_cast<size_t>(s)].count(key) == 0) {
      ++waiting_alone_;
      cv_.wait(lock, [&] { return !alone_ && running_ == 0; });
      --waiting_alone_;
      alone_ = true;
      ++alone_passes_;
      return true;
    }
    // A stage waiting to run alone goes first (otherwise passes of seen shapes, always some
    // stage's, could keep it out for good).
    cv_.wait(lock, [&] { return !alone_ && waiting_alone_ == 0; });
    ++running_;
    return false;
  }
  // The pass entered with enter(s, key) is over; `ok`: it ran (its shape is now seen).
  void leave(int s, const Key& key, bool alone, bool ok) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (alone) {
        alone_ = false;
        if (ok) seen_[static_cast<size_t>(s)].insert(key);
      } else {
        --running_;
      }
    }
    cv_.notify_all();
  }
  // Passes that ran alone so far (for tests).
  int64_t alone_passes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return alone_passes_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int running_ = 0;        // passes of seen shapes inside
  int waiting_alone_ = 0;  // stages waiting to run a new shape alone
  bool alone_ = false;     // a stage runs a new shape alone
  int64_t alone_passes_ = 0;
  std::vector<std::set<Key>> seen_;  // per stage
};

// Whether in-process pipeline stages go through the StageGate: tensor-parallel stages (tp > 1) on
// GPUs; `env` (EnvConfig::pp_stage_gate, STRATA_PP_STAGE_GATE) 0 / 1 forces it off / on.
inline bool stages_gated(bool cuda, int tp, int env) {
  if (env >= 0) return env == 1;
  return cuda && tp > 1;
}

}  // namespace strata
