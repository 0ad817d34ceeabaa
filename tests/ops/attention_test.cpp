// kv_append + attention over the paged cache against a double reference. Two sequences of
// different lengths share one batch (their tokens interleaved), their blocks are scattered
// through the pool in shuffled order, q/k/v are strided views of one fused qkv buffer, and the
// cases cover MQA/GQA/MHA, head dims 8/12/24/64/80/128, sliding windows, soft-capping, decode steps
// and whole prefills. Unwritten cache slots hold NaN, so reading one shows up as a failure.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>

#include "backends/cpu/cpu_kernels.h"
#include "op_test_util.h"
#include "ops/reference.h"

namespace strata {
namespace {

using testing::kF32Tol;
using testing::random_floats;
using testing::rel_err;

constexpr int64_t kBlockSize = 16;

struct AttnCase {
  int64_t n_heads;
  int64_t n_heads_kv;
  int64_t head_dim;
  int64_t len[2];    // sequence lengths after this step
  int64_t chunk[2];  // tokens of each sequence in this step (the last ones)
  int64_t window = 0;
  float softcap = 0.0f;
  float scale_mul = 1.0f;  // scale = scale_mul / sqrt(head_dim)
  // Each sequence's blocks one after another in the pool (as a fresh cache hands them out), so
  // a work item's runs of keys continue across blocks; else shuffled, with unused blocks between.
  bool contiguous = false;
};

std::string case_name(const AttnCase& c) {
  return "h" + std::to_string(c.n_heads) + "kv" + std::to_string(c.n_heads_kv) + "_d" +
         std::to_string(c.head_dim) + "_len" + std::to_string(c.len[0]) + "_" +
         std::to_string(c.len[1]) + "_chunk" + std::to_string(c.chunk[0]) + "_" +
         std::to_string(c.chunk[1]) + (c.window ? "_win" + std::to_string(c.window) : "") +
         (c.softcap > 0 ? "_softcap" : "") + (c.contiguous ? "_contiguous" : "");
}

const AttnCase kCases[] = {
    {3, 1, 12, {37, 70}, {7, 13}},
    {4, 2, 24, {37, 70}, {1, 1}, 5},
    {2, 2, 80, {16, 33}, {16, 33}, 20, 2.0f, 4.0f},
    {3, 1, 80, {70, 37}, {13, 7}, 0, 30.0f},
    {6, 3, 24, {150, 5}, {1, 5}, 0, 0.0f, 2.0f},
    {3, 1, 24, {150, 41}, {9, 1}, 33, 5.0f, 3.0f},
    {17, 1, 12, {40, 3}, {1, 1}},  // a query group larger than one work item holds
    // head_dim a multiple of 8: the AVX2 work item (up to four heads and 8 keys per scoring
    // pass, accumulators in registers, several vectors at a time then one at a time).
    {9, 3, 64, {150, 70}, {1, 1}},           // SmolLM2-135M's heads, a decode step
    {4, 2, 128, {70, 37}, {13, 7}, 20},      // 16 vectors, sliding window
    {8, 1, 64, {33, 3}, {33, 3}, 0, 30.0f},  // whole prefills, soft-capping, runs not of 4 keys
    {2, 1, 8, {21, 66}, {2, 66}},            // one vector
    // Runs across blocks: up to 64 keys (4 blocks) a run, then the next run; a window that
    // starts inside a block.
    {9, 3, 64, {150, 70}, {150, 70}, 0, 0.0f, 1.0f, true},
    {4, 2, 24, {100, 37}, {9, 5}, 40, 0.0f, 1.0f, true},
    {3, 1, 8, {70, 3}, {1, 3}, 0, 30.0f, 1.0f, true},
};

// One token of the batch.
struct Tok {
  int32_t seq;
  int32_t pos;
};

class AttentionTest : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionTest, MatchesDoubleReference) {
  const AttnCase& c = GetParam();
  const int64_t H = c.n_heads, Hkv = c.n_heads_kv, D = c.head_dim;
  const uint32_t seed = static_cast<uint32_t>(H * 1000 + D * 10 + c.len[0] + c.len[1]);
  std::mt19937 gen(seed);

