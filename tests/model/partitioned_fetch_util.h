// Helpers shared by the partitioned-fetch tests on the CPU (tests/model/test_partitioned_fetch.cpp)
// and on CUDA (tests/cuda/test_partitioned_fetch_cuda.cpp): a prefill plus decode steps through an
// executor with fixed block tables, bitwise comparison, prompts from a fixture's reference, and
// the check that every replica copied its part of every layer and only that.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "fixture_util.h"
#include "runtime/executor.h"
#include "runtime/weight_streamer.h"

namespace strata::testing::pfetch {

// Every sequence's context and the KV block size the runs use (sequence k owns blocks
// [k * per, (k + 1) * per), per = kMaxLen / kBlock).
constexpr int64_t kMaxLen = 128, kBlock = 16;

struct Outputs {
  std::vector<float> logits;  // the prefill's every position, then each logits step's rows
  std::vector<int32_t> ids;   // each argmax step's ids
};

// `prompts` prefilled together in one pass (logits of every position), then decode steps of all
// of them on fixed tokens, alternately logits and greedy ids (device argmax). Sequence k owns
// blocks [k * per, (k + 1) * per).
// `after_prefill` (optional) may move sequences' blocks (swaps) and edit their tables.
inline Result<Outputs> run(
    Executor& e, const std::vector<std::vector<int32_t>>& prompts, int steps,
    const std::function<Status(std::vector<int32_t>&)>& after_prefill = nullptr) {
  const int64_t V = e.config().vocab;
  const int64_t per = kMaxLen / kBlock, n = static_cast<int64_t>(prompts.size());
  std::vector<int32_t> tables;
  for (int64_t k = 0; k < n; ++k) {
    for (int64_t j = 0; j < per; ++j) tables.push_back(static_cast<int32_t>(k * per + j));
  }
  Outputs out;
  std::vector<int32_t> tokens, seq, pos, rows;
  std::vector<int64_t> len(static_cast<size_t>(n), 0);
  for (int64_t k = 0; k < n; ++k) {
    for (int32_t t : prompts[static_cast<size_t>(k)]) {
      rows.push_back(static_cast<int32_t>(tokens.size()));
      tokens.push_back(t);
      seq.push_back(static_cast<int32_t>(k));
      pos.push_back(static_cast<int32_t>(len[static_cast<size_t>(k)]++));
    }
  }
  auto batch = [&] {
    ForwardBatch b;
    b.tokens = tokens;
    b.token_seq = seq;
    b.token_pos = pos;
    b.block_tables = tables.data();
    b.max_blocks_per_seq = per;
    b.n_seqs = n;
    b.logit_rows = rows;
    return b;
  };
  std::vector<float> l(rows.size() * static_cast<size_t>(V));
  STRATA_RETURN_IF_ERROR(e.forward(batch(), l.data()));
  out.logits = l;
  if (after_prefill) STRATA_RETURN_IF_ERROR(after_prefill(tables));
  for (int s = 0; s < steps; ++s) {
    tokens.clear();
    seq.clear();
    pos.clear();
    rows.clear();
    for (int64_t k = 0; k < n; ++k) {
      rows.push_back(static_cast<int32_t>(tokens.size()));
      tokens.push_back(static_cast<int32_t>((7 * s + 3 * k + 1) % V));
      seq.push_back(static_cast<int32_t>(k));
      pos.push_back(static_cast<int32_t>(len[static_cast<size_t>(k)]++));
    }
    if (s % 2 == 0) {
      l.assign(static_cast<size_t>(n * V), 0.0f);
      STRATA_RETURN_IF_ERROR(e.forward(batch(), l.data()));
      out.logits.insert(out.logits.end(), l.begin(), l.end());
    } else {
      std::vector<int32_t> ids(static_cast<size_t>(n), -1);
      STRATA_RETURN_IF_ERROR(e.forward_argmax(batch(), ids.data()));
      out.ids.insert(out.ids.end(), ids.begin(), ids.end());
    }
  }
  return out;
}

inline bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline std::vector<std::vector<int32_t>> prompts_of(const Reference& ref, int n) {
  std::vector<std::vector<int32_t>> p;
  for (int k = 0; k < n; ++k) {
    std::vector<int32_t> ids = ref.inputs[static_cast<size_t>(k) % ref.inputs.size()];
    if (k >= static_cast<int>(ref.inputs.size())) ids.resize(std::max<size_t>(1, ids.size() - 2));
    p.push_back(ids);
  }
  return p;
}

// Every replica saw the same layer items; each byte of each item was copied from host memory by
// exactly one replica (its part; the rest came with the all-gather). `pieces` > 0: every replica
// fetched each layer in at most that many pieces, more than one all-gather per layer when
// pieces > 1 (the fixtures' layers are large enough for several).
inline void expect_partitioned(const std::vector<StreamStats>& st, int dp, const std::string& what,
                               int pieces = 0) {
  ASSERT_EQ(st.size(), static_cast<size_t>(dp)) << what;
  int64_t copied = 0;
  const int64_t whole = st[0].bytes + st[0].gathered_bytes;
  for (const StreamStats& s : st) {
    EXPECT_EQ(s.fetch_parts, dp) << what;
    EXPECT_EQ(s.layers, st[0].layers) << what << ": replicas streamed different layer sequences";
    EXPECT_EQ(s.bytes + s.gathered_bytes, whole) << what;
    // About 1/dp of every layer (parts are rounded up to 256 bytes).
    EXPECT_LE(s.bytes, whole / dp + s.layers * 256) << what;
    EXPECT_GT(s.bytes, 0) << what;
    EXPECT_EQ(s.gathers, st[0].gathers) << what << ": replicas issued different all-gathers";
    EXPECT_GE(s.gathers, s.layers) << what;
    if (pieces > 0) {
      EXPECT_EQ(s.fetch_pieces, pieces) << what;
      EXPECT_LE(s.gathers, s.layers * pieces) << what;
      if (pieces > 1) EXPECT_GT(s.gathers, s.layers) << what << ": no layer came in pieces";
    }
    copied += s.bytes;
  }
  EXPECT_EQ(copied, whole) << what << ": the replicas' parts do not add up to the layers";
  EXPECT_GT(st[0].layers, 0) << what;
}

}  // namespace strata::testing::pfetch
