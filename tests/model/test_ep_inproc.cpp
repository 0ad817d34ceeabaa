// Mixture-of-experts parallelism with ranks as threads of one process (make_in_process_tp_executor
// with ep > 1, the in-process communicator): the configurations of the mpirun test (EP = 2 and
// 4, TP = 2 with expert slicing, TP = 2 x EP = 2 with PCC) against one rank, for the f32
// reference (logits within 1e-5 relative, greedy identical) and the device layout on the bf16
// twins (the GPU path's arithmetic: expert parallelism only moves rows, so EP alone matches one
// rank exactly; slicing and TP attention within a bf16 tolerance). What runs on one GPU in
// tests/cuda/test_ep_cuda.cpp. Then ops::all_to_all_v with uneven and empty splits on the
// in-process communicator.
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "fixture_util.h"
#include "io/gguf.h"
#include "model/gguf_model.h"
#include "moe_parallel_util.h"

namespace strata {
namespace {

Result<testing::MoeRun> inproc_run(const std::string& dir, int tp, int ep, DType act,
                                   const std::vector<int32_t>& ids) {
  STRATA_ASSIGN_OR_RETURN(ModelConfig config, testing::moe_config(dir));
  std::vector<int32_t> routes;  // rank 0's
  RunnerOptions o;
  o.moe_route_trace = &routes;
  o.act_dtype = act;
  o.max_model_len = 64;
  o.num_kv_blocks = 16;
  o.block_size = 4;
  o.max_num_tokens = 64;
  o.max_num_seqs = 4;
  STRATA_ASSIGN_OR_RETURN(
      auto exec, make_in_process_tp_executor(config, testing::moe_loader(dir, config), tp, o, ep));
  STRATA_ASSIGN_OR_RETURN(testing::MoeRun run, testing::moe_run(*exec, ids, 3));
  run.routes = std::move(routes);
  return run;
}

struct Case {
  const char* fixture;
  int tp, ep;
};

class EpInProcess : public ::testing::TestWithParam<Case> {};

TEST_P(EpInProcess, MatchesOneRank) {
  const Case& c = GetParam();
  const std::string dir = testing::moe_fixture(c.fixture);
  auto ref = testing::load_reference(dir);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  const std::vector<int32_t>& ids = ref->inputs.back();
  for (DType act : {DType::kF32, DType::kBF16}) {
    auto one = inproc_run(dir, 1, 1, act, ids);
    ASSERT_TRUE(one.ok()) << one.status().to_string();
    auto many = inproc_run(dir, c.tp, c.ep, act, ids);
    ASSERT_TRUE(many.ok()) << many.status().to_string();
    const double err = testing::relative_error(many->logits, one->logits);
    const char* what = act == DType::kF32 ? "f32" : "bf16 twins";
    std::printf("[ info ] %s TP=%d EP=%d %s: %.2e of max|logit| from one rank\n", c.fixture, c.tp,
                c.ep, what, err);
    const double tol = act == DType::kF32 ? 1e-5 : (c.tp == 1 ? 0.0 : 2e-2);
    EXPECT_LE(err, tol) << c.fixture << " TP " << c.tp << " EP " << c.ep << " " << what;
    if (act == DType::kF32 || c.tp == 1) {
      EXPECT_EQ(many->greedy, one->greedy) << c.fixture << " TP " << c.tp << " EP " << c.ep;
      ASSERT_FALSE(one->routes.empty());
      EXPECT_EQ(many->routes, one->routes) << c.fixture << " TP " << c.tp << " EP " << c.ep;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, EpInProcess,
                         ::testing::Values(Case{"mixtral", 1, 2}, Case{"qwen2_moe", 1, 4},
                                           Case{"qwen2_moe", 2, 1}, Case{"qwen2_moe", 2, 2}),
                         [](const auto& info) {
                           return std::string(info.param.fixture) + "_tp" +
                                  std::to_string(info.param.tp) + "_ep" +
                                  std::to_string(info.param.ep);
                         });

// The GGUF form of Qwen2-MoE (f32, llama.cpp's stacked [E, F, H] expert tensors): the stacked
// path's expert slicing (TP = 2) and partition (TP = 2 x EP = 2) against one rank.
TEST(EpInProcess, GgufStackedExpertsMatchOneRank) {
  auto file = GgufFile::open(testing::moe_fixture("qwen2_moe") + "/model.gguf");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  auto shared = std::make_shared<const GgufFile>(std::move(*file));
  auto config = model_config_from_gguf(*shared);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  std::shared_ptr<TensorSource> src = make_gguf_tensor_source(shared, config->family);
  auto ref = testing::load_reference(testing::moe_fixture("qwen2_moe"));
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  auto run = [&](int tp, int ep) -> Result<testing::MoeRun> {
    RunnerOptions o;
    o.max_model_len = 64;
    o.num_kv_blocks = 16;
    o.block_size = 4;
    o.max_num_tokens = 64;
    o.max_num_seqs = 4;
    auto load = [&](const ParallelConfig& par) { return Model::load(*config, par, src); };
    STRATA_ASSIGN_OR_RETURN(auto exec, make_in_process_tp_executor(*config, load, tp, o, ep));
    return testing::moe_run(*exec, ref->inputs.back(), 2);
  };
  auto one = run(1, 1);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  for (auto [tp, ep] : {std::pair{2, 1}, std::pair{2, 2}}) {
    auto many = run(tp, ep);
    ASSERT_TRUE(many.ok()) << many.status().to_string();
    EXPECT_LE(testing::relative_error(many->logits, one->logits), 1e-5)
        << "TP " << tp << " EP " << ep;
    EXPECT_EQ(many->greedy, one->greedy) << "TP " << tp << " EP " << ep;
  }
}

TEST(EpInProcess, ExpertsNotDivisibleByGroupIsAClearError) {
  const std::string dir = testing::moe_fixture("mixtral");  // 6 experts
  auto config = testing::moe_config(dir);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  RunnerOptions o;
  o.num_kv_blocks = 4;
  auto exec = make_in_process_tp_executor(*config, testing::moe_loader(dir, *config), 1, o, 4);
  ASSERT_FALSE(exec.ok());
  EXPECT_NE(exec.status().message().find("6 experts cannot be split over expert-parallel size 4"),
            std::string::npos)
      << exec.status().to_string();
}

TEST(EpInProcess, AllToAllRowsUnevenAndEmptySplits) {
  for (int n : {2, 3, 4}) {
    auto comms = make_in_process_communicators(n);
    std::vector<std::string> err(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        err[static_cast<size_t>(r)] =
            testing::check_all_to_all_rows(*comms[static_cast<size_t>(r)]);
      });
    }
    for (std::thread& t : threads) t.join();
    for (const std::string& e : err) EXPECT_TRUE(e.empty()) << n << " ranks: " << e;
  }
}

}  // namespace
}  // namespace strata
