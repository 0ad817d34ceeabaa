// The fixed-capacity expert-parallel exchange (model/moe_ep.h) on the CPU twin, ranks as threads
// of the in-process communicator: the exchange round trip for EP = 2, 3, 4 with uneven routing,
// an empty chunk and no rows to a rank, and the capacity exactly reached (f32 and bf16 rows);
// the counted all-to-all (all_to_all_rows) against a reference, and the counted exchange against
// whole blocks under skewed routing (every row to one rank);
// the plans' capacity checks; and whole models on the mixtral and qwen2_moe fixtures with every
// step on the fixed-capacity exchange against every step on the variable-split one (EP = 2, 4
// and TP = 2 x EP = 2; logits identical, greedy and routing identical).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ep_fixed_util.h"
#include "fixture_util.h"
#include "moe_parallel_util.h"

namespace strata {
namespace {

TEST(EpFixed, ExchangeRoundTrip) {
  for (int ep : {2, 3, 4}) {
    for (const char* kind : {"uneven", "full", "empty"}) {
      for (DType act : {DType::kF32, DType::kBF16}) {
        SCOPED_TRACE(std::to_string(ep) + " ranks, " + kind + ", " + std::string(dtype_name(act)));
        const testing::EpRouting R = testing::make_routing(ep, kind, 7u + ep);
        auto comms = make_in_process_communicators(ep);
        std::vector<std::string> err(static_cast<size_t>(ep));
        std::vector<std::thread> threads;
        for (int r = 0; r < ep; ++r) {
          threads.emplace_back([&, r] {
            std::vector<std::unique_ptr<char[]>> mem;
            auto alloc = [&](int64_t bytes) {
              mem.emplace_back(new char[static_cast<size_t>(bytes)]());
              return static_cast<void*>(mem.back().get());
            };
            ops::Context ctx{Device::cpu()};
            err[static_cast<size_t>(r)] =
                testing::ep_round_trip(ctx, *comms[static_cast<size_t>(r)], R, act, alloc);
          });
        }
        for (std::thread& t : threads) t.join();
        for (const std::string& e : err) EXPECT_EQ(e, "");
      }
    }
  }
}

// all_to_all_rows on host memory: rank s sends (s + 2 d) % (C + 1) rows to rank d (some 0, some
// the whole capacity); each receiver gets exactly those rows, and the rows past them keep the
// sentinel they held.
TEST(EpFixed, CountedAllToAllMovesOnlyTheCountedRows) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    constexpr int64_t C = 3, cols = 5;
    auto rows = [&](int s, int d) { return static_cast<int32_t>((s + 2 * d) % (C + 1)); };
    auto value = [&](int s, int d, int64_t i, int64_t c) {
      return static_cast<float>(1000 * s + 100 * d + 10 * i + c);
    };
    auto comms = make_in_process_communicators(n);
    std::vector<std::string> err(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int me = 0; me < n; ++me) {
      threads.emplace_back([&, me] {
        std::vector<float> send(static_cast<size_t>(n * C * cols)), recv(send.size(), -1.0f);
        std::vector<int32_t> sr(static_cast<size_t>(n)), rr(static_cast<size_t>(n));
        for (int d = 0; d < n; ++d) {
          sr[static_cast<size_t>(d)] = rows(me, d);
          rr[static_cast<size_t>(d)] = rows(d, me);
          for (int64_t i = 0; i < C; ++i) {
            for (int64_t c = 0; c < cols; ++c) {
              send[static_cast<size_t>((d * C + i) * cols + c)] = value(me, d, i, c);
            }
          }
        }
        Status st = comms[static_cast<size_t>(me)]->all_to_all_rows(
            send.data(), C, cols, DType::kF32, recv.data(), sr.data(), rr.data(),
            CommStream::host());
        if (!st.ok()) {
          err[static_cast<size_t>(me)] = st.to_string();
          return;
        }
        for (int s = 0; s < n; ++s) {
          for (int64_t i = 0; i < C; ++i) {
            for (int64_t c = 0; c < cols; ++c) {
              const float want = i < rows(s, me) ? value(s, me, i, c) : -1.0f;
              if (recv[static_cast<size_t>((s * C + i) * cols + c)] != want) {
                err[static_cast<size_t>(me)] = "rank " + std::to_string(me) + ": row " +
                                               std::to_string(i) + " from " + std::to_string(s);
                return;
              }
            }
          }
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (const std::string& e : err) EXPECT_EQ(e, "");
  }
}

// The counted exchange and the whole-block one under skewed routing (rank 0 sends nothing, every
// row goes to the last rank, the others receive nothing) and uneven routing, in-process with 2
// and 4 ranks: each round trip is checked row by row against the grouping and the outputs the
// variable-split path gives (ep_round_trip's reference), so the two paths agree bit for bit.
TEST(EpFixed, CountedMatchesWholeBlocksUnderSkewedRouting) {
  for (int ep : {2, 4}) {
    for (const char* kind : {"skewed", "uneven", "full"}) {
      for (bool counted : {true, false}) {
        for (DType act : {DType::kF32, DType::kBF16}) {
          SCOPED_TRACE(std::to_string(ep) + " ranks, " + kind +
                       (counted ? ", counted, " : ", whole, ") + std::string(dtype_name(act)));
          const testing::EpRouting R = testing::make_routing(ep, kind, 11u + ep);
          auto comms = make_in_process_communicators(ep);
          std::vector<std::string> err(static_cast<size_t>(ep));
          std::vector<std::thread> threads;
          for (int r = 0; r < ep; ++r) {
            threads.emplace_back([&, r] {
              std::vector<std::unique_ptr<char[]>> mem;
              auto alloc = [&](int64_t bytes) {
                // Not zeroed: stale padding must not matter.
                mem.emplace_back(new char[static_cast<size_t>(bytes)]);
                std::memset(mem.back().get(), 0x7f, static_cast<size_t>(bytes));
                return static_cast<void*>(mem.back().get());
              };
              ops::Context ctx{Device::cpu()};
              err[static_cast<size_t>(r)] = testing::ep_round_trip(
                  ctx, *comms[static_cast<size_t>(r)], R, act, alloc, counted);
            });
          }
          for (std::thread& t : threads) t.join();
          for (const std::string& e : err) EXPECT_EQ(e, "");
        }
      }
    }
  }
}

TEST(EpFixed, PlansReportRowsAboveTheCapacity) {
  ops::Context ctx{Device::cpu()};
  // 2 ranks x 2 experts, capacity 2: the chunk's 3 rows all go to rank 1.
  std::vector<int32_t> off{0, 0, 0, 1, 3}, counts(4), send_map(4), back_map(3);
  Tensor o = Tensor::make(off.data(), DType::kI32, {1, 5});
  Tensor c = Tensor::make(counts.data(), DType::kI32, {1, 4});
  Tensor sm = Tensor::make(send_map.data(), DType::kI32, {1, 4});
  Tensor bm = Tensor::make(back_map.data(), DType::kI32, {1, 3});
  Status st = ops::moe_ep_send_plan(ctx, o, 2, 2, 3, c, sm, bm);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.to_string();
  // Received: source 0 claims 3 rows of capacity 2.
  std::vector<int32_t> rc{1, 2, 0, 0}, roff(3), gm(4), um(4);
  Tensor rct = Tensor::make(rc.data(), DType::kI32, {1, 4});
  Tensor rot = Tensor::make(roff.data(), DType::kI32, {1, 3});
  Tensor gmt = Tensor::make(gm.data(), DType::kI32, {1, 4});
  Tensor umt = Tensor::make(um.data(), DType::kI32, {1, 4});
  st = ops::moe_ep_recv_plan(ctx, rct, 2, 2, rot, gmt, umt);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.to_string();
  EXPECT_EQ(roff, (std::vector<int32_t>{0, 1, 2}));  // cut to the capacity
}

Result<testing::MoeRun> run_with(const std::string& dir, int tp, int ep, DType act,
                                 int64_t fixed_tokens, const std::vector<int32_t>& ids) {
  STRATA_ASSIGN_OR_RETURN(ModelConfig config, testing::moe_config(dir));
  std::vector<int32_t> routes;
  RunnerOptions o;
  o.moe_route_trace = &routes;
  o.act_dtype = act;
  o.max_model_len = 64;
  o.num_kv_blocks = 16;
  o.block_size = 4;
  o.max_num_tokens = 64;
  o.max_num_seqs = 4;
  o.moe_ep_fixed_tokens = fixed_tokens;
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

class EpFixedModel : public ::testing::TestWithParam<Case> {};

// Every step (prefill chunks of 5 tokens, the last one smaller than the world, and decode) on
// the fixed-capacity exchange, against every step on the variable-split one: the same rows
// grouped the same way through the same kernels, so the same logits bit for bit.
TEST_P(EpFixedModel, MatchesVariableSplits) {
  const Case& c = GetParam();
  const std::string dir = testing::moe_fixture(c.fixture);
  auto ref = testing::load_reference(dir);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  const std::vector<int32_t>& ids = ref->inputs.back();
  for (DType act : {DType::kF32, DType::kBF16}) {
    auto variable = run_with(dir, c.tp, c.ep, act, 0, ids);
    ASSERT_TRUE(variable.ok()) << variable.status().to_string();
    auto fixed = run_with(dir, c.tp, c.ep, act, 64, ids);
    ASSERT_TRUE(fixed.ok()) << fixed.status().to_string();
    const double err = testing::relative_error(fixed->logits, variable->logits);
    std::printf("[ info ] %s TP=%d EP=%d %s: fixed-capacity %.2e of max|logit| from variable\n",
                c.fixture, c.tp, c.ep, std::string(dtype_name(act)).c_str(), err);
    EXPECT_EQ(err, 0.0) << c.fixture << " TP " << c.tp << " EP " << c.ep;
    EXPECT_EQ(fixed->greedy, variable->greedy);
    EXPECT_EQ(fixed->routes, variable->routes);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, EpFixedModel,
                         ::testing::Values(Case{"mixtral", 1, 2}, Case{"qwen2_moe", 1, 2},
                                           Case{"qwen2_moe", 1, 4}, Case{"mixtral", 2, 2},
                                           Case{"qwen2_moe", 2, 2}),
                         [](const auto& info) {
                           return std::string(info.param.fixture) + "_tp" +
                                  std::to_string(info.param.tp) + "_ep" +
                                  std::to_string(info.param.ep);
                         });

}  // namespace
}  // namespace strata
