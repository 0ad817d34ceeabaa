// strata's public API: load a model, generate text. Nothing here exposes CUDA, MPI or the
// engine's internal types; the `strata` binary and the server use only this header.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "strata/sampling.h"
#include "strata/status.h"
#include "strata/types.h"

namespace strata {

// Where the forward pass runs.
enum class DeviceType : uint8_t { kCpu, kCuda };
struct DeviceSpec {
  DeviceType type = DeviceType::kCpu;
  int index = 0;  // CUDA ordinal
  static DeviceSpec cpu() { return {}; }
  static DeviceSpec cuda(int i = 0) { return {DeviceType::kCuda, i}; }
  bool is_cuda() const { return type == DeviceType::kCuda; }
  bool operator==(const DeviceSpec&) const = default;
};

// How the device layout holds linear weights: bf16, or quantized at load to int8 / fp8-e4m3
// with one scale per output row (weight-only), or (random weights only: --model-config /
// --load-format dummy, for benchmarks) random blocks of a GGUF block format. A GGUF checkpoint
// keeps its own block formats with kNone.
enum class Quantization : uint8_t { kNone, kInt8, kFp8, kQ8_0, kQ4_0, kQ4_K, kQ5_K, kQ6_K };

// The weight dtype of the device layout for `q` (kBF16 for kNone).
DType quantization_dtype(Quantization q);

// kAuto reads the checkpoint; kDummy makes random weights of the model's shapes on the device.
enum class LoadFormat : uint8_t { kAuto, kDummy };

// Where the layers that do not fit --gpu-weight-budget live between forward passes (weight
// streaming, ZeRO-Inference): kAuto = pinned host memory when a budget is given (no streaming
// without one), kCpu = pinned host memory (every layer streamed when no budget is given), kDisk =
// read from the checkpoint file on every pass (O_DIRECT).
enum class WeightOffload : uint8_t { kAuto, kCpu, kDisk };

// The parallel layout of the world: tensor, pipeline, expert and data parallel sizes. Their
// product is the number of ranks (launched with mpirun -np N, or, for tensor parallelism alone
// or pipeline stages alone, run as threads of one process).
struct ParallelSizes {
  int tp = 1;
  int pp = 1;
  int ep = 1;
  int dp = 1;
  // Layers per pipeline stage (--pp-layers 10,12,10); empty: an even split.
  std::vector<int64_t> pp_layers;
  // The smallest micro-batch (tokens) a pipeline cuts a forward pass into (--pp-micro-batch).
  int64_t pp_micro_batch = 256;
  // The FFN's layout over the tensor-parallel group (--ffn-layout 1d | 2d | weight-gathered; seed
  // 003 Sec. 3.2) and the 2d grid's hidden split X (--ffn-2d-x; 0: the default for --tp).
  std::string ffn_layout = "1d";
  int ffn_2d_x = 0;
  // With --ffn-layout 1d: steps of at least this many tokens (prefill) run the weight-gathered
  // FFN, smaller ones (decode) the 1d one (--ffn-gather-min-tokens; 0: never).
  int64_t ffn_gather_min_tokens = 0;
  // Attention's layout over the tensor-parallel group (--attn-layout head-sharded |
  // batch-sharded; seed 003 Sec. 3.3).
  std::string attn_layout = "head-sharded";
  int world() const { return tp * pp * ep * dp; }
};

// The command-line spellings, parsed once by the CLI: "cpu", "cuda", "cuda:N"; "none"/"bf16",
// "int8", "fp8", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k"; "auto", "dummy". Errors are one line
// naming the value and the choices.
Result<DeviceSpec> parse_device(std::string_view text);
Result<Quantization> parse_quantization(std::string_view text);
Result<LoadFormat> parse_load_format(std::string_view text);
Result<WeightOffload> parse_weight_offload(std::string_view text);  // auto, cpu, disk
std::string_view to_string(WeightOffload o);
std::string to_string(const DeviceSpec& d);  // "cpu", "cuda:0"
std::string_view to_string(Quantization q);  // "none", "int8", "fp8"

struct EngineConfig {
  std::string model;          // HF checkpoint directory, .gguf file, alias or hub id (org/name)
  ParallelSizes parallel;     // tp > 1: ranks launched with mpirun -np N
  int64_t max_model_len = 0;  // context length; 0 = the model's own
  int num_threads = 0;        // CPU threads; 0 = OpenMP default
  bool show_progress = true;  // progress line while loading large checkpoints