  // Block tables: blocks of the pool assigned in shuffled order, with unused blocks between.
  const int64_t max_blocks = (std::max(c.len[0], c.len[1]) + kBlockSize - 1) / kBlockSize;
  const int64_t n_blocks = 2 * max_blocks + 3;
  std::vector<int32_t> ids(static_cast<size_t>(n_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  if (!c.contiguous) std::shuffle(ids.begin(), ids.end(), gen);
  std::vector<int32_t> tables(static_cast<size_t>(2 * max_blocks), -1);
  for (int64_t i = 0; i < 2 * max_blocks; ++i) tables[i] = ids[i];

  // The K, V and Q every (sequence, position) will have.
  const int64_t qkv_row = (H + 2 * Hkv) * D;  // fused projection output row
  std::vector<std::vector<float>> rows[2];
  for (int s = 0; s < 2; ++s) {
    for (int64_t p = 0; p < c.len[s]; ++p) {
      rows[s].push_back(random_floats(static_cast<size_t>(qkv_row), seed + 97 * s + 7 * p + 1));
    }
  }

  std::vector<float> k_cache(static_cast<size_t>(n_blocks * kBlockSize * Hkv * D),
                             std::numeric_limits<float>::quiet_NaN());
  std::vector<float> v_cache = k_cache;
  ops::ref::PagedKv cache{
      .k = Tensor::make(k_cache.data(), DType::kF32, {n_blocks, kBlockSize, Hkv, D}),
      .v = Tensor::make(v_cache.data(), DType::kF32, {n_blocks, kBlockSize, Hkv, D}),
      .block_tables = tables.data(),
      .max_blocks_per_seq = max_blocks,
      .n_seqs = 2,
  };

  // Appends the given tokens' k/v (strided views of their qkv rows) to the cache; returns the
  // packed qkv buffer so attention can view q in it.
  const auto append = [&](const std::vector<Tok>& toks) {
    std::vector<float> qkv;
    std::vector<int32_t> seq, pos;
    for (const Tok& t : toks) {
      const auto& r = rows[t.seq][static_cast<size_t>(t.pos)];
      qkv.insert(qkv.end(), r.begin(), r.end());
      seq.push_back(t.seq);
      pos.push_back(t.pos);
    }
    const int64_t n = static_cast<int64_t>(toks.size());
    Tensor k, v;
    k.data = qkv.data() + H * D;
    v.data = qkv.data() + (H + Hkv) * D;
    k.dtype = v.dtype = DType::kF32;
    k.ndim = v.ndim = 3;
    k.shape = v.shape = {n, Hkv, D, 0};
    k.stride = v.stride = {qkv_row, D, 1, 0};
    EXPECT_TRUE(ops::ref::kv_append(k, v, seq.data(), pos.data(), cache).ok());
    return qkv;
  };

  // Earlier context: everything before this step's chunk, both sequences in one call.
  std::vector<Tok> context;
  for (int s = 0; s < 2; ++s) {
    for (int64_t p = 0; p < c.len[s] - c.chunk[s]; ++p) {
      context.push_back({s, static_cast<int32_t>(p)});
    }
  }
  if (!context.empty()) append(context);

  // This step: the two chunks interleaved.
  std::vector<Tok> batch;
  for (int64_t i = 0; i < std::max(c.chunk[0], c.chunk[1]); ++i) {
    for (int s = 0; s < 2; ++s) {
      if (i < c.chunk[s]) batch.push_back({s, static_cast<int32_t>(c.len[s] - c.chunk[s] + i)});
    }
  }
  std::vector<float> qkv = append(batch);
  const int64_t n = static_cast<int64_t>(batch.size());
  std::vector<int32_t> seq, pos;
  for (const Tok& t : batch) {
    seq.push_back(t.seq);
    pos.push_back(t.pos);
  }

  // kv_append wrote every slot of both sequences and nothing else.
  for (int s = 0; s < 2; ++s) {
    for (int64_t p = 0; p < c.len[s]; ++p) {
      const int64_t slot = tables[s * max_blocks + p / kBlockSize] * kBlockSize + p % kBlockSize;
      for (int64_t i = 0; i < Hkv * D; ++i) {
        ASSERT_EQ(k_cache[slot * Hkv * D + i], rows[s][p][H * D + i]) << "k s" << s << " p" << p;
        ASSERT_EQ(v_cache[slot * Hkv * D + i], rows[s][p][(H + Hkv) * D + i]);
      }
    }
  }
  int64_t written = 0;
  for (float f : k_cache) written += !std::isnan(f);
  EXPECT_EQ(written, (c.len[0] + c.len[1]) * Hkv * D);

  const float scale = c.scale_mul / std::sqrt(static_cast<float>(D));
  std::vector<double> want(static_cast<size_t>(n * H * D));
  for (int64_t t = 0; t < n; ++t) {
    const int s = batch[t].seq;
    const int64_t p = batch[t].pos;
    const int64_t lo = c.window > 0 ? std::max<int64_t>(0, p - c.window + 1) : 0;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / Hkv);
      const float* q = &rows[s][p][h * D];
      std::vector<double> sc;
      for (int64_t j = lo; j <= p; ++j) {
        const float* kj = &rows[s][j][H * D + g * D];
        double d = 0.0;
        for (int64_t i = 0; i < D; ++i) d += double(q[i]) * kj[i];
        d *= scale;
        if (c.softcap > 0) d = c.softcap * std::tanh(d / c.softcap);
        sc.push_back(d);
      }
      const double mx = *std::max_element(sc.begin(), sc.end());
      double sum = 0.0;
      for (double& v : sc) sum += (v = std::exp(v - mx));
      for (int64_t i = 0; i < D; ++i) {
        double o = 0.0;
        for (int64_t j = lo; j <= p; ++j) o += sc[j - lo] * rows[s][j][(H + Hkv) * D + g * D + i];
        want[(t * H + h) * D + i] = o / sum;
      }
    }
  }

