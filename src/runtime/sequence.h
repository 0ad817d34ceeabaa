// Run tokens of one sequence through a model: the single-request path used by `strata run`,
// `Engine::score` and the tests. Prefill is split into chunks of `chunk` tokens so activation
// scratch stays bounded.
#pragma once

#include <functional>
#include <span>

#include "memory/kv_pool.h"
#include "model/model.h"

namespace strata {

// Append `tokens` to `seq` (growing its block table from `cache`), running `forward` (an
// Executor's) over chunks of at most `chunk` tokens and computing logits for every token
// (all_logits: logits is [n, vocab]) or only for the last one (logits is [vocab]).
using ForwardFn = std::function<Status(const ForwardBatch&, float*)>;
Status forward_sequence(const ForwardFn& forward, int64_t context_length, int64_t vocab,
                        KvPool& cache, SequenceKv& seq, std::span<const int32_t> tokens,
                        bool all_logits, float* logits, int64_t chunk = 512);

}  // namespace strata
