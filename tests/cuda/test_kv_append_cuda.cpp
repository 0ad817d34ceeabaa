// strata::cuda::kv_append against its CPU twin: 33 tokens of 3 sequences (prefill, decode and a
// chunk) into a 16-slot-block cache with shuffled block tables; n_heads_kv x head_dim of 1 x 12,
// 2 x 80, 3 x 5 (odd row: scalar path) and 1 x 128 with padded token strides. Both caches start
// from the same random contents, so the comparison (exact: a copy) also proves that nothing but
// the target slots was written. Also the GPU-only contract: a token whose slot is invalid writes
// nothing.
#include <gtest/gtest.h>

#include <algorithm>
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

// Tokens: sequence 0 prefill 0..6, sequence 1 decode at 77, sequence 2 a chunk 30..54.
void make_tokens(std::vector<int32_t>& seq, std::vector<int32_t>& pos) {
  for (int32_t p = 0; p < 7; ++p) seq.push_back(0), pos.push_back(p);
  seq.push_back(1), pos.push_back(77);
  for (int32_t p = 30; p < 55; ++p) seq.push_back(2), pos.push_back(p);
}

std::vector<int32_t> shuffled_tables(std::mt19937& rng) {
  std::vector<int32_t> t(kBlocks);
  std::iota(t.begin(), t.end(), 0);
  std::shuffle(t.begin(), t.end(), rng);
  return t;
}

class KvAppendCudaTest : public testutil::CudaTest {};

TEST_F(KvAppendCudaTest, MatchesCpuTwin) {
  struct Shape {
    int64_t heads_kv;
    int64_t head_dim;
    int64_t pad;
  };
  const cudaStream_t st = ctx().stream;
  for (const Shape& s :
       {Shape{1, 12, 0}, Shape{2, 80, 0}, Shape{3, 5, 0}, Shape{1, 128, 4}, Shape{2, 64, 1}}) {
    SCOPED_TRACE("heads_kv " + std::to_string(s.heads_kv) + " head_dim " +
                 std::to_string(s.head_dim) + " pad " + std::to_string(s.pad));
    std::mt19937 rng(static_cast<uint32_t>(s.heads_kv * 1000 + s.head_dim + s.pad));
    std::vector<int32_t> seq, pos;
    make_tokens(seq, pos);
    const int64_t n_tokens = static_cast<int64_t>(seq.size());
    const int64_t row = s.heads_kv * s.head_dim;
    const int64_t stride = row + s.pad;
    const size_t cache_n = static_cast<size_t>(kBlocks * kBlockSize * row);
    std::vector<float> k = random_floats(static_cast<size_t>(n_tokens * stride), rng, -1, 1);
    std::vector<float> v = random_floats(static_cast<size_t>(n_tokens * stride), rng, -1, 1);
    std::vector<float> kc = random_floats(cache_n, rng, 5, 6);
    std::vector<float> vc = random_floats(cache_n, rng, 5, 6);
    const std::vector<int32_t> tables = shuffled_tables(rng);
    DeviceArray<float> dk(k, st), dv(v, st), dkc(kc, st), dvc(vc, st);
    DeviceArray<int32_t> dseq(seq, st), dpos(pos, st), dtables(tables, st);

    KvAppendParams p{.k = k.data(),
                     .k_stride = stride,
                     .v = v.data(),
                     .v_stride = stride,
                     .token_seq = seq.data(),
                     .token_pos = pos.data(),
                     .n_tokens = n_tokens,
                     .cache = {.k_cache = kc.data(),
                               .v_cache = vc.data(),
                               .block_tables = tables.data(),
                               .max_blocks_per_seq = kMaxBlocks,
                               .n_seqs = kSeqs,
                               .n_blocks = kBlocks,
                               .block_size = kBlockSize,
                               .n_heads_kv = s.heads_kv,
                               .head_dim = s.head_dim}};
    ASSERT_TRUE(cpu::kv_append(p).ok());
    p.k = dk.get();
    p.v = dv.get();
    p.token_seq = dseq.get();
    p.token_pos = dpos.get();
    p.cache.k_cache = dkc.get();
    p.cache.v_cache = dvc.get();
    p.cache.block_tables = dtables.get();
    const Status status = kv_append(ctx(), p);
    ASSERT_TRUE(status.ok()) << status.to_string();
    EXPECT_TRUE(all_close(dkc.download(st), kc, {0.0, 0.0})) << "k cache";
    EXPECT_TRUE(all_close(dvc.download(st), vc, {0.0, 0.0})) << "v cache";
  }
}

TEST_F(KvAppendCudaTest, InvalidSlotWritesNothing) {
  const cudaStream_t st = ctx().stream;
  std::mt19937 rng(3);
  const int64_t row = 16;
  // token 0: sequence 5 (of 3); token 1: position past the table; token 2: block id -1
  const std::vector<int32_t> seq = {5, 0, 1};
  const std::vector<int32_t> pos = {0, static_cast<int32_t>(kMaxBlocks * kBlockSize), 3};
  std::vector<int32_t> tables = shuffled_tables(rng);
  tables[kMaxBlocks] = -1;  // sequence 1, block 0
  const size_t cache_n = static_cast<size_t>(kBlocks * kBlockSize * row);
  const std::vector<float> kc = random_floats(cache_n, rng, 5, 6);
  const std::vector<float> k = random_floats(3 * row, rng, -1, 1);
  DeviceArray<float> dk(k, st), dkc(kc, st), dvc(kc, st);
  DeviceArray<int32_t> dseq(seq, st), dpos(pos, st), dtables(tables, st);
  KvAppendParams p{.k = dk.get(),
                   .k_stride = row,
                   .v = dk.get(),
                   .v_stride = row,
                   .token_seq = dseq.get(),
                   .token_pos = dpos.get(),
                   .n_tokens = 3,
                   .cache = {.k_cache = dkc.get(),
                             .v_cache = dvc.get(),
                             .block_tables = dtables.get(),
                             .max_blocks_per_seq = kMaxBlocks,
                             .n_seqs = kSeqs,
                             .n_blocks = kBlocks,
                             .block_size = kBlockSize,
                             .n_heads_kv = 1,
                             .head_dim = row}};
  ASSERT_TRUE(kv_append(ctx(), p).ok());
  EXPECT_TRUE(all_close(dkc.download(st), kc, {0.0, 0.0}));
  EXPECT_TRUE(all_close(dvc.download(st), kc, {0.0, 0.0}));
}

TEST(KvAppendCudaArgs, RejectsBadArguments) {
  static float fake[64];
  static int32_t ids[2];
  KvAppendParams p{.k = fake,
                   .k_stride = 8,
                   .v = fake,
                   .v_stride = 8,
                   .token_seq = ids,
                   .token_pos = ids,
                   .n_tokens = 2,
                   .cache = {.k_cache = fake,
                             .v_cache = fake,
                             .block_tables = ids,
                             .max_blocks_per_seq = 1,
                             .n_seqs = 1,
                             .n_blocks = 1,
                             .block_size = 0,
                             .n_heads_kv = 1,
                             .head_dim = 8}};
  EXPECT_EQ(kv_append(LaunchCtx{}, p).code(), StatusCode::kInvalidArgument);  // block_size 0
  p.cache.block_size = 16;
  p.k_stride = 4;
  EXPECT_EQ(kv_append(LaunchCtx{}, p).code(), StatusCode::kInvalidArgument);  // stride < row
  p.k_stride = 8;
  p.cache.v_cache = nullptr;
  EXPECT_EQ(kv_append(LaunchCtx{}, p).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::cuda