  Tensor q;
  q.data = qkv.data();
  q.dtype = DType::kF32;
  q.ndim = 3;
  q.shape = {n, H, D, 0};
  q.stride = {qkv_row, D, 1, 0};
  std::vector<float> out(static_cast<size_t>(n * H * D), -1.0f);
  Tensor ot = Tensor::make(out.data(), DType::kF32, {n, H, D});
  const ops::ref::AttentionParams params{.token_seq = seq.data(),
                                         .token_pos = pos.data(),
                                         .scale = scale,
                                         .sliding_window = c.window,
                                         .logit_softcap = c.softcap};
  ASSERT_TRUE(ops::ref::attention(q, cache, params, ot).ok());
  EXPECT_LE(rel_err(out, want), kF32Tol);

  // The same bits for any thread count: attention_items sizes the items' head groups for the
  // threads, and in-process pipeline stages (and the fused decode block) rely on the bits not
  // following them. Each sizing's items run here one after another.
  const AttentionKernelParams kp{.q = qkv.data(),
                                 .q_stride = qkv_row,
                                 .out = nullptr,
                                 .out_stride = H * D,
                                 .token_seq = seq.data(),
                                 .token_pos = pos.data(),
                                 .n_tokens = n,
                                 .n_heads = H,
                                 .cache = {.k_cache = k_cache.data(),
                                           .v_cache = v_cache.data(),
                                           .block_tables = tables.data(),
                                           .max_blocks_per_seq = max_blocks,
                                           .n_seqs = 2,
                                           .n_blocks = n_blocks,
                                           .block_size = kBlockSize,
                                           .n_heads_kv = Hkv,
                                           .head_dim = D},
                                 .scale = scale,
                                 .sliding_window = c.window,
                                 .logit_softcap = c.softcap};
  for (const int nt : {1, 2, 3, 5, 8, 64}) {
    std::vector<float> again(out.size(), -1.0f);
    AttentionKernelParams p = kp;
    p.out = again.data();
    cpu::AttentionItems items;
    ASSERT_TRUE(cpu::attention_items(p, nt, &items).ok());
    for (int64_t i = 0; i < items.count; ++i) cpu::run_attention_item(items, i);
    EXPECT_EQ(std::memcmp(again.data(), out.data(), out.size() * sizeof(float)), 0)
        << "items sized for " << nt << " threads";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return case_name(info.param); });

class AttentionErrors : public ::testing::Test {
 protected:
  static constexpr int64_t kBlocks = 4;
  std::vector<float> kc_ = std::vector<float>(kBlocks * kBlockSize * 2 * 8, 0.0f);
  std::vector<float> vc_ = kc_;
  std::vector<int32_t> tables_ = {2, 0, 1, 3};  // 2 sequences x 2 blocks
  ops::ref::PagedKv cache_{
      .k = Tensor::make(kc_.data(), DType::kF32, {kBlocks, kBlockSize, 2, 8}),
      .v = Tensor::make(vc_.data(), DType::kF32, {kBlocks, kBlockSize, 2, 8}),
      .block_tables = tables_.data(),
      .max_blocks_per_seq = 2,
      .n_seqs = 2,
  };
  std::vector<float> q_ = random_floats(1 * 4 * 8, 3);
  std::vector<float> out_ = std::vector<float>(1 * 4 * 8);
  Tensor q() { return Tensor::make(q_.data(), DType::kF32, {1, 4, 8}); }
  Tensor out() { return Tensor::make(out_.data(), DType::kF32, {1, 4, 8}); }
  Tensor kv() { return Tensor::make(q_.data(), DType::kF32, {1, 2, 8}); }
};

TEST_F(AttentionErrors, BadSlotsAreOutOfRange) {
  int32_t seq = 0, pos = 32;  // past the 2 blocks of 16 in the table
  Status s = ops::ref::kv_append(kv(), kv(), &seq, &pos, cache_);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("kv_append: token 0 position 32 needs block 2"), std::string::npos)
      << s.message();
  seq = 2;
  pos = 0;
  EXPECT_EQ(ops::ref::kv_append(kv(), kv(), &seq, &pos, cache_).code(), StatusCode::kOutOfRange);
  seq = -1;
  EXPECT_EQ(ops::ref::kv_append(kv(), kv(), &seq, &pos, cache_).code(), StatusCode::kOutOfRange);
  seq = 0;
  pos = -3;
  EXPECT_EQ(ops::ref::kv_append(kv(), kv(), &seq, &pos, cache_).code(), StatusCode::kOutOfRange);
  tables_[1] = 9;  // block id outside the pool of 4
  seq = 0;
  pos = 20;
  EXPECT_EQ(ops::ref::kv_append(kv(), kv(), &seq, &pos, cache_).code(), StatusCode::kOutOfRange);
  const ops::ref::AttentionParams params{.token_seq = &seq, .token_pos = &pos};
  Tensor o = out();
  EXPECT_EQ(ops::ref::attention(q(), cache_, params, o).code(), StatusCode::kOutOfRange);
  // Position 15 reads only sequence 0's first block, which is fine; so is sequence 1.
  pos = 15;
  EXPECT_TRUE(ops::ref::attention(q(), cache_, params, o).ok());
  seq = 1;
  pos = 20;
  EXPECT_TRUE(ops::ref::attention(q(), cache_, params, o).ok());
}

