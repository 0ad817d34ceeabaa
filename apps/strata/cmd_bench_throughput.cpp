// `strata bench-throughput`: offline throughput, like vLLM's `benchmark_throughput` and
// TensorRT-LLM's `trtllm-bench throughput`: the serving engine runs in this process (no HTTP),
// every request is queued at once (random token-id prompts, greedy, ignore_eos, fixed lengths)
// and the engine's continuous batching works through them. Prints requests/s and tokens/s over
// the wall time from the first submit to the last completion. A warm-up batch (not counted)
// runs first so CUDA-graph captures and GEMM autotuning stay out of the numbers.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "commands.h"
#include "strata/serving.h"

namespace strata::app {

namespace {

struct ThroughputOptions {
  ServingConfig serving;
  int num_prompts = 1000;
  int input_len = 128;
  int output_len = 128;
  int warmup = 32;
  uint64_t seed = 0;
  std::string json_path;
};

struct Run {
  double seconds = 0;
  int64_t output_tokens = 0, input_tokens = 0, failed = 0;
  std::string first_error;
};

Result<Run> run_batch(ServingEngine& engine, const std::vector<std::vector<int32_t>>& prompts,
                      int output_len) {
  std::mutex mu;
  std::condition_variable cv;
  int64_t done = 0;
  Run run;
  std::atomic<int64_t> out_tokens{0};
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& p : prompts) {
    CompletionRequest req;
    req.prompt_tokens = p;
    req.max_tokens = output_len;
    req.sampling.temperature = 0.0f;
    req.ignore_eos = true;
    run.input_tokens += static_cast<int64_t>(p.size());
    auto id = engine.submit(std::move(req), [&](const CompletionEvent& ev) {
      if (!ev.finished) return;
      std::lock_guard<std::mutex> lock(mu);
      out_tokens += ev.completion_tokens;
      if (ev.finish_reason == "error" || ev.finish_reason == "abort") {
        ++run.failed;
        if (run.first_error.empty()) run.first_error = ev.error.message();
      }
      ++done;
      cv.notify_all();
    });
    if (!id.ok()) return id.status();
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done == static_cast<int64_t>(prompts.size()); });
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  run.output_tokens = out_tokens;
  return run;
}

std::vector<std::vector<int32_t>> random_prompts(int n, int len, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t lo = vocab > 1000 ? 100 : 0;  // skip the low ids where special tokens live
  std::uniform_int_distribution<int64_t> tok(lo, std::max<int64_t>(lo, vocab - 1));
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(n));
  for (auto& p : out) {
    for (int i = 0; i < len; ++i) p.push_back(static_cast<int32_t>(tok(rng)));
  }
  return out;
}

