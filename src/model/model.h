// Model: one decoder-only transformer as this rank holds it — its config, its rank in the
// parallel world, its weights (model/weights.h, owned by a WeightStore) in one of two layouts
// (as stored on the CPU, or the device layout of the GPU kernels), and its forward pass: the
// family's layer program (model/program.h) run over a layer range on whichever backend holds the
// weights.
//
// Tensor parallelism follows Megatron: QKV and gate/up are column-parallel (each rank owns a
// slice of heads / ffn columns), o_proj and down_proj are row-parallel (partial sums, then an
// explicit all-reduce), embedding and LM head are vocab-parallel.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "core/buffer.h"
#include "io/tensor_source.h"
#include "memory/weight_store.h"
#include "model/config.h"
#include "model/residency.h"
#include "model/weights.h"
#include "ops/ops.h"
#include "parallel/parallel_config.h"

namespace strata {

class Communicator;
struct StreamedWeights;

// One forward call's inputs. Token i belongs to sequence token_seq[i] at position
// token_pos[i]; its K/V are written to that sequence's blocks before attention reads them.
struct ForwardBatch {
  std::span<const int32_t> tokens;        // [n_tokens]
  std::span<const int32_t> token_seq;     // [n_tokens]
  std::span<const int32_t> token_pos;     // [n_tokens]
  const int32_t* block_tables = nullptr;  // [n_seqs, max_blocks_per_seq]
  int64_t max_blocks_per_seq = 0;
  int64_t n_seqs = 1;                   // rows of block_tables
  std::span<const int32_t> logit_rows;  // token indices whose logits are wanted
};

// How Model::to_device / Model::random lay the weights out on a device.
struct DeviceLayout {
  DType weight_dtype = DType::kBF16;  // linear weights: kBF16, kI8 or kFP8E4M3 (per-row scales)
  size_t free_bytes = 0;              // device memory free, for the "does not fit" check (0: skip)
  std::string device_name;            // for messages
  uint64_t seed = 0;                  // random(): the weights' seed
  // Weight streaming: layers the plan does not keep resident are built into per-layer blobs in
  // host memory from host_alloc (pinned on CUDA), or described as reads of the checkpoint file
  // (disk tier), and their views point into the plan's slots (model/residency.h).
  const ResidencyPlan* residency = nullptr;
  std::function<Result<Buffer>(size_t)> host_alloc;
  // Host tier: the host blobs of another replica of the same model (data-parallel replicas share
  // one pinned host copy of the streamed layers); null: this model makes its own.
  std::shared_ptr<const StreamedWeights> shared_host;
};

// The device layout pads each expert's FFN dimension to a multiple of this (zero gate/up rows
// and down columns: exact), so the expert GEMMs' 16-byte loads of act rows and of 8-bit weight
// rows stay aligned for any expert_ffn_dim. `ffn`: the rank's slice (Model::expert_ffn_local).
constexpr int64_t kExpertFfnAlign = 16;
inline int64_t expert_ffn_padded(int64_t ffn) {
  return (ffn + kExpertFfnAlign - 1) / kExpertFfnAlign * kExpertFfnAlign;
}

// The activation buffers of one forward pass, sized for the largest batch (runtime allocates
// them once; a graph replays over the same addresses). act = the activation dtype: f32 for the
// CPU reference, bf16 for the device layout.
struct Workspace {
  Tensor x;             // f32 [T, hidden]: the residual stream
  Tensor y;             // f32 [T, hidden]: partial sums (all-reduce, post norms, parallel block)
  Tensor h;             // act [T, hidden]: norm output, the next GEMM's input
  Tensor qkv;           // f32 [T, (hq + 2 hkv) head_dim]: fused QKV projection
  Tensor q;             // act [T, hq, head_dim]: rotated queries
  Tensor attn;          // act [T, hq head_dim]: attention output
  Tensor ff;            // act [T, 2 ffn]: MLP GEMM output before its activation (scratch)
  Tensor act;           // act [T, ffn]: MLP activation, the down GEMM's input
  Tensor sel;           // f32 [R, hidden]: rows that want logits
  Tensor logits;        // f32 [R, vocab]
  Tensor logits_local;  // f32 [R, vocab chunk]: this rank's vocab shard (tensor parallel)
  Tensor gathered;      // f32 [tp, R, vocab chunk]: every rank's shard (tensor parallel)
  Tensor ids;           // i32 [R]: argmax of each logit row
  Tensor attn_ws;       // u8: split-K attention scratch (may be empty)
  // Mixture-of-experts layers (T tokens, K = n_experts_used, E experts, Fe = expert_ffn_dim):
  Tensor moe_logits;   // f32 [T, E]: router logits
  Tensor moe_ids;      // i32 [T, K]: chosen experts
  Tensor moe_w;        // f32 [T, K]: their weights
  Tensor moe_offsets;  // i32 [E + 1]: per-expert row ranges of the permuted batch
  Tensor moe_perm;     // i32 [T K]: slot -> permuted row
  Tensor moe_x;        // act [T K, hidden]: rows grouped by expert
  Tensor moe_ff;       // act [T K, 2 Fe]: expert gate/up GEMM output (f32 reference only)
  Tensor moe_act;      // act [T K, Fe]
  Tensor moe_y;        // act [T K, hidden]: expert outputs, permuted
  Tensor moe_gate;     // f32 [T, 1]: shared-expert gate logits
  // Expert parallelism (R <= T K rows received from the expert-parallel group, W world ranks):
  Tensor moe_recv_x;        // act [T K, hidden]: received rows, then grouped by local expert
  Tensor moe_recv_y;        // act [T K, hidden]: expert outputs in arrival order
  Tensor moe_recv_ids;      // i32 [T K, 1]: local expert of each received row
  Tensor moe_recv_perm;     // i32 [T K]: arrival row -> grouped row
  Tensor moe_recv_offsets;  // i32 [E + 1]: per local expert row ranges
  Tensor moe_chunks;        // f32 [ceil(T / W) W, hidden]: the expert-parallel group's chunks
  Tensor moe_gathered;      // f32 [ceil(T / W) W, hidden]: every rank's chunk of the output
  // The fixed-capacity exchange (model/moe_ep.h) of steps of at most Tf tokens
  // (WorkspaceLimits::ep_fixed_tokens): P = ceil(Tf / W) tokens per chunk, C = P min(K, E / ep)
  // rows to each of the ep ranks.
  Tensor moe_ep_x;       // act [ep C, hidden]: the packed rows, then the grouped ones
  Tensor moe_ep_recv_x;  // act [ep C, hidden]: the rows received
  // The experts' outputs travel in the activation dtype (bf16 on the device layout: half the
  // bytes of the combine; moe_combine adds them up in f32).
  Tensor moe_ep_y;       // act [ep C, hidden]: the experts' outputs, then the rows back
  Tensor moe_ep_recv_y;  // act [ep C, hidden]: the outputs in arrival order
  Tensor moe_ep_act;     // act [ep C, Fe]
  Tensor moe_ep_ff;      // act [ep C, 2 Fe]: the f32 reference's gate/up scratch (else a stub)
  Tensor moe_ep_index;   // i32: counts and maps (ep_index_entries)
  // FFN layouts other than 1d (model/ffn_layouts.cpp; N tensor-parallel ranks, P = ceil(T / N)
  // tokens per rank, F = intermediate size, wdt = the FFN weights' dtype as stored):
  Tensor ffn_tokens;  // f32 [max(N P, T), hidden]: weight-gathered: o_proj's padded partial sums,
                      // then every rank's token slice gathered; 2d: the X group's hidden slices
  Tensor ffn_x;       // f32 [P, hidden]: weight-gathered: this rank's token slice of the residual
  Tensor ffn_ff;      // act [P, 2 F]: weight-gathered: the gate/up GEMM's output (scratch);
                      // 2d: f32 [T, 2 F / Y], the gate/up partial sums reduced over X
  Tensor ffn_act;     // act [P, F]
  Tensor ffn_w_in;    // wdt [2 F, hidden]: the layer's gathered gate/up weights
  Tensor ffn_w_out;   // wdt [hidden, F]: the layer's gathered down weight
  Tensor ffn_w_send;  // wdt [hidden, F / N]: this rank's down columns, contiguous
  Tensor ffn_w_recv;  // wdt [N hidden, F / N]: every rank's
  // Batch-sharded attention (model/attn_layouts.cpp; hq / hkv = this rank's query / KV heads of
  // the projections, H / KV = all of them, D = head_dim, T tokens, N ranks):
  // The first three in qkv's dtype (f32 in both layouts), the rest in the activations'.
  Tensor bsa_send;      // f32 [T, (hq + 2 hkv) D]: the projections' rows grouped by owner rank
  Tensor bsa_recv;      // f32 [N T, (hq + 2 hkv) D]: every rank's head shard of my tokens
  Tensor bsa_qkv;       // f32 [T, (H + 2 KV) D]: my tokens, every head
  Tensor bsa_q;         // act [T, H, D]: their rotated queries
  Tensor bsa_attn;      // act [T, H D]: their attention output
  Tensor bsa_out_send;  // act [N T, hq D]: the output's head shards, one block per rank
  Tensor bsa_out_recv;  // act [T, hq D]: my heads of every token, grouped by owner rank
};

struct WorkspaceLimits {
  int64_t max_tokens = 0;      // T
  int64_t max_logit_rows = 0;  // R
  DType act = DType::kF32;
  size_t attn_workspace_bytes = 0;
  // Expert parallelism: steps of at most this many tokens take the fixed-capacity exchange
  // (model/moe_ep.h; 0: none, every step the variable-split one).
  int64_t ep_fixed_tokens = 0;
};

// What the last layer range computes after the layers (the pipeline's last stage).
struct HeadArgs {
  int64_t n_out = 0;      // logit rows
  bool all_rows = false;  // logit rows are tokens [0, n_out) in order (no gather)
  const std::vector<std::pair<int64_t, int64_t>>* out_runs = nullptr;  // (first token, count)
  bool argmax = false;                                                 // also ids = argmax(logits)
};

// Called by Model::forward around every layer it runs (weight streaming: make the layer's
// weights present in the slot its views point at, start copying the next streamed layer). The
// family layer programs do not know about it.
class LayerWeightHook {
 public:
  virtual ~LayerWeightHook() = default;
  virtual Status begin_pass(int64_t first_layer, int64_t last_layer) = 0;
  virtual Status before_layer(int64_t layer) = 0;
  virtual Status after_layer(int64_t layer) = 0;
};

// Batch-sharded attention's plan of one step (ParallelConfig::attn_layout), built on the host
// by plan_batch_sharded_attention from the step's runs and the rank owning each (every block of
// a sequence is on one rank, ParallelConfig::attn_owner of its blocks: the block accounting
// hands them out per owner, memory/block_manager.h): the runs grouped by owner and this rank's
// runs as a step of their own, their block tables in the rank's local block indices (block b at
// b / N). Holds the arrays `step` points into (host memory): not copyable. On a GPU the runner
// uploads them every step and points `step` at the device copies before the forward pass
// (runtime/executor.cpp); the ops read `step` on the ops' device.
struct AttnBatchPlan {
  std::vector<int64_t> rows_of_rank;    // [N] tokens of the runs each rank owns
  std::vector<int64_t> mine_from_each;  // [N] rows_of_rank[rank] each: what every rank sends me
  // (first token, count) of the step's runs grouped by owner rank, in rank order: the rows of
  // the first all-to-all's send buffer (and of the second's receive buffer).
  std::vector<std::pair<int64_t, int64_t>> runs;
  ops::StepArgs step;  // this rank's runs; n_tokens = rows_of_rank[rank]; the ops' device
  std::vector<int32_t> tokens, token_seq, token_pos, cu_q, kv_len, block_tables;