TEST_F(AttentionErrors, ShapeMismatchesAreErrors) {
  int32_t seq = 0, pos = 0;
  const ops::ref::AttentionParams params{.token_seq = &seq, .token_pos = &pos};
  Tensor o = out();
  // 3 query heads do not share 2 KV heads evenly.
  Tensor q3 = Tensor::make(q_.data(), DType::kF32, {1, 3, 8});
  Tensor o3 = Tensor::make(out_.data(), DType::kF32, {1, 3, 8});
  Status s = ops::ref::attention(q3, cache_, params, o3);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("attention: q is [1, 3, 8] but cache.k is [4, 16, 2, 8]"),
            std::string::npos)
      << s.message();
  Tensor q_d4 = Tensor::make(q_.data(), DType::kF32, {1, 8, 4});
  Tensor o_d4 = Tensor::make(out_.data(), DType::kF32, {1, 8, 4});
  EXPECT_FALSE(ops::ref::attention(q_d4, cache_, params, o_d4).ok());
  Tensor o_bad = Tensor::make(out_.data(), DType::kF32, {1, 2, 16});
  EXPECT_FALSE(ops::ref::attention(q(), cache_, params, o_bad).ok());
  ops::ref::AttentionParams no_pos{.token_seq = &seq};
  EXPECT_FALSE(ops::ref::attention(q(), cache_, no_pos, o).ok());
  ops::ref::AttentionParams neg_window{.token_seq = &seq, .token_pos = &pos, .sliding_window = -1};
  EXPECT_FALSE(ops::ref::attention(q(), cache_, neg_window, o).ok());
  ops::ref::PagedKv no_seqs = cache_;
  no_seqs.n_seqs = 0;
  EXPECT_FALSE(ops::ref::attention(q(), no_seqs, params, o).ok());
  ops::ref::PagedKv mismatched = cache_;
  mismatched.v = Tensor::make(vc_.data(), DType::kF32, {kBlocks, kBlockSize, 1, 16});
  EXPECT_FALSE(ops::ref::attention(q(), mismatched, params, o).ok());
  // kv_append: k with the wrong head count, k and v disagreeing.
  Tensor k1 = Tensor::make(q_.data(), DType::kF32, {1, 1, 16});
  EXPECT_FALSE(ops::ref::kv_append(k1, k1, &seq, &pos, cache_).ok());
  Tensor v2 = Tensor::make(q_.data(), DType::kF32, {2, 2, 8});
  EXPECT_FALSE(ops::ref::kv_append(kv(), v2, &seq, &pos, cache_).ok());
  Tensor kc = kv();
  kc.device = Device::cuda(0);
  EXPECT_FALSE(ops::ref::kv_append(kc, kc, &seq, &pos, cache_).ok());
}

}  // namespace
}  // namespace strata
