// Flags shared by the commands that create an Engine: where it runs and how weights are held.
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "commands.h"
#include "strata/hub.h"

namespace strata::app {

namespace {

// The value of a parse, or a CLI11 validation error carrying its one-line message.
template <class T>
T parsed(Result<T> r) {
  if (!r.ok()) throw CLI::ValidationError(r.status().message());
  return *r;
}

// A seed: an integer in [0, 2^64). CLI11 would saturate 2^64 and more to 2^64 - 1 silently.
Result<uint64_t> parse_seed(const std::string& text) {
  uint64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end) {
    return Status(StatusCode::kInvalidArgument,
                  "--seed '" + text + "' must be an integer in [0, 18446744073709551615]");
  }
  return v;
}

}  // namespace

CLI::Option* add_seed_option(CLI::App* sub, uint64_t& seed, const std::string& help) {
  return sub->add_option_function<std::string>(
      "-s,--seed", [&seed](const std::string& v) { seed = parsed(parse_seed(v)); }, help);
}

// "1073741824", "1GiB", "1G", "512MiB", "1.5 GiB": binary units (K, M, G, T with optional "i"
// and "B"), as vLLM's memory flags are given in GiB.
Result<int64_t> parse_bytes(const std::string& flag, const std::string& text) {
  const auto bad = [&] {
    return Status(StatusCode::kInvalidArgument,
                  flag + " '" + text + "': expected bytes, or a size such as 512MiB or 4GiB");
  };
  double v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || !(v >= 0)) return bad();
  std::string unit(ptr, end);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  double scale = 1;
  if (!unit.empty()) {
    const std::string units = "KMGT";
    const size_t k =
        units.find(static_cast<char>(std::toupper(static_cast<unsigned char>(unit[0]))));
    const std::string rest = unit.substr(1);
    if (k == std::string::npos || !(rest.empty() || rest == "i" || rest == "iB" || rest == "B"))
      return bad();
    scale = std::pow(1024.0, static_cast<double>(k + 1));
  } else if (v != std::floor(v)) {
    return bad();
  }
  const double bytes = v * scale;
  if (bytes > 9.0e18) return bad();
  return static_cast<int64_t>(bytes);
}

void add_bytes_option(CLI::App* sub, const std::string& names, int64_t& target,
                      const std::string& help) {
  sub->add_option_function<std::string>(
      names,
      [&target, names](const std::string& v) {
        const std::string flag =
            names.substr(names.rfind(',') == std::string::npos ? 0 : names.rfind(',') + 1);
        target = parsed(parse_bytes(flag, v));
      },
      help);
}

uint64_t random_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

Result<std::string> read_prompt_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status(StatusCode::kNotFound, "-f " + path + ": cannot open");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  if (in.bad()) return Status(StatusCode::kIoError, "-f " + path + ": read failed");
  // A trailing newline (as editors write) is not part of the prompt.
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (text.empty()) return Status(StatusCode::kInvalidArgument, "-f " + path + ": empty prompt");
  return text;
}

void add_offline_flag(CLI::App* sub, bool& offline) {
  sub->add_flag("--offline", offline,
                "Models by hub id come from the Hugging Face cache only, never the network (as "
                "HF_HUB_OFFLINE=1)");
}

Result<std::string> resolve_model_arg(const std::string& model, bool offline) {
  HubOptions hub = hub_options_from_env();
  hub.offline = hub.offline || offline;
  return resolve_model_location(model, hub);
}

bool is_hub_reference(const std::string& model) {
  std::error_code ec;
  return is_hub_model_id(model) && !std::filesystem::exists(model, ec);
}

void add_threads_option(CLI::App* sub, int& threads) {
  sub->add_option("-t,--threads", threads,
                  "CPU threads; 0 = all cores (default 0; at most 4 per CPU)");
}

Status check_before_load(EngineConfig& engine, const SamplingParams* sampling) {
  STRATA_RETURN_IF_ERROR(apply_plan(engine));
  STRATA_RETURN_IF_ERROR(check_engine_config(engine));
  if (sampling != nullptr) STRATA_RETURN_IF_ERROR(validate_sampling(*sampling));
  return ok_status();
}

