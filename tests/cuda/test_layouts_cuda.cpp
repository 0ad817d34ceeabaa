// The seed-003 FFN layouts (--ffn-layout 2d | weight-gathered, model/ffn_layouts.cpp) with the
// ranks as threads (make_in_process_tp_executor): on one GPU over the in-process communicator's
// one-shot kernels, or, where the machine has a GPU per rank, one GPU each over NCCL (its
// subgroups split from the ranks' communicators): the one-shot reduce-scatter the weight-gathered
// layout needs against its CPU twin (the in-process host reduce_scatter: reduce_sum_host,
// bit-exact), eagerly and replayed from a CUDA graph; and the llama fixture at TP = 2 and 4 in each
// layout against TP = 1 (1d) on the GPU, CUDA graphs on, within the bf16 tolerance of the TP tests
// (test_tp_cuda.cpp) and with the same greedy tokens. And --attn-layout batch-sharded
// (model/attn_layouts.cpp) with the ranks as threads (one GPU, or a GPU each through NCCL) against
// TP = 1 (AttnLayoutCuda): batches of sequences of different lengths and one sequence, eager steps.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "../model/fixture_util.h"
#include "../parallel/ffn_layout_util.h"
#include "backends/cuda/cuda_device.h"
#include "core/env.h"
#include "core/half.h"
#include "core/mapped_file.h"
#include "core/status.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/model.h"
#include "parallel/comm.h"
#include "parallel/inproc_comm.h"
#include "runtime/executor.h"
#include "runtime/sequence.h"
#include "tp_logits_util.h"

