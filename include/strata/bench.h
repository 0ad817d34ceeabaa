// Benchmark primitives for `strata bench`: a model loaded on its device (as Engine::create
// loads it) whose forward pass is timed on seeded random token ids in fresh sequences, without
// tokenizer or sampling. Every rank of a tensor-parallel run must make the same calls.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/engine.h"
#include "strata/status.h"

namespace strata {

// Weight streaming (--gpu-weight-budget / --offload-weights): the plan and the counters so far.
struct WeightStreamInfo {
  bool streaming = false;
  std::vector<std::string> plan;  // where every layer lives and why
  std::string tier;               // "host" or "disk"
  bool prefetch = true;
  int64_t layers_streamed = 0, layers_resident = 0;
  int64_t bytes_per_pass = 0;  // copied into the slots per forward pass
  int64_t slot_bytes = 0;      // device memory of the slots (part of the device weight bytes)
  int64_t passes = 0, bytes_copied = 0, disk_bytes = 0;
  bool direct_io = false;
  // Data-parallel replicas (--dp): their number, the replicas sharing each layer's fetch
  // (partitioned fetch; 1: each copies whole layers), and per replica the forward passes and the
  // bytes it copied from host memory so far.
  int dp = 1;
  int fetch_parts = 1;
  int fetch_pieces = 1;  // partitioned fetch: the most pieces (all-gathers) per layer
  std::vector<int64_t> replica_passes, replica_bytes_copied;
};

class Benchmark {
 public:
  static Result<std::unique_ptr<Benchmark>> create(const EngineConfig& config);
  virtual ~Benchmark() = default;

  virtual const ModelInfo& info() const = 0;
  virtual int rank() const = 0;  // only rank 0 should print

  // Seconds for one prefill of n_prompt tokens (logits for the last token only), and seconds
  // for n_gen single-token decode steps after an n_context-token prefill (not timed).
  virtual Result<double> time_prefill(int64_t n_prompt, uint64_t seed) = 0;
  virtual Result<double> time_decode(int64_t n_context, int64_t n_gen, uint64_t seed) = 0;
  // Batched: seconds for one forward pass prefilling `batch` sequences of n_prompt tokens
  // together (logits of each last token), and mean seconds per decode step of `batch` sequences
  // (greedy, argmax on the device) over n_gen steps after an n_context-token prefill of each
  // (not timed).
  virtual Result<double> time_prefill_batch(int64_t batch, int64_t n_prompt, uint64_t seed) = 0;
  virtual Result<double> time_decode_batch(int64_t batch, int64_t n_context, int64_t n_gen,
                                           uint64_t seed) = 0;
  // With pipeline stages: the measured bubble (idle stage-time over all stage-time) of the last
  // batched prefill or of the decode steps of the last batched decode; -1 without stages.
  virtual double pipeline_bubble() const { return -1.0; }
  virtual WeightStreamInfo weight_streaming() const { return {}; }
};

}  // namespace strata
