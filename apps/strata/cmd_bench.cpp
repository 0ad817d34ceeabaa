// `strata bench`: llama-bench style throughput table. pp<N>: one prefill of N tokens;
// tg<N>: N single-token decode steps from an empty context. Each test runs -r times after one
// warm-up run; the table shows mean ± standard deviation of tokens/s.
#include <omp.h>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "strata/engine.h"

namespace strata::app {

namespace {

struct BenchOptions {
  EngineConfig engine;
  std::vector<int64_t> n_prompt{512};
  std::vector<int64_t> n_gen{128};
  int repetitions = 5;
  std::string json_path;
  bool json_stdout = false;
};

struct Stats {
  double mean = 0, stddev = 0;
  std::vector<double> samples;
};

Stats stats(std::vector<double> v) {
  Stats s;
  s.samples = v;
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  for (double x : v) s.stddev += (x - s.mean) * (x - s.mean);
  s.stddev = v.size() > 1 ? std::sqrt(s.stddev / static_cast<double>(v.size() - 1)) : 0.0;
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

}  // namespace

void add_bench_command(CLI::App& app, std::vector<Command>& commands) {
  auto opt = std::make_shared<BenchOptions>();
  CLI::App* sub =
      app.add_subcommand("bench", "Measure prefill and decode throughput (llama-bench style)");
  sub->add_option("-m,--model", opt->engine.model,
                  "Model: a .gguf file, a Hugging Face checkpoint directory, or an alias")
      ->required();
  sub->add_option("-p,--n-prompt", opt->n_prompt, "Prompt lengths to test, pp<N> (default 512)");
  sub->add_option("-n,--n-gen", opt->n_gen, "Generation lengths to test, tg<N> (default 128)");
  sub->add_option("-r,--repetitions", opt->repetitions, "Timed runs per test (default 5)");
  sub->add_option("-t,--threads", opt->engine.num_threads, "CPU threads; 0 = all cores");
  sub->add_option("--json", opt->json_path,
                  "Also write the results as JSON to this file ('-' = stdout only)");
  commands.push_back(
      {sub, [opt]() -> int {
         if (opt->repetitions < 1)
           return report(Status(StatusCode::kInvalidArgument, "--repetitions must be >= 1"));
         int64_t longest = 1;
         for (int64_t n : opt->n_prompt) longest = std::max(longest, n);
         for (int64_t n : opt->n_gen) longest = std::max(longest, n);
         opt->engine.max_model_len = longest;
         auto engine = Engine::create(opt->engine);
         if (!engine.ok()) return report(engine.status());
         Engine& e = **engine;
         const ModelInfo& info = e.info();
         const int threads =
             opt->engine.num_threads > 0 ? opt->engine.num_threads : omp_get_max_threads();
         const bool to_stdout = opt->json_path == "-";
         nlohmann::ordered_json results = nlohmann::ordered_json::array();
         char model_name[96];
         std::snprintf(model_name, sizeof(model_name), "%s %.0fM %s", info.architecture.c_str(),
                       static_cast<double>(info.n_params) / 1e6, info.dtype.c_str());
         if (!to_stdout) {
           std::printf("| %-28s | %12s | %10s | %-7s | %7s | %8s | %20s |\n", "model", "size",
                       "params", "backend", "threads", "test", "t/s");
           std::printf("| %s | %s: | %s: | %s | %s: | %s: | %s: |\n", std::string(28, '-').c_str(),
                       std::string(11, '-').c_str(), std::string(9, '-').c_str(),
                       std::string(7, '-').c_str(), std::string(6, '-').c_str(),
                       std::string(7, '-').c_str(), std::string(19, '-').c_str());
         }
         auto run_test = [&](const std::string& name, int64_t n, bool prefill) -> Status {
           std::vector<double> tps;
           for (int r = -1; r < opt->repetitions; ++r) {  // r = -1: warm-up
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
                         static_cast<double>(info.n_params) / 1e6, "CPU", threads, name.c_str(),
                         tput);
             std::fflush(stdout);
           }
           results.push_back({{"model", info.path},
                              {"architecture", info.architecture},
                              {"dtype", info.dtype},
                              {"model_bytes", info.weight_bytes},
                              {"n_params", info.n_params},
                              {"backend", "CPU"},
                              {"n_threads", threads},
                              {"test", name},
                              {"n_prompt", prefill ? n : 0},
                              {"n_gen", prefill ? 0 : n},
                              {"avg_ts", st.mean},
                              {"stddev_ts", st.stddev},
                              {"samples_ts", st.samples}});
           return ok_status();
         };
         for (int64_t n : opt->n_prompt) {
           if (n > 0) {
             Status s = run_test("pp" + std::to_string(n), n, true);
             if (!s.ok()) return report(s);
           }
         }
         for (int64_t n : opt->n_gen) {
           if (n > 0) {
             Status s = run_test("tg" + std::to_string(n), n, false);
             if (!s.ok()) return report(s);
           }
         }
         if (to_stdout) {
           std::printf("%s\n", results.dump(2).c_str());
         } else if (!opt->json_path.empty()) {
           std::ofstream out(opt->json_path);
           out << results.dump(2) << "\n";
           if (!out) return report(Status(StatusCode::kIoError, opt->json_path + ": cannot write"));
         }
         return 0;
       }});
}

}  // namespace strata::app
