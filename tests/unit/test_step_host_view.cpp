// StepPacker::host_view: the packed step with its arrays in the host staging instead of the
// device copy (what batch-sharded attention plans from on a GPU, runtime/executor.cpp). Two host
// buffers stand in for the staging and the device copy: every array of the view lies in the
// staging at the offset the step's has in the device copy, and holds what pack() wrote.
#include <gtest/gtest.h>

#include <vector>

#include "core/buffer.h"
#include "runtime/step.h"

namespace strata {
namespace {

bool inside(const int32_t* p, const Buffer& b) {
  const auto* lo = static_cast<const int32_t*>(b.data());
  return p >= lo && p < lo + b.bytes() / sizeof(int32_t);
}

TEST(StepHostView, ArraysInTheStagingAtTheDeviceOffsets) {
  StepLimits l;
  l.max_tokens = 16;
  l.max_seqs = 4;
  l.max_logit_rows = 4;
  l.max_blocks_per_seq = 3;
  l.block_size = 4;
  l.max_model_len = 12;
  l.n_blocks = 8;
  l.vocab = 100;
  const size_t bytes = StepPacker::ints_needed(l) * sizeof(int32_t);
  auto host = allocate_host(bytes);
  auto dev = allocate_host(bytes);
  ASSERT_TRUE(host.ok() && dev.ok());
  const Buffer h = *host, d = *dev;
  StepPacker packer(l, *host, *dev);
  // Two sequences: 3 prompt tokens of sequence 1, 1 decode token of sequence 0 at position 5.
  const std::vector<int32_t> tokens{7, 8, 9, 42}, seq{1, 1, 1, 0}, pos{0, 1, 2, 5}, rows{2, 3};
  const std::vector<int32_t> tables{3, 5, -1, 6, -1, -1};
  ForwardBatch b;
  b.tokens = tokens;
  b.token_seq = seq;
  b.token_pos = pos;
  b.block_tables = tables.data();
  b.max_blocks_per_seq = 3;
  b.n_seqs = 2;
  b.logit_rows = rows;
  PackedStep st;
  ASSERT_TRUE(packer.pack(b, st).ok());
  const ops::StepArgs& a = st.args;
  const ops::StepArgs v = packer.host_view(a);
  EXPECT_EQ(v.n_tokens, 4);
  EXPECT_EQ(v.n_seqs, 2);
  EXPECT_EQ(v.max_blocks_per_seq, a.max_blocks_per_seq);
  const auto* h0 = static_cast<const int32_t*>(h.data());
  const auto* d0 = static_cast<const int32_t*>(d.data());
  for (auto [hp, dp] : {std::pair{v.tokens, a.tokens}, std::pair{v.token_seq, a.token_seq},
                        std::pair{v.token_pos, a.token_pos}, std::pair{v.cu_q, a.cu_q},
                        std::pair{v.kv_len, a.kv_len}, std::pair{v.block_tables, a.block_tables}}) {
    EXPECT_TRUE(inside(dp, d));
    EXPECT_TRUE(inside(hp, h));
    EXPECT_EQ(hp - h0, dp - d0);
  }
  // Runs: sequence 1's three tokens, then sequence 0's one.
  EXPECT_EQ(std::vector<int32_t>(v.tokens, v.tokens + 4), tokens);
  EXPECT_EQ(std::vector<int32_t>(v.token_pos, v.token_pos + 4), pos);
  EXPECT_EQ(std::vector<int32_t>(v.token_seq, v.token_seq + 4), (std::vector<int32_t>{0, 0, 0, 1}));
  EXPECT_EQ(std::vector<int32_t>(v.cu_q, v.cu_q + 3), (std::vector<int32_t>{0, 3, 4}));
  EXPECT_EQ(std::vector<int32_t>(v.kv_len, v.kv_len + 2), (std::vector<int32_t>{3, 6}));
  EXPECT_EQ(v.block_tables[0], 6);
  EXPECT_EQ(v.block_tables[3], 3);
  EXPECT_EQ(v.block_tables[4], 5);
  // One buffer (the CPU): the step itself.
  auto one = allocate_host(bytes);
  ASSERT_TRUE(one.ok());
  StepPacker same(l, *one, *one);
  PackedStep st1;
  ASSERT_TRUE(same.pack(b, st1).ok());
  const ops::StepArgs v1 = same.host_view(st1.args);
  EXPECT_EQ(v1.tokens, st1.args.tokens);
  EXPECT_EQ(v1.block_tables, st1.args.block_tables);
}

}  // namespace
}  // namespace strata