void add_weight_residency_options(CLI::App* sub, EngineConfig& e) {
  sub->add_option_function<std::string>(
      "--gpu-weight-budget",
      [&e](const std::string& v) {
        // GiB by default ("8" = 8 GiB); units as for the other sizes ("512MiB").
        const bool bare = !v.empty() && v.find_first_not_of("0123456789.") == std::string::npos;
        e.gpu_weight_budget = parsed(parse_bytes("--gpu-weight-budget", bare ? v + "GiB" : v));
      },
      "CUDA: the most GPU memory for weights, in GiB (or 512MiB, ...): the embeddings, LM head "
      "and as many whole layers as fit next to two streaming slots stay on the GPU; the other "
      "layers are streamed into the slots before they run (ZeRO-Inference). The memory left "
      "goes to the KV cache. Default: no limit");
  sub->add_option_function<std::string>(
      "--offload-weights",
      [&e](const std::string& v) { e.offload_weights = parsed(parse_weight_offload(v)); },
      "CUDA: where streamed layers live: auto (pinned host memory when --gpu-weight-budget is "
      "given, default), cpu (pinned host memory; without a budget every layer is streamed) or "
      "disk (read from the checkpoint file on every pass with O_DIRECT; bf16 only)");
  sub->add_flag("--partitioned-fetch,!--no-partitioned-fetch", e.partitioned_fetch,
                "CUDA, weight streaming with --dp N > 1: each replica copies 1/N of every "
                "streamed layer over its own host link and an all-gather over the replicas "
                "completes it on every GPU (default on; --no-partitioned-fetch: every replica "
                "copies whole layers)");
  sub->add_option("--fetch-pieces", e.fetch_pieces,
                  "CUDA, partitioned fetch: the most pieces each streamed layer is fetched in; "
                  "piece j's all-gather runs while piece j + 1 is copied (default: "
                  "STRATA_FETCH_PIECES, else 4; 1: whole-layer all-gathers)")
      ->check(CLI::Range(1, 1024));
  sub->add_flag(
      "--no-weight-prefetch", [&e](int64_t) { e.weight_prefetch = false; },
      "CUDA, weight streaming: copy each streamed layer just before it runs instead of while the "
      "previous layer computes (for A/B measurements)");
}

void add_kv_offload_options(CLI::App* sub, ServingConfig& s) {
  sub->add_flag("--kv-offload", s.kv_offload,
                "Keep the KV cache in host memory (pinned on a GPU) and run the sequences in "
                "groups that take turns on the device's KV pool, the next group loaded while one "
                "runs: a larger batch than the device pool holds. One rank only; no prefix "
                "caching; preemption recomputes");
  sub->add_option_function<int64_t>(
      "--kv-offload-groups",
      [&s](int64_t n) {
        if (n < 2) throw CLI::ValidationError("--kv-offload-groups must be >= 2");
        s.kv_offload_groups = n;
      },
      "With --kv-offload: groups of running sequences (default: enough that half the device "
      "pool holds one group when the host pool is full, at least 2, at most --max-num-seqs)");
  sub->add_option_function<std::string>(
      "--kv-host-gib",
      [&s](const std::string& v) {
        const bool bare = !v.empty() && v.find_first_not_of("0123456789.") == std::string::npos;
        s.kv_host_bytes = parsed(parse_bytes("--kv-host-gib", bare ? v + "GiB" : v));
      },
      "With --kv-offload: the host KV pool in GiB (or 512MiB, ...); default: --max-num-seqs "
      "sequences of --max-model-len, at most 4x the device pool");
}