  AttnBatchPlan() = default;
  AttnBatchPlan(const AttnBatchPlan&) = delete;
  AttnBatchPlan& operator=(const AttnBatchPlan&) = delete;
};
// `plan` for `step` (host arrays) on rank par.tp_rank of par.tp_size; owner[s] = the rank owning
// run s (step.n_seqs entries). The block table entries a run reads (those below its kv_len, in
// blocks of block_size) must be the owner's; the others become `scratch` (a local index).
Status plan_batch_sharded_attention(const ops::StepArgs& step, const ParallelConfig& par,
                                    std::span<const int> owner, int64_t block_size, int32_t scratch,
                                    AttnBatchPlan* plan);

// Everything a forward pass reads and writes besides the weights.
struct ForwardArgs {
  ops::Context& ctx;
  const ops::StepArgs& step;
  Workspace& ws;
  std::span<ops::KvLayer> kv;  // one per layer of the model
  Communicator& comm;          // the tensor-parallel group
  int64_t first_layer = 0;
  int64_t last_layer = -1;  // -1: n_layers
  HeadArgs head;
  // Set by a layer whose last all-reduce already wrote the next layer's input norm into ws.h
  // (blocks::residual_linear_norm); that layer skips its own and clears it.
  bool next_norm_done = false;
  LayerWeightHook* weights = nullptr;  // weight streaming (null: every layer resident)
  // The expert-parallel group (ranks of this tensor-parallel rank; rank = ParallelConfig::ep_rank)
  // when ep_size > 1: the mixture-of-experts layers' all-to-alls.
  Communicator* expert_comm = nullptr;
  // The 2d FFN layout's groups (ParallelConfig::grid_*): X, the ranks of this rank's grid column
  // (same j, ordered by i), and Y, those of its row (same i, ordered by j). Null otherwise.
  Communicator* ffn_x_comm = nullptr;
  Communicator* ffn_y_comm = nullptr;
  // Batch-sharded attention (ParallelConfig::attn_layout): the step's plan (null otherwise).
  const AttnBatchPlan* attn_batch = nullptr;
  // Tests: every sparse layer appends its routing (top-k expert ids, [n_tokens, k]) here, read
  // back on the host (a synchronization: never inside a CUDA graph). Null: nothing recorded.
  std::vector<int32_t>* moe_route_trace = nullptr;
};

class Model;
// Model::to_device / Model::random (model/device_layout.cpp).
Result<std::unique_ptr<Model>> build_device_model(const ModelConfig& config,
                                                  const ParallelConfig& par, const Model* host,
                                                  const DeviceLayout& layout, ops::Context& ctx,
                                                  Allocator& alloc);

class Model {
 public:
  // Load (and shard for par) the weights named per the config's family from `source`, as stored
  // (views into the checkpoint where the layout allows): the CPU reference layout.
  static Result<std::unique_ptr<Model>> load(const ModelConfig& config, const ParallelConfig& par,
                                             std::shared_ptr<TensorSource> source);
  // `host`'s weights in the device layout on ctx's device (CUDA, or the CPU for the bf16 twins):
  // Q/K/V and gate/up concatenated, linear weights bf16 or quantized per row, the rest f32; GGUF
  // blocks are dequantized. Memory comes from `alloc`.
  static Result<std::unique_ptr<Model>> to_device(const Model& host, const DeviceLayout& layout,
                                                  ops::Context& ctx, Allocator& alloc);
  // Random weights of `config`'s shapes in the device layout (`--load-format dummy`): linear
  // weights and embeddings uniform with the std of N(0, 0.02), norms 1, biases 0.
  static Result<std::unique_ptr<Model>> random(const ModelConfig& config, const ParallelConfig& par,
                                               const DeviceLayout& layout, ops::Context& ctx,
                                               Allocator& alloc);

