// `strata bench`: two tables.
//
// llama-bench style (default): pp<N> = one prefill of N tokens, tg<N> = N single-token decode
// steps from an empty context; mean ± stddev of tokens/s over -r runs after one warm-up.
//
// Serving-engine style (--batch / --prefill / --ctx, the usual form on a GPU): per decode batch
// size, ms per step at KV length --ctx (greedy, argmax on the device), tokens/s and the weight
// bandwidth that implies; per prefill BxL, the forward time, TFLOP/s and MFU; per -p N, the time
// to first token of an N-token prompt (upload, forward, logits back). Medians over -r runs.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "strata/bench.h"

namespace strata::app {

namespace {

struct BenchOptions {
  EngineConfig engine;
  bool offline = false;
  std::vector<int64_t> n_prompt;
  std::vector<int64_t> n_gen;
  std::vector<int64_t> batch;
  std::vector<std::string> prefill;
  int64_t ctx = 0;
  int64_t decode_steps = 32;
  int repetitions = 5;
  double peak_tflops = 0;
  double peak_gbps = 0;
  std::string json_path;
  bool offload = false;  // --offload: the KV-cache choice, then the resident-layers choice
  std::string choice;    // the row's choice under --offload ("kv_cache", "resident_layers")
};

struct Stats {
  double mean = 0, stddev = 0, median = 0;
  std::vector<double> samples;
};

Stats stats(std::vector<double> v) {
  Stats s;
  s.samples = v;
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  for (double x : v) s.stddev += (x - s.mean) * (x - s.mean);
  s.stddev = v.size() > 1 ? std::sqrt(s.stddev / static_cast<double>(v.size() - 1)) : 0.0;
  std::sort(v.begin(), v.end());
  s.median = v[v.size() / 2];
  return s;
}

std::string size_string(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f MiB", bytes / (1024.0 * 1024.0));
  if (bytes >= 1024.0 * 1024.0 * 1024.0) {
    std::snprintf(buf, sizeof(buf), "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  }
  return buf;
}

// Dense bf16 tensor-core peak by device name (datasheet, no sparsity), for MFU; 0 if unknown.
double default_peak_tflops(const std::string& device) {
  if (device.find("H100") != std::string::npos || device.find("H200") != std::string::npos) {
    return 989.4;
  }
  if (device.find("A100") != std::string::npos) return 312.0;
  return 0.0;
}

bool parse_bxl(const std::string& s, int64_t* b, int64_t* l) {
  const size_t x = s.find('x');
  if (x == std::string::npos) return false;
  try {
    size_t u = 0, v = 0;
    *b = std::stoll(s.substr(0, x), &u);
    *l = std::stoll(s.substr(x + 1), &v);
    return u == x && v == s.size() - x - 1 && *b > 0 && *l > 0;
  } catch (...) {
    return false;
  }
}

int run_llama_bench(const BenchOptions& opt, Benchmark& e) {
  const ModelInfo& info = e.info();
  const int threads = opt.engine.num_threads > 0 ? opt.engine.num_threads : omp_get_max_threads();
  const bool to_stdout = opt.json_path == "-";
  // The command has set the defaults and dropped the 0 lengths (tests skipped, as llama-bench).
  const std::vector<int64_t>& n_prompt = opt.n_prompt;
  const std::vector<int64_t>& n_gen = opt.n_gen;
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  char model_name[96];
  std::snprintf(model_name, sizeof(model_name), "%s %.0fM %s", info.architecture.c_str(),
                static_cast<double>(info.n_params) / 1e6, info.dtype.c_str());
  if (info.backend == "CPU") std::fprintf(stderr, "cpu kernels: %s\n", cpu_kernel_path().c_str());
  if (!to_stdout) {
    std::printf("| %-28s | %12s | %10s | %-7s | %7s | %8s | %20s |\n", "model", "size", "params",
                "backend", "threads", "test", "t/s");
    std::printf("| %s | %s: | %s: | %s | %s: | %s: | %s: |\n", std::string(28, '-').c_str(),
                std::string(11, '-').c_str(), std::string(9, '-').c_str(),
                std::string(7, '-').c_str(), std::string(6, '-').c_str(),
                std::string(7, '-').c_str(), std::string(19, '-').c_str());
  }
  auto run_test = [&](const std::string& name, int64_t n, bool prefill) -> Status {
    std::vector<double> tps;
    for (int r = -1; r < opt.repetitions; ++r) {  // r = -1: warm-up
      auto s = prefill ? e.time_prefill(n, static_cast<uint64_t>(r + 1))
                       : e.time_decode(0, n, static_cast<uint64_t>(r + 1));
      if (!s.ok()) return s.status();
      if (r >= 0) tps.push_back(static_cast<double>(n) / *s);
    }
    const Stats st = stats(tps);
    if (!to_stdout) {
      char tput[48];
      std::snprintf(tput, sizeof(tput), "%.2f ± %.2f", st.mean, st.stddev);
      std::printf("| %-28s | %12s | %9.2f M | %-7s | %7d | %8s | %20s |\n", model_name,
                  size_string(static_cast<double>(info.weight_bytes)).c_str(),
                  static_cast<double>(info.n_params) / 1e6, info.backend.c_str(), threads,
                  name.c_str(), tput);
      std::fflush(stdout);
    }
    results.push_back({{"model", info.path},
                       {"architecture", info.architecture},
                       {"dtype", info.dtype},
                       {"model_bytes", info.weight_bytes},
                       {"n_params", info.n_params},
                       {"backend", info.backend},
                       {"n_threads", threads},
                       {"test", name},
                       {"n_prompt", prefill ? n : 0},
                       {"n_gen", prefill ? 0 : n},
                       {"avg_ts", st.mean},
                       {"stddev_ts", st.stddev},
                       {"samples_ts", st.samples}});
    return ok_status();
  };
  for (int64_t n : n_prompt) {
    if (n > 0) {
      Status s = run_test("pp" + std::to_string(n), n, true);
      if (!s.ok()) return report(s);
    }
  }
  for (int64_t n : n_gen) {
    if (n > 0) {
      Status s = run_test("tg" + std::to_string(n), n, false);
      if (!s.ok()) return report(s);
    }
  }
  if (to_stdout) {
    std::printf("%s\n", results.dump(2).c_str());
  } else if (!opt.json_path.empty()) {
    std::ofstream out(opt.json_path);
    out << results.dump(2) << "\n";
    if (!out) return report(Status(StatusCode::kIoError, opt.json_path + ": cannot write"));
  }
  return 0;
}

// `all`: the rows of earlier runs (--offload runs two); the JSON holds them all.
int run_engine_bench(const BenchOptions& opt, Benchmark& e, nlohmann::ordered_json* all = nullptr) {
  const ModelInfo& info = e.info();
  const bool to_stdout = opt.json_path == "-";
  // MFU against the peak of every GPU the ranks use (--peak-tflops is per GPU).
  const double peak_tflops =
      static_cast<double>(std::max<int64_t>(info.n_gpus, 1)) *
      (opt.peak_tflops > 0 ? opt.peak_tflops : default_peak_tflops(info.device_name));
  const double peak_gbps = static_cast<double>(std::max<int64_t>(info.n_gpus, 1)) * opt.peak_gbps;
  // Bytes one decode step streams: every weight but the embedding table (of which only the
  // batch's rows are read); with tied embeddings the LM head reads the table itself.
  const bool bf16_emb = info.backend == "CUDA";
  const double emb_bytes = static_cast<double>(info.vocab * info.hidden) * (bf16_emb ? 2.0 : 4.0);
  // Weight streaming: the slots hold a layer at a time; a pass reads the resident weights and
  // every streamed layer once.
  const WeightStreamInfo ws = e.weight_streaming();
  // Data-parallel replicas each hold (and read) the weights: one replica's share.
  const double weights = info.backend == "CUDA"
                             ? static_cast<double>(info.device_weight_bytes / std::max(1, ws.dp) -
                                                   ws.slot_bytes + ws.bytes_per_pass)
                             : static_cast<double>(info.weight_bytes);
  const bool tied = info.tied_embeddings;
  const double streamed = tied ? weights : weights - emb_bytes;
  // KV bytes per cached token (all layers, K and V; bf16 on CUDA, f32 on the CPU).
  const double kv_token = static_cast<double>(2 * info.n_layers * info.n_heads_kv * info.head_dim) *
                          (info.backend == "CUDA" ? 2.0 : 4.0);
  // Matmul parameters as the peer counts them: all parameters but the embedding table; of a
  // mixture-of-experts model, the parameters one token uses (its k experts of each sparse layer).
  const double matmul_params = static_cast<double>(
      (info.n_experts > 0 ? info.n_active_params : info.n_params) - info.vocab * info.hidden);
  // Mixture of experts: the expert weights a decode step of b sequences touches. With routing
  // spread evenly (random weights), a layer's expert is used by none of b tokens with
  // probability (1 - k / E)^b; the step streams the other weights whole and the touched experts.
  const double expert_params = info.n_experts > 0
                                   ? static_cast<double>(info.n_moe_layers * info.n_experts * 3 *
                                                         info.hidden * info.expert_ffn_dim)
                                   : 0.0;
  const double total_params = std::max<double>(static_cast<double>(info.n_params), 1.0);
  auto streamed_at = [&](int64_t b, double dense_streamed) {
    if (info.n_experts <= 0) return dense_streamed;
    const double expert_bytes = dense_streamed * expert_params / total_params;
    const double unused = std::pow(
        1.0 - static_cast<double>(info.n_experts_used) / static_cast<double>(info.n_experts),
        static_cast<double>(b));
    return dense_streamed - expert_bytes * unused;
  };
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  if (!to_stdout) {
    std::printf("model %s (%s), backend %s%s%s, weights %s (%s on the device)\n", info.path.c_str(),
                info.architecture.c_str(), info.backend.c_str(),
                info.device_name.empty() ? "" : " ", info.device_name.c_str(),
                info.weight_format.empty() ? info.dtype.c_str() : info.weight_format.c_str(),
                size_string(weights).c_str());
    for (const std::string& line : ws.plan) std::printf("weights: %s\n", line.c_str());
    std::printf("| %-8s | %5s | %6s | %10s | %10s | %11s | %9s | %8s | %6s |\n", "test", "batch",
                "tokens", "ms", "tok/s", "weight GB/s", "%peak BW", "TFLOP/s", "MFU");
    std::printf(
        "|----------|------:|-------:|-----------:|-----------:|------------:|----------:|---------"
        ":|-------:|\n");
  }
  auto print_row = [&](const char* test, int64_t batch, int64_t tokens, double ms, double tps,
                       double gbps, double tflops) {
    if (to_stdout) return;
    char bw[16] = "-", pct[16] = "-", tf[16] = "-", mfu[16] = "-";
    if (gbps > 0) std::snprintf(bw, sizeof(bw), "%.0f", gbps);
    if (gbps > 0 && peak_gbps > 0)
      std::snprintf(pct, sizeof(pct), "%.1f%%", 100 * gbps / peak_gbps);
    if (tflops > 0) std::snprintf(tf, sizeof(tf), "%.1f", tflops);
    if (tflops > 0 && peak_tflops > 0)
      std::snprintf(mfu, sizeof(mfu), "%.1f%%", 100 * tflops / peak_tflops);
    std::printf("| %-8s | %5lld | %6lld | %10.3f | %10.1f | %11s | %9s | %8s | %6s |\n", test,
                static_cast<long long>(batch), static_cast<long long>(tokens), ms, tps, bw, pct, tf,
                mfu);
    std::fflush(stdout);
  };
  auto base = [&](const char* test) {
    nlohmann::ordered_json j;
    j["test"] = test;
    j["model"] = info.path;
    j["backend"] = info.backend;
    j["device"] = info.device_name;
    j["n_gpus"] = info.n_gpus;
    j["weights"] = info.weight_format.empty() ? info.dtype : info.weight_format;
    j["weight_bytes"] = weights;
    if (!opt.choice.empty()) {
      j["choice"] = opt.choice;
      j["kv_cache_blocks"] = info.kv_cache_blocks;
    }
    return j;
  };
  // Pipeline stages: the bubble of the row's last repetition, in the JSON row and on stderr.
  auto pipeline_bubble = [&](nlohmann::ordered_json& j, const char* test, int64_t b) {
    const double bubble = e.pipeline_bubble();
    if (bubble < 0) return;
    j["pipeline_bubble"] = bubble;
    std::fprintf(stderr, "strata: %s batch %lld: pipeline bubble %.1f%% (measured)\n", test,
                 static_cast<long long>(b), 100 * bubble);
  };
  // Weight streaming: the bytes copied into the slots per forward pass and the rate that makes
  // over the pass's time (the figure ZeRO-Inference's bound is: host-to-device bandwidth).
  // Data-parallel replicas: every replica gets the whole layers each pass (stream_GBps is per
  // replica, stream_GBps_total over all of them); under partitioned fetch each copies its part
  // from host memory (h2d_GBps_per_replica, from the counters over the row's passes) and the
  // all-gather brings the rest.
  WeightStreamInfo before = ws;
  auto streaming = [&](nlohmann::ordered_json& j, const char* test, int64_t b, double seconds) {
    if (!ws.streaming) return;
    const WeightStreamInfo now = e.weight_streaming();
    const double gbps = static_cast<double>(ws.bytes_per_pass) / seconds / 1e9;
    if (ws.dp > 1 || ws.fetch_parts > 1) {
      nlohmann::ordered_json h2d = nlohmann::ordered_json::array();
      nlohmann::ordered_json per_pass = nlohmann::ordered_json::array();
      double h2d_total = 0;
      for (size_t r = 0; r < now.replica_passes.size(); ++r) {
        const int64_t p0 = r < before.replica_passes.size() ? before.replica_passes[r] : 0;
        const int64_t b0 =
            r < before.replica_bytes_copied.size() ? before.replica_bytes_copied[r] : 0;
        const int64_t passes = now.replica_passes[r] - p0;
        const double bytes = passes > 0 ? static_cast<double>(now.replica_bytes_copied[r] - b0) /
                                              static_cast<double>(passes)
                                        : 0.0;
        per_pass.push_back(bytes);
        h2d.push_back(bytes / seconds / 1e9);
        h2d_total += bytes / seconds / 1e9;
      }
      j["dp"] = ws.dp;
      j["partitioned_fetch"] = ws.fetch_parts > 1;
      j["fetch_pieces"] = ws.fetch_pieces;
      j["stream_GBps_total"] = gbps * ws.dp;
      j["h2d_bytes_per_pass_per_replica"] = per_pass;
      j["h2d_GBps_per_replica"] = h2d;
      j["h2d_GBps_total"] = h2d_total;
      if (!to_stdout) {
        const std::string pieces =
            ws.fetch_parts > 1 ? ", " + std::to_string(ws.fetch_pieces) + " pieces per layer" : "";
        std::printf(
            "|   %d data-parallel replicas, %s%s: per replica %.1f GB/s of layers arrive "
            "(%.1f GB/s over all), host-to-device %.1f GB/s in all (%s batch %lld)\n",
            ws.dp,
            ws.fetch_parts > 1 ? "partitioned fetch (1/N of each layer from host, all-gather)"
                               : "whole layers from host",
            pieces.c_str(), gbps, gbps * ws.dp, h2d_total, test, static_cast<long long>(b));
      }
      before = now;
    }
    j["offload"] = ws.tier;
    j["prefetch"] = ws.prefetch;
    j["layers_streamed"] = ws.layers_streamed;
    j["layers_resident"] = ws.layers_resident;
    j["streamed_bytes_per_pass"] = ws.bytes_per_pass;
    j["stream_GBps"] = gbps;
    if (ws.tier == "disk") {
      j["disk_bytes_total"] = now.disk_bytes;
      j["direct_io"] = now.direct_io;
    }
    if (!to_stdout) {
      std::printf(
          "|   streamed %.2f GB per pass from %s (%lld of %lld layers, prefetch %s): %.1f GB/s "
          "effective (%s batch %lld)\n",
          static_cast<double>(ws.bytes_per_pass) / 1e9, ws.tier.c_str(),
          static_cast<long long>(ws.layers_streamed),
          static_cast<long long>(ws.layers_streamed + ws.layers_resident),
          ws.prefetch ? "on" : "off", gbps, test, static_cast<long long>(b));
    }
  };
  // Decode: ms per step at KV length ctx (the first step attends to ctx positions).
  for (int64_t b : opt.batch) {
    std::vector<double> ms;
    const int64_t ctx = std::max<int64_t>(opt.ctx, 1);
    for (int r = -1; r < opt.repetitions; ++r) {
      auto s = e.time_decode_batch(b, ctx > 1 ? ctx - 1 : 1, opt.decode_steps,
                                   static_cast<uint64_t>(r + 2));
      if (!s.ok()) return report(s.status());
      if (r >= 0) ms.push_back(*s * 1e3);
    }
    const Stats st = stats(ms);
    const double t = st.median / 1e3;
    const double kv_read =
        static_cast<double>(b) * static_cast<double>(ctx + opt.decode_steps / 2) * kv_token;
    const double step_bytes = streamed_at(b, streamed);
    const double gbps = step_bytes / t / 1e9;
    const double tflops = 2.0 * matmul_params * static_cast<double>(b) / t / 1e12;
    print_row("decode", b, b, st.median, static_cast<double>(b) / t, gbps, tflops);
    auto j = base("decode");
    pipeline_bubble(j, "decode", b);
    streaming(j, "decode", b, t);
    j["batch"] = b;
    j["ctx"] = ctx;
    j["steps"] = opt.decode_steps;
    j["ms_per_step"] = st.median;
    j["ms_samples"] = st.samples;
    j["tok_per_s"] = static_cast<double>(b) / t;
    j["weight_GBps"] = gbps;
    j["weight_bytes_streamed"] = step_bytes;
    j["weight_plus_kv_GBps"] = (step_bytes + kv_read) / t / 1e9;
    if (peak_gbps > 0) j["pct_peak_bw"] = 100 * gbps / peak_gbps;
    rows.push_back(j);
  }
  // Prefill: one forward pass over B sequences of L tokens.
  for (const std::string& spec : opt.prefill) {
    int64_t b = 0, l = 0;
    if (!parse_bxl(spec, &b, &l)) {
      return report(Status(StatusCode::kInvalidArgument,
                           "--prefill '" + spec + "': expected BxL, e.g. 8x2048"));
    }
    std::vector<double> ms;
    for (int r = -1; r < opt.repetitions; ++r) {
      auto s = e.time_prefill_batch(b, l, static_cast<uint64_t>(r + 2));
      if (!s.ok()) return report(s.status());
      if (r >= 0) ms.push_back(*s * 1e3);
    }
    const Stats st = stats(ms);
    const double t = st.median / 1e3;
    const double tokens = static_cast<double>(b * l);
    const double tflops = 2.0 * matmul_params * tokens / t / 1e12;
    // Strict count: the matmuls actually run (LM head on one row per sequence) + causal attention.
    const double lm = static_cast<double>(info.vocab * info.hidden);
    const double attn = 4.0 * static_cast<double>(info.n_layers * info.n_heads * info.head_dim) *
                        static_cast<double>(b) * static_cast<double>(l) *
                        static_cast<double>(l + 1) / 2.0;
    const double strict = (2.0 * (matmul_params - (tied ? 0.0 : lm)) * tokens +
                           2.0 * lm * static_cast<double>(b) + attn) /
                          t / 1e12;
    print_row("prefill", b, b * l, st.median, tokens / t, 0, tflops);
    auto j = base("prefill");
    pipeline_bubble(j, "prefill", b);
    streaming(j, "prefill", b, t);
    j["batch"] = b;
    j["tokens"] = l;
    j["ms"] = st.median;
    j["ms_samples"] = st.samples;
    j["tok_per_s"] = tokens / t;
    j["TFLOPs"] = tflops;
    j["TFLOPs_strict"] = strict;
    if (peak_tflops > 0) j["MFU"] = tflops / peak_tflops;
    rows.push_back(j);
  }
  // Time to first token of an N-token prompt (single sequence, logits copied to the host).
  for (int64_t n : opt.n_prompt) {
    std::vector<double> ms;
    for (int r = -1; r < opt.repetitions; ++r) {
      auto s = e.time_prefill(n, static_cast<uint64_t>(r + 2));
      if (!s.ok()) return report(s.status());
      if (r >= 0) ms.push_back(*s * 1e3);
    }
    const Stats st = stats(ms);
    print_row("ttft", 1, n, st.median, static_cast<double>(n) / (st.median / 1e3), 0, 0);
    auto j = base("ttft");
    j["tokens"] = n;
    j["ms"] = st.median;
    j["ms_samples"] = st.samples;
    rows.push_back(j);
  }
  if (all != nullptr) {
    for (auto& r : rows) all->push_back(r);
    rows = *all;
  }
  if (to_stdout) {
    std::printf("%s\n", rows.dump(2).c_str());
  } else if (!opt.json_path.empty()) {
    std::ofstream out(opt.json_path);
    out << rows.dump(2) << "\n";
    if (!out) return report(Status(StatusCode::kIoError, opt.json_path + ": cannot write"));
  }
  return 0;
}

// --offload: ZeRO-Inference's question, where GPU memory the budget frees should go. First the
// default: the weights under --gpu-weight-budget, every other byte of --gpu-memory-utilization
// to the KV cache (more sequences fit). Then the other choice: the budget raised by the KV cache
// the tested batches do not need (10% kept spare), so more layers stay resident and fewer are
// streamed. Both tables; the JSON rows say which choice they are.
int run_offload_choices(BenchOptions& o, int64_t most_seqs) {
  if (o.batch.empty() && o.prefill.empty()) {
    return report(Status(StatusCode::kInvalidArgument, "--offload needs --batch or --prefill"));
  }
  if (o.engine.gpu_weight_budget <= 0) {
    return report(Status(StatusCode::kInvalidArgument,
                         "--offload compares where a --gpu-weight-budget's savings go: give one"));
  }
  nlohmann::ordered_json all = nlohmann::ordered_json::array();
  int64_t spare_bytes = 0;
  {
    auto engine = Benchmark::create(o.engine);
    if (!engine.ok()) return report(engine.status());
    const ModelInfo& info = (*engine)->info();
    // KV bytes per block on the GPU (bf16 K and V; info counts f32).
    const int64_t block = info.kv_block_size * info.kv_bytes_per_token / 2;
    const int64_t per_seq = (o.engine.max_model_len + info.kv_block_size - 1) /
                            std::max<int64_t>(1, info.kv_block_size);
    const int64_t needed = per_seq * most_seqs;
    spare_bytes = std::max<int64_t>(0, (info.kv_cache_blocks - needed) * block) / 10 * 9;
    if (o.json_path != "-") {
      std::printf(
          "choice 1: GPU memory to the KV cache (ZeRO-Inference's default): %lld KV blocks "
          "(%lld sequences of %lld tokens)\n",
          static_cast<long long>(info.kv_cache_blocks),
          static_cast<long long>(info.kv_cache_blocks / std::max<int64_t>(1, per_seq)),
          static_cast<long long>(o.engine.max_model_len));
    }
    o.choice = "kv_cache";
    const int rc = run_engine_bench(o, **engine, &all);
    if (rc != 0) return rc;
  }
  o.engine.gpu_weight_budget += spare_bytes;
  if (o.json_path != "-") {
    std::printf(
        "\nchoice 2: the KV cache the batches above do not need to weights: "
        "--gpu-weight-budget %.2f GiB\n",
        static_cast<double>(o.engine.gpu_weight_budget) / (1 << 30));
  }
  auto engine = Benchmark::create(o.engine);
  if (!engine.ok()) return report(engine.status());
  o.choice = "resident_layers";
  return run_engine_bench(o, **engine, &all);
}

}  // namespace

void add_bench_command(CLI::App& app, std::vector<Command>& commands) {
  auto opt = std::make_shared<BenchOptions>();
  CLI::App* sub =
      app.add_subcommand("bench", "Measure prefill and decode throughput (llama-bench style)");
  sub->add_option("-m,--model", opt->engine.model,
                  "Model: a .gguf file, a Hugging Face checkpoint directory, an alias, or a hub "
                  "id org/name[@REVISION][:FILE.gguf] (not needed with --model-config)");
  add_offline_flag(sub, opt->offline);
  sub->add_option("-p,--n-prompt", opt->n_prompt,
                  "Prompt lengths N[,N...]: pp<N> tests (default 512), or time-to-first-token "
                  "rows with --batch/--prefill")
      ->delimiter(',');
  sub->add_option("-n,--n-gen", opt->n_gen,
                  "Generation lengths N[,N...] to test, tg<N> (default 128)")
      ->delimiter(',');
  sub->add_option(
         "-b,--batch", opt->batch,
         "Decode batch sizes: ms per step of B sequences at KV length --ctx (e.g. 1,16,64)")
      ->delimiter(',');
  sub->add_option("--ctx", opt->ctx, "KV length at which decode steps are timed (default 256)");
  sub->add_option("--decode-steps", opt->decode_steps,
                  "Decode steps timed per repetition (default 32)");
  sub->add_option("--prefill", opt->prefill,
                  "Prefill tests BxL: one forward pass over B sequences of L tokens (e.g. "
                  "1x2048,8x2048)")
      ->delimiter(',');
  sub->add_option("-r,--repetitions", opt->repetitions, "Timed runs per test (default 5)");
  add_threads_option(sub, opt->engine.num_threads);
  sub->add_option("-c,--max-model-len", opt->engine.max_model_len,
                  "Context length (default: what the tests need)");
  sub->add_option("--peak-tflops", opt->peak_tflops,
                  "Peak dense TFLOP/s of one GPU for MFU, which counts every GPU the ranks use "
                  "(default: the datasheet's for H100/H200)");
  sub->add_option("--peak-gbps", opt->peak_gbps,
                  "Measured memory read bandwidth of one GPU in GB/s, for % of peak over every GPU "
                  "the ranks use (default: not shown)");
  sub->add_option("--json", opt->json_path,
                  "Also write the results as JSON to this file ('-' = stdout only)");
  sub->add_flag("--offload", opt->offload,
                "With --gpu-weight-budget and --batch/--prefill: run the tests twice, the memory "
                "the budget frees given to the KV cache (default), then to more resident layers");
  add_engine_device_options(sub, opt->engine, /*with_dummy=*/true);
  commands.push_back(
      {sub, [opt]() -> int {
         BenchOptions& o = *opt;
         if (o.repetitions < 1) {
           return report(Status(StatusCode::kInvalidArgument, "--repetitions must be >= 1"));
         }
         if (o.engine.model.empty() && o.engine.model_config.empty()) {
           return report(
               Status(StatusCode::kInvalidArgument, "give a model (-m) or --model-config"));
         }
         if (!o.engine.model.empty()) {
           auto path = resolve_model_arg(o.engine.model, o.offline);
           if (!path.ok()) return report(path.status());
           o.engine.model = *path;
         }
         if (!o.engine.model_config.empty()) o.engine.load_format = LoadFormat::kDummy;
         const bool engine_mode = !o.batch.empty() || !o.prefill.empty() || o.ctx > 0;
         if (engine_mode && o.ctx <= 0) o.ctx = 256;
         // llama-bench's defaults are set here, so that the automatic context length below
         // covers them (it used to see neither and refused pp512 with a context of 1).
         if (!engine_mode && o.n_prompt.empty()) o.n_prompt = {512};
         if (!engine_mode && o.n_gen.empty()) o.n_gen = {128};
         // As in llama-bench, a length of 0 skips that test (-p 0: generation only).
         const int64_t min_len = engine_mode ? 1 : 0;
         for (int64_t n : o.n_prompt) {
           if (n < min_len) {
             return report(Status(StatusCode::kInvalidArgument,
                                  engine_mode
                                      ? "-p lengths must be >= 1 with --batch/--prefill/--ctx"
                                      : "-p lengths must be >= 0"));
           }
         }
         for (int64_t n : o.n_gen) {
           if (n < min_len) {
             return report(Status(StatusCode::kInvalidArgument,
                                  engine_mode
                                      ? "-n lengths must be >= 1 with --batch/--prefill/--ctx"
                                      : "-n lengths must be >= 0"));
           }
         }
         std::erase(o.n_prompt, 0);
         std::erase(o.n_gen, 0);
         if (!engine_mode && o.n_prompt.empty() && o.n_gen.empty()) {
           return report(
               Status(StatusCode::kInvalidArgument, "nothing to run: every -p and -n length is 0"));
         }
         if (o.decode_steps < 1) {
           return report(Status(StatusCode::kInvalidArgument, "--decode-steps must be >= 1"));
         }
         for (int64_t b : o.batch) {
           if (b < 1) {
             return report(Status(StatusCode::kInvalidArgument, "--batch sizes must be >= 1"));
           }
         }
         int64_t longest = 1, most_tokens = 1, most_seqs = 1;
         for (int64_t n : o.n_prompt) longest = std::max(longest, n);
         for (int64_t n : o.n_gen) longest = std::max(longest, n);
         if (engine_mode) longest = std::max(longest, o.ctx + o.decode_steps);
         for (int64_t b : o.batch) most_seqs = std::max(most_seqs, b);
         for (const std::string& spec : o.prefill) {
           int64_t b = 0, l = 0;
           if (!parse_bxl(spec, &b, &l)) {
             return report(Status(StatusCode::kInvalidArgument,
                                  "--prefill '" + spec + "': expected BxL, e.g. 8x2048"));
           }
           longest = std::max(longest, l);
           most_tokens = std::max(most_tokens, b * l);
           most_seqs = std::max(most_seqs, b);
         }
         for (int64_t n : o.n_prompt)
           most_tokens = std::max(most_tokens, std::min<int64_t>(n, 512));
         if (o.engine.max_model_len <= 0) o.engine.max_model_len = longest;
         o.engine.max_num_batched_tokens = std::max(o.engine.max_num_batched_tokens, most_tokens);
         if (engine_mode) {
           o.engine.max_num_seqs = std::max(o.engine.max_num_seqs, most_seqs);
         }
         // After the step size above: --plan prices weight-gathered prefill per step.
         if (Status s = check_before_load(o.engine, nullptr); !s.ok()) return report(s);
         if (o.offload) return run_offload_choices(o, most_seqs);
         auto engine = Benchmark::create(o.engine);
         if (!engine.ok()) return report(engine.status());
         return engine_mode ? run_engine_bench(o, **engine) : run_llama_bench(o, **engine);
       }});
}

}  // namespace strata::app
