// cpu::varlen_attention (bf16 paged cache, variable-length batch layout) against the f32
// reference cpu::attention run on f32 copies of the same bf16 values, with token_seq/token_pos
// built from cu_q and kv_len. Batches mix a whole prefill (37 tokens), a chunk of 5 queries at
// positions 20..24 of a 25-long sequence, decodes of one token (kv_len 1, 17, 50) and a sequence
// with no query this step; GQA, MQA and MHA; head dims 12..64; block sizes 4, 8, 16 with the
// pool's blocks in shuffled order; sliding windows (blocks wholly before the window are -1 in
// the table, as if freed) and soft-capping. Cache slots no query may read hold NaN.
//
// Tolerance: the twin computes in f32 like the reference (other summation order: ~1e-6 of the
// output scale) and rounds its output to bf16 once (at most 2^-9 relative), so every element
// must be within 2^-8 |ref| + 1e-5 max|ref|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "core/half.h"

namespace strata {
namespace {

constexpr uint16_t kBf16NaN = 0x7fc0;

struct Seq {
  int64_t n_q;
  int64_t kv_len;
};

struct TwinCase {
  std::string name;
  std::vector<Seq> seqs;
  int64_t n_heads;
  int64_t n_heads_kv;
  int64_t head_dim;
  int64_t block_size;
  int64_t window = 0;
  float softcap = 0.0f;
};

// A batch in host memory: the bf16 inputs of varlen_attention.
struct Batch {
  std::vector<uint16_t> q, k, v;
  std::vector<int32_t> cu_q, kv_len, tables;
  int64_t n_tokens = 0, max_blocks = 0, n_blocks = 0, max_q = 0, max_kv = 0;
};

int64_t window_start(int64_t pos, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
}

Batch make_batch(const TwinCase& c, std::mt19937& rng) {
  Batch b;
  const int64_t n_seqs = static_cast<int64_t>(c.seqs.size());
  b.cu_q.push_back(0);
  for (const Seq& s : c.seqs) {
    b.cu_q.push_back(static_cast<int32_t>(b.cu_q.back() + s.n_q));
    b.kv_len.push_back(static_cast<int32_t>(s.kv_len));
    b.max_q = std::max(b.max_q, s.n_q);
    b.max_kv = std::max(b.max_kv, s.kv_len);
    b.max_blocks = std::max(b.max_blocks, (s.kv_len + c.block_size - 1) / c.block_size);
  }
  b.n_tokens = b.cu_q.back();
  b.max_blocks += 1;  // one spare entry per table (-1)
  b.n_blocks = n_seqs * b.max_blocks + 3;
  std::vector<int32_t> ids(static_cast<size_t>(b.n_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  b.tables.assign(static_cast<size_t>(n_seqs * b.max_blocks), -1);

  const int64_t slot = c.n_heads_kv * c.head_dim;
  const size_t cache_n = static_cast<size_t>(b.n_blocks * c.block_size * slot);
  b.k.assign(cache_n, kBf16NaN);
  b.v.assign(cache_n, kBf16NaN);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  size_t next_id = 0;
  for (int64_t s = 0; s < n_seqs; ++s) {
    const int64_t kv = c.seqs[s].kv_len;
    // Positions before the first query's window are never read: their blocks are "freed".
    const int64_t lo = c.seqs[s].n_q > 0 ? window_start(kv - c.seqs[s].n_q, c.window) : 0;
    for (int64_t blk = 0; blk * c.block_size < kv; ++blk) {
      const int32_t id = ids[next_id++];
      if ((blk + 1) * c.block_size > lo) b.tables[s * b.max_blocks + blk] = id;
      for (int64_t i = 0; i < c.block_size; ++i) {
        const int64_t pos = blk * c.block_size + i;
        if (pos < lo || pos >= kv) continue;
        const size_t at = static_cast<size_t>((id * c.block_size + i) * slot);
        for (int64_t e = 0; e < slot; ++e) {
          b.k[at + e] = f32_to_bf16(dist(rng));
          b.v[at + e] = f32_to_bf16(dist(rng));
        }
      }
    }
  }
  b.q.resize(static_cast<size_t>(b.n_tokens * c.n_heads * c.head_dim));
  for (uint16_t& x : b.q) x = f32_to_bf16(2.0f * dist(rng));
  return b;
}

VarlenAttentionParams make_params(const TwinCase& c, Batch& b, uint16_t* out) {
  const int64_t row = c.n_heads * c.head_dim;
  return VarlenAttentionParams{.q = b.q.data(),
                               .q_stride = row,
                               .out = out,
                               .out_stride = row,
                               .cu_q = b.cu_q.data(),
                               .kv_len = b.kv_len.data(),
                               .n_seqs = static_cast<int64_t>(c.seqs.size()),
                               .n_heads = c.n_heads,
                               .max_q_len = b.max_q,
                               .max_kv_len = b.max_kv,
                               .cache = {.k_cache = b.k.data(),
                                         .v_cache = b.v.data(),
                                         .block_tables = b.tables.data(),
                                         .max_blocks_per_seq = b.max_blocks,
                                         .n_seqs = static_cast<int64_t>(c.seqs.size()),
                                         .n_blocks = b.n_blocks,
                                         .block_size = c.block_size,
                                         .n_heads_kv = c.n_heads_kv,
                                         .head_dim = c.head_dim},
                               .scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
                               .sliding_window = c.window,
                               .logit_softcap = c.softcap};
}

const TwinCase kCases[] = {
    {"mixed_gqa", {{37, 37}, {5, 25}, {1, 50}, {1, 1}, {0, 10}, {1, 17}}, 8, 2, 16, 16},
    {"mixed_mqa_window", {{37, 37}, {5, 25}, {1, 50}, {1, 1}}, 4, 1, 24, 8, 7},
    {"mixed_mha_softcap", {{1, 50}, {37, 37}, {5, 25}}, 3, 3, 64, 16, 0, 5.0f},
    {"gqa_window_softcap", {{5, 25}, {1, 1}, {37, 37}, {1, 33}}, 6, 2, 12, 4, 10, 2.0f},
    {"decodes", {{1, 1}, {1, 2}, {1, 63}, {1, 64}, {1, 65}}, 4, 2, 16, 16, 0, 0.0f},
};

void PrintTo(const TwinCase& c, std::ostream* os) {
  *os << c.name;
}

class VarlenTwinTest : public ::testing::TestWithParam<TwinCase> {};

TEST_P(VarlenTwinTest, MatchesF32Attention) {
  const TwinCase& c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.head_dim * 131 + c.n_heads * 7 + c.block_size));
  Batch b = make_batch(c, rng);
  const int64_t row = c.n_heads * c.head_dim;
  std::vector<uint16_t> out(static_cast<size_t>(b.n_tokens * row), kBf16NaN);
  const VarlenAttentionParams p = make_params(c, b, out.data());
  const Status st = cpu::varlen_attention(p);
  ASSERT_TRUE(st.ok()) << st.to_string();

  // The reference: f32 copies of the same values, one (sequence, position) per token.
  std::vector<float> qf(b.q.size()), kf(b.k.size()), vf(b.v.size());
  for (size_t i = 0; i < b.q.size(); ++i) qf[i] = bf16_to_f32(b.q[i]);
  for (size_t i = 0; i < b.k.size(); ++i) kf[i] = bf16_to_f32(b.k[i]);
  for (size_t i = 0; i < b.v.size(); ++i) vf[i] = bf16_to_f32(b.v[i]);
  std::vector<int32_t> token_seq, token_pos;
  for (size_t s = 0; s < c.seqs.size(); ++s) {
    for (int64_t j = 0; j < c.seqs[s].n_q; ++j) {
      token_seq.push_back(static_cast<int32_t>(s));
      token_pos.push_back(static_cast<int32_t>(c.seqs[s].kv_len - c.seqs[s].n_q + j));
    }
  }
  std::vector<float> ref(out.size());
  const AttentionKernelParams rp{.q = qf.data(),
                                 .q_stride = row,
                                 .out = ref.data(),
                                 .out_stride = row,
                                 .token_seq = token_seq.data(),
                                 .token_pos = token_pos.data(),
                                 .n_tokens = b.n_tokens,
                                 .n_heads = c.n_heads,
                                 .cache = {.k_cache = kf.data(),
                                           .v_cache = vf.data(),
                                           .block_tables = b.tables.data(),
                                           .max_blocks_per_seq = b.max_blocks,
                                           .n_seqs = p.n_seqs,
                                           .n_blocks = b.n_blocks,
                                           .block_size = c.block_size,
                                           .n_heads_kv = c.n_heads_kv,
                                           .head_dim = c.head_dim},
                                 .scale = p.scale,
                                 .sliding_window = c.window,
                                 .logit_softcap = c.softcap};
  const Status rst = cpu::attention(rp);
  ASSERT_TRUE(rst.ok()) << rst.to_string();

  double max_ref = 0.0;
  for (float x : ref) max_ref = std::max(max_ref, std::fabs(static_cast<double>(x)));
  ASSERT_GT(max_ref, 0.0);
  size_t bad = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double got = bf16_to_f32(out[i]);
    const double err = std::fabs(got - ref[i]);
    if (!(err <= std::ldexp(std::fabs(ref[i]), -8) + 1e-5 * max_ref) && bad++ < 5) {
      ADD_FAILURE() << "element " << i << " (token " << i / row << ", head "
                    << (i % row) / c.head_dim << "): twin " << got << " reference " << ref[i];
    }
  }
  EXPECT_EQ(bad, 0u);
}

INSTANTIATE_TEST_SUITE_P(Batches, VarlenTwinTest, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return info.param.name; });

