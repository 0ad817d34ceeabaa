// strata::cuda::attention against its CPU twin on one mixed batch: sequence 0 prefilling
// positions 0..6, sequence 1 decoding at position 77, sequence 2 a prefill chunk at 30..54 (33
// tokens), plus decode-only (1 token) and prefill-only (7 tokens) subsets; 16-slot blocks with a
// shuffled block table; GQA/MQA (3 heads on 1 KV head, 8 on 2), MHA; head_dim 12, 64, 66, 80,
// 128, 256; no window and a sliding window of 5; no softcap and softcap 2; a padded q stride.
// Tolerance: 1e-4 relative + 1e-5 absolute: the GPU sums the softmax in f32 in another order (the
// CPU keeps l in double) and expf/tanhf are within 2 ulp of the host's; outputs are averages of
// values in [-1, 1] that can cancel, so near-zero outputs get the absolute term.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cuda/cuda_kernels.h"
#include "cuda_test_util.h"
#include "kernel_test_util.h"

namespace strata::cuda {
namespace {

using testutil::all_close;
using testutil::DeviceArray;
using testutil::random_floats;

constexpr int64_t kBlockSize = 16;
constexpr int64_t kSeqs = 3;
constexpr int64_t kMaxBlocks = 6;
constexpr int64_t kBlocks = kSeqs * kMaxBlocks;

struct Case {
  int64_t n_heads;
  int64_t n_heads_kv;
  int64_t head_dim;
  int64_t window;
  float softcap;
  int64_t q_pad = 0;
};

// which: 0 = the whole mixed batch, 1 = the decode token only, 2 = sequence 0's prefill only.
void make_tokens(int which, std::vector<int32_t>& seq, std::vector<int32_t>& pos) {
  if (which != 1) {
    for (int32_t p = 0; p < 7; ++p) seq.push_back(0), pos.push_back(p);
  }
  if (which != 2) seq.push_back(1), pos.push_back(77);
  if (which == 0) {
    for (int32_t p = 30; p < 55; ++p) seq.push_back(2), pos.push_back(p);
  }
}

class AttentionCudaTest : public testutil::CudaTest {};

TEST_F(AttentionCudaTest, MatchesCpuTwin) {
  std::vector<Case> cases;
  for (int64_t hd : {12, 64, 80, 128}) {
    for (int64_t window : {0, 5}) {
      for (float cap : {0.0f, 2.0f}) cases.push_back({3, 1, hd, window, cap});
    }
  }
  cases.push_back({8, 2, 256, 0, 0.0f});
  cases.push_back({8, 2, 256, 20, 2.0f});
  cases.push_back({2, 2, 128, 0, 0.0f});
  cases.push_back({4, 2, 66, 0, 0.0f});  // head_dim not a multiple of 4: scalar path
  cases.push_back({3, 1, 64, 0, 0.0f, 4});
  cases.push_back({3, 1, 80, 16, 0.0f, 1});  // odd q stride: scalar path
  const cudaStream_t st = ctx().stream;
  for (const Case& c : cases) {
    for (int which : {0, 1, 2}) {
      SCOPED_TRACE("heads " + std::to_string(c.n_heads) + "/" + std::to_string(c.n_heads_kv) +
                   " head_dim " + std::to_string(c.head_dim) + " window " +
                   std::to_string(c.window) + " softcap " + std::to_string(c.softcap) + " q_pad " +
                   std::to_string(c.q_pad) + " tokens " + std::to_string(which));
      std::mt19937 rng(static_cast<uint32_t>(c.head_dim * 733 + c.n_heads * 31 + c.window * 7 +
                                             static_cast<int>(c.softcap) + which));
      std::vector<int32_t> seq, pos;
      make_tokens(which, seq, pos);
      const int64_t n_tokens = static_cast<int64_t>(seq.size());
      const int64_t row = c.n_heads * c.head_dim;
      const int64_t q_stride = row + c.q_pad;
      const size_t cache_n = static_cast<size_t>(kBlocks * kBlockSize * c.n_heads_kv * c.head_dim);
      const std::vector<float> q =
          random_floats(static_cast<size_t>(n_tokens * q_stride), rng, -2, 2);
      const std::vector<float> kc = random_floats(cache_n, rng, -1, 1);
      const std::vector<float> vc = random_floats(cache_n, rng, -1, 1);
      std::vector<int32_t> tables(kBlocks);
      std::iota(tables.begin(), tables.end(), 0);
      std::shuffle(tables.begin(), tables.end(), rng);
      std::vector<float> out(static_cast<size_t>(n_tokens * row), testutil::kNaN);

      DeviceArray<float> dq(q, st), dkc(kc, st), dvc(vc, st), dout(out.size());
      DeviceArray<int32_t> dseq(seq, st), dpos(pos, st), dtables(tables, st);
      dout.poison(st);
      AttentionKernelParams p{.q = q.data(),
                              .q_stride = q_stride,
                              .out = out.data(),
                              .out_stride = row,
                              .token_seq = seq.data(),
                              .token_pos = pos.data(),
                              .n_tokens = n_tokens,
                              .n_heads = c.n_heads,
                              .cache = {.k_cache = const_cast<float*>(kc.data()),
                                        .v_cache = const_cast<float*>(vc.data()),
                                        .block_tables = tables.data(),
                                        .max_blocks_per_seq = kMaxBlocks,
                                        .n_seqs = kSeqs,
                                        .n_blocks = kBlocks,
                                        .block_size = kBlockSize,
                                        .n_heads_kv = c.n_heads_kv,
                                        .head_dim = c.head_dim},
                              .scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
                              .sliding_window = c.window,
                              .logit_softcap = c.softcap};
      ASSERT_TRUE(cpu::attention(p).ok());
      ASSERT_EQ(testutil::nan_in_view(out, n_tokens, row, row), 0u);
      p.q = dq.get();
      p.out = dout.get();
      p.token_seq = dseq.get();
      p.token_pos = dpos.get();
      p.cache.k_cache = dkc.get();
      p.cache.v_cache = dvc.get();
      p.cache.block_tables = dtables.get();
      const Status status = attention(ctx(), p);
      ASSERT_TRUE(status.ok()) << status.to_string();
      EXPECT_TRUE(all_close(dout.download(st), out, {1e-4, 1e-5}));
    }
  }
}

TEST_F(AttentionCudaTest, InvalidBlockGivesNanRow) {
  const cudaStream_t st = ctx().stream;
  std::mt19937 rng(9);
  const int64_t hd = 64;
  const std::vector<int32_t> seq = {0, 1};
  const std::vector<int32_t> pos = {20, 20};
  std::vector<int32_t> tables(kBlocks);
  std::iota(tables.begin(), tables.end(), 0);
  tables[kMaxBlocks + 0] = static_cast<int32_t>(kBlocks);  // sequence 1 reads a block past the pool
  const size_t cache_n = static_cast<size_t>(kBlocks * kBlockSize * hd);
  DeviceArray<float> dq(random_floats(2 * hd, rng, -1, 1), st);
  DeviceArray<float> dkc(random_floats(cache_n, rng, -1, 1), st);
  DeviceArray<float> dout(2 * hd);
  DeviceArray<int32_t> dseq(seq, st), dpos(pos, st), dtables(tables, st);
  dout.poison(st);
  AttentionKernelParams p{.q = dq.get(),
                          .q_stride = hd,
                          .out = dout.get(),
                          .out_stride = hd,
                          .token_seq = dseq.get(),
                          .token_pos = dpos.get(),
                          .n_tokens = 2,
                          .n_heads = 1,
                          .cache = {.k_cache = dkc.get(),
                                    .v_cache = dkc.get(),
                                    .block_tables = dtables.get(),
                                    .max_blocks_per_seq = kMaxBlocks,
                                    .n_seqs = kSeqs,
                                    .n_blocks = kBlocks,
                                    .block_size = kBlockSize,
                                    .n_heads_kv = 1,
                                    .head_dim = hd}};
  ASSERT_TRUE(attention(ctx(), p).ok());
  const std::vector<float> got = dout.download(st);
  for (int64_t d = 0; d < hd; ++d) {
    EXPECT_FALSE(std::isnan(got[static_cast<size_t>(d)])) << d;
    EXPECT_TRUE(std::isnan(got[static_cast<size_t>(hd + d)])) << d;
  }
}

TEST(AttentionCudaArgs, RejectsBadArguments) {
  static float fake[64];
  static int32_t ids[2];
  AttentionKernelParams p{.q = fake,
                          .q_stride = 24,
                          .out = fake,
                          .out_stride = 24,
                          .token_seq = ids,
                          .token_pos = ids,
                          .n_tokens = 2,
                          .n_heads = 3,
                          .cache = {.k_cache = fake,
                                    .v_cache = fake,
                                    .block_tables = ids,
                                    .max_blocks_per_seq = 1,
                                    .n_seqs = 1,
                                    .n_blocks = 1,
                                    .block_size = 16,
                                    .n_heads_kv = 2,
                                    .head_dim = 8}};
  EXPECT_EQ(attention(LaunchCtx{}, p).code(), StatusCode::kInvalidArgument);  // 3 heads on 2
  p.cache.n_heads_kv = 1;
  p.cache.head_dim = 512;
  EXPECT_EQ(attention(LaunchCtx{}, p).code(), StatusCode::kUnimplemented);  // head_dim > 256
  p.cache.head_dim = 8;
  p.q_stride = 16;
  EXPECT_EQ(attention(LaunchCtx{}, p).code(), StatusCode::kInvalidArgument);  // stride < row
  p.q_stride = 24;
  p.sliding_window = -1;
  EXPECT_EQ(attention(LaunchCtx{}, p).code(), StatusCode::kInvalidArgument);
  p.sliding_window = 0;
  p.n_tokens = 0;
  EXPECT_TRUE(attention(LaunchCtx{}, p).ok());
}

}  // namespace
}  // namespace strata::cuda
