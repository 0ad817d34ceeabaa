// The analytical cost model of seed 003 ("Efficiently Scaling Transformer Inference") with the
// pipeline, expert-parallel and weight-streaming terms of seed 000 (DeepSpeed Inference).
//
// A phase (one prefill pass, or the decode steps) of a model shape on a hardware profile under a
// layout is costed per layer and per device: GEMM time (from the profile's measured GEMM curve
// when it has one, else the roofline of peak FLOP/s and HBM bandwidth), attention time (KV read
// or attention FLOPs), the collectives the layout needs (ring all-gather / reduce-scatter /
// all-to-all: latency + bytes over the group's bandwidth), pipeline bubbles and host-link
// streaming. Nothing here needs a GPU: the planner only reads numbers.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "strata/status.h"

namespace strata {
struct ModelConfig;
}

namespace strata::planner {

// How the weights are stored and read. Activations and the KV cache are bf16 throughout.
enum class WeightFormat { kBF16, kInt8, kFp8 };

const char* weight_format_name(WeightFormat f);
Result<WeightFormat> parse_weight_format(const std::string& s);
double weight_format_bytes(WeightFormat f);

// The shapes the cost model needs (dimension names as in docs/glossary.md).
struct ModelShape {
  std::string name;
  int64_t n_layers = 0;
  int64_t hidden = 0;
  int64_t n_heads = 0;
  int64_t n_heads_kv = 0;
  int64_t head_dim = 0;
  int64_t ffn_dim = 0;  // dense FFN width (0 when every layer is MoE)
  int64_t vocab = 0;
  bool gated_mlp = true;
  bool parallel_block = false;  // attention and FFN read the same normed input (PaLM, NeoX)
  bool tied_embeddings = false;
  // Mixture of experts (0 = dense): every layer's FFN is n_experts experts of expert_ffn_dim,
  // each token routed to n_experts_used of them.
  int64_t n_experts = 0;
  int64_t n_experts_used = 0;
  int64_t expert_ffn_dim = 0;

