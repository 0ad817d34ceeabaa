// strata::cuda::embedding against its CPU twin: hidden 72, 769, 1031, 4096, 5125; 1/7/33 tokens;
// table dtypes f32/f16/bf16; the whole vocabulary and a vocab-parallel shard (zero rows for other
// shards' ids); padded table and output strides. A copy and a conversion: exact (1e-6 relative).
// Also the GPU-only contract for ids outside [0, vocab): a NaN row, the other rows untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
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

constexpr int64_t kVocab = 50;

class EmbeddingCudaTest : public testutil::CudaTest {};

TEST_F(EmbeddingCudaTest, MatchesCpuTwin) {
  const cudaStream_t st = ctx().stream;
  for (int64_t hidden : {72, 769, 1031, 4096, 5125}) {
    for (int64_t n_tokens : {1, 7, 33}) {
      for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
        for (bool sharded : {false, true}) {
          const int64_t pad = sharded ? (hidden % 4 == 0 ? 4 : 1) : 0;
          SCOPED_TRACE("hidden " + std::to_string(hidden) + " tokens " + std::to_string(n_tokens) +
                       " " + std::string(dtype_name(dt)) + (sharded ? " sharded" : ""));
          std::mt19937 rng(static_cast<uint32_t>(hidden * 7 + n_tokens + sharded));
          const int64_t offset = sharded ? 10 : 0;
          const int64_t shard = sharded ? 25 : kVocab;
          const int64_t table_stride = hidden + pad;
          const int64_t out_stride = hidden + 2 * pad;
          const std::vector<uint8_t> table =
              testutil::random_typed(dt, shard * table_stride, rng, -1, 1);
          std::uniform_int_distribution<int32_t> id_dist(0, kVocab - 1);
          std::vector<int32_t> ids(static_cast<size_t>(n_tokens));
          for (int32_t& id : ids) id = id_dist(rng);
          ids[0] = static_cast<int32_t>(offset);  // first row of the shard
          std::vector<float> out(static_cast<size_t>(n_tokens * out_stride), testutil::kNaN);

          DeviceArray<uint8_t> dtable(table, st);
          DeviceArray<int32_t> dids(ids, st);
          DeviceArray<float> dout(out.size());
          dout.poison(st);
          EmbeddingParams p{.table = table.data(),
                            .table_dtype = dt,
                            .table_stride = table_stride,
                            .ids = ids.data(),
                            .out = out.data(),
                            .out_stride = out_stride,
                            .n_tokens = n_tokens,
                            .hidden = hidden,
                            .vocab_offset = offset,
                            .vocab_shard = shard,
                            .vocab = kVocab};
          ASSERT_TRUE(cpu::embedding(p).ok());
          ASSERT_EQ(testutil::nan_in_view(out, n_tokens, hidden, out_stride), 0u);
          p.table = dtable.get();
          p.ids = dids.get();
          p.out = dout.get();
          const Status status = embedding(ctx(), p);
          ASSERT_TRUE(status.ok()) << status.to_string();
          EXPECT_TRUE(all_close(dout.download(st), out, {1e-6, 0.0}));
        }
      }
    }
  }
}

