// Tensor-, expert- and pipeline-parallel serving across processes (mpirun -np N): rank 0's
// ServingEngine drives, the other ranks follow its broadcast steps. 16 concurrent greedy requests
// at TP = N or EP = N (32 at PP = 2, TP = N / 2), with a KV cache too small for all of them (so
// sequences are preempted and swapped out and back in on every rank), must give exactly the tokens
// a single-rank greedy loop over the CPU reference gives, computed on rank 0 without the server.
// TP also with batch-sharded attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <random>
#include <vector>

#include "../model/fixture_util.h"
#include "core/mapped_file.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/model.h"
#include "parallel/comm.h"
#include "runtime/executor.h"
#include "runtime/sequence.h"
#include "strata/serving.h"

namespace strata {

extern Communicator* g_comm;

namespace {

constexpr int kRequests = 16;
constexpr int64_t kMaxTokens = 10;

std::vector<std::vector<int32_t>> prompts(int64_t vocab, int n = kRequests) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(vocab - 1));
  std::vector<std::vector<int32_t>> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    p[static_cast<size_t>(i)].resize(static_cast<size_t>(4 + (i * 7) % 23));
    for (int32_t& t : p[static_cast<size_t>(i)]) t = tok(rng);
  }
  return p;
}

// Greedy tokens for one prompt through a single-rank runner (no server, no parallelism).
Result<std::vector<int32_t>> reference_greedy(const std::string& dir,
                                              const std::vector<int32_t>& prompt) {
  STRATA_ASSIGN_OR_RETURN(std::string text, read_text_file(dir + "/config.json"));
  STRATA_ASSIGN_OR_RETURN(ModelConfig config, parse_hf_config(text, dir + "/config.json"));
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> ckpt, Checkpoint::open(dir));
  STRATA_ASSIGN_OR_RETURN(auto model, Model::load(config, ParallelConfig{}, ckpt));
  auto single = make_single_rank_communicator();
  RunnerOptions ro;
  ro.block_size = 16;
  ro.num_kv_blocks = 8;
  STRATA_ASSIGN_OR_RETURN(auto exec,
                          make_runner(config, ParallelConfig{}, std::move(model), *single, ro));
  const int64_t V = config.vocab;
  std::vector<float> logits(static_cast<size_t>(V));
  std::vector<int32_t> out;
  SequenceKv seq;
  const ForwardFn fn = [&](const ForwardBatch& b, float* o) { return exec->forward(b, o); };
  std::vector<int32_t> next = prompt;
  for (int64_t i = 0; i < kMaxTokens; ++i) {
    STRATA_RETURN_IF_ERROR(forward_sequence(fn, 128, V, exec->cache(), seq, next,
                                            /*all_logits=*/false, logits.data(), 64));
    const auto tok =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(tok);
    next = {tok};
  }
  return out;
}

// Serves `n` concurrent greedy requests with rank 0's engine over tp x pp x ep ranks (the others
// follow) and checks each against the single-rank greedy loop. kv_cache_bytes > 0: the KV pool
// of that many bytes per rank (else 40 blocks), and the preemptions expected or not; rank 0's
// metrics into *metrics.
void serve_and_check(const std::string& dir, int tp, int pp, int ep, int n,
                     const std::string& attn_layout = "head-sharded", int64_t kv_cache_bytes = 0,
                     bool expect_preemptions = true, ServingMetrics* metrics = nullptr) {
  ServingConfig cfg;
  cfg.engine.model = dir;
  cfg.engine.parallel.attn_layout = attn_layout;
  cfg.engine.parallel.tp = tp;
  cfg.engine.parallel.pp = pp;
  cfg.engine.parallel.ep = ep;
  cfg.engine.show_progress = false;
  cfg.max_num_seqs = n;
  cfg.block_size = 4;
  cfg.num_kv_blocks = 40;  // < n sequences x ~9 blocks: preemption and swap happen
  if (kv_cache_bytes > 0) {
    cfg.num_kv_blocks = 0;
    cfg.kv_cache_bytes = kv_cache_bytes;
  }
  cfg.preemption_mode = PreemptionMode::kSwap;
  cfg.enable_prefix_caching = false;
  auto engine = ServingEngine::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_EQ((*engine)->rank(), g_comm->rank());
  if (g_comm->rank() != 0) {
    const Status st = (*engine)->wait_follower();
    EXPECT_TRUE(st.ok()) << st.to_string();
    return;
  }
  const auto ps = prompts((*engine)->info().vocab, n);
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  std::vector<std::vector<int32_t>> got(static_cast<size_t>(n));
  std::vector<std::string> reasons(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    CompletionRequest r;
    r.prompt_tokens = ps[static_cast<size_t>(i)];
    r.sampling.temperature = 0.0f;
    r.max_tokens = kMaxTokens;
    r.ignore_eos = true;
    auto id = (*engine)->submit(r, [&, i](const CompletionEvent& ev) {
      std::lock_guard<std::mutex> lock(mu);
      auto& g = got[static_cast<size_t>(i)];
      g.insert(g.end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.finished) {
        reasons[static_cast<size_t>(i)] = ev.finish_reason;
        ++done;
        cv.notify_all();
      }
    });
    ASSERT_TRUE(id.ok()) << id.status().to_string();
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return done == n; }))
        << done << " of " << n << " requests finished";
  }
  const ServingMetrics m = (*engine)->metrics();
  std::printf(
      "[ info ] TP=%d x PP=%d x EP=%d (%s attention) serving %d requests: %lld "
      "preemptions\n",
      tp, pp, ep, attn_layout.c_str(), n, static_cast<long long>(m.preemptions_total));
  if (metrics != nullptr) *metrics = m;
  if (expect_preemptions) {
    EXPECT_GT(m.preemptions_total, 0) << "the test means to exercise swapping";
  } else {
    EXPECT_EQ(m.preemptions_total, 0);
  }
  engine->reset();  // rank 0's driver tells the followers to stop
  for (int i = 0; i < n; ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(reasons[static_cast<size_t>(i)], "length");
    auto want = reference_greedy(dir, ps[static_cast<size_t>(i)]);
    ASSERT_TRUE(want.ok()) << want.status().to_string();
    EXPECT_EQ(got[static_cast<size_t>(i)], *want);
  }
}