  bool is_moe() const { return n_experts > 0; }
  // Weight elements of one layer's attention projections (Q, K, V, O).
  double attention_weights() const;
  // Weight elements of one layer's FFN: dense, or one expert.
  double ffn_weights_per_expert() const;
  // Weight elements of one layer (all experts).
  double layer_weights() const;
  double embedding_weights() const;  // embedding table and LM head (once when tied)
  double n_params() const;           // every weight
  double n_active_params() const;    // the weights one token multiplies (MoE: k experts)
  // K and V bytes one token adds to the cache over all layers (bf16).
  double kv_bytes_per_token() const;
};

Result<ModelShape> model_shape_from_config(const ModelConfig& config, const std::string& name);
// Named shapes: the engine's presets (src/model/presets.cpp) plus shapes only the planner needs
// (palm-540b, palm-540b-padded, llama-34b, mixtral-8x7b, qwen3-30b-a3b).
Result<ModelShape> model_shape_preset(const std::string& name);
std::vector<std::string> model_shape_preset_names();

enum class Topology { kSwitch, kTorus3d };

struct HardwareProfile {
  std::string name;
  std::string source;  // where every number comes from
  double memory_bytes = 0;
  std::map<WeightFormat, double> peak_flops;  // FLOP/s by weight format (bf16 = MFU peak)
  double hbm_read_Bps = 0;
  double host_to_device_Bps = 0;
  Topology topology = Topology::kSwitch;
  double link_Bps = 0;              // per device, one direction
  double collective_latency_s = 0;  // per ring step (hop) of a collective
  double compute_efficiency = 1;    // fraction of peak FLOP/s a large GEMM reaches (roofline path)
  double memory_efficiency = 1;     // fraction of HBM read bandwidth a weight or KV stream reaches
  double host_link_efficiency = 1;
  double attention_flops = 0;  // attention FLOP/s; 0 = peak bf16 x compute_efficiency
  double layer_overhead_s = 0;
  // Whether the elementwise work (norms, residual adds, RoPE, the gated activation) is fused into
  // the matrix multiplies (XLA on the TPU). false: the engine's separate kernels read and write
  // the activations in HBM (cost_model.cpp prices that traffic).
  bool fused_elementwise = false;
  // The engine's fixed-capacity expert exchange (a decode step's dispatch + combine): a fixed
  // part and the rate of its bytes (ep x C rows of hidden bf16 out, f32 back). 0: the ring model.
  double moe_exchange_fixed_s = 0;
  double moe_exchange_Bps = 0;
  // A collective between in-process ranks that share one device (the one-shot kernels on one
  // GPU): a fixed part and the rate of its bytes. 0: priced as the interconnect's.
  double shared_collective_fixed_s = 0;
  double shared_collective_Bps = 0;
  // The engine's MoE block of a decode step measured whole on one GPU (plan --calibrate:
  // router, top-k, permute, grouped expert MLP, combine; per expert weight format): the cost
  // model prices what its expert GEMMs do not explain per layer and per expert touched, from the
  // probes of the workload's weight format (bf16's when it has none). Empty: not priced.
  struct MoeBlockProbe {
    int64_t experts = 0, k = 0, hidden = 0, ffn = 0, tokens = 0;
    double seconds = 0;
    WeightFormat weights = WeightFormat::kBF16;  // the experts' weights ("weights"; bf16 if absent)
  };
  std::vector<MoeBlockProbe> moe_block_probes;
  // The engine's decode attention of one layer measured on one GPU (plan --calibrate: RoPE + KV
  // append and the split-K flash decode over a paged bf16 cache, from a graph): the cost model
  // prices what the KV read does not explain (launches, the split-K combine) as a line in the
  // sequences. Empty: the roofline alone.
  struct DecodeAttentionProbe {
    int64_t seqs = 0, kv_len = 0, kv_heads = 0, head_dim = 0;
    double seconds = 0;
  };
  std::vector<DecodeAttentionProbe> decode_attention_probes;
  // The layouts' collectives as the paper's TPU implementation runs them (bf16 activations, the
  // 2D FFN sequence of its Figure 2b for every block). false: as strata's engine runs them
  // (2D FFN: all-reduces of f32 partial sums over X then Y, an all-gather over X; attention
  // head-sharded with the 1D all-reduce).
  bool paper_layouts = false;
  // NCCL collectives measured over groups of g GPUs (plan --calibrate's collective_probes):
  // seconds against bytes, interpolated linearly between points and along the last segment past
  // them. The engine's 2D FFN groups run NCCL; empty for g: priced by the ring model.
  struct CollectiveCurve {
    std::vector<std::pair<double, double>> all_reduce, all_gather;  // (bytes, seconds)
  };
  std::map<int64_t, CollectiveCurve> nccl_curves;
  // Measured GEMM throughput (FLOP/s) against tokens per GEMM, by weight format; interpolated
  // log-log between points and flat past the last one. Empty: the roofline is used.
  std::map<WeightFormat, std::vector<std::pair<double, double>>> gemm_curve;

  double peak_bf16() const;
};

Result<HardwareProfile> parse_hardware_profile(const std::string& json_text,
                                               const std::string& source);
// "h100", "h200", "a100", "tpu-v4" (shipped, embedded in the binary) or a path to a JSON file.
Result<HardwareProfile> load_hardware_profile(const std::string& name_or_path);
std::vector<std::string> shipped_profile_names();

// ---- layouts -------------------------------------------------------------------------------

// FFN (and fused attention projection) partitioning over the tensor-parallel group, Section 3.2.
enum class FfnLayout {
  k1DWeightStationary,  // Megatron: F sharded, activations all-gathered / reduce-scattered
  k2DWeightStationary,  // E over X, F over YZ, alternating the reduction axis
  kWeightGatheredX,     // weights all-gathered over X, activations stay
  kWeightGatheredXY,
  kWeightGatheredXYZ,
};
enum class AttentionSharding { kHeads, kBatch };
enum class BlockKind { kSerial, kParallel };
enum class WeightResidency { kDevice, kHostStreamed };

const char* ffn_layout_name(FfnLayout l);
// Whether tp chips can be split 2D (a divisor 1 < X < tp).
bool has_2d_split(int64_t tp);
const char* attention_sharding_name(AttentionSharding a);

// A world layout as a plain value: what the engine's world configuration will consume.
struct Layout {
  int64_t tp = 1;  // tensor-parallel group: the chips one layer is partitioned over
  int64_t pp = 1;  // pipeline stages
  int64_t ep = 1;  // expert-parallel group (MoE); attention is data-parallel across it
  int64_t dp = 1;  // replicas
  FfnLayout ffn = FfnLayout::k1DWeightStationary;
  AttentionSharding attention = AttentionSharding::kHeads;
  BlockKind block = BlockKind::kSerial;
  WeightResidency residency = WeightResidency::kDevice;
  int64_t x = 0;  // 2D weight-stationary split of E (0 = the best divisor of tp)
  // Every rank and stage on one device (strata's in-process ranks sharing a GPU): the device
  // does the whole model's work, plus the collectives between ranks on it
  // (HardwareProfile::shared_collective_*) and the stages' hand-offs through host memory.
  bool shared_device = false;