  const ModelConfig& config() const { return config_; }
  const ParallelConfig& parallel() const { return par_; }
  const ModelWeights& weights() const { return w_; }
  Device device() const { return device_; }
  bool device_layout() const { return device_layout_; }
  DType weight_dtype() const { return weight_dtype_; }  // device layout's linear weights
  int64_t n_heads_local() const { return n_heads_local_; }
  int64_t n_heads_kv_local() const { return n_kv_local_; }
  // KV heads of this rank's KV cache: its projections' (head-sharded attention), or all of them
  // (batch-sharded: the rank holds whole sequences).
  int64_t n_heads_kv_cache() const {
    return par_.attn_layout == AttnLayout::kBatchSharded ? config_.n_heads_kv : n_kv_local_;
  }
  int64_t ffn_local() const { return ffn_local_; }
  ShardRange vocab_range() const { return vocab_range_; }
  // Mixture of experts: the experts this rank holds (expert parallelism) and the slice of each
  // one's FFN dimension (expert slicing over the tensor-parallel group); all of both on one rank.
  ShardRange expert_range() const { return expert_range_; }
  int64_t n_experts_local() const { return expert_range_.size(); }
  ShardRange expert_ffn_range() const { return expert_ffn_range_; }
  int64_t expert_ffn_local() const { return expert_ffn_range_.size(); }
  int64_t vocab_local() const { return vocab_range_.size(); }
  int64_t qkv_dim() const { return (n_heads_local_ + 2 * n_kv_local_) * config_.head_dim; }
  // Bytes one forward pass reads: every weight once (the tied embedding once).
  size_t weight_bytes() const { return weight_bytes_; }
  // Bytes of memory the store holds beyond the mapped checkpoint (device weights, copies).
  size_t owned_bytes() const { return store_.owned_bytes(); }
  const WeightStore& store() const { return store_; }
  // The streamed layers (slots, host blobs or disk reads), or null when every layer is resident.
  const std::shared_ptr<StreamedWeights>& streamed() const { return store_.streamed(); }