namespace strata {
namespace {

using cuda_test::on_ranks;

// Rank r's input: n blocks of `count` elements of dt.
std::vector<uint8_t> random_input(int n, int r, int64_t count, DType dt) {
  const int64_t elem = dtype_bytes(dt, 1);
  std::vector<uint8_t> v(static_cast<size_t>(n * count * elem));
  std::mt19937 rng(static_cast<uint32_t>(1000 * n + 17 * r + count));
  std::uniform_real_distribution<float> d(-2, 2);
  for (int64_t i = 0; i < n * count; ++i) {
    const float x = d(rng);
    if (dt == DType::kF32) {
      std::memcpy(v.data() + 4 * i, &x, 4);
    } else {
      const uint16_t b = f32_to_bf16(x);
      std::memcpy(v.data() + 2 * i, &b, 2);
    }
  }
  return v;
}

TEST(OneShotCuda, ReduceScatterMatchesHostTwin) {
  REQUIRE_GPU();
  for (int n : {2, 3, 4}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      // 4099: the scalar path; 8192 and 65536: 16-byte vectors, one block and many.
      for (int64_t count : {int64_t{1}, int64_t{4099}, int64_t{8192}, int64_t{65536}}) {
        SCOPED_TRACE(std::to_string(n) + " ranks, " + std::string(dtype_name(dt)) + ", count " +
                     std::to_string(count));
        const int64_t elem = dtype_bytes(dt, 1);
        const size_t in_bytes = static_cast<size_t>(n * count * elem);
        const size_t out_bytes = static_cast<size_t>(count * elem);
        std::vector<std::vector<uint8_t>> in(static_cast<size_t>(n));
        for (int r = 0; r < n; ++r) in[static_cast<size_t>(r)] = random_input(n, r, count, dt);
        // The twin: the in-process communicator's host reduce_scatter on the same inputs.
        std::vector<std::vector<uint8_t>> want(static_cast<size_t>(n),
                                               std::vector<uint8_t>(out_bytes));
        {
          auto host = make_in_process_communicators(n);
          const std::string err = on_ranks(n, [&](int r) -> Status {
            const auto i = static_cast<size_t>(r);
            return host[i]->reduce_scatter(in[i].data(), count, dt, want[i].data(),
                                           CommStream::host());
          });
          ASSERT_EQ(err, "");
        }
        auto comms = make_in_process_communicators(n);
        std::vector<std::vector<uint8_t>> got(static_cast<size_t>(n),
                                              std::vector<uint8_t>(out_bytes));
        const std::string err = on_ranks(n, [&](int r) -> Status {
          const auto i = static_cast<size_t>(r);
          auto dev = cuda::CudaDevice::create(0);
          if (!dev.ok()) return dev.status();
          STRATA_RETURN_IF_ERROR(init_in_process_device(*comms[i], 0, n * count * elem));
          cudaStream_t stream = (*dev)->launch_ctx().stream;
          void *src = nullptr, *out = nullptr;
          const bool allocated = cudaMalloc(&src, in_bytes) == cudaSuccess &&
                                 cudaMalloc(&out, out_bytes) == cudaSuccess;
          if (allocated) {
            cudaMemcpy(src, in[i].data(), in_bytes, cudaMemcpyHostToDevice);
            // Work on the fresh stream before its first collective (test_tp_cuda.cpp says why).
            cudaMemsetAsync(out, 0, out_bytes, stream);
            cudaStreamSynchronize(stream);
          }
          // No allocation while a peer's kernel spins (test_tp_cuda.cpp).
          STRATA_RETURN_IF_ERROR(comms[i]->barrier());
          if (!allocated) return Status(StatusCode::kOutOfMemory, "cudaMalloc");
          CommStream s;
          s.device = Device::cuda(0);
          s.cuda_stream = stream;
          Status st = ok_status();
          // Rounds 0 and 1 eager (both staging halves), 2 and 3 one captured graph replayed.
          cudaGraphExec_t exec = nullptr;
          for (int round = 0; round < 4 && st.ok(); ++round) {
            cudaMemsetAsync(out, 0, out_bytes, stream);
            if (round < 2) {
              st = comms[i]->reduce_scatter(src, count, dt, out, s);
            } else {
              if (round == 2) {
                cudaGraph_t g = nullptr;
                cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
                st = comms[i]->reduce_scatter(src, count, dt, out, s);
                cudaStreamEndCapture(stream, &g);
                if (g != nullptr) {
                  cudaGraphInstantiate(&exec, g, 0);
                  cudaGraphDestroy(g);
                }
                if (st.ok() && exec == nullptr) st = Status(StatusCode::kInternal, "no graph");
              }
              if (st.ok()) cudaGraphLaunch(exec, stream);
            }
            cudaStreamSynchronize(stream);
            cudaMemcpy(got[i].data(), out, out_bytes, cudaMemcpyDeviceToHost);
            if (st.ok()) st = comms[i]->health();
            if (st.ok() && got[i] != want[i]) {
              st = errorf(StatusCode::kInternal, "rank {} round {}: differs from the host twin", r,
                          round);
            }
          }
          if (exec != nullptr) cudaGraphExecDestroy(exec);
          const Status met = comms[i]->barrier();
          cudaFree(src);
          cudaFree(out);
          return st.ok() ? met : st;
        });
        EXPECT_EQ(err, "");
      }
    }
  }
}

struct LayoutCase {
  const char* model;
  int tp;
  FfnLayout layout;
  int64_t gather = 0;  // 1d: --ffn-gather-min-tokens (the prompt's 16-token chunks gather)
};

std::string layout_case_name(const LayoutCase& c) {
  return testing::layout_case_name(c.model, c.tp, c.layout, c.gather);
}

class FfnLayoutCuda : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(FfnLayoutCuda, MatchesOneRankWithGraphs) {
  REQUIRE_GPU();
  const LayoutCase& c = GetParam();
  const std::string dir = testing::fixture_model(c.model);
  auto r =
      cuda_test::against_one_rank(dir, c.tp, 8, 1, c.layout, AttnLayout::kHeadSharded, c.gather);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const std::vector<int32_t>&g1 = r->one_ids, &gn = r->many_ids;
  const double err = r->err;
  const int64_t rn = r->replays;
  std::printf("[ info ] %s: %.2e of max|logit| from TP=1; greedy %s; %lld graph replays\n",
              layout_case_name(c).c_str(), err, gn == g1 ? "identical" : "differs",
              static_cast<long long>(rn));
  EXPECT_LE(err, 2e-2);
  EXPECT_EQ(gn, g1);
  EXPECT_GE(rn, 6) << "decode steps should replay graphs";
}

// llama: hidden 64, intermediate 176: the 2d grid at 4 ranks is 2 x 2 (GEMM inputs of 32 and 88
// features, multiples of 8 as the CUDA GEMMs need); weight-gathered GEMMs read the whole FFN.
// The pair (1d decode, weight-gathered prefill) runs 1d GEMMs too, whose down input at 4 ranks
// (44 features) the CUDA GEMMs refuse: 2 ranks (88).
INSTANTIATE_TEST_SUITE_P(Fixtures, FfnLayoutCuda,
                         ::testing::Values(LayoutCase{"llama", 4, FfnLayout::k2D},
                                           LayoutCase{"llama", 2, FfnLayout::kWeightGathered},
                                           LayoutCase{"llama", 4, FfnLayout::kWeightGathered},
                                           LayoutCase{"llama_bf16", 4, FfnLayout::k2D},
                                           LayoutCase{"llama_bf16", 4, FfnLayout::kWeightGathered},
                                           LayoutCase{"llama", 2, FfnLayout::k1D, 8}),
                         [](const auto& info) { return layout_case_name(info.param); });

// --attn-layout batch-sharded on ONE GPU with the ranks as threads (make_in_process_tp_executor
// over the in-process communicator): each sequence's KV cache (every KV head) on one rank, the
// projections and the attention output moved by all-to-alls (device-to-device copies), the per-rank
// step arrays planned on the host and uploaded every step, no CUDA graphs. The llama fixtures
// (GQA: 4 query heads, 2 KV heads, replicated at 4 ranks under head-sharded attention) at TP = 2
// and 4 against TP = 1 (head-sharded, graphs on) on the GPU, within the bf16 tolerance of the TP
// tests and with the same greedy tokens:
//   - a batch (testing::run_batch_layout): one prefill step of every sequence, prompts of 3 to 13
//     tokens, then 4 greedy decode steps of one token per sequence, sequence 0 sitting out the
//     odd ones; each sequence's first block is taken first, so the sequences spread over the
//     ranks and the ranks own different numbers of them (none, with fewer sequences than ranks);
//   - one sequence (cuda_tp_logits: a prefill, then 8 forward_argmax decode steps): one rank
//     owns it, the others run attention for nothing and only move rows.
// At TP = 4 the fixture's FFN (176 wide) would be sliced into 44 columns, which the CUDA GEMMs
// refuse (bf16 rows must be multiples of 8): those cases gather the FFN weights
// (--ffn-layout weight-gathered, FfnLayoutCuda above), the attention still batch-sharded.
struct AttnCudaCase {
  const char* model;
  int tp;
  int n_seqs;
  FfnLayout ffn = FfnLayout::k1D;
};

class AttnLayoutCuda : public ::testing::TestWithParam<AttnCudaCase> {};

TEST_P(AttnLayoutCuda, BatchShardedMatchesOneRank) {
  REQUIRE_GPU();
  const AttnCudaCase& c = GetParam();
  const std::string dir = testing::fixture_model(c.model);
  RunnerOptions o = testing::batch_runner_options();  // blocks of 4 tokens, 64 of them
  o.device = Device::cuda(0);
  o.act_dtype = DType::kBF16;
  o.cuda_graphs = true;
  const auto prompts = testing::batch_prompts(c.n_seqs);
  auto one = cuda_test::cuda_tp_executor(dir, 1, o);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  auto a = testing::run_batch_layout(**one, prompts, 4);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  o.attn_layout = AttnLayout::kBatchSharded;
  o.ffn_layout = c.ffn;
  auto many = cuda_test::cuda_tp_executor(dir, c.tp, o);
  ASSERT_TRUE(many.ok()) << many.status().to_string();
  const KvPoolConfig& kc = (*many)->cache().config();
  EXPECT_EQ(kc.n_owners, c.tp);
  EXPECT_EQ(kc.n_heads_kv, (*many)->config().n_heads_kv);  // every KV head on the owner
  std::vector<int> seqs_of_rank(static_cast<size_t>(c.tp), 0);
  auto count_owners = [&](const std::vector<SequenceKv>& seqs) {
    for (const SequenceKv& q : seqs) {
      const int owner = (*many)->cache().blocks().owner_of(q.block_table[0]);
      if (owner >= 0 && owner < c.tp) ++seqs_of_rank[static_cast<size_t>(owner)];
    }
  };
  auto b = testing::run_batch_layout(**many, prompts, 4, count_owners);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  const double err = testing::relative_error(b->logits, a->logits);
  std::string spread;
  for (int n : seqs_of_rank) spread += (spread.empty() ? "" : "/") + std::to_string(n);
  std::printf(
      "[ info ] %s TP=%d --attn-layout batch-sharded on %s, %d sequences (%s per rank): "
      "%.2e of max|logit| from TP=1; greedy %s\n",
      c.model, c.tp, (*many)->device_name().c_str(), c.n_seqs, spread.c_str(), err,
      b->ids == a->ids ? "identical" : "differs");
  EXPECT_LE(err, 2e-2);
  EXPECT_EQ(b->ids, a->ids);
  EXPECT_EQ((*many)->graph_replays(), 0) << "the layout's steps run eagerly";
  EXPECT_EQ(std::accumulate(seqs_of_rank.begin(), seqs_of_rank.end(), 0), c.n_seqs);
  if (c.n_seqs < c.tp) {
    EXPECT_EQ(*std::min_element(seqs_of_rank.begin(), seqs_of_rank.end()), 0);
  }
  (*many).reset();

  // One sequence: a prefill, then decode steps through forward_argmax.
  auto r = cuda_test::against_one_rank(dir, c.tp, 8, 1, c.ffn, AttnLayout::kBatchSharded);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::printf(
      "[ info ] %s TP=%d --attn-layout batch-sharded, one sequence: %.2e of "
      "max|logit| from TP=1; greedy %s\n",
      c.model, c.tp, r->err, r->many_ids == r->one_ids ? "identical" : "differs");
  EXPECT_LE(r->err, 2e-2);
  EXPECT_EQ(r->many_ids, r->one_ids);
  EXPECT_EQ(r->replays, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, AttnLayoutCuda,
                         ::testing::Values(AttnCudaCase{"llama", 2, 3}, AttnCudaCase{"llama", 2, 1},
                                           AttnCudaCase{"llama_bf16", 2, 5},
                                           AttnCudaCase{"llama", 4, 2, FfnLayout::kWeightGathered},
                                           AttnCudaCase{"llama", 4, 7, FfnLayout::kWeightGathered},
                                           AttnCudaCase{"llama_bf16", 4, 5,
                                                        FfnLayout::kWeightGathered}),
                         [](const auto& info) {
                           return std::string(info.param.model) + "_tp" +
                                  std::to_string(info.param.tp) + "_" +
                                  std::to_string(info.param.n_seqs) + "seqs" +
                                  (info.param.ffn == FfnLayout::kWeightGathered ? "_wg" : "");
                         });

}  // namespace
}  // namespace strata