  int64_t devices() const { return tp * pp * ep * dp; }
  std::string name() const;
};

// ---- workloads and estimates -----------------------------------------------------------

enum class Phase { kPrefill, kDecode };

struct PhaseWorkload {
  Phase phase = Phase::kPrefill;
  int64_t batch = 1;   // sequences
  int64_t prompt = 0;  // prompt tokens per sequence
  int64_t gen = 0;     // generated tokens per sequence (decode steps)
  WeightFormat weights = WeightFormat::kBF16;
};

enum class Bottleneck { kCompute, kMemory, kCommunication, kHostLink };
const char* bottleneck_name(Bottleneck b);

struct Estimate {
  double seconds = 0;       // the whole phase: one prefill pass, or all decode steps
  double step_seconds = 0;  // prefill: = seconds; decode: one step at the mean context
  double tokens = 0;        // tokens the phase produces or consumes (batch x prompt or gen)
  double model_flops = 0;   // 2 x active parameters x tokens (the MFU numerator)
  double mfu = 0;
  double tokens_per_s = 0;
  // Critical-path seconds per step by kind (they add to step_seconds with the bubble).
  double compute_s = 0, memory_s = 0, comm_s = 0, host_s = 0, overhead_s = 0;
  double bubble_fraction = 0;
  double weight_bytes_per_device = 0;
  double kv_bytes_per_device = 0;
  double workspace_bytes_per_device = 0;
  double memory_per_device = 0;
  bool fits = true;
  Bottleneck bottleneck = Bottleneck::kCompute;
  int64_t x = 1, yz = 1;  // the 2D split used
};

Result<Estimate> estimate(const ModelShape& shape, const HardwareProfile& hw, const Layout& layout,
                          const PhaseWorkload& work);

// Offline throughput under continuous batching: prompts prefilled in chunks of
// max_batched_tokens, then decoded max_seqs at a time. Returns output tokens per second.
struct OfflineWorkload {
  int64_t prompts = 0;
  int64_t prompt = 0;
  int64_t gen = 0;
  int64_t max_seqs = 256;
  int64_t max_batched_tokens = 8192;
  WeightFormat weights = WeightFormat::kBF16;
};
Result<double> offline_output_tokens_per_s(const ModelShape& shape, const HardwareProfile& hw,
                                           const Layout& layout, const OfflineWorkload& work);

// MFU as seed 003 defines it: 2 x parameters x tokens / (seconds x devices x peak bf16).
double model_flops_utilization(const ModelShape& shape, const HardwareProfile& hw, double tokens,
                               double seconds, int64_t devices);

// The longest context that fits when kv_fraction of every device's memory holds the KV cache,
// for `batch` sequences on `devices` chips with the attention sharded as given (Table 1).
double max_context(const ModelShape& shape, const HardwareProfile& hw, AttentionSharding sharding,
                   int64_t devices, int64_t batch, double kv_fraction);

// ---- search --------------------------------------------------------------------------------

struct RankedLayout {
  Layout layout;
  Estimate estimate;
  bool meets_target = true;
};

struct SearchOptions {
  double max_latency_s = 0;  // prefill: the pass; decode: per step; 0 = none
  bool allow_host_streaming = true;
};

// Every layout of `devices` chips for this phase, ranked: those that fit, meet the target and are
// fastest first (with a target: highest throughput among those that meet it).
Result<std::vector<RankedLayout>> rank_layouts(const ModelShape& shape, const HardwareProfile& hw,
                                               int64_t devices, const PhaseWorkload& work,
                                               const SearchOptions& options);

}  // namespace strata::planner