void add_engine_device_options(CLI::App* sub, EngineConfig& e, bool with_dummy,
                               bool with_batch_tokens) {
  add_weight_residency_options(sub, e);
  sub->add_option_function<std::string>(
      "--device", [&e](const std::string& v) { e.device = parsed(parse_device(v)); },
      "Where the model runs: cpu (default), cuda or cuda:N");
  sub->add_option_function<std::string>(
      "--quantization",
      [&e](const std::string& v) { e.quantization = parsed(parse_quantization(v)); },
      "CUDA weight format: none (bf16, default), int8 or fp8 (weight-only, per-row scales, "
      "quantized at load)");
  sub->add_option("--gpu-memory-utilization", e.gpu_memory_utilization,
                  "CUDA: share of the device's memory for weights, KV cache and workspace "
                  "(default 0.9)");
  if (with_batch_tokens) {
    sub->add_option("--max-num-batched-tokens", e.max_num_batched_tokens,
                    "CUDA: most tokens in one forward pass (activation workspace; default 2048)");
  }
  sub->add_option("--tp,--tensor-parallel-size", e.parallel.tp,
                  "Tensor-parallel ranks (default 1): processes launched with mpirun -np N (one "
                  "GPU each with --device cuda), or, with --device cuda and no mpirun, N threads "
                  "of this process on GPUs index..index+N-1 (all on one GPU when there are fewer)");
  sub->add_option("--ep,--expert-parallel-size", e.parallel.ep,
                  "Expert-parallel ranks for mixture-of-experts models (default 1): each holds "
                  "1/N of every sparse layer's experts (the expert count must be a multiple of "
                  "N); the world is tp x N ranks, launched with mpirun -np tp*N, or, with --device "
                  "cuda and no mpirun, tp*N threads of this process");
  sub->add_option("--dp,--data-parallel-size", e.parallel.dp,
                  "CUDA: data-parallel replicas (default 1): N threads of this process, replica r "
                  "on GPU index+r (all on one GPU when there are fewer), each with the whole "
                  "model and its own KV cache; every forward pass's sequences are split among "
                  "them. With streamed weights (--gpu-weight-budget / --offload-weights) the "
                  "replicas share one pinned host copy and fetch each layer partitioned "
                  "(--partitioned-fetch). Not with --tp, --pp, --ep or mpirun");
  sub->add_option("--pp,--pipeline-parallel-size", e.parallel.pp,
                  "Pipeline stages (default 1): the layers split into N contiguous stages "
                  "(embedding on the first, LM head on the last); with --tp T, T x N ranks, rank "
                  "= stage * T + tensor-parallel rank. Without mpirun: threads of this process "
                  "(--device cuda: rank r on GPU index+r, all on one GPU when there are fewer); "
                  "on the CPU, mpirun -np T*N runs one process per rank");
  sub->add_option(
      "--ffn-layout", e.parallel.ffn_layout,
      "--tp N on the CPU under mpirun, or with --device cuda as N threads (on one GPU, or "
      "one GPU each through NCCL; tested on an H100 and 4 x H200): how the FFN is "
      "partitioned (seed 003 Sec. "
      "3.2): 1d (Megatron, default), 2d (weight-stationary over an X x Y grid of the "
      "ranks: hidden split X, ffn split Y) or weight-gathered (each rank runs the FFN "
      "for 1/N of the tokens with the layer's FFN weights all-gathered). Llama family, "
      "f32/f16/bf16 checkpoints; combines with --attn-layout (on CUDA not yet tested "
      "together)");
  sub->add_option("--ffn-2d-x", e.parallel.ffn_2d_x,
                  "--ffn-layout 2d: ranks along the hidden dimension, X (Y = N / X; default: "
                  "the largest divisor of N up to sqrt(N), e.g. 2 for 4 and 8 ranks)");
  sub->add_option("--ffn-gather-min-tokens", e.parallel.ffn_gather_min_tokens,
                  "With --ffn-layout 1d and --tp N (where weight-gathered runs): the FFN layout "
                  "per phase, as seed 003 picks it. Steps of at least this many tokens "
                  "(prefill) run the weight-gathered FFN, smaller ones (decode) the 1d one, from "
                  "the same bf16 shards (default 0: always 1d). --plan sets it when the cost "
                  "model prices weight-gathered prefill faster");
  sub->add_option("--attn-layout", e.parallel.attn_layout,
                  "--tp N on the CPU under mpirun, or with --device cuda as N threads on one GPU "
                  "or one GPU each (eager steps; all-to-alls through host memory on one GPU, NCCL "
                  "across GPUs; tested on an H100 and 4 x H200): how attention is partitioned "
                  "(seed 003 Sec. 3.3): "
                  "head-sharded (Megatron, default; KV heads and the KV cache replicated when "
                  "there are fewer KV heads than ranks) or batch-sharded (each rank holds the KV "
                  "cache of its sequences, all KV heads; all-to-alls move q/k/v to the owner and "
                  "the output back). Dense Llama family; combines with every --ffn-layout");
  sub->add_option("--plan", e.plan,
                  "CUDA: choose --tp / --pp with the cost model of `strata plan`: auto (plan "
                  "for the GPUs visible from --device, or the mpirun world, with the shipped "
                  "profile of this GPU) or a file written by `strata plan --json`");
  sub->add_option("--plan-workload", e.plan_workload,
                  "With --plan auto: the workload to plan for, prompt=P,gen=G,batch=B (default "
                  "prompt=512,gen=128,batch=--max-num-seqs or 64)");
  sub->add_option("--pp-layers", e.parallel.pp_layers,
                  "Layers per pipeline stage, e.g. 10,12,10 (default: an even split, the first "
                  "stages one layer longer)")
      ->delimiter(',');
  sub->add_option("--pp-micro-batch", e.parallel.pp_micro_batch,
                  "Pipeline stages: the fewest tokens per micro-batch when a forward pass is cut "
                  "into micro-batches that flow through the stages (default 256)");
  sub->add_flag(
      "--no-cuda-graphs", [&e](int64_t) { e.cuda_graphs = false; },
      "CUDA: launch decode steps kernel by kernel instead of replaying CUDA graphs");
  if (with_dummy) {
    sub->add_option_function<std::string>(
        "--load-format",
        [&e](const std::string& v) { e.load_format = parsed(parse_load_format(v)); },
        "auto (read the checkpoint, default) or dummy (random weights on the GPU, no "
        "files read; shapes from --model-config or the model's config)");
    sub->add_option("--model-config", e.model_config,
                    "Shape preset for --load-format dummy: llama3-8b, llama2-7b, qwen2.5-7b, "
                    "llama3-70b, llama3.2-1b, llama-34b, and the mixture-of-experts "
                    "qwen3-30b-a3b and mixtral-8x7b");
  }
}

}  // namespace strata::app