  // The workspace for `limits`: its size in bytes, and its tensors carved from `base` on `device`.
  size_t workspace_bytes(const WorkspaceLimits& limits) const;
  Workspace bind_workspace(const WorkspaceLimits& limits, void* base, Device device) const;

  // Layers [first_layer, last_layer) of the forward pass over args.step, with the embedding
  // when first_layer is 0 and the head (final norm, LM head, logits of args.head's rows) when
  // last_layer is n_layers. Only device work on args.ctx's stream: no host sync, no allocation
  // (the body of a CUDA graph capture).
  Status forward(ForwardArgs& args) const;

 private:
  friend Result<std::unique_ptr<Model>> build_device_model(const ModelConfig&,
                                                           const ParallelConfig&, const Model*,
                                                           const DeviceLayout&, ops::Context&,
                                                           Allocator&);
  Model() = default;
  Status load_weights();
  Status load_moe_layer(int64_t layer, LayerWeights& L);
  Status init_shapes();
  // The FFN layout's constraints on the model and the world (ParallelConfig::ffn_layout).
  Status check_ffn_layout(const std::string& where) const;
  // The attention layout's (ParallelConfig::attn_layout).
  Status check_attn_layout(const std::string& where) const;
  void count_weight_bytes();

  ModelConfig config_;
  ParallelConfig par_;
  ModelWeights w_;
  WeightStore store_;
  Device device_;
  bool device_layout_ = false;
  DType weight_dtype_ = DType::kF32;
  int64_t n_heads_local_ = 0, n_kv_local_ = 0, ffn_local_ = 0;
  ShardRange vocab_range_;
  ShardRange expert_range_, expert_ffn_range_;
  size_t weight_bytes_ = 0;
};

}  // namespace strata
