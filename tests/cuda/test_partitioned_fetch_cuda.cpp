// Data-parallel replicas with partitioned weight fetch on the GPU (issue 13 item 4): the CPU test
// (tests/model/test_partitioned_fetch.cpp) with the replicas on GPUs 0..N-1 when there are that
// many (the layer parts' all-gather through NCCL), else all on GPU 0 (device-to-device copies of
// the peers' parts, ordered on the host: CudaCopier::gather_shared). Streamed replicas must give
// bit-identical logits to the same replicas with every layer resident, and one runner's logits
// within bf16 tolerance and its greedy ids; each replica copies only its part of every layer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

#include "../model/fixture_util.h"
#include "../model/partitioned_fetch_util.h"
#include "backends/cuda/cuda_device.h"
#include "core/mapped_file.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/residency.h"
#include "parallel/comm.h"
#include "runtime/executor.h"
#include "runtime/weight_streamer.h"

namespace strata {
namespace {

// Replicas that share one GPU need kernels loaded eagerly (tp_executor.cpp says why).
[[maybe_unused]] const bool kEagerLoading = [] {
  return setenv("CUDA_MODULE_LOADING", "EAGER", 0) == 0;
}();

#define REQUIRE_GPU() \
  if (cuda::cuda_device_count() == 0) GTEST_SKIP() << "needs a CUDA device"

using namespace testing::pfetch;  // NOLINT: the shared helpers
constexpr int64_t kSeqs = 4;

Result<ModelConfig> fixture_config(const std::string& dir) {
  STRATA_ASSIGN_OR_RETURN(std::string text, read_text_file(dir + "/config.json"));
  return parse_hf_config(text, dir + "/config.json");
}

RunnerOptions options(const ResidencyOptions& res) {
  RunnerOptions o;
  o.device = Device::cuda(0);
  o.act_dtype = DType::kBF16;
  o.cuda_graphs = false;  // streaming runs eagerly; the references too
  o.max_model_len = kMaxLen;
  o.num_kv_blocks = kSeqs * kMaxLen / kBlock;
  o.block_size = kBlock;
  o.max_num_tokens = 128;
  o.max_num_seqs = 8;
  o.residency = res;
  return o;
}

struct Exec {
  std::unique_ptr<Communicator> comm;  // a single runner's group
  std::unique_ptr<Executor> exec;
};

// dp == 0: one plain runner; else dp replicas.
Result<Exec> make(const std::string& dir, int dp, const ResidencyOptions& res,
                  bool partitioned = true) {
  STRATA_ASSIGN_OR_RETURN(ModelConfig config, fixture_config(dir));
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> ckpt, Checkpoint::open(dir));
  Exec e;
  if (dp == 0) {
    STRATA_ASSIGN_OR_RETURN(auto model, Model::load(config, ParallelConfig{}, ckpt));
    e.comm = make_single_rank_communicator();
    STRATA_ASSIGN_OR_RETURN(
        e.exec, make_runner(config, ParallelConfig{}, std::move(model), *e.comm, options(res)));
    return e;
  }
  auto load = [&](const ParallelConfig& par) { return Model::load(config, par, ckpt); };
  STRATA_ASSIGN_OR_RETURN(e.exec,
                          make_in_process_dp_executor(config, load, dp, options(res), partitioned));
  return e;
}

TEST(PartitionedFetchCuda, FixturesEqualResident) {
  REQUIRE_GPU();
  for (const char* name : {"llama", "llama_bf16", "gpt2", "qwen2"}) {
    const std::string dir = testing::fixture_model(name);
    auto ref = testing::load_reference(dir);
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();
    auto one = make(dir, 0, ResidencyOptions{});
    ASSERT_TRUE(one.ok()) << one.status().to_string();
    constexpr int kSteps = 4;
    for (int dp : {2, 3}) {
      const auto prompts = prompts_of(*ref, 3);
      auto want = run(*one->exec, prompts, kSteps);
      ASSERT_TRUE(want.ok()) << want.status().to_string();
      auto plain = make(dir, dp, ResidencyOptions{});
      ASSERT_TRUE(plain.ok()) << plain.status().to_string();
      auto same_split = run(*plain->exec, prompts, kSteps);
      ASSERT_TRUE(same_split.ok()) << same_split.status().to_string();
      // Each layer in 4 pieces (a piece's all-gather on the gather stream while the next piece
      // is copied), in 1 (whole-layer all-gathers), and in 3 without prefetch.
      for (auto [prefetch, pieces] :
           {std::pair{true, 4}, std::pair{true, 1}, std::pair{false, 3}}) {
        ResidencyOptions o;
        o.offload = WeightOffload::kCpu;
        o.prefetch = prefetch;
        o.fetch_pieces = pieces;
        std::string what = std::string(name) + " dp " + std::to_string(dp) + ", prefetch " +
                           std::to_string(prefetch) + ", " + std::to_string(pieces) + " pieces";
        auto s = make(dir, dp, o);
        ASSERT_TRUE(s.ok()) << what << ": " << s.status().to_string();
        what += " on " + s->exec->device_name();
        auto got = run(*s->exec, prompts, kSteps);
        ASSERT_TRUE(got.ok()) << what << ": " << got.status().to_string();
        EXPECT_TRUE(bit_equal(got->logits, same_split->logits))
            << what << ": streamed replicas differ from resident replicas (max err "
            << testing::relative_error(got->logits, same_split->logits) << ")";
        EXPECT_EQ(got->ids, same_split->ids) << what;
        EXPECT_LT(testing::relative_error(got->logits, want->logits), 2e-2) << what;
        EXPECT_EQ(got->ids, want->ids) << what << ": greedy ids differ from one runner";
        expect_partitioned(s->exec->replica_stream_stats(), dp, what, pieces);
      }
    }
  }
}

// llama3.2-1b's shapes (random weights, the same seed on every replica): 12 of 16 layers
// streamed through two slots over many passes, two replicas each fetching half of every layer,
// in 1 and in 4 pieces (parameter).
class PartitionedFetchCudaPieces : public ::testing::TestWithParam<int> {};

TEST_P(PartitionedFetchCudaPieces, ManyLayersEqualResidentReplicas) {
  REQUIRE_GPU();
  const int pieces = GetParam();
  auto c = model_config_preset("llama3.2-1b");
  ASSERT_TRUE(c.ok());
  std::vector<std::vector<int32_t>> prompts;
  for (int k = 0; k < 3; ++k) {
    std::vector<int32_t> ids;
    for (int i = 0; i < 20 + 5 * k; ++i) ids.push_back((i * 7919 + k * 104729) % 128000);
    prompts.push_back(ids);
  }
  std::vector<float> want;
  std::vector<int32_t> want_ids;
  for (int mode = 0; mode < 3; ++mode) {  // resident, streamed partitioned, streamed whole
    ResidencyOptions o;
    o.fetch_pieces = pieces;
    if (mode > 0) {
      o.gpu_weight_budget = device_nonlayer_bytes(*c, ParallelConfig{}, DType::kBF16) +
                            6 * device_layer_bytes(*c, ParallelConfig{}, DType::kBF16);
    }
    RunnerOptions ro = options(o);
    ro.seed = 3;
    auto e = make_in_process_dp_executor(*c, nullptr, 2, ro, /*partitioned=*/mode != 2);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    auto out = run(**e, prompts, 6);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    if (mode == 0) {
      want = out->logits;
      want_ids = out->ids;
      continue;
    }
    ASSERT_NE((*e)->residency_plan(), nullptr);
    EXPECT_EQ((*e)->residency_plan()->n_streamed, 12);
    EXPECT_TRUE(bit_equal(out->logits, want))
        << "mode " << mode << ", max err " << testing::relative_error(out->logits, want);
    EXPECT_EQ(out->ids, want_ids);
    if (mode == 1) {
      expect_partitioned((*e)->replica_stream_stats(), 2,
                         "llama3.2-1b, " + std::to_string(pieces) + " pieces", pieces);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Pieces, PartitionedFetchCudaPieces, ::testing::Values(1, 4));

}  // namespace
}  // namespace strata