int bench_throughput(ThroughputOptions& o) {
  if (o.num_prompts < 1 || o.input_len < 1 || o.output_len < 1 || o.warmup < 0) {
    return report(
        Status(StatusCode::kInvalidArgument,
               "--num-prompts, --input-len and --output-len must be >= 1, --warmup >= 0"));
  }
  if (o.serving.engine.model.empty() && o.serving.engine.model_config.empty()) {
    return report(Status(StatusCode::kInvalidArgument, "give a model (-m) or --model-config"));
  }
  if (o.serving.engine.model.empty()) o.serving.engine.model = o.serving.engine.model_config;
  if (o.serving.engine.max_model_len <= 0) {
    o.serving.engine.max_model_len = o.input_len + o.output_len;
  }
  if (Status s = check_before_load(o.serving.engine, nullptr); !s.ok()) return report(s);
  auto engine = ServingEngine::create(o.serving);
  if (!engine.ok()) return report(engine.status());
  ServingEngine& e = **engine;
  const ModelInfo& info = e.info();
  if (o.warmup > 0) {
    auto w =
        run_batch(e, random_prompts(o.warmup, o.input_len, info.vocab, o.seed + 1), o.output_len);
    if (!w.ok()) return report(w.status());
  }
  auto r =
      run_batch(e, random_prompts(o.num_prompts, o.input_len, info.vocab, o.seed), o.output_len);
  if (!r.ok()) return report(r.status());
  const ServingMetrics m = e.metrics();
  e.shutdown(true);
  const Run& run = *r;
  const double s = run.seconds;
  std::printf("strata bench-throughput: %s (%s%s%s, weights %s), %d prompts x %d in / %d out\n",
              info.path.c_str(), info.backend.c_str(), info.device_name.empty() ? "" : " ",
              info.device_name.c_str(),
              info.weight_format.empty() ? info.dtype.c_str() : info.weight_format.c_str(),
              o.num_prompts, o.input_len, o.output_len);
  std::printf("Throughput: %.2f requests/s, %.1f total tokens/s, %.1f output tokens/s (%.2f s)\n",
              o.num_prompts / s, static_cast<double>(run.input_tokens + run.output_tokens) / s,
              static_cast<double>(run.output_tokens) / s, s);
  // Forward passes (warm-up included): how full they were and, with pipeline stages, how many
  // were in flight and the bubble.
  const double tokens_per_step =
      m.steps_total > 0 ? static_cast<double>(m.step_tokens_total) / m.steps_total : 0.0;
  std::printf("Steps: %lld forward passes, %.1f tokens each, at most %lld in flight",
              static_cast<long long>(m.steps_total), tokens_per_step,
              static_cast<long long>(m.max_steps_in_flight));
  if (m.pipeline_bubble >= 0) std::printf(", pipeline bubble %.1f%%", 100 * m.pipeline_bubble);
  std::printf("\n");
  // The batch the KV pool allowed: the most sequences running at once (warm-up included).
  std::printf("Batch reached: %lld sequences running at once (device KV pool %lld blocks of %lld",
              static_cast<long long>(m.running_max), static_cast<long long>(info.kv_cache_blocks),
              static_cast<long long>(info.kv_block_size));
  if (o.serving.kv_offload) {
    std::printf("; KV offload: %lld groups, host pool %lld blocks, %lld blocks loaded, %lld stored",
                static_cast<long long>(m.kv_offload_groups),
                static_cast<long long>(m.kv_host_blocks_total),
                static_cast<long long>(m.kv_offload_loaded_blocks_total),
                static_cast<long long>(m.kv_offload_stored_blocks_total));
  }
  std::printf(")\n");
  if (run.failed > 0) {
    std::fprintf(stderr, "strata: bench-throughput: %lld requests failed: %s\n",
                 static_cast<long long>(run.failed), run.first_error.c_str());
  }
  if (!o.json_path.empty()) {
    nlohmann::ordered_json j{
        {"model", info.path},
        {"backend", info.backend},
        {"device", info.device_name},
        {"weights", info.weight_format.empty() ? info.dtype : info.weight_format},
        {"num_prompts", o.num_prompts},
        {"input_len", o.input_len},
        {"output_len", o.output_len},
        {"max_num_seqs", o.serving.max_num_seqs},
        {"max_num_batched_tokens", o.serving.max_num_batched_tokens},
        {"elapsed_s", s},
        {"requests_per_s", o.num_prompts / s},
        {"total_tokens_per_s", static_cast<double>(run.input_tokens + run.output_tokens) / s},
        {"output_tokens_per_s", static_cast<double>(run.output_tokens) / s},
        {"output_tokens", run.output_tokens},
        {"batch_reached", m.running_max},
        {"kv_cache_blocks", info.kv_cache_blocks},
        {"kv_block_size", info.kv_block_size},
        {"kv_offload", o.serving.kv_offload},
        {"kv_offload_groups", m.kv_offload_groups},
        {"kv_host_blocks", m.kv_host_blocks_total},
        {"kv_offload_loaded_blocks", m.kv_offload_loaded_blocks_total},
        {"kv_offload_stored_blocks", m.kv_offload_stored_blocks_total},
        {"failed", run.failed},
        {"steps", m.steps_total},
        {"tokens_per_step", tokens_per_step},
        {"max_steps_in_flight", m.max_steps_in_flight}};
    if (m.pipeline_bubble >= 0) j["pipeline_bubble"] = m.pipeline_bubble;
    std::ofstream f(o.json_path);
    f << j.dump(2) << "\n";
    if (!f) return report(Status(StatusCode::kIoError, "cannot write " + o.json_path));
  }
  return run.failed > 0 ? 1 : 0;
}

}  // namespace

void add_bench_throughput_command(CLI::App& app, std::vector<Command>& commands) {
  auto o = std::make_shared<ThroughputOptions>();
  o->serving.max_num_seqs = 256;
  o->serving.max_num_batched_tokens = 8192;
  CLI::App* sub = app.add_subcommand(
      "bench-throughput", "Offline throughput: all requests queued at once, in-process engine");
  sub->add_option("-m,--model", o->serving.engine.model,
                  "Model: a .gguf file, a checkpoint directory or an alias (or --model-config)");
  sub->add_option("--num-prompts", o->num_prompts, "Requests (default 1000)");
  sub->add_option("--input-len", o->input_len, "Prompt tokens per request (default 128)");
  sub->add_option("--output-len", o->output_len, "Generated tokens per request (default 128)");
  sub->add_option("--warmup", o->warmup, "Warm-up requests, not counted (default 32)");
  sub->add_option("--seed", o->seed, "Seed for the prompts (default 0)");
  sub->add_option("--max-num-seqs", o->serving.max_num_seqs,
                  "Sequences running at once (default 256)");
  sub->add_option("--max-num-batched-tokens", o->serving.max_num_batched_tokens,
                  "Token budget per engine step (default 8192)");
  sub->add_option("--block-size", o->serving.block_size, "Tokens per KV-cache block (default 16)");
  sub->add_option("--num-kv-blocks", o->serving.num_kv_blocks,
                  "KV blocks; 0 = from --kv-cache-bytes on the CPU, fill memory on CUDA");
  sub->add_option("--kv-cache-bytes", o->serving.kv_cache_bytes, "CPU KV cache bytes (1 GiB)");
  sub->add_option("-c,--max-model-len", o->serving.engine.max_model_len,
                  "Context length (default input + output length)");
  sub->add_option("-t,--threads", o->serving.engine.num_threads, "CPU threads; 0 = all cores");
  sub->add_option("--json", o->json_path, "Also write the result as JSON to this file");
  add_kv_offload_options(sub, o->serving);
  add_engine_device_options(sub, o->serving.engine, /*with_dummy=*/true,
                            /*with_batch_tokens=*/false);
  commands.push_back({sub, [o]() { return bench_throughput(*o); }});
}

}  // namespace strata::app
