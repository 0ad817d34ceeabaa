// Mixture-of-experts parallelism on the CPU under mpirun (issue 12, item 4): the world of this
// run (2 or 4 ranks) as expert parallel (EP = N), expert slicing (TP = 2) and TP = 2 x EP = 2
// with PCC. On every rank, each configuration's routing (every sparse layer's top-k ids in
// every forward pass) must be the single-rank routing, computed in the same process, its logits
// within 1e-5 relative of the single-rank logits, and its greedy continuation the same.
#include <gtest/gtest.h>

#include "../model/fixture_util.h"
#include "../model/moe_parallel_util.h"
#include "strata/engine.h"

namespace strata {

extern Communicator* g_comm;  // tests/parallel/test_tensor_parallel.cpp

namespace {

struct Layout {
  const char* fixture;
  int tp, ep;
};

std::string name_of(const Layout& l) {
  return std::string(l.fixture) + " TP=" + std::to_string(l.tp) + " EP=" + std::to_string(l.ep);
}

Result<testing::MoeRun> run_one(const std::string& dir, const ParallelConfig& par,
                                Communicator& tp_comm, Communicator* ep_comm,
                                const std::vector<int32_t>& ids) {
  STRATA_ASSIGN_OR_RETURN(ModelConfig config, testing::moe_config(dir));
  STRATA_ASSIGN_OR_RETURN(auto model, testing::moe_loader(dir, config)(par));
  std::vector<int32_t> routes;
  RunnerOptions ro;  // the CPU reference: f32 activations, the weights as stored
  ro.block_size = 4;
  ro.num_kv_blocks = 16;
  ro.moe_route_trace = &routes;
  STRATA_ASSIGN_OR_RETURN(
      auto exec, make_runner(config, par, std::move(model), tp_comm, ro, nullptr, ep_comm));
  STRATA_ASSIGN_OR_RETURN(testing::MoeRun run, testing::moe_run(*exec, ids, 3));
  run.routes = std::move(routes);
  return run;
}

class ExpertParallel : public ::testing::TestWithParam<Layout> {};

TEST_P(ExpertParallel, MatchesSingleRank) {
  const Layout& l = GetParam();
  if (l.tp * l.ep != g_comm->size()) GTEST_SKIP() << "needs " << l.tp * l.ep << " ranks";
  const std::string dir = testing::moe_fixture(l.fixture);
  auto ref = testing::load_reference(dir);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  // Megatron numbering: world rank = ep_rank * tp + tp_rank.
  ParallelConfig par;
  par.tp_size = l.tp;
  par.tp_rank = g_comm->rank() % l.tp;
  par.ep_size = l.ep;
  par.ep_rank = g_comm->rank() / l.tp;
  auto tp_comm = g_comm->split(par.ep_rank, par.tp_rank);
  ASSERT_TRUE(tp_comm.ok()) << tp_comm.status().to_string();
  auto ep_comm = g_comm->split(par.tp_rank, par.ep_rank);
  ASSERT_TRUE(ep_comm.ok()) << ep_comm.status().to_string();
  auto single = make_single_rank_communicator();
  for (const auto& ids : ref->inputs) {
    auto a = run_one(dir, ParallelConfig{}, *single, nullptr, ids);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    auto b = run_one(dir, par, **tp_comm, l.ep > 1 ? ep_comm->get() : nullptr, ids);
    ASSERT_TRUE(b.ok()) << name_of(l) << ": " << b.status().to_string();
    const double err = testing::relative_error(b->logits, a->logits);
    if (g_comm->rank() == 0) std::printf("[ info ] %s: max err %.2e\n", name_of(l).c_str(), err);
    EXPECT_LE(err, 1e-5) << name_of(l) << " rank " << g_comm->rank();
    EXPECT_EQ(b->greedy, a->greedy) << name_of(l) << " rank " << g_comm->rank();
    // Every rank routes every token of every pass as one rank does.
    ASSERT_FALSE(a->routes.empty());
    EXPECT_EQ(b->routes, a->routes) << name_of(l) << " rank " << g_comm->rank();
  }
}

// Mixtral: 6 experts, expert FFN 40; Qwen2-MoE: 8 experts of FFN 20, a shared expert, a dense
// layer, 2 heads (TP = 2 at most). TP = 2 slices each expert's FFN over the two ranks; EP = N
// holds E / N whole experts per rank; TP = 2 x EP = 2 holds E / 2 experts per rank, tokens split
// over all four ranks around the all-to-alls (PCC).
INSTANTIATE_TEST_SUITE_P(Layouts, ExpertParallel,
                         ::testing::Values(Layout{"mixtral", 1, 2}, Layout{"qwen2_moe", 1, 2},
                                           Layout{"mixtral", 2, 1}, Layout{"qwen2_moe", 2, 1},
                                           Layout{"qwen2_moe", 1, 4}, Layout{"qwen2_moe", 2, 2},
                                           Layout{"mixtral", 2, 2}),
                         [](const ::testing::TestParamInfo<Layout>& i) {
                           return std::string(i.param.fixture) + "_tp" +
                                  std::to_string(i.param.tp) + "_ep" + std::to_string(i.param.ep);
                         });

// The same through EngineConfig (load_executor: --expert-parallel-size under mpirun), every
// rank scoring the same tokens: EP = N, and TP = 2 x EP = 2 on four ranks.
TEST(ExpertParallel, EngineMatchesSingleRank) {
  const std::string dir = testing::moe_fixture("qwen2_moe");
  auto ref = testing::load_reference(dir);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  const int n = g_comm->size();
  std::vector<std::pair<int, int>> layouts = {{1, n}};
  if (n == 4) layouts.push_back({2, 2});
  auto single = make_single_rank_communicator();
  const std::vector<int32_t>& ids = ref->inputs.back();
  auto one = run_one(dir, ParallelConfig{}, *single, nullptr, ids);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  for (const auto& [tp, ep] : layouts) {
    EngineConfig cfg;
    cfg.model = dir;
    cfg.parallel.tp = tp;
    cfg.parallel.ep = ep;
    cfg.show_progress = false;
    auto engine = Engine::create(cfg);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    EXPECT_EQ((*engine)->world_size(), n);
    auto logits = (*engine)->score(ids);
    ASSERT_TRUE(logits.ok()) << logits.status().to_string();
    EXPECT_LE(testing::relative_error(*logits, one->logits), 1e-5)
        << "TP " << tp << " EP " << ep << " rank " << g_comm->rank();
  }
}

TEST(ExpertParallel, AllToAllRowsUnevenAndEmptySplits) {
  const std::string err = testing::check_all_to_all_rows(*g_comm);
  EXPECT_TRUE(err.empty()) << err;
}

TEST(ExpertParallel, ExpertsNotDivisibleByGroupIsAClearError) {
  // OLMoE's 5 experts over the whole world (2 or 4 ranks).
  const std::string dir = testing::moe_fixture("olmoe");
  auto config = testing::moe_config(dir);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  ParallelConfig par;
  par.ep_size = g_comm->size();
  par.ep_rank = g_comm->rank();
  auto m = testing::moe_loader(dir, *config)(par);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("5 experts cannot be split over expert-parallel size " +
                                      std::to_string(g_comm->size())),
            std::string::npos)
      << m.status().to_string();
}

}  // namespace
}  // namespace strata
