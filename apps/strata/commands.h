// Subcommand registry for the strata binary. Each add_<name>_command adds a CLI11 subcommand
// and a callback that runs it and returns the process exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "strata/engine.h"
#include "strata/serving.h"
#include "strata/status.h"

namespace strata::app {

struct Command {
  CLI::App* sub = nullptr;
  std::function<int()> run;
};

void add_run_command(CLI::App& app, std::vector<Command>& commands);
void add_info_command(CLI::App& app, std::vector<Command>& commands);
void add_chat_command(CLI::App& app, std::vector<Command>& commands);
void add_bench_command(CLI::App& app, std::vector<Command>& commands);
void add_serve_command(CLI::App& app, std::vector<Command>& commands);
void add_bench_serve_command(CLI::App& app, std::vector<Command>& commands);
void add_bench_throughput_command(CLI::App& app, std::vector<Command>& commands);
void add_plan_command(CLI::App& app, std::vector<Command>& commands);

// --device, --quantization, --gpu-memory-utilization, --max-num-batched-tokens,
// --no-cuda-graphs (and --load-format, --model-config when with_dummy) into `e`.
void add_engine_device_options(CLI::App* sub, EngineConfig& e, bool with_dummy = false,
                               bool with_batch_tokens = true);
// --gpu-weight-budget, --offload-weights, --no-weight-prefetch (weight streaming) into `e`
// (part of add_engine_device_options; `strata info` takes them alone).
void add_weight_residency_options(CLI::App* sub, EngineConfig& e);
// --kv-offload, --kv-offload-groups, --kv-host-gib (serving engine's KV offload) into `s`.
void add_kv_offload_options(CLI::App* sub, ServingConfig& s);

// -s/--seed as an integer in [0, 2^64) (2^64 and more is an error, not 2^64 - 1), and
// -t/--threads.
CLI::Option* add_seed_option(CLI::App* sub, uint64_t& seed, const std::string& help);
uint64_t random_seed();
// A size flag: bytes, or with a binary unit (512MiB, 4GiB, 1.5G).
void add_bytes_option(
    CLI::App* sub, const std::string& names, int64_t& target,
    const std::string& help);  // the default seed when -s is not given (printed, llama.cpp style)
// -f FILE: the prompt text (one trailing newline dropped).
Result<std::string> read_prompt_file(const std::string& path);
void add_threads_option(CLI::App* sub, int& threads);

// The flag values that need no model (threads, tp, context length, and the sampling values when
// given), checked before a model is loaded.
// Also applies --plan (apply_plan): `engine` may change.
Status check_before_load(EngineConfig& engine, const SamplingParams* sampling);
// --plan auto|FILE: sets engine.parallel.tp / .pp to the layout the planner picks among those the
// engine runs, and says which on stderr (plan_choice.cpp).
Status apply_plan(EngineConfig& engine);

// --offline: models by hub id (-m org/name) come from the Hugging Face cache only.
void add_offline_flag(CLI::App* sub, bool& offline);
// A -m argument made local: a hub id (org/name[@REV][:FILE.gguf]) resolves through the Hugging
// Face cache, downloading what is missing unless offline; a local path or an alias is returned
// unchanged.
Result<std::string> resolve_model_arg(const std::string& model, bool offline);
// Whether `model` names a model by hub id (no local file or folder of that name).
bool is_hub_reference(const std::string& model);

// Print "strata: error: <message>" to stderr and return exit code 1.
int report(const Status& status);

}  // namespace strata::app