TEST(VarlenTwinArgs, RejectsBadArguments) {
  const TwinCase c{"args", {{5, 25}, {1, 9}}, 4, 2, 8, 16};
  std::mt19937 rng(3);
  Batch b = make_batch(c, rng);
  std::vector<uint16_t> out(static_cast<size_t>(b.n_tokens * c.n_heads * c.head_dim));
  const VarlenAttentionParams good = make_params(c, b, out.data());
  ASSERT_TRUE(cpu::varlen_attention(good).ok());

  auto code = [&](auto&& edit) {
    Batch copy = b;
    VarlenAttentionParams p = make_params(c, copy, out.data());
    edit(p, copy);
    return cpu::varlen_attention(p).code();
  };
  constexpr StatusCode kBad = StatusCode::kInvalidArgument;
  EXPECT_EQ(code([](auto& p, auto&) { p.n_heads = 3; }), kBad);  // 3 heads on 2 KV heads
  EXPECT_EQ(code([](auto& p, auto&) { p.cache.n_heads_kv = 0; }), kBad);
  EXPECT_EQ(code([](auto& p, auto&) { p.n_seqs = 1; }), kBad);  // != cache.n_seqs
  EXPECT_EQ(code([](auto& p, auto&) { p.q_stride = 8; }), kBad);
  EXPECT_EQ(code([](auto& p, auto&) { p.scale = 0.0f; }), kBad);
  EXPECT_EQ(code([](auto& p, auto&) { p.sliding_window = -1; }), kBad);
  EXPECT_EQ(code([](auto& p, auto&) { p.logit_softcap = -1.0f; }), kBad);
  EXPECT_EQ(code([](auto& p, auto& bb) { bb.cu_q[0] = 1; }), kBad);
  EXPECT_EQ(code([](auto& p, auto& bb) { bb.cu_q[2] = 4; }), kBad);    // decreasing
  EXPECT_EQ(code([](auto& p, auto& bb) { bb.kv_len[1] = 0; }), kBad);  // 1 query, 0 positions
  EXPECT_EQ(code([](auto& p, auto&) { p.max_q_len = 4; }), kBad);      // sequence 0 has 5
  EXPECT_EQ(code([](auto& p, auto&) { p.max_kv_len = 24; }), kBad);    // sequence 0 has 25
  // A block the queries read is -1 or past the pool: kOutOfRange.
  EXPECT_EQ(code([](auto& p, auto& bb) { bb.tables[1] = -1; }), StatusCode::kOutOfRange);
  EXPECT_EQ(code([&](auto& p, auto& bb) { bb.tables[0] = static_cast<int32_t>(b.n_blocks); }),
            StatusCode::kOutOfRange);
  // The block table is too short for kv_len 25 at block size 16.
  EXPECT_EQ(code([](auto& p, auto&) { p.cache.max_blocks_per_seq = 1; }), StatusCode::kOutOfRange);
  // No sequences: nothing to do.
  EXPECT_TRUE(code([](auto& p, auto&) { p.n_seqs = p.cache.n_seqs = 0; }) == StatusCode::kOk);
}

}  // namespace
}  // namespace strata
