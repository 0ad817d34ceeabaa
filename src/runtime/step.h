// Step packing: a ForwardBatch (host spans from the engines) becomes the ops' view of one forward
// pass (ops::StepArgs) in fixed buffers on the model's device — flashinfer's plan/run split: the
// plan (validation, grouping tokens into runs, padding a decode step to its CUDA-graph bucket) is
// host work; the run reads only device arrays whose addresses never change, so a captured graph
// replays over them.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/buffer.h"
#include "model/model.h"
#include "ops/ops.h"

namespace strata {

struct StepLimits {
  int64_t max_tokens = 0;          // tokens in one forward pass
  int64_t max_seqs = 0;            // runs in one forward pass (decode batch)
  int64_t max_logit_rows = 0;      // logit rows one forward pass returns
  int64_t max_blocks_per_seq = 0;  // block-table width (context length / block size)
  int64_t block_size = 0;
  int64_t max_model_len = 0;
  int64_t n_blocks = 0;      // usable KV blocks; block n_blocks is the scratch block
  int64_t vocab = 0;         // token ids must be in [0, vocab)
  bool cuda_graphs = false;  // pad pure decode steps to graph buckets
};

// The packed step: the ops' arguments plus what the runtime needs to run and read it back.
struct PackedStep {
  ops::StepArgs args;
  HeadArgs head;
  std::vector<std::pair<int64_t, int64_t>> out_runs;  // (first token, count) of logit rows
  int64_t n_real = 0;                                 // tokens before graph padding
  int64_t n_out = 0;                                  // logit rows the caller asked for
  bool graph = false;                                 // a pure decode step padded to a graph bucket
  std::pair<int64_t, int64_t> graph_key{0, 0};        // (batch bucket, KV-length bucket)
};

class StepPacker {
 public:
  // Staging in `host` (pinned for a GPU), the packed arrays in `dev` (the device's copy; the same
  // memory as `host` on the CPU). Both hold ints_needed(limits) int32s.
  static size_t ints_needed(const StepLimits& limits);
  StepPacker(const StepLimits& limits, Buffer host, Buffer dev);

  // Validates `b` and packs it into the host staging; fills `out` (its args point at the device
  // arrays). The caller then uploads staging() to device() (a no-op on the CPU).
  Status pack(const ForwardBatch& b, PackedStep& out);
  // `a` (packed by pack()) with its arrays in the host staging instead of the device copy, for
  // host-side planning (batch-sharded attention); `a` itself on the CPU.
  ops::StepArgs host_view(const ops::StepArgs& a) const;
  void* staging() const { return host_.data(); }
  void* device() const { return dev_.data(); }
  size_t bytes() const { return ints_ * sizeof(int32_t); }

 private:
  StepLimits lim_;
  size_t ints_ = 0;
  Buffer host_, dev_;
};

}  // namespace strata
