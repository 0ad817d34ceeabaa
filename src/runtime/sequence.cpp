#include "runtime/sequence.h"

#include <algorithm>
#include <vector>

#include "core/status.h"

namespace strata {

Status forward_sequence(const ForwardFn& forward, int64_t context_length, int64_t vocab,
                        KvPool& cache, SequenceKv& seq, std::span<const int32_t> tokens,
                        bool all_logits, float* logits, int64_t chunk) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t ctx = context_length;
  if (seq.length + n > ctx) {
    return errorf(StatusCode::kOutOfRange, "{} tokens exceed the context length {}", seq.length + n,
                  ctx);
  }
  STRATA_RETURN_IF_ERROR(seq.reserve(cache, seq.length + n));
  const int64_t V = vocab;
  std::vector<int32_t> seq_ids, pos, rows;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t end = std::min(n, begin + chunk), m = end - begin;
    seq_ids.assign(static_cast<size_t>(m), 0);
    pos.resize(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) {
      pos[static_cast<size_t>(i)] = static_cast<int32_t>(seq.length + i);
    }
    rows.clear();
    if (all_logits) {
      for (int64_t i = 0; i < m; ++i) rows.push_back(static_cast<int32_t>(i));
    } else if (end == n) {
      rows.push_back(static_cast<int32_t>(m - 1));
    }
    ForwardBatch b;
    b.tokens = tokens.subspan(static_cast<size_t>(begin), static_cast<size_t>(m));
    b.token_seq = seq_ids;
    b.token_pos = pos;
    b.block_tables = seq.block_table.data();
    b.max_blocks_per_seq = static_cast<int64_t>(seq.block_table.size());
    b.logit_rows = rows;
    STRATA_RETURN_IF_ERROR(forward(b, all_logits ? logits + begin * V : logits));
    seq.length += m;
  }
  return ok_status();
}

}  // namespace strata
