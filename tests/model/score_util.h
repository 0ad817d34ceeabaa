// Logits of every position of `ids` through an Executor, `chunk` tokens per forward pass (so
// later passes continue over cached blocks), the sequence's KV blocks released after.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/executor.h"
#include "runtime/sequence.h"

namespace strata::testing {

inline Result<std::vector<float>> score_chunked(Executor& e, const std::vector<int32_t>& ids,
                                                int64_t chunk) {
  const int64_t V = e.config().vocab;
  std::vector<float> logits(ids.size() * static_cast<size_t>(V));
  SequenceKv seq;
  const ForwardFn fn = [&](const ForwardBatch& b, float* out) { return e.forward(b, out); };
  Status s = forward_sequence(fn, 128, V, e.cache(), seq, ids, true, logits.data(), chunk);
  seq.release(e.cache());
  if (!s.ok()) return s;
  return logits;
}

}  // namespace strata::testing