  DeviceSpec device;
  Quantization quantization = Quantization::kNone;  // device layout only (CUDA)
  // kDummy: random weights of the shapes of `model_config` (a preset name such as llama3-8b) or
  // of `model`'s config, on the device, without reading weights.
  LoadFormat load_format = LoadFormat::kAuto;
  std::string model_config;
  // CUDA executor limits: the largest forward batch in tokens (activation workspace), the most
  // sequences decoded together (CUDA-graph buckets; 0 = 64; on the CPU, 0 = a KV pool for one
  // sequence, N = for N sequences), the share of device memory to use (weights + KV cache +
  // workspace) and whether decode steps replay CUDA graphs.
  int64_t max_num_batched_tokens = 2048;
  int64_t max_num_seqs = 0;
  double gpu_memory_utilization = 0.9;
  bool cuda_graphs = true;
  // Weight streaming (ZeRO-Inference): the most bytes of weights kept on the GPU (0 = no limit;
  // the non-layer weights, the resident layers and the streaming slots count against it), where
  // the other layers live, and whether the next streamed layer is copied while one computes.
  int64_t gpu_weight_budget = 0;
  WeightOffload offload_weights = WeightOffload::kAuto;
  bool weight_prefetch = true;
  // Data-parallel replicas (parallel.dp > 1) with streamed weights: each replica fetches 1/dp of
  // every streamed layer and an all-gather completes it (ZeRO-Inference's partitioned fetch);
  // false: every replica fetches whole layers.
  bool partitioned_fetch = true;
  // Partitioned fetch: the most pieces each layer is fetched in (piece j's all-gather overlaps
  // piece j + 1's copy); 0: the environment's STRATA_FETCH_PIECES, else 4.
  int fetch_pieces = 0;
  // --plan auto|FILE and --plan-workload: the CLI replaces parallel.tp / .pp with the layout the
  // cost model of `strata plan` picks, before the engine loads (the library ignores them).
  std::string plan;
  std::string plan_workload;
};

// Checks of values that need no model, so that the CLI refuses them before loading one: the
// engine's flags (--threads in [0, 4 per CPU], --tp >= 1, --max-model-len >= 0) and the sampling
// values (temperature, top_k, top_p, min_p, penalties). The engine checks them again.
Status check_engine_config(const EngineConfig& config);
Status validate_sampling(const SamplingParams& params);
int max_cpu_threads();  // the most --threads accepted: 4 per CPU

// What `strata info` prints; also available without loading the weights.
struct ModelInfo {
  std::string path;
  std::string architecture;
  std::string dtype;  // weight dtype(s), e.g. "bf16" or "q4_1 (+ f32 norms)"
  int64_t n_params = 0;
  int64_t n_layers = 0, hidden = 0, n_heads = 0, n_heads_kv = 0, head_dim = 0, ffn_dim = 0;
  // Mixture of experts (0 experts: a dense model): experts per sparse layer, experts each token
  // uses, their FFN size, the shared expert's FFN size, the sparse layers, and the parameters one
  // token reads.
  int64_t n_experts = 0, n_experts_used = 0, expert_ffn_dim = 0, shared_expert_ffn_dim = 0;
  int64_t n_moe_layers = 0, n_active_params = 0;
  int64_t vocab = 0;
  int64_t context_length = 0;
  int64_t weight_bytes = 0;        // bytes of weight data in the files
  int64_t kv_bytes_per_token = 0;  // K and V, all layers, f32 cache
  bool has_tokenizer = false;
  bool has_chat_template = false;
  bool tied_embeddings = false;     // the LM head is the embedding table
  std::string backend = "CPU";      // "CPU" or "CUDA"
  std::string device_name;          // e.g. "NVIDIA H100 80GB HBM3" (CUDA)
  std::string weight_format;        // how the executor holds weights: "bf16", "int8", ... (CUDA)
  int64_t device_weight_bytes = 0;  // bytes of weights on the device (CUDA)
  int64_t n_gpus = 1;               // GPUs the ranks of this process run on (CUDA)
  int64_t kv_cache_blocks = 0;      // KV blocks of block_size tokens in the pool
  int64_t kv_block_size = 0;
};

// `model` may also be "dummy:NAME" for a --model-config preset's shapes.
Result<ModelInfo> inspect_model(const std::string& model);
// Where --gpu-weight-budget / --offload-weights (and --quantization) put every layer of `model`
// (as for inspect_model) on one GPU, as lines; computed from the config alone, no GPU needed.
Result<std::vector<std::string>> describe_weight_residency(const std::string& model,
                                                           const EngineConfig& config);

// The CPU kernel variant this process runs, chosen by CPUID at start, and the features seen:
// e.g. "avx2 (avx2 fma f16c; no avx512f/bw/dq/vl)".
std::string cpu_kernel_path();

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

struct GenerateRequest {
  std::string prompt;
  std::vector<int32_t> prompt_tokens;  // used instead of `prompt` when not empty
  int64_t max_tokens = 64;
  SamplingParams sampling;
  bool chat = false;  // render `messages` (+ `prompt` as a last user turn) with
                      // the model's chat template
  std::vector<ChatMessage> messages;
  bool ignore_eos = false;
};

struct GenerateResult {
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> tokens;  // generated ids
  std::string text;             // generated text
  std::string finish_reason;    // "stop" (EOS) or "length"
  double prefill_seconds = 0, decode_seconds = 0;
};

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> create(const EngineConfig& config);
  virtual ~Engine() = default;

  virtual const ModelInfo& info() const = 0;
  virtual int rank() const = 0;  // tensor-parallel rank; only rank 0 should print
  virtual int world_size() const = 0;

  // Generate; `on_text` receives complete UTF-8 pieces as they are produced (return false to
  // stop early). Every rank must call this with the same request.
  virtual Result<GenerateResult> generate(const GenerateRequest& request,
                                          const std::function<bool(std::string_view)>& on_text) = 0;

  // Logits for every position of `tokens` run as one fresh sequence: [n, vocab] row-major.
  virtual Result<std::vector<float>> score(const std::vector<int32_t>& tokens) = 0;
  virtual Result<std::vector<int32_t>> tokenize(const std::string& text, bool add_special) = 0;
};

}  // namespace strata
