// Mixture-of-experts parallelism on ONE GPU through the in-process communicator (ranks =
// threads sharing the GPU, each its own stream): EP = 2 and TP = 2 x EP = 2 (PCC) against one
// rank on the GPU (Mixtral's 6 experts, 3 per rank; Qwen2-MoE's 44 features are not a
// multiple of 8, which the CUDA expert kernels need), the CUDA twin of
// tests/model/test_ep_inproc.cpp. The route trace keeps these runs eager: decode steps take the
// fixed-capacity exchange (one-shot all-to-alls), prefill the variable splits (copies between
// the ranks' device buffers). The graph-replayed decode is tests/cuda/test_ep_fixed_cuda.cpp.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "../model/fixture_util.h"
#include "../model/moe_parallel_util.h"
#include "backends/cuda/cuda_device.h"

namespace strata {
namespace {

// Ranks that share one GPU need kernels loaded eagerly (runtime/tp_executor.cpp says why).
[[maybe_unused]] const bool kEagerLoading = [] {
  return setenv("CUDA_MODULE_LOADING", "EAGER", 0) == 0;
}();

Result<testing::MoeRun> ep_run(const std::string& dir, int tp, int ep,
                               const std::vector<int32_t>& ids) {
  STRATA_ASSIGN_OR_RETURN(ModelConfig config, testing::moe_config(dir));
  RunnerOptions o;
  o.device = Device::cuda(0);
  o.act_dtype = DType::kBF16;
  o.max_model_len = 128;
  o.num_kv_blocks = 16;
  o.max_num_tokens = 64;
  o.max_num_seqs = 4;
  o.cuda_graphs = true;         // the route trace and expert parallelism turn them off
  std::vector<int32_t> routes;  // rank 0's
  o.moe_route_trace = &routes;
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

class EpCuda : public ::testing::TestWithParam<Case> {};

TEST_P(EpCuda, MatchesOneRank) {
  if (cuda::cuda_device_count() == 0) GTEST_SKIP() << "needs a CUDA device";
  const Case& c = GetParam();
  const std::string dir = testing::moe_fixture(c.fixture);
  auto ref = testing::load_reference(dir);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  for (const auto& ids : ref->inputs) {
    auto one = ep_run(dir, 1, 1, ids);
    ASSERT_TRUE(one.ok()) << one.status().to_string();
    auto many = ep_run(dir, c.tp, c.ep, ids);
    ASSERT_TRUE(many.ok()) << many.status().to_string();
    const double err = testing::relative_error(many->logits, one->logits);
    std::printf("[ info ] %s TP=%d EP=%d on one GPU: %.2e of max|logit| from one rank\n", c.fixture,
                c.tp, c.ep, err);
    // EP alone moves rows between ranks (the expert GEMMs may tile other row counts); TP
    // attention and its all-reduces round in another order.
    EXPECT_LE(err, c.tp == 1 ? 1e-2 : 2e-2) << c.fixture << " TP " << c.tp << " EP " << c.ep;
    EXPECT_EQ(many->greedy, one->greedy) << c.fixture << " TP " << c.tp << " EP " << c.ep;
    // EP alone runs the router on the same rows as one rank (TP attention rounds differently:
    // a near-tie could route another way, which the logits bound covers).
    if (c.tp == 1) {
      EXPECT_EQ(many->routes, one->routes) << c.fixture << " TP " << c.tp << " EP " << c.ep;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, EpCuda,
                         ::testing::Values(Case{"mixtral", 1, 2}, Case{"mixtral_bf16", 1, 2},
                                           Case{"mixtral", 2, 2}, Case{"mixtral_bf16", 2, 2}),
                         [](const auto& info) {
                           return std::string(info.param.fixture) + "_tp" +
                                  std::to_string(info.param.tp) + "_ep" +
                                  std::to_string(info.param.ep);
                         });

}  // namespace
}  // namespace strata