TEST(TpServing, GreedyOutputsOf16ConcurrentRequestsEqualOneRank) {
  serve_and_check(testing::fixture_model("llama"), g_comm->size(), 1, 1, kRequests);
}

// Batch-sharded attention (--attn-layout batch-sharded): each sequence's KV on one rank, through
// the scheduler's mixed prefill / decode steps and swap preemption (a sequence swapped back in
// under new blocks stays on its rank).
TEST(TpServing, BatchShardedAttentionGreedyOutputsEqualOneRank) {
  serve_and_check(testing::fixture_model("llama"), g_comm->size(), 1, 1, kRequests,
                  "batch-sharded");
}

// The point of batch-sharded attention's pool: it is not replicated. With the llama's 2 KV heads
// over 4 ranks, head-sharded attention holds 1 KV head of every block on each rank (each head
// twice over the world); batch-sharded holds both heads of a quarter of the blocks. The same
// bytes per rank (40 head-sharded blocks) give it 80 block ids: 8 requests needing 52 blocks run
// without a preemption, where head-sharded attention preempts. Both equal the one-rank loop.
TEST(TpServing, BatchShardedAttentionFitsTheBatchHeadShardedPreempts) {
  const std::string dir = testing::fixture_model("llama");
  auto text = read_text_file(dir + "/config.json");
  ASSERT_TRUE(text.ok());
  auto config = parse_hf_config(*text, dir + "/config.json");
  ASSERT_TRUE(config.ok());
  const int64_t N = g_comm->size(), KV = config->n_heads_kv;
  const int64_t hkv = std::max<int64_t>(1, KV / N);
  if (N * hkv <= KV) GTEST_SKIP() << "no KV head is replicated over " << N << " ranks";
  // Head-sharded: bytes of one block (all layers' K and V, f32, block_size 4) on a rank.
  const int64_t block = 2 * config->n_layers * 4 * hkv * config->head_dim * 4;
  ServingMetrics hs, bs;
  serve_and_check(dir, static_cast<int>(N), 1, 1, 8, "head-sharded", 40 * block, true, &hs);
  serve_and_check(dir, static_cast<int>(N), 1, 1, 8, "batch-sharded", 40 * block, false, &bs);
  if (g_comm->rank() != 0) return;
  EXPECT_EQ(hs.kv_blocks_total, 40);
  EXPECT_EQ(bs.kv_blocks_total, 40 * N * hkv / KV);  // 80 at 4 ranks
  EXPECT_EQ(bs.running_max, 8);
  std::printf(
      "[ info ] TP=%lld, %lld bytes of KV per rank: head-sharded %lld blocks, %lld "
      "preemptions; batch-sharded %lld blocks, %lld preemptions, %lld running at once\n",
      static_cast<long long>(N), static_cast<long long>(40 * block),
      static_cast<long long>(hs.kv_blocks_total), static_cast<long long>(hs.preemptions_total),
      static_cast<long long>(bs.kv_blocks_total), static_cast<long long>(bs.preemptions_total),
      static_cast<long long>(bs.running_max));
}

// Expert parallelism over the whole world (Qwen2-MoE: 8 experts, a shared expert, a dense
// layer): the followers' forward passes join rank 0's all-to-alls in every sparse layer.
TEST(TpServing, ExpertParallelGreedyOutputsEqualOneRank) {
  serve_and_check(std::string(STRATA_FIXTURE_DIR) + "/moe/qwen2_moe", 1, 1, g_comm->size(),
                  kRequests);
}

// Pipeline stages as processes: PP = 2 with two ranks, TP = 2 x PP = 2 with four; 32 requests.
TEST(PpServing, GreedyOutputsOf32ConcurrentRequestsEqualOneRank) {
  const int w = g_comm->size();
  serve_and_check(testing::fixture_model("llama"), w / 2, 2, 1, 32);
}

}  // namespace
}  // namespace strata