// The scale (Gemma's sqrt(hidden)) and accumulate (learned positions added to x) options: out
// starts from random values (accumulate adds to them; rows of other shards stay as they were).
TEST_F(EmbeddingCudaTest, ScaleAndAccumulateMatchCpuTwin) {
  const cudaStream_t st = ctx().stream;
  for (int64_t hidden : {72, 769, 4096}) {
    for (bool accumulate : {false, true}) {
      for (bool sharded : {false, true}) {
        SCOPED_TRACE("hidden " + std::to_string(hidden) + (accumulate ? " accumulate" : " scale") +
                     (sharded ? " sharded" : ""));
        std::mt19937 rng(static_cast<uint32_t>(hidden * 3 + accumulate * 2 + sharded));
        const int64_t n_tokens = 9, offset = sharded ? 10 : 0, shard = sharded ? 25 : kVocab;
        const std::vector<uint8_t> table =
            testutil::random_typed(DType::kBF16, shard * hidden, rng, -1, 1);
        std::uniform_int_distribution<int32_t> id_dist(0, kVocab - 1);
        std::vector<int32_t> ids(static_cast<size_t>(n_tokens));
        for (int32_t& id : ids) id = id_dist(rng);
        const std::vector<float> out0 =
            testutil::random_floats(static_cast<size_t>(n_tokens * hidden), rng, -1, 1);
        std::vector<float> out = out0;
        EmbeddingParams p{.table = table.data(),
                          .table_dtype = DType::kBF16,
                          .table_stride = hidden,
                          .ids = ids.data(),
                          .out = out.data(),
                          .out_stride = hidden,
                          .n_tokens = n_tokens,
                          .hidden = hidden,
                          .vocab_offset = offset,
                          .vocab_shard = shard,
                          .vocab = kVocab,
                          .scale = accumulate ? 1.0f : 25.2982f,
                          .accumulate = accumulate};
        ASSERT_TRUE(cpu::embedding(p).ok());
        DeviceArray<uint8_t> dtable(table, st);
        DeviceArray<int32_t> dids(ids, st);
        DeviceArray<float> dout(out0, st);
        p.table = dtable.get();
        p.ids = dids.get();
        p.out = dout.get();
        const Status status = embedding(ctx(), p);
        ASSERT_TRUE(status.ok()) << status.to_string();
        EXPECT_TRUE(all_close(dout.download(st), out, {0.0, 0.0}));  // one IEEE op per element
      }
    }
  }
}

TEST_F(EmbeddingCudaTest, IdOutsideVocabGivesNanRow) {
  const cudaStream_t st = ctx().stream;
  const int64_t hidden = 72;
  std::mt19937 rng(5);
  const std::vector<uint8_t> table =
      testutil::random_typed(DType::kF32, kVocab * hidden, rng, -1, 1);
  const std::vector<int32_t> ids = {3, static_cast<int32_t>(kVocab), 7, -1};
  DeviceArray<uint8_t> dtable(table, st);
  DeviceArray<int32_t> dids(ids, st);
  DeviceArray<float> dout(ids.size() * hidden);
  dout.poison(st);
  EmbeddingParams p{.table = dtable.get(),
                    .table_stride = hidden,
                    .ids = dids.get(),
                    .out = dout.get(),
                    .out_stride = hidden,
                    .n_tokens = 4,
                    .hidden = hidden,
                    .vocab_shard = kVocab,
                    .vocab = kVocab};
  ASSERT_TRUE(embedding(ctx(), p).ok());
  const std::vector<float> got = dout.download(st);
  const float* t = reinterpret_cast<const float*>(table.data());
  for (int64_t i = 0; i < hidden; ++i) {
    EXPECT_EQ(got[static_cast<size_t>(i)], t[3 * hidden + i]);
    EXPECT_TRUE(std::isnan(got[static_cast<size_t>(hidden + i)]));
    EXPECT_EQ(got[static_cast<size_t>(2 * hidden + i)], t[7 * hidden + i]);
    EXPECT_TRUE(std::isnan(got[static_cast<size_t>(3 * hidden + i)]));
  }
}

TEST(EmbeddingCudaArgs, RejectsBadArguments) {
  static float fake[16];
  static int32_t ids[2];
  EmbeddingParams p{.table = fake,
                    .table_stride = 4,
                    .ids = ids,
                    .out = fake,
                    .out_stride = 4,
                    .n_tokens = 2,
                    .hidden = 4,
                    .vocab_offset = 2,
                    .vocab_shard = 3,
                    .vocab = 4};
  EXPECT_EQ(embedding(LaunchCtx{}, p).code(), StatusCode::kInvalidArgument);  // shard past vocab
  p.vocab_shard = 2;
  p.table_stride = 3;
  EXPECT_EQ(embedding(LaunchCtx{}, p).code(), StatusCode::kInvalidArgument);
  p.table_stride = 4;
  p.table_dtype = DType::kQ4_0;
  EXPECT_EQ(embedding(LaunchCtx{}, p).code(), StatusCode::kUnimplemented);
  p.table_dtype = DType::kF32;
  p.ids = nullptr;
  EXPECT_EQ(embedding(LaunchCtx{}, p).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::cuda
