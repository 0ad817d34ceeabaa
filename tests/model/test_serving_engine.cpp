// ServingEngine on the CPU fixtures: concurrent greedy requests give exactly what the
// single-request Engine gives for each alone, also under preemption (swap and recompute) and
// prefix caching; cancellation, stop strings, logprobs and metrics.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "fixture_util.h"
#include "kv_offload_util.h"
#include "runtime/executor.h"
#include "strata/engine.h"
#include "strata/serving.h"

namespace strata {
namespace {

struct Output {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<TokenLogprob> logprobs;
  bool finished = false;
  std::string finish_reason;
  int64_t cached_prompt_tokens = 0, completion_tokens = 0;
  int events = 0;
};

// Collects the events of many requests and waits for all of them to finish.
class Collector {
 public:
  ServingEngine::Callback callback(int key) {
    return [this, key](const CompletionEvent& ev) {
      std::lock_guard<std::mutex> lk(mu_);
      Output& o = out_[key];
      EXPECT_FALSE(o.finished) << "event after the final one";
      o.tokens.insert(o.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      o.text += ev.text;
      o.logprobs.insert(o.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
      ++o.events;
      if (ev.finished) {
        o.finished = true;
        o.finish_reason = ev.finish_reason;
        o.cached_prompt_tokens = ev.cached_prompt_tokens;
        o.completion_tokens = ev.completion_tokens;
        ++n_finished_;
        cv_.notify_all();
      }
    };
  }
  bool wait(int n, double seconds = 120) {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, std::chrono::duration<double>(seconds),
                        [&] { return n_finished_ >= n; });
  }
  Output get(int key) {
    std::lock_guard<std::mutex> lk(mu_);
    return out_[key];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, Output> out_;
  int n_finished_ = 0;
};

struct Job {
  std::vector<int32_t> prompt;
  int64_t max_tokens;
};

std::vector<Job> make_jobs(int n) {
  std::vector<Job> jobs;
  uint32_t state = 12345;
  for (int i = 0; i < n; ++i) {
    Job j;
    const int len = 3 + (i * 37) % 61;
    for (int t = 0; t < len; ++t) {
      state = state * 1664525u + 1013904223u;
      j.prompt.push_back(static_cast<int32_t>(3 + (state >> 8) % 400));
    }
    j.max_tokens = 4 + (i * 7) % 17;
    jobs.push_back(std::move(j));
  }
  return jobs;
}

std::vector<int32_t> reference_tokens(Engine& engine, const Job& job) {
  GenerateRequest req;
  req.prompt_tokens = job.prompt;
  req.max_tokens = job.max_tokens;
  req.sampling.temperature = 0.0f;
  req.ignore_eos = true;
  auto out = engine.generate(req, nullptr);
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  return out.ok() ? out->tokens : std::vector<int32_t>{};
}

CompletionRequest greedy(const Job& job) {
  CompletionRequest r;
  r.prompt_tokens = job.prompt;
  r.max_tokens = job.max_tokens;
  r.sampling.temperature = 0.0f;
  r.ignore_eos = true;
  return r;
}

ServingConfig base_config(const std::string& model) {
  ServingConfig cfg;
  cfg.engine.model = testing::fixture_model(model);
  cfg.max_num_batched_tokens = 64;
  cfg.num_kv_blocks = 256;
  cfg.block_size = 16;
  return cfg;
}

// Waits (briefly) until the loop has published idle metrics.
ServingMetrics idle_metrics(ServingEngine& engine) {
  ServingMetrics m;
  for (int i = 0; i < 200; ++i) {
    m = engine.metrics();
    if (m.running == 0 && m.waiting == 0 && m.swapped == 0 && m.kv_blocks_used == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return m;
}

void check_matches_engine(const std::string& model, ServingConfig cfg, bool expect_preemption) {
  EngineConfig ecfg;
  ecfg.model = testing::fixture_model(model);
  auto engine = Engine::create(ecfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<Job> jobs = make_jobs(16);
  std::vector<std::vector<int32_t>> expected;
  for (const Job& j : jobs) expected.push_back(reference_tokens(**engine, j));

  auto serving = ServingEngine::create(cfg);
  ASSERT_TRUE(serving.ok()) << serving.status().to_string();
  Collector col;
  for (size_t i = 0; i < jobs.size(); ++i) {
    auto id = (*serving)->submit(greedy(jobs[i]), col.callback(static_cast<int>(i)));
    ASSERT_TRUE(id.ok()) << id.status().to_string();
  }
  ASSERT_TRUE(col.wait(static_cast<int>(jobs.size())));
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Output o = col.get(static_cast<int>(i));
    EXPECT_EQ(o.tokens, expected[i]) << model << " request " << i;
    EXPECT_EQ(o.finish_reason, "length");
    EXPECT_EQ(o.completion_tokens, jobs[i].max_tokens);
  }
  const ServingMetrics m = idle_metrics(**serving);
  EXPECT_EQ(m.running, 0);
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_EQ(m.requests_finished_total, 16);
  EXPECT_EQ(m.ttft_count, 16);
  EXPECT_EQ(m.e2e_count, 16);
  if (expect_preemption) {
    EXPECT_GT(m.preemptions_total, 0);
    ::testing::Test::RecordProperty("preemptions", static_cast<int>(m.preemptions_total));
  }
  (*serving)->shutdown(true);
}

class ServingFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(ServingFixture, ConcurrentGreedyMatchesEngine) {
  check_matches_engine(GetParam(), base_config(GetParam()), false);
}

TEST_P(ServingFixture, PreemptionBySwapKeepsOutputs) {
  ServingConfig cfg = base_config(GetParam());
  cfg.block_size = 4;
  cfg.num_kv_blocks = 24;
  cfg.preemption_mode = PreemptionMode::kSwap;
  check_matches_engine(GetParam(), cfg, true);
}

TEST_P(ServingFixture, PreemptionByRecomputeKeepsOutputs) {
  ServingConfig cfg = base_config(GetParam());
  cfg.block_size = 4;
  cfg.num_kv_blocks = 24;
  cfg.preemption_mode = PreemptionMode::kRecompute;
  check_matches_engine(GetParam(), cfg, true);
}

// Pipeline stages under the serving engine: three stages of one layer each, KV blocks swapped
// out and back across every stage's pool; outputs equal the single-rank engine's.
TEST(ServingPipeline, ThreeStagesWithSwapKeepOutputs) {
  ServingConfig cfg = base_config("llama");
  cfg.engine.parallel.pp = 3;
  cfg.block_size = 4;
  cfg.num_kv_blocks = 24;
  cfg.preemption_mode = PreemptionMode::kSwap;
  check_matches_engine("llama", cfg, true);
}

INSTANTIATE_TEST_SUITE_P(Cpu, ServingFixture, ::testing::Values("llama", "qwen2"),
                         [](const auto& info) { return std::string(info.param); });

// Issue 11 item 3, --kv-offload: 32 concurrent greedy requests with a device pool of 24 blocks
// of 16 (about 8 of these requests' worth): the host pool holds the KV, the running sequences
// take turns on the device in groups, and every completion equals the single-request engine's.
// The batch reached is larger than the device pool alone allows.
class ServingKvOffload : public ::testing::TestWithParam<const char*> {};

TEST_P(ServingKvOffload, LargerBatchThanTheDevicePoolKeepsOutputs) {
  const std::string model = GetParam();
  EngineConfig ecfg;
  ecfg.model = testing::fixture_model(model);
  auto engine = Engine::create(ecfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<Job> jobs = make_jobs(32);
  ServingConfig cfg = base_config(model);
  cfg.engine.max_model_len = 96;  // 6 blocks: half the device pool holds two such sequences
  cfg.max_num_seqs = 32;
  cfg.num_kv_blocks = 24;
  cfg.kv_offload = true;
  auto serving = ServingEngine::create(cfg);
  ASSERT_TRUE(serving.ok()) << serving.status().to_string();
  Collector col;
  for (size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_TRUE((*serving)->submit(greedy(jobs[i]), col.callback(static_cast<int>(i))).ok());
  }
  ASSERT_TRUE(col.wait(static_cast<int>(jobs.size())));
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Output o = col.get(static_cast<int>(i));
    EXPECT_EQ(o.tokens, reference_tokens(**engine, jobs[i])) << model << " request " << i;
    EXPECT_EQ(o.finish_reason, "length");
  }
  const ServingMetrics m = idle_metrics(**serving);
  EXPECT_EQ(m.kv_offload_groups, 8);  // default: 96 host blocks, regions of 12
  EXPECT_EQ(m.kv_host_blocks_total, 96);
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_EQ(m.requests_finished_total, 32);
  // About 8 of these sequences fit the 24 device blocks at once; offload ran more.
  EXPECT_GT(m.running_max, 12);
  EXPECT_GT(m.kv_offload_loaded_blocks_total, 0);
  EXPECT_GT(m.kv_offload_stored_blocks_total, 0);
  ::testing::Test::RecordProperty("running_max", static_cast<int>(m.running_max));
  (*serving)->shutdown(true);
}

INSTANTIATE_TEST_SUITE_P(Cpu, ServingKvOffload, ::testing::Values("llama", "gpt2"),
                         [](const auto& info) { return std::string(info.param); });

// Two groups forced, and a host pool given in bytes.
TEST(ServingKvOffloadConfig, ForcedGroupsAndHostBytes) {
  ServingConfig cfg = base_config("llama");
  cfg.engine.max_model_len = 64;
  cfg.num_kv_blocks = 16;
  cfg.max_num_seqs = 8;
  cfg.kv_offload = true;
  cfg.kv_offload_groups = 2;
  cfg.kv_host_bytes = int64_t{1} << 20;
  auto serving = ServingEngine::create(cfg);
  ASSERT_TRUE(serving.ok()) << serving.status().to_string();
  const ServingMetrics m = idle_metrics(**serving);
  EXPECT_EQ(m.kv_offload_groups, 2);
  EXPECT_GT(m.kv_host_blocks_total, 16);
  Collector col;
  const std::vector<Job> jobs = make_jobs(6);
  for (size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_TRUE((*serving)->submit(greedy(jobs[i]), col.callback(static_cast<int>(i))).ok());
  }
  ASSERT_TRUE(col.wait(6));
  EXPECT_EQ(col.get(5).completion_tokens, jobs[5].max_tokens);
}

// The CPU executor's offload copies (two copy threads) move blocks there and back exactly.
TEST(ServingKvOffloadConfig, ExecutorRoundTripIsExact) {
  EngineConfig ecfg;
  ecfg.model = testing::fixture_model("llama");
  ecfg.max_model_len = 64;
  ExecutorOptions eo;
  eo.cpu_blocks = 8;
  auto loaded = load_executor(ecfg, eo);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  testing::check_offload_round_trip(*loaded->exec);
}

TEST(ServingKvOffloadConfig, ClearErrors) {
  auto fails_with = [](ServingConfig cfg, const char* what) {
    auto s = ServingEngine::create(cfg);
    ASSERT_FALSE(s.ok()) << what;
    EXPECT_NE(s.status().message().find(what), std::string::npos) << s.status().message();
  };
  ServingConfig cfg = base_config("llama");
  cfg.engine.max_model_len = 64;
  cfg.num_kv_blocks = 16;
  cfg.kv_offload = true;
  {
    ServingConfig c = cfg;
    c.engine.parallel.pp = 2;
    fails_with(c, "--kv-offload runs on one rank");
  }
  {
    ServingConfig c = cfg;
    c.num_kv_blocks = 6;  // half of it cannot hold one 64-token sequence (4 blocks)
    fails_with(c, "half the device KV pool");
  }
  {
    ServingConfig c = cfg;
    c.kv_host_bytes = 1;  // no block
    fails_with(c, "must be larger than the device pool");
  }
  {
    ServingConfig c = cfg;
    c.kv_offload_groups = 1;
    fails_with(c, "--kv-offload-groups");
  }
}

TEST(ServingEngine, PrefixCacheReportsCachedTokensAndKeepsOutput) {
  EngineConfig ecfg;
  ecfg.model = testing::fixture_model("llama");
  auto engine = Engine::create(ecfg);
  ASSERT_TRUE(engine.ok());
  std::vector<Job> jobs = make_jobs(2);
  std::vector<int32_t> prefix;
  for (int i = 0; i < 48; ++i) prefix.push_back(10 + (i * 13) % 300);
  for (Job& j : jobs) j.prompt.insert(j.prompt.begin(), prefix.begin(), prefix.end());
  auto serving = ServingEngine::create(base_config("llama"));
  ASSERT_TRUE(serving.ok()) << serving.status().to_string();
  Collector col;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE((*serving)->submit(greedy(jobs[static_cast<size_t>(i)]), col.callback(i)).ok());
    ASSERT_TRUE(col.wait(i + 1));
  }
  EXPECT_EQ(col.get(0).cached_prompt_tokens, 0);
  EXPECT_EQ(col.get(1).cached_prompt_tokens, 48);  // three full blocks of 16
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(col.get(i).tokens, reference_tokens(**engine, jobs[static_cast<size_t>(i)]));
  }
  const ServingMetrics m = idle_metrics(**serving);
  EXPECT_EQ(m.prefix_cache_hits_total, 48);
  EXPECT_EQ(m.kv_blocks_used, 0);
}

TEST(ServingEngine, CancelAbortsAndFreesBlocks) {
  auto serving = ServingEngine::create(base_config("llama"));
  ASSERT_TRUE(serving.ok()) << serving.status().to_string();
  ServingEngine* eng = serving->get();
  Collector col;
  Job job = make_jobs(1)[0];
  CompletionRequest req = greedy(job);
  req.max_tokens = 200;
  std::mutex mu;
  uint64_t id = 0;
  bool cancelled = false;
  auto inner = col.callback(0);
  auto id_or = eng->submit(req, [&](const CompletionEvent& ev) {
    inner(ev);
    std::lock_guard<std::mutex> lk(mu);
    if (!cancelled && id != 0 && !ev.finished && ev.completion_tokens >= 3) {
      cancelled = true;
      eng->cancel(id);
    }
  });
  ASSERT_TRUE(id_or.ok());
  {
    std::lock_guard<std::mutex> lk(mu);
    id = *id_or;
  }
  // Callbacks that run before `id` is set skip the cancel; a later one does it.
  ASSERT_TRUE(col.wait(1));
  const Output o = col.get(0);
  EXPECT_EQ(o.finish_reason, "abort");
  EXPECT_LT(o.tokens.size(), 200u);
  const ServingMetrics m = idle_metrics(*eng);
  EXPECT_EQ(m.running, 0);
  EXPECT_EQ(m.waiting, 0);
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_EQ(m.kv_blocks_total, 256);
  // Issue 16 item 9: an aborted request is not a success.
  EXPECT_EQ(m.requests_finished_total, 0);
}

// Issue 16 item 10: with no --num-kv-blocks / --kv-cache-bytes the pool holds max_num_seqs
// sequences of max_model_len (it was 1 GiB whatever the model), ...
TEST(ServingEngine, KvPoolSizedFromSeqsAndContext) {
  ServingConfig cfg = base_config("llama");
  cfg.num_kv_blocks = 0;
  cfg.max_num_seqs = 4;
  cfg.engine.max_model_len = 64;
  auto serving = ServingEngine::create(cfg);
  ASSERT_TRUE(serving.ok()) << serving.status().to_string();
  EXPECT_EQ(idle_metrics(**serving).kv_blocks_total, 4 * 64 / 16);
  EXPECT_EQ((*serving)->info().kv_cache_blocks, 16);
}

int64_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// ... and host memory for the pool and the swap area is committed as blocks are used, not at
// start (a 780 KB model held 2.1 GB resident).
TEST(ServingEngine, HostMemoryIsCommittedLazily) {
  ServingConfig cfg = base_config("llama");
  cfg.num_kv_blocks = 0;
  cfg.kv_cache_bytes = int64_t{512} << 20;
  cfg.swap_space_bytes = int64_t{512} << 20;
  const int64_t before = resident_bytes();
  auto serving = ServingEngine::create(cfg);
  ASSERT_TRUE(serving.ok()) << serving.status().to_string();
  const int64_t grown = resident_bytes() - before;
  EXPECT_GT(idle_metrics(**serving).kv_blocks_total, 1000);
  EXPECT_LT(grown, int64_t{64} << 20) << "resident memory grew by " << (grown >> 20) << " MiB";
}

TEST(ServingEngine, StopStringsAreNotEmitted) {
  auto serving = ServingEngine::create(base_config("llama"));
  ASSERT_TRUE(serving.ok()) << serving.status().to_string();
  Collector col;
  Job job = make_jobs(3)[2];
  job.max_tokens = 24;
  ASSERT_TRUE((*serving)->submit(greedy(job), col.callback(0)).ok());
  ASSERT_TRUE(col.wait(1));
  const std::string full = col.get(0).text;
  ASSERT_GE(full.size(), 8u) << "the fixture produced too little text";
  // A stop string from the middle of the text: everything before its first occurrence is
  // emitted, nothing from it on.
  const std::string stop = full.substr(full.size() / 2, 3);
  const size_t at = full.find(stop);
  CompletionRequest req = greedy(job);
  req.stop = {stop};
  ASSERT_TRUE((*serving)->submit(req, col.callback(1)).ok());
  ASSERT_TRUE(col.wait(2));
  const Output o = col.get(1);
  EXPECT_EQ(o.finish_reason, "stop");
  EXPECT_EQ(o.text, full.substr(0, at));
}

TEST(ServingEngine, GreedyLogprobsAreTheMaxLogSoftmax) {
  auto serving = ServingEngine::create(base_config("llama"));
  ASSERT_TRUE(serving.ok()) << serving.status().to_string();
  Collector col;
  CompletionRequest req = greedy(make_jobs(2)[1]);
  req.top_logprobs = 3;
  ASSERT_TRUE((*serving)->submit(req, col.callback(0)).ok());
  ASSERT_TRUE(col.wait(1));
  const Output o = col.get(0);
  ASSERT_EQ(o.logprobs.size(), o.tokens.size());
  for (size_t i = 0; i < o.logprobs.size(); ++i) {
    const TokenLogprob& lp = o.logprobs[i];
    EXPECT_EQ(lp.token, o.tokens[i]);
    ASSERT_EQ(lp.top.size(), 3u);
    EXPECT_EQ(lp.top[0].first, lp.token);
    EXPECT_FLOAT_EQ(lp.top[0].second, lp.logprob);
    EXPECT_LE(lp.logprob, 0.0f);
    EXPECT_GE(lp.top[0].second, lp.top[1].second);
  }
}

TEST(ServingEngine, ChatTemplateAndValidation) {
  auto serving = ServingEngine::create(base_config("llama"));
  ASSERT_TRUE(serving.ok()) << serving.status().to_string();
  auto text = (*serving)->apply_chat_template(R"([{"role":"user","content":"hi"}])", true, "");
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_NE(text->find("hi"), std::string::npos);
  EXPECT_NE(text->find("<|im_start|>"), std::string::npos);
  auto toks = (*serving)->tokenize("hello world", false);
  ASSERT_TRUE(toks.ok());
  EXPECT_EQ((*serving)->detokenize(*toks), "hello world");
  CompletionRequest empty;
  EXPECT_FALSE((*serving)->submit(empty, nullptr).ok());
  CompletionRequest too_long;
  too_long.prompt_tokens.assign(300, 5);
  EXPECT_EQ((*serving)->submit(too_long, nullptr).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ((*serving)->model_name(), "llama");
}

}  // namespace
}  // namespace strata
