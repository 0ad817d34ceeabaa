#include "runtime/executor.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "core/env.h"
#include "core/log.h"
#include "core/status.h"
#include "model/model.h"
#include "model/presets.h"
#include "runtime/device_runtime.h"
#include "runtime/model_loader.h"
#include "runtime/pipeline_schedule.h"
#include "runtime/step.h"

namespace strata {

namespace {

class ModelRunner final : public Executor {
 public:
  static Result<std::unique_ptr<ModelRunner>> create(const ModelConfig& config,
                                                     const ParallelConfig& par,
                                                     std::unique_ptr<Model> host,
                                                     Communicator& comm, Communicator* pipeline,
                                                     Communicator* expert,
                                                     const RunnerOptions& options);

  const ModelConfig& config() const override { return model_->config(); }
  KvPool& cache() override { return *kv_; }
  std::string backend_name() const override {
    return runtime_->device().is_cuda() ? "CUDA" : "CPU";
  }
  Status forward(const ForwardBatch& batch, float* logits) override {
    return run(batch, logits, nullptr);
  }
  Status forward_argmax(const ForwardBatch& batch, int32_t* ids) override {
    return run(batch, nullptr, ids);
  }
  size_t block_bytes() const override { return kv_->config().block_bytes(); }
  Status copy_block_to_host(int32_t block, void* host) override {
    STRATA_RETURN_IF_ERROR(runtime_->make_current());
    return kv_->copy_block_to_host(runtime_->ctx(), block, host);
  }
  Status copy_block_from_host(int32_t block, const void* host) override {
    STRATA_RETURN_IF_ERROR(runtime_->make_current());
    return kv_->copy_block_from_host(runtime_->ctx(), block, host);
  }
  Status kv_offload_enable(int64_t host_blocks) override;
  Status kv_offload_load(std::span<const int32_t> device_blocks,
                         std::span<const int32_t> host_blocks) override {
    return kv_transfer(device_blocks, host_blocks, /*to_host=*/false);
  }
  Status kv_offload_wait_loads() override {
    if (!kv_copier_) return kv_offload_off();
    STRATA_RETURN_IF_ERROR(runtime_->make_current());
    return kv_copier_->wait(KvStream::kCompute, kEvLoaded);
  }
  Status kv_offload_store(std::span<const int32_t> device_blocks,
                          std::span<const int32_t> host_blocks) override {
    return kv_transfer(device_blocks, host_blocks, /*to_host=*/true);
  }
  Status kv_offload_synchronize() override {
    if (!kv_copier_) return ok_status();
    STRATA_RETURN_IF_ERROR(runtime_->make_current());
    return kv_copier_->synchronize();
  }
  int64_t max_model_len() const override { return opt_.max_model_len; }
  std::string device_name() const override { return runtime_->name(); }
  std::vector<int> gpus() const override {
    if (!runtime_->device().is_cuda()) return {};
    return {runtime_->device().index};
  }
  int64_t device_weight_bytes() const override {
    return static_cast<int64_t>(model_->owned_bytes());
  }
  int64_t graph_captures() const override { return runtime_->graph_captures(); }
  int64_t graph_replays() const override { return runtime_->graph_replays(); }
  double wait_seconds() const override { return wait_seconds_; }
  const ResidencyPlan* residency_plan() const override { return plan_ ? &*plan_ : nullptr; }
  bool stream_stats(StreamStats* out) const override {
    if (!streamer_) return false;
    *out = streamer_->stats();
    return true;
  }
  std::shared_ptr<const StreamedWeights> streamed_weights() const override {
    return model_->streamed();
  }
  Status stream_pass() override {
    if (!streamer_ || opt_.fetch_group == nullptr) return ok_status();
    STRATA_RETURN_IF_ERROR(runtime_->make_current());
    const ParallelConfig& par = model_->parallel();
    const int64_t last = par.stage_end(model_->config().n_layers);
    STRATA_RETURN_IF_ERROR(streamer_->begin_pass(par.first_layer, last));
    for (int64_t l = par.first_layer; l < last; ++l) {
      STRATA_RETURN_IF_ERROR(streamer_->before_layer(l));
      STRATA_RETURN_IF_ERROR(streamer_->after_layer(l));
    }
    return ok_status();
  }

  // Communicators this runner uses and owns (the groups split from an mpirun world).
  void adopt(std::vector<std::unique_ptr<Communicator>> comms) {
    for (auto& c : comms) owned_.push_back(std::move(c));
  }

  const Model& model() const { return *model_; }
  DeviceRuntime& runtime() { return *runtime_; }
  const RunnerOptions& options() const { return opt_; }

 private:
  ModelRunner(Communicator& comm, Communicator* pipeline, Communicator* expert)
      : comm_(comm), pipe_(pipeline), expert_(expert) {}
  Status allocate(const RunnerOptions& o);
  Status run(const ForwardBatch& b, float* out_logits, int32_t* out_ids);
  // Batch-sharded attention in the device layout: the plan's step arrays (host vectors) into
  // attn_staging_, uploaded to attn_dev_ on the compute stream, attn_plan_.step pointed at the
  // device copies.
  Status upload_attn_plan();
  // KV offload's events: the compute before a store, the end of a store's odd / even layers,
  // the end of the loads so far.
  enum KvEvent { kEvComputed, kEvStoredOdd, kEvStoredEven, kEvLoaded, kNumKvEvents };
  static Status kv_offload_off() {
    return Status(StatusCode::kFailedPrecondition, "KV offload is not enabled");
  }
  Status kv_transfer(std::span<const int32_t> device_blocks, std::span<const int32_t> host_blocks,
                     bool to_host);

  std::vector<std::unique_ptr<Communicator>> owned_;  // first: destroyed after the rest
  Communicator& comm_;    // the tensor-parallel group: the layer program's collectives
  Communicator* pipe_;    // the pipeline group (stage s = rank s), null without stages
  Communicator* expert_;  // the expert-parallel group, null without expert parallelism
  RunnerOptions opt_;
  std::unique_ptr<DeviceRuntime> runtime_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<KvPool> kv_;
  Buffer ws_mem_;
  Workspace ws_;
  std::unique_ptr<StepPacker> packer_;
  PackedStep step_;
  // Batch-sharded attention: this step's plan and each run's owner (ParallelConfig::attn_owner
  // of its first block; the block accounting keeps all of a sequence's blocks on one rank).
  AttnBatchPlan attn_plan_;
  std::vector<int> attn_owner_;
  Buffer attn_staging_, attn_dev_;     // its step arrays (device layout): staging, device copy
  Buffer host_logits_, host_ids_;      // staging for the results (pinned on a GPU)
  Buffer host_hidden_;                 // a pipeline stage's hidden states in transit (GPU)
  double wait_seconds_ = 0.0;          // time blocked receiving them
  std::optional<ResidencyPlan> plan_;  // weight streaming asked for
  std::unique_ptr<WeightStreamer> streamer_;  // some layers streamed
  Buffer kv_host_;                            // KV offload's host pool (pinned on a GPU)
  int64_t kv_host_blocks_ = 0;
  std::unique_ptr<KvCopier> kv_copier_;
  std::vector<KvCopy> kv_copies_;  // scratch
};

Status ModelRunner::kv_offload_enable(int64_t host_blocks) {
  if (host_blocks < 1) {
    return errorf(StatusCode::kInvalidArgument, "KV offload: {} host blocks", host_blocks);
  }
  if (kv_->config().n_owners > 1) {
    return Status(StatusCode::kUnimplemented,
                  "--kv-offload with --attn-layout batch-sharded is not built yet (the KV pool is "
                  "split among the ranks)");
  }
  STRATA_RETURN_IF_ERROR(runtime_->make_current());
  const size_t bytes = kv_->config().block_bytes() * static_cast<size_t>(host_blocks);
  Result<Buffer> host = runtime_->allocate_staging(bytes);
  if (!host.ok()) {
    return host.status().with_context(
        fmt::format("KV offload: {:.2f} GiB of host memory for {} blocks",
                    static_cast<double>(bytes) / (1 << 30), host_blocks));
  }
  kv_host_ = std::move(host).value();
  kv_host_blocks_ = host_blocks;
  STRATA_ASSIGN_OR_RETURN(kv_copier_, runtime_->make_kv_copier(kNumKvEvents));
  return ok_status();
}

// Layers by parity: odd layers go first in both directions, and the load of a layer waits for
// the store of that layer (kEvStoredOdd / kEvStoredEven), so a load's odd layers overlap the
// store's even layers (KvCopier: one stream per direction).
Status ModelRunner::kv_transfer(std::span<const int32_t> device_blocks,
                                std::span<const int32_t> host_blocks, bool to_host) {
  if (!kv_copier_) return kv_offload_off();
  STRATA_RETURN_IF_ERROR(runtime_->make_current());
  KvCopier& c = *kv_copier_;
  const KvStream dir = to_host ? KvStream::kToHost : KvStream::kToDevice;
  if (to_host) {
    // After the compute that wrote the blocks.
    STRATA_RETURN_IF_ERROR(c.record(KvStream::kCompute, kEvComputed));
    STRATA_RETURN_IF_ERROR(c.wait(dir, kEvComputed));
  }
  for (int parity : {1, 0}) {
    const int stored = parity == 1 ? kEvStoredOdd : kEvStoredEven;
    // A load overwrites slots the last store of these layers may still be reading.
    if (!to_host) STRATA_RETURN_IF_ERROR(c.wait(dir, stored));
    kv_copies_.clear();
    STRATA_RETURN_IF_ERROR(kv_->offload_copies(kv_host_.data(), kv_host_blocks_, device_blocks,
                                               host_blocks, parity, to_host, kv_copies_));
    STRATA_RETURN_IF_ERROR(c.copy(dir, kv_copies_));
    if (to_host) STRATA_RETURN_IF_ERROR(c.record(dir, stored));
  }
  if (!to_host) STRATA_RETURN_IF_ERROR(c.record(dir, kEvLoaded));
  return ok_status();
}

Result<std::unique_ptr<ModelRunner>> ModelRunner::create(const ModelConfig& config,
                                                         const ParallelConfig& par,
                                                         std::unique_ptr<Model> host,
                                                         Communicator& comm, Communicator* pipeline,
                                                         Communicator* expert,
                                                         const RunnerOptions& options) {
  if (par.pp_size > 1 &&
      (pipeline == nullptr || pipeline->size() != par.pp_size || pipeline->rank() != par.pp_rank)) {
    return errorf(StatusCode::kInvalidArgument, "pipeline stage {} of {} needs its stage group",
                  par.pp_rank, par.pp_size);
  }
  if (par.ep_size > 1 &&
      (expert == nullptr || expert->size() != par.ep_size || expert->rank() != par.ep_rank)) {
    return errorf(StatusCode::kInvalidArgument, "expert-parallel rank {} of {} needs its group",
                  par.ep_rank, par.ep_size);
  }
  if (par.ep_size > 1 && par.pp_size > 1) {
    return Status(StatusCode::kUnimplemented,
                  "expert parallelism with pipeline stages is not built yet");
  }
  if (par.ffn_layout != FfnLayout::k1D || par.gathers_ffn()) {
    // Both the CPU reference (f32) and the device layout (bf16 activations, on the CPU or CUDA):
    // the program's ops all have both (model/ffn_layouts.cpp).
    const char* name = ffn_layout_name(par.ffn_layout);
    if (comm.size() != par.tp_size || comm.rank() != par.tp_rank) {
      return errorf(StatusCode::kInvalidArgument,
                    "--ffn-layout {}: tensor-parallel rank {} of {} needs its group", name,
                    par.tp_rank, par.tp_size);
    }
    const Communicator* xg = options.ffn_x_group;
    const Communicator* yg = options.ffn_y_group;
    if (par.ffn_layout == FfnLayout::k2D &&
        (xg == nullptr || yg == nullptr || xg->size() != par.grid_x() ||
         xg->rank() != par.grid_i() || yg->size() != par.grid_y() || yg->rank() != par.grid_j())) {
      return errorf(StatusCode::kInvalidArgument,
                    "--ffn-layout 2d: tensor-parallel rank {} needs its X and Y groups "
                    "(split_ffn_groups)",
                    par.tp_rank);
    }
  }
  if (par.attn_layout != AttnLayout::kHeadSharded) {
    // The CPU reference (f32) and the device layout (bf16 activations, on the CPU or CUDA). On
    // CUDA the all-to-alls are copies between the ranks' device buffers with the in-process group
    // (ranks as threads on one GPU) and NCCL's device all-to-alls with ranks on GPUs of their own
    // (model/attn_layouts.cpp, blocks::group_all_to_all_v).
    if (options.device.is_cuda() && comm.size() > 1 && !comm.supports(options.device)) {
      return errorf(StatusCode::kUnimplemented,
                    "--attn-layout batch-sharded on CUDA needs a communicator that takes device "
                    "memory (the {} one does not)",
                    comm.name());
    }
    if (comm.size() != par.tp_size || comm.rank() != par.tp_rank) {
      return errorf(StatusCode::kInvalidArgument,
                    "--attn-layout batch-sharded: tensor-parallel rank {} of {} needs its group",
                    par.tp_rank, par.tp_size);
    }
  }
  std::unique_ptr<ModelRunner> r(new ModelRunner(comm, pipeline, expert));
  r->opt_ = options;
  RunnerOptions& o = r->opt_;
  if (o.act_dtype != DType::kF32 && o.act_dtype != DType::kBF16) {
    return errorf(StatusCode::kInvalidArgument, "activation dtype {} (use f32 or bf16)",
                  dtype_name(o.act_dtype));
  }
  if (o.device.is_cuda()) o.act_dtype = DType::kBF16;  // the GPU runs the device layout
  const bool device_layout = o.act_dtype == DType::kBF16;
  if (!device_layout && o.weight_dtype != DType::kBF16) {
    return Status(StatusCode::kInvalidArgument,
                  "--quantization int8 / fp8 needs the device layout (--device cuda)");
  }
  if (o.block_size < 1 || o.max_num_tokens < 1 || o.max_num_seqs < 1 || o.max_logit_rows < 1) {
    return Status(StatusCode::kInvalidArgument, "block size and batch limits must be >= 1");
  }
  if (o.max_model_len <= 0 || o.max_model_len > config.max_position_embeddings) {
    o.max_model_len = config.max_position_embeddings;
  }
  o.max_logit_rows = std::max(o.max_logit_rows, o.max_num_seqs);
  if (!host && !device_layout) {
    return Status(StatusCode::kInvalidArgument,
                  "random weights (--load-format dummy) need the device layout (--device cuda)");
  }
  STRATA_ASSIGN_OR_RETURN(r->runtime_, DeviceRuntime::create(o.device, o.profile));
  if (o.plan_barrier) r->runtime_->set_plan_barrier(o.plan_barrier);
  if (o.profile || !r->runtime_->supports_graphs()) o.cuda_graphs = false;
  // Batch-sharded attention plans every step on the host (which rank owns which runs, how many
  // rows each all-to-all moves), and its all-to-alls wait on the host: eager.
  if (par.attn_layout == AttnLayout::kBatchSharded) o.cuda_graphs = false;
  // Pipeline stages hand hidden states over through host memory between steps: eager for now.
  if (par.pp_size > 1) o.cuda_graphs = false;
  // Expert parallelism: the fixed-capacity exchange (model/moe_ep.h) runs decode steps of up to
  // moe_ep_fixed_tokens tokens without host synchronization, so they may be captured when it
  // covers every graph-sized step (at most max_num_seqs tokens) and the group takes device
  // memory; the variable-split exchange reads its counts on the host (model/moe.cpp): eager.
  if (o.moe_ep_fixed_tokens < 0) o.moe_ep_fixed_tokens = o.max_num_seqs;
  if (par.ep_size > 1 && (o.moe_ep_fixed_tokens < o.max_num_seqs || !expert->supports(o.device))) {
    o.cuda_graphs = false;
  }
  if (o.moe_route_trace != nullptr) o.cuda_graphs = false;
  DeviceRuntime& rt = *r->runtime_;
  if (device_layout) {
    DeviceLayout layout;
    layout.weight_dtype = o.weight_dtype;
    layout.device_name = rt.name();
    layout.seed = o.seed;
    if (o.device.is_cuda()) {
      STRATA_ASSIGN_OR_RETURN(DeviceMemoryInfo mi, rt.memory_info());
      layout.free_bytes = mi.free_bytes;
    }
    if (o.fetch_group != nullptr) o.residency.fetch_parts = o.fetch_group->size();
    if (o.residency.requested()) {
      STRATA_ASSIGN_OR_RETURN(ResidencyPlan plan,
                              plan_residency(config, par, o.weight_dtype, o.residency,
                                             static_cast<int64_t>(layout.free_bytes), rt.name()));
      r->plan_ = std::move(plan);
      layout.residency = &*r->plan_;
      DeviceRuntime* rtp = &rt;
      layout.host_alloc = [rtp](size_t n) { return rtp->allocate_staging(n); };
      layout.shared_host = o.shared_host_blobs;
      for (const std::string& line : r->plan_->describe()) log_info("weights: {}", line);
    }
    if (host) {
      STRATA_ASSIGN_OR_RETURN(r->model_, Model::to_device(*host, layout, rt.ctx(), rt.allocator()));
      host.reset();  // the device copy is all the runner reads (the mapping can go)
    } else {
      STRATA_ASSIGN_OR_RETURN(r->model_,
                              Model::random(config, par, layout, rt.ctx(), rt.allocator()));
    }
  } else {
    if (o.residency.requested()) {
      return Status(StatusCode::kInvalidArgument,
                    "--gpu-weight-budget / --offload-weights stream the device layout: they need "
                    "--device cuda (or the bf16 twins on the CPU)");
    }
    r->model_ = std::move(host);
  }
  if (r->model_->streamed()) {
    STRATA_ASSIGN_OR_RETURN(r->streamer_,
                            WeightStreamer::create(r->model_->streamed(), rt, o.residency.prefetch,
                                                   o.fetch_group, o.residency.fetch_pieces));
    // The copies are issued (and the disk read) between layers from the host: eager launches.
    o.cuda_graphs = false;
  }
  STRATA_RETURN_IF_ERROR(r->allocate(o));
  return r;
}

Status ModelRunner::allocate(const RunnerOptions& o) {
  DeviceRuntime& rt = *runtime_;
  const Model& m = *model_;
  const ModelConfig& c = m.config();
  const int64_t T = o.max_num_tokens, S = o.max_num_seqs, R = o.max_logit_rows;
  const int64_t max_blocks = (o.max_model_len + o.block_size - 1) / o.block_size;
  // 8-bit weights: cuBLASLt's A8W8 / fp8 GEMMs quantize x per token into the GEMM workspace, with
  // an f32 / int32 D there too when the output is bf16 (backends/cuda/linear.cpp, via_scratch),
  // and cut the tokens into slices that fit. The default 32 MiB held ~200 tokens of the gate/up
  // GEMM of Llama-3-8B (D 28,672 f32 a token): a 2,048-token prefill ran as ten 200-token GEMMs.
  // Room for 1,024 tokens of the widest layer GEMM, three quarters of the workspace (cuBLASLt
  // keeps a quarter).
  if (m.weight_dtype() == DType::kI8 || m.weight_dtype() == DType::kFP8E4M3) {
    const int64_t out = std::max({2 * m.ffn_local(), m.qkv_dim(), c.hidden});
    const int64_t in = std::max({c.hidden, m.ffn_local(), m.n_heads_local() * c.head_dim});
    const int64_t per_token = 4 * ((out + 3) / 4 * 4) + (in + 15) / 16 * 16 + 4;
    const int64_t scratch = std::min<int64_t>(T, 1024) * per_token + 4 * 256;
    STRATA_RETURN_IF_ERROR(
        rt.reserve_linear_workspace(static_cast<size_t>(scratch / 3 * 4 + (int64_t{1} << 20)))
            .with_context("GEMM workspace"));
  }
  // Workspace.
  WorkspaceLimits wl;
  wl.max_tokens = T;
  wl.max_logit_rows = R;
  wl.act = o.act_dtype;
  if (m.parallel().ep_size > 1) wl.ep_fixed_tokens = std::min(o.moe_ep_fixed_tokens, T);
  // Batch-sharded attention runs every query head of the rank's own sequences.
  const bool batch_sharded = m.parallel().attn_layout == AttnLayout::kBatchSharded;
  const int64_t attn_heads = batch_sharded ? c.n_heads : m.n_heads_local();
  wl.attn_workspace_bytes =
      rt.attention_workspace_bytes(std::max(S, T), attn_heads, c.head_dim, o.max_model_len);
  {
    Result<Buffer> b = rt.allocator().allocate(m.workspace_bytes(wl));
    if (!b.ok()) return b.status().with_context("activation workspace");
    ws_mem_ = std::move(b).value();
  }
  ws_ = m.bind_workspace(wl, ws_mem_.data(), rt.device());
  // Step buffers: pinned staging + device copy (one buffer on the CPU).
  StepLimits sl;
  sl.max_tokens = T;
  sl.max_seqs = S;
  sl.max_logit_rows = R;
  sl.max_blocks_per_seq = max_blocks;
  sl.block_size = o.block_size;
  sl.max_model_len = o.max_model_len;
  sl.vocab = c.vocab;
  sl.cuda_graphs = o.cuda_graphs;
  const size_t step_bytes = StepPacker::ints_needed(sl) * sizeof(int32_t);
  STRATA_ASSIGN_OR_RETURN(Buffer staging, rt.allocate_staging(step_bytes));
  Buffer dev = staging;
  if (rt.device().is_cuda()) {
    Result<Buffer> b = rt.allocator().allocate(step_bytes);
    if (!b.ok()) return b.status().with_context("step inputs");
    dev = std::move(b).value();
  }
  if (batch_sharded && o.act_dtype == DType::kBF16) {
    // Batch-sharded attention's per-rank step arrays (AttnBatchPlan), no larger than the step's:
    // the device layout uploads them (on the CPU twins too, a copy, so that its CPU tests run
    // the GPU's path); the f32 reference reads the plan's own vectors.
    STRATA_ASSIGN_OR_RETURN(attn_staging_, rt.allocate_staging(step_bytes));
    Result<Buffer> b = rt.allocator().allocate(step_bytes);
    if (!b.ok()) return b.status().with_context("batch-sharded attention's step inputs");
    attn_dev_ = std::move(b).value();
  }
  STRATA_ASSIGN_OR_RETURN(host_logits_, rt.allocate_staging(static_cast<size_t>(R * c.vocab) * 4));
  STRATA_ASSIGN_OR_RETURN(host_ids_, rt.allocate_staging(static_cast<size_t>(R) * 4));
  const ParallelConfig& par = m.parallel();
  if (par.pp_size > 1 && rt.device().is_cuda()) {
    STRATA_ASSIGN_OR_RETURN(host_hidden_,
                            rt.allocate_staging(static_cast<size_t>(T * c.hidden) * 4));
  }
  // The KV pool: what is asked for, or on a GPU what fits under gpu_memory_utilization.
  KvPoolConfig kc;
  kc.first_layer = par.first_layer;  // a pipeline stage holds its own layers' K and V
  kc.n_layers = par.stage_end(c.n_layers) - par.first_layer;
  kc.block_size = o.block_size;
  kc.n_heads_kv = m.n_heads_kv_cache();
  kc.head_dim = c.head_dim;
  kc.dtype = o.act_dtype;
  // Batch-sharded attention: each rank holds its own sequences' blocks only (KvPoolConfig), so
  // the ids are N times the blocks it holds: counts below are per rank, times N.
  const int owners = par.attn_layout == AttnLayout::kBatchSharded ? par.tp_size : 1;
  kc.n_owners = owners;
  kc.owner = owners > 1 ? par.tp_rank : 0;
  int64_t n_blocks = o.num_kv_blocks;
  if (n_blocks <= 0) {
    if (rt.device().is_cuda()) {
      STRATA_ASSIGN_OR_RETURN(DeviceMemoryInfo mi, rt.memory_info());
      const double budget = o.gpu_memory_utilization * static_cast<double>(mi.total_bytes);
      const double used = static_cast<double>(mi.total_bytes - mi.free_bytes);
      // Leave room for cuBLASLt, graphs and the CUDA context's own growth.
      const double avail =
          std::min(budget - used, static_cast<double>(mi.free_bytes)) - 512.0 * (1 << 20);
      const int64_t fit =
          avail > 0 ? static_cast<int64_t>(avail / static_cast<double>(kc.block_bytes())) : 0;
      if (fit < max_blocks + 1) {
        return errorf(
            StatusCode::kOutOfMemory,
            "cuda: no room for the KV cache: one {}-token sequence needs {:.2f} GiB but "
            "{:.2f} GiB is left after the weights ({:.2f} GiB) under "
            "--gpu-memory-utilization {}; lower --max-model-len or quantize the weights",
            o.max_model_len,
            static_cast<double>(kc.block_bytes() * static_cast<size_t>(max_blocks)) / (1 << 30),
            std::max(0.0, avail) / (1 << 30), static_cast<double>(m.owned_bytes()) / (1 << 30),
            o.gpu_memory_utilization);
      }
      n_blocks = (fit - 1) * owners;
    } else {
      n_blocks = max_blocks * owners;
    }
  }
  // Every owner the same number of blocks (the ids a rank holds, b % N == rank, fill its pool).
  if (owners > 1) n_blocks = n_blocks / owners * owners;
  if (n_blocks < owners) {
    return errorf(StatusCode::kInvalidArgument,
                  "--attn-layout batch-sharded: {} KV blocks for {} ranks (one each at least)",
                  o.num_kv_blocks, owners);
  }
  kc.n_blocks = n_blocks;
  {
    Result<KvPool> pool = KvPool::create(kc, rt.allocator());
    if (!pool.ok()) return pool.status().with_context("KV cache");
    kv_ = std::make_unique<KvPool>(std::move(pool).value());
  }
  sl.n_blocks = n_blocks;
  packer_ = std::make_unique<StepPacker>(sl, std::move(staging), std::move(dev));
  return ops::synchronize(rt.ctx());
}

Status ModelRunner::upload_attn_plan() {
  AttnBatchPlan& p = attn_plan_;
  const std::vector<int32_t>* parts[] = {&p.tokens, &p.token_seq, &p.token_pos,
                                         &p.cu_q,   &p.kv_len,    &p.block_tables};
  size_t total = 0;
  for (const std::vector<int32_t>* v : parts) total += v->size();
  if (total * sizeof(int32_t) > attn_staging_.bytes() ||
      attn_dev_.bytes() < attn_staging_.bytes()) {
    return errorf(StatusCode::kInternal,
                  "batch-sharded attention: {} step ints for a staging buffer of {} bytes", total,
                  attn_staging_.bytes());
  }
  // Packed back to back; the staging is free again: the last step ended with a synchronize.
  auto* host = static_cast<int32_t*>(attn_staging_.data());
  const auto* dev = static_cast<const int32_t*>(attn_dev_.data());
  const int32_t* at[6];
  size_t off = 0;
  for (size_t i = 0; i < 6; ++i) {
    std::copy(parts[i]->begin(), parts[i]->end(), host + off);
    at[i] = dev + off;
    off += parts[i]->size();
  }
  if (total > 0) {
    Tensor dst = Tensor::make(attn_dev_.data(), DType::kI32, {static_cast<int64_t>(total)},
                              runtime_->device());
    STRATA_RETURN_IF_ERROR(ops::upload(runtime_->ctx(), host, dst));
  }
  ops::StepArgs& l = p.step;
  l.tokens = at[0];
  l.token_seq = at[1];
  l.token_pos = at[2];
  l.cu_q = at[3];
  l.kv_len = at[4];
  l.block_tables = at[5];
  return ok_status();
}

Status ModelRunner::run(const ForwardBatch& b, float* out_logits, int32_t* out_ids) {
  DeviceRuntime& rt = *runtime_;
  STRATA_RETURN_IF_ERROR(rt.make_current());
  if (b.tokens.empty()) return ok_status();
  ops::Context& ctx = rt.ctx();
  STRATA_RETURN_IF_ERROR(packer_->pack(b, step_));
  if (rt.device().is_cuda()) {
    Tensor dst = Tensor::make(packer_->device(), DType::kU8,
                              {static_cast<int64_t>(packer_->bytes())}, rt.device());
    STRATA_RETURN_IF_ERROR(ops::upload(ctx, packer_->staging(), dst));
  }
  step_.head.argmax = true;  // always: one graph serves both logits and greedy ids
  const ParallelConfig& par = model_->parallel();
  const bool pipeline = par.pp_size > 1;
  const int64_t H = model_->config().hidden;
  const int64_t n_tok = step_.args.n_tokens;
  Tensor hidden = ws_.x.slice_rows(0, n_tok);
  if (pipeline && !par.first_stage()) {
    // The previous stage's residual stream is this stage's input.
    void* dst = rt.device().is_cuda() ? host_hidden_.data() : hidden.data;
    const auto t0 = std::chrono::steady_clock::now();
    STRATA_RETURN_IF_ERROR(
        pipe_->recv(dst, n_tok * H, DType::kF32, par.pp_rank - 1, CommStream::host()));
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rt.device().is_cuda())
      STRATA_RETURN_IF_ERROR(ops::upload(ctx, host_hidden_.data(), hidden));
  }
  ForwardArgs args{
      ctx, step_.args, ws_, kv_->layers(), comm_, par.first_layer, par.last_layer, step_.head};
  args.weights = streamer_.get();
  args.expert_comm = expert_;
  args.ffn_x_comm = opt_.ffn_x_group;
  args.ffn_y_comm = opt_.ffn_y_group;
  args.moe_route_trace = opt_.moe_route_trace;
  if (par.attn_layout == AttnLayout::kBatchSharded) {
    // Planned on the host from the packer's staging (on a GPU step_.args points at the device
    // copy, uploaded above from the same staging), then the plan's step arrays uploaded.
    const ops::StepArgs st = packer_->host_view(step_.args);
    attn_owner_.resize(static_cast<size_t>(st.n_seqs));
    for (int64_t s = 0; s < st.n_seqs; ++s) {
      attn_owner_[static_cast<size_t>(s)] =
          par.attn_owner(st.block_tables[s * st.max_blocks_per_seq]);
    }
    STRATA_RETURN_IF_ERROR(
        plan_batch_sharded_attention(st, par, attn_owner_, kv_->config().block_size,
                                     static_cast<int32_t>(kv_->scratch_block()), &attn_plan_));
    if (attn_dev_.data() != nullptr) STRATA_RETURN_IF_ERROR(upload_attn_plan());
    args.attn_batch = &attn_plan_;
  }
  rt.begin_step(step_.args.max_q_len == 1);
  STRATA_RETURN_IF_ERROR(
      rt.run(step_.graph, step_.graph_key, [&] { return model_->forward(args); }));
  if (pipeline && !par.last_stage()) {
    void* src = hidden.data;
    if (rt.device().is_cuda()) {
      STRATA_RETURN_IF_ERROR(ops::download(ctx, hidden, host_hidden_.data()));
      STRATA_RETURN_IF_ERROR(ops::synchronize(ctx));
      src = host_hidden_.data();
    }
    STRATA_RETURN_IF_ERROR(
        pipe_->send(src, n_tok * H, DType::kF32, par.pp_rank + 1, CommStream::host()));
  }
  const int64_t n_out = step_.n_out;
  const int64_t V = model_->config().vocab;
  const bool has_head = !pipeline || par.last_stage();
  if (has_head && n_out > 0 && out_logits != nullptr) {
    STRATA_RETURN_IF_ERROR(
        ops::download(ctx, ws_.logits.slice_rows(0, n_out), host_logits_.data()));
  }
  if (has_head && n_out > 0 && out_ids != nullptr) {
    Tensor ids = Tensor::make(ws_.ids.data, DType::kI32, {n_out}, ws_.ids.device);
    STRATA_RETURN_IF_ERROR(ops::download(ctx, ids, host_ids_.data()));
  }
  STRATA_RETURN_IF_ERROR(ops::synchronize(ctx));
  if (comm_.size() > 1) STRATA_RETURN_IF_ERROR(comm_.health());
  // Partitioned fetch: a layer part's all-gather that gave up waiting for a peer (one-shot
  // kernels) or NCCL's asynchronous error.
  if (opt_.fetch_group != nullptr) STRATA_RETURN_IF_ERROR(opt_.fetch_group->health());
  rt.collect_profile();
  // A pipeline's results are the last stage's (the executor asks that stage for them).
  if (has_head && n_out > 0 && out_logits != nullptr) {
    std::memcpy(out_logits, host_logits_.data(), static_cast<size_t>(n_out * V) * 4);
  }
  if (has_head && n_out > 0 && out_ids != nullptr) {
    std::memcpy(out_ids, host_ids_.data(), static_cast<size_t>(n_out) * 4);
  }
  return ok_status();
}

}  // namespace

Result<std::unique_ptr<Executor>> make_runner(const ModelConfig& config, const ParallelConfig& par,
                                              std::unique_ptr<Model> host, Communicator& comm,
                                              const RunnerOptions& options, Communicator* pipeline,
                                              Communicator* expert) {
  STRATA_ASSIGN_OR_RETURN(
      std::unique_ptr<ModelRunner> r,
      ModelRunner::create(config, par, std::move(host), comm, pipeline, expert, options));
  return std::unique_ptr<Executor>(std::move(r));
}

OneShotSizes oneshot_sizes(const ModelConfig& config, const RunnerOptions& o, int tp) {
  const int64_t T = o.max_num_tokens, R = std::max(o.max_logit_rows, o.max_num_seqs);
  OneShotSizes s;
  s.largest = std::max<int64_t>(T * config.hidden * 4, R * ((config.vocab + tp - 1) / tp) * 4);
  ParallelConfig ffn;  // the ranks' FFN layout (ParallelConfig::gathers_ffn)
  ffn.ffn_layout = o.ffn_layout;
  ffn.ffn_gather_min_tokens = o.ffn_gather_min_tokens;
  if (ffn.gathers_ffn() && tp > 1) {
    // Its reduce-scatter stages o_proj's padded partial sums [N P, hidden] f32 (P = ceil(T /
    // N)) whole, and its all-gathers of a layer's FFN shards are not split: [F / N, hidden]
    // bf16 each (model/ffn_layouts.cpp).
    const int64_t P = (T + tp - 1) / tp, F = (config.ffn_dim + tp - 1) / tp;
    s.largest = std::max({s.largest, tp * P * config.hidden * 4, F * config.hidden * 2});
  }
  s.oneshot_max =
      env_config().oneshot_max_bytes >= 0 ? env_config().oneshot_max_bytes : int64_t{256} << 10;
  return s;
}

// The device collectives of an mpirun rank (one process per GPU): the CUDA IPC one-shot kernels
// for decode-sized messages (up to STRATA_ONESHOT_MAX_BYTES, 256 KB by default) and NCCL above;
// host collectives and NCCL's bootstrap over `mpi`. With every rank on one GPU (shared_gpu) NCCL
// cannot run, and the one-shot kernels take every message the model sends. Where the GPUs cannot
// map each other's memory, NCCL alone.
Result<std::unique_ptr<Communicator>> make_device_communicator(std::unique_ptr<Communicator> mpi,
                                                               const ModelConfig& config,
                                                               const RunnerOptions& ro,
                                                               bool shared_gpu) {
  const int tp = mpi->size();
  const OneShotSizes sizes = oneshot_sizes(config, ro, tp);
  const int64_t largest = sizes.largest, oneshot_max = sizes.oneshot_max;
  if (shared_gpu) {
    return make_ipc_oneshot_communicator(std::move(mpi), ro.device.index, largest);
  }
  if (oneshot_max <= 0 || tp == 1) {
    return make_nccl_communicator(std::move(mpi), ro.device.index);
  }
  // Every rank tries; on failure each rank gets the error and all fall back together (a split
  // gives each attempt its own host communicator, so the fallback keeps a working one).
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> sub, mpi->split(0, mpi->rank()));
  Result<std::unique_ptr<Communicator>> ipc =
      make_ipc_oneshot_communicator(std::move(sub), ro.device.index, oneshot_max);
  if (!ipc.ok()) {
    log_warn("one-shot all-reduce over CUDA IPC unavailable ({}); NCCL takes every size",
             ipc.status().message());
    return make_nccl_communicator(std::move(mpi), ro.device.index);
  }
  return make_nccl_communicator(std::move(*ipc), ro.device.index, oneshot_max);
}

Result<FfnGroups> split_ffn_groups(Communicator& tp, const ParallelConfig& par) {
  FfnGroups g;
  if (par.ffn_layout != FfnLayout::k2D) return g;
  STRATA_ASSIGN_OR_RETURN(g.x, tp.split(par.grid_j(), par.grid_i()));
  STRATA_ASSIGN_OR_RETURN(g.y, tp.split(par.grid_i(), par.grid_j()));
  return g;
}

Result<std::unique_ptr<Executor>> make_layout_runner(const ModelConfig& config,
                                                     const ParallelConfig& par,
                                                     std::unique_ptr<Model> host,
                                                     Communicator& comm,
                                                     const RunnerOptions& options) {
  if (par.ffn_layout != FfnLayout::k2D) {
    return make_runner(config, par, std::move(host), comm, options);
  }
  if (par.grid_x() < 1 || par.tp_size % par.grid_x() != 0) {
    // Every rank fails alike before splitting (the loader names the flags).
    return errorf(StatusCode::kInvalidArgument,
                  "--ffn-layout 2d cannot split tensor-parallel size {} into a grid", par.tp_size);
  }
  STRATA_ASSIGN_OR_RETURN(FfnGroups g, split_ffn_groups(comm, par));
  RunnerOptions o = options;
  o.ffn_x_group = g.x.get();
  o.ffn_y_group = g.y.get();
  STRATA_ASSIGN_OR_RETURN(
      std::unique_ptr<ModelRunner> r,
      ModelRunner::create(config, par, std::move(host), comm, nullptr, nullptr, o));
  std::vector<std::unique_ptr<Communicator>> owned;
  owned.push_back(std::move(g.x));
  owned.push_back(std::move(g.y));
  r->adopt(std::move(owned));
  return std::unique_ptr<Executor>(std::move(r));
}

namespace {

// A rank's tensor-parallel group (the world ranks of its ep_rank, ordered by tp_rank) and
// expert-parallel group (those of its tp_rank, ordered by ep_rank), split from the world.
struct ExpertGroups {
  std::unique_ptr<Communicator> tp, ep;
};

Result<ExpertGroups> split_expert_groups(Communicator& world, const ParallelConfig& par) {
  ExpertGroups g;
  STRATA_ASSIGN_OR_RETURN(g.tp, world.split(par.ep_rank, par.tp_rank));
  STRATA_ASSIGN_OR_RETURN(g.ep, world.split(par.tp_rank, par.ep_rank));
  return g;
}

// A runner over its groups, which it owns.
Result<std::unique_ptr<Executor>> make_expert_parallel_runner(const ModelConfig& config,
                                                              const ParallelConfig& par,
                                                              std::unique_ptr<Model> host,
                                                              ExpertGroups g,
                                                              const RunnerOptions& ro) {
  STRATA_ASSIGN_OR_RETURN(
      std::unique_ptr<ModelRunner> r,
      ModelRunner::create(config, par, std::move(host), *g.tp, nullptr, g.ep.get(), ro));
  std::vector<std::unique_ptr<Communicator>> owned;
  owned.push_back(std::move(g.tp));
  owned.push_back(std::move(g.ep));
  r->adopt(std::move(owned));
  return std::unique_ptr<Executor>(std::move(r));
}

// The GGUF block formats the device layout keeps for `host`'s dense linears ("gguf:q4_k+q6_k"),
// or "" (none, or STRATA_GGUF_DEQUANT=1). For the engine's weight_format line; the device
// layout itself decides per linear (also falling back for shapes without a kernel).
std::string gguf_block_formats(const Model& host) {
  if (env_config().gguf_dequant) return "";
  std::vector<DType> seen;
  const auto add = [&](const ops::LinearWeight& w) {
    for (int i = 0; i < w.n_parts; ++i) {
      const DType dt = w.parts[static_cast<size_t>(i)].w.dtype;
      if (cpu::gguf_device_ok(dt, w.cols()) &&
          std::find(seen.begin(), seen.end(), dt) == seen.end()) {
        seen.push_back(dt);
      }
    }
  };
  for (const LayerWeights& l : host.weights().layers) {
    for (const ops::LinearWeight* w : {&l.qkv, &l.o, &l.gate_up, &l.down}) add(*w);
  }
  add(host.weights().lm_head);
  std::sort(seen.begin(), seen.end());
  std::string s;
  for (DType dt : seen) s += (s.empty() ? "gguf:" : "+") + std::string(dtype_name(dt));
  return s;
}

}  // namespace

Result<LoadedExecutor> load_executor(const EngineConfig& cfg, const ExecutorOptions& eo) {
  LoadedExecutor out;
  const bool cuda = cfg.device.is_cuda();
  const int dp = cfg.parallel.dp;
  if (dp < 1)
    return errorf(StatusCode::kInvalidArgument, "--data-parallel-size {} must be >= 1", dp);
  if (dp > 1 && !cuda) {
    return Status(StatusCode::kInvalidArgument,
                  "--data-parallel-size > 1 needs --device cuda (the CPU runs one replica; the "
                  "library's make_in_process_dp_executor runs CPU replicas for tests)");
  }
  if (dp > 1 && (cfg.parallel.tp > 1 || cfg.parallel.pp > 1 || cfg.parallel.ep > 1 ||
                 env_config().launcher_size > 1)) {
    return Status(StatusCode::kUnimplemented,
                  "--data-parallel-size with --tp, --pp, --ep or mpirun is not built yet: data-"
                  "parallel replicas are threads of one process, one GPU each");
  }
  const int ep = cfg.parallel.ep;
  if (ep < 1) {
    return errorf(StatusCode::kInvalidArgument, "--expert-parallel-size {} must be >= 1", ep);
  }
  const int pp = cfg.parallel.pp;
  if (ep > 1 && pp > 1) {
    return Status(StatusCode::kUnimplemented,
                  "--expert-parallel-size with --pipeline-parallel-size > 1 is not built yet");
  }
  if (pp < 1) return errorf(StatusCode::kInvalidArgument, "--pipeline-parallel-size must be >= 1");
  ParallelConfig ffn_probe;  // --ffn-layout and --ffn-2d-x (the CUDA ranks' RunnerOptions)
  if (cfg.parallel.ffn_layout != "1d" || cfg.parallel.ffn_2d_x != 0 ||
      cfg.parallel.ffn_gather_min_tokens != 0) {
    ParallelConfig& probe = ffn_probe;
    STRATA_RETURN_IF_ERROR(apply_ffn_layout(cfg.parallel, &probe));
    // On CUDA: --tensor-parallel-size ranks as threads of this process, on one GPU (the
    // in-process one-shot kernels) or one GPU each (NCCL, its subgroups split from the ranks');
    // not under mpirun (the IPC communicator has no subgroups or reduce-scatter).
    const bool other = probe.ffn_layout != FfnLayout::k1D || probe.gathers_ffn();
    const std::string name = probe.ffn_layout == FfnLayout::k1D
                                 ? std::string("1d --ffn-gather-min-tokens")
                                 : cfg.parallel.ffn_layout;
    if (other && ((cuda && env_config().launcher_size > 1) || pp > 1 || ep > 1 || dp > 1)) {
      return errorf(StatusCode::kUnimplemented,
                    "--ffn-layout {} is built with --tensor-parallel-size only: on the CPU under "
                    "mpirun, or with --device cuda as ranks that are threads of one process (not "
                    "under mpirun, nor with --pp, --ep or --dp yet)",
                    name);
    }
    if ((probe.ffn_layout == FfnLayout::kWeightGathered || probe.gathers_ffn()) &&
        cfg.quantization != Quantization::kNone) {
      return errorf(StatusCode::kUnimplemented,
                    "--ffn-layout {} gathers bf16 FFN shards: --quantization {} is not built for "
                    "it yet",
                    name, to_string(cfg.quantization));
    }
    if (other && cuda && cfg.parallel.tp < 2) {
      return errorf(StatusCode::kInvalidArgument,
                    "--ffn-layout {} with --device cuda needs --tensor-parallel-size > 1", name);
    }
  }
  ParallelConfig attn_probe;  // --attn-layout (the CUDA ranks' RunnerOptions)
  if (cfg.parallel.attn_layout != "head-sharded") {
    ParallelConfig& probe = attn_probe;
    STRATA_RETURN_IF_ERROR(apply_attn_layout(cfg.parallel, &probe));
    // On CUDA: --tensor-parallel-size ranks as threads of this process (no mpirun): on one GPU
    // the all-to-alls are device-to-device copies, across GPUs NCCL's (model/attn_layouts.cpp).
    if (probe.attn_layout != AttnLayout::kHeadSharded &&
        ((cuda && env_config().launcher_size > 1) || pp > 1 || ep > 1 || dp > 1)) {
      return errorf(StatusCode::kUnimplemented,
                    "--attn-layout {} is built with --tensor-parallel-size only: on the CPU under "
                    "mpirun, or with --device cuda as ranks that are threads of one process (not "
                    "under mpirun, nor with --pp, --ep or --dp yet)",
                    cfg.parallel.attn_layout);
    }
  }
  if (cfg.parallel.pp_micro_batch < 1) {
    return errorf(StatusCode::kInvalidArgument, "--pp-micro-batch must be >= 1");
  }
  if (pp == 1 && !cfg.parallel.pp_layers.empty()) {
    return Status(StatusCode::kInvalidArgument, "--pp-layers needs --pipeline-parallel-size > 1");
  }
  // A shape preset has no files to read: it implies dummy weights.
  const bool dummy = cfg.load_format == LoadFormat::kDummy || !cfg.model_config.empty();
  const DType wdt = quantization_dtype(cfg.quantization);
  std::string gguf_formats;  // a GGUF checkpoint's block formats kept on the GPU
  if (dtype_info(wdt).is_quantized && !dummy) {
    return errorf(StatusCode::kInvalidArgument,
                  "--quantization {} builds random weights (with --model-config or --load-format "
                  "dummy); a GGUF checkpoint keeps its own block formats without --quantization",
                  dtype_name(wdt));
  }
  if (!cuda && (wdt != DType::kBF16 || dummy)) {
    return Status(StatusCode::kInvalidArgument,
                  "--quantization, --load-format dummy and --model-config need --device cuda");
  }
  if (cfg.max_model_len < 0) {
    return errorf(StatusCode::kInvalidArgument, "--max-model-len must be >= 0");
  }
  RunnerOptions ro;
  if (cuda) {
    // The in-process ranks' layout (the CPU's comes from load_model, per mpirun rank).
    ro.ffn_layout = ffn_probe.ffn_layout;
    ro.ws2d_x = ffn_probe.ws2d_x;
    ro.ffn_gather_min_tokens = ffn_probe.ffn_gather_min_tokens;
    ro.attn_layout = attn_probe.attn_layout;
  }
  ro.residency.gpu_weight_budget = cfg.gpu_weight_budget;
  ro.residency.offload = cfg.offload_weights;
  ro.residency.prefetch = cfg.weight_prefetch;
  ro.residency.fetch_pieces = cfg.fetch_pieces;
  if (!cuda && ro.residency.requested()) {
    return Status(StatusCode::kInvalidArgument,
                  "--gpu-weight-budget and --offload-weights need --device cuda (the CPU runs the "
                  "weights as stored, in place)");
  }
  ro.block_size = eo.block_size;
  ro.max_model_len = cfg.max_model_len;
  ro.profile = env_config().profile;
  ro.pp_min_micro_batch_tokens = cfg.parallel.pp_micro_batch;
  if (!cuda) {
    STRATA_ASSIGN_OR_RETURN(LoadedModel loaded, load_model(cfg));
    out.info = std::move(loaded.info);
    out.max_len = loaded.max_len;
    out.comm = std::move(loaded.comm);
    out.tokenizer = std::move(loaded.tokenizer);
    const ModelConfig config = loaded.config;
    KvPoolConfig kc;
    kc.n_layers = config.n_layers;
    kc.block_size = eo.block_size;
    kc.n_heads_kv = loaded.model ? loaded.model->n_heads_kv_cache() : config.n_heads_kv;
    kc.head_dim = config.head_dim;
    kc.dtype = DType::kF32;
    // The byte budgets are per rank; with batch-sharded attention a rank holds 1 / tp of the
    // block ids (every KV head of its own sequences' blocks: KvPoolConfig::n_owners), so the
    // engine's pool has tp times the blocks that fit one rank.
    const int64_t owners =
        loaded.model && loaded.model->parallel().attn_layout == AttnLayout::kBatchSharded
            ? loaded.model->parallel().tp_size
            : 1;
    int64_t n_blocks = eo.cpu_blocks;
    if (n_blocks <= 0 && eo.cpu_kv_bytes > 0) {
      const auto per = static_cast<int64_t>(kc.block_bytes());
      n_blocks = eo.cpu_kv_bytes / per * owners;
      if (n_blocks < 1) {
        return errorf(StatusCode::kOutOfMemory,
                      "KV cache of {} bytes holds no block ({} bytes each)", eo.cpu_kv_bytes, per);
      }
    }
    if (n_blocks <= 0) {
      n_blocks = (out.max_len + eo.block_size - 1) / eo.block_size * eo.cpu_seqs;
      if (eo.cpu_kv_max_bytes > 0) {
        const auto per = static_cast<int64_t>(kc.block_bytes());
        n_blocks = std::min(n_blocks, std::max<int64_t>(1, eo.cpu_kv_max_bytes / per) * owners);
      }
    }
    ro.device = Device::cpu();
    ro.act_dtype = DType::kF32;
    ro.num_kv_blocks = n_blocks;
    ro.max_model_len = out.max_len;
    ro.max_num_tokens = std::max<int64_t>(512, cfg.max_num_batched_tokens);
    ro.max_num_seqs = std::max<int64_t>(64, std::max<int64_t>(cfg.max_num_seqs, eo.cpu_seqs));
    ro.max_logit_rows = ro.max_num_tokens;
    ro.cuda_graphs = false;
    ro.moe_ep_fixed_tokens = env_config().moe_ep_fixed_tokens;
    if (out.comm->size() > 1) {
      // mpirun: every rank sizes the pool alike; rank 0's count makes it certain (the driver's
      // block ids address every rank's pool).
      STRATA_RETURN_IF_ERROR(out.comm->broadcast(&n_blocks, sizeof(n_blocks), 0));
      ro.num_kv_blocks = n_blocks;
    }
    if (pp > 1) {
      STRATA_ASSIGN_OR_RETURN(std::vector<int64_t> bounds,
                              pipeline_bounds(config.n_layers, pp, cfg.parallel.pp_layers));
      std::shared_ptr<TensorSource> weights = loaded.weights;
      auto load = [&](const ParallelConfig& par) { return Model::load(config, par, weights); };
      if (out.comm->size() > 1) {
        // mpirun: this process is one rank (stage, tensor-parallel rank) of tp x pp.
        STRATA_ASSIGN_OR_RETURN(
            out.exec, make_pipeline_rank(config, bounds, cfg.parallel.tp, *out.comm, load, ro));
      } else {
        STRATA_ASSIGN_OR_RETURN(out.exec, make_in_process_pp_executor(config, load, bounds, ro));
      }
    } else if (ep > 1) {
      const ParallelConfig par = loaded.model->parallel();
      STRATA_ASSIGN_OR_RETURN(ExpertGroups g, split_expert_groups(*out.comm, par));
      STRATA_ASSIGN_OR_RETURN(
          out.exec,
          make_expert_parallel_runner(config, par, std::move(loaded.model), std::move(g), ro));
    } else {
      const ParallelConfig par = loaded.model->parallel();
      STRATA_ASSIGN_OR_RETURN(
          out.exec, make_layout_runner(config, par, std::move(loaded.model), *out.comm, ro));
    }
    out.info.kv_cache_blocks = out.exec->cache().config().n_blocks;  // batch-sharded: rounded to N
    out.info.kv_block_size = eo.block_size;
    return out;
  }
  if (cfg.gpu_memory_utilization <= 0.0 || cfg.gpu_memory_utilization > 1.0) {
    return errorf(StatusCode::kInvalidArgument, "--gpu-memory-utilization must be in (0, 1]");
  }
  ro.device = Device::cuda(cfg.device.index);
  ro.act_dtype = DType::kBF16;
  ro.weight_dtype = wdt;
  ro.max_num_tokens = std::max<int64_t>(1, cfg.max_num_batched_tokens);
  ro.max_num_seqs = cfg.max_num_seqs > 0 ? cfg.max_num_seqs : 64;
  ro.num_kv_blocks = eo.cuda_blocks;
  ro.gpu_memory_utilization = cfg.gpu_memory_utilization;
  ro.cuda_graphs = cfg.cuda_graphs;
  const EnvConfig& env = env_config();
  ro.moe_ep_fixed_tokens = env.moe_ep_fixed_tokens;
  const bool mpi = env.launcher_size > 1;
  if (cfg.parallel.tp < 1) {
    return errorf(StatusCode::kInvalidArgument, "--tensor-parallel-size must be >= 1");
  }
  const int world = cfg.parallel.tp * ep * pp;
  if (mpi && env.launcher_size != world) {
    return errorf(StatusCode::kInvalidArgument,
                  "--tensor-parallel-size {} x --expert-parallel-size {} x "
                  "--pipeline-parallel-size {} but {} ranks were launched (use mpirun -np {}, or "
                  "no mpirun: {} ranks as threads of one process, one GPU each)",
                  cfg.parallel.tp, ep, pp, env.launcher_size, world, world);
  }
  if (mpi && ep > 1 && env.tp_one_gpu) {
    return Status(StatusCode::kUnimplemented,
                  "--expert-parallel-size under mpirun with every rank on one GPU "
                  "(STRATA_TP_ONE_GPU) is not built yet; run without mpirun (ranks as threads)");
  }
  ModelConfig config;
  std::shared_ptr<TensorSource> weights;  // null: random weights
  if (mpi) {
    // One process per GPU (mpirun): this rank's shard on GPU index + local rank, device
    // collectives through NCCL, host ones (and NCCL's bootstrap) through MPI.
    const int local =
        env.launcher_local_rank >= 0 ? env.launcher_local_rank : std::max(0, env.launcher_rank);
    // STRATA_TP_ONE_GPU=1: every rank on the one GPU (testing the multi-process path on one
    // card); NCCL cannot run two ranks on one GPU, so the CUDA IPC one-shot takes every size.
    const bool shared_gpu = env.tp_one_gpu;
    ro.device = Device::cuda(cfg.device.index + (shared_gpu ? 0 : local));
    EngineConfig shard_cfg = cfg;
    shard_cfg.device = DeviceSpec::cuda(ro.device.index);
    if (pp > 1) {
      // Pipeline stages, one process per (stage, tensor-parallel rank): each loads only its
      // stage's layers; the stage's tensor-parallel group gets device collectives, stages pass
      // hidden states through host memory over MPI.
      STRATA_ASSIGN_OR_RETURN(out.comm, make_mpi_communicator());
      if (dummy && !cfg.model_config.empty()) {
        STRATA_ASSIGN_OR_RETURN(config, model_config_preset(cfg.model_config));
        out.info = make_model_info("dummy:" + cfg.model_config, config);
      } else {
        STRATA_ASSIGN_OR_RETURN(ModelFiles files, open_model(cfg.model, /*with_weights=*/!dummy));
        config = files.config;
        out.info = std::move(files.info);
        out.tokenizer = std::move(files.tokenizer);
        weights = files.weights;
      }
      STRATA_ASSIGN_OR_RETURN(std::vector<int64_t> bounds,
                              pipeline_bounds(config.n_layers, pp, cfg.parallel.pp_layers));
      std::function<Result<std::unique_ptr<Model>>(const ParallelConfig&)> load;
      if (weights)
        load = [&](const ParallelConfig& par) { return Model::load(config, par, weights); };
      auto device_tp = [&](std::unique_ptr<Communicator> g) {
        return make_device_communicator(std::move(g), config, ro, shared_gpu);
      };
      RunnerOptions rp = ro;
      if (shared_gpu && rp.num_kv_blocks <= 0) rp.gpu_memory_utilization /= world;
      STRATA_ASSIGN_OR_RETURN(out.exec, make_pipeline_rank(config, bounds, cfg.parallel.tp,
                                                           *out.comm, load, rp, device_tp));
    } else {
      if (dummy) {
        STRATA_ASSIGN_OR_RETURN(out.comm, make_mpi_communicator());
        if (!cfg.model_config.empty()) {
          STRATA_ASSIGN_OR_RETURN(config, model_config_preset(cfg.model_config));
          out.info = make_model_info("dummy:" + cfg.model_config, config);
        } else {
          STRATA_ASSIGN_OR_RETURN(ModelFiles files, open_model(cfg.model, /*with_weights=*/false));
          config = files.config;
          out.info = std::move(files.info);
          out.tokenizer = std::move(files.tokenizer);
        }
      }
      std::unique_ptr<Model> host;
      if (!dummy) {
        STRATA_ASSIGN_OR_RETURN(LoadedModel loaded, load_model(shard_cfg));
        out.info = std::move(loaded.info);
        out.tokenizer = std::move(loaded.tokenizer);
        out.comm = std::move(loaded.comm);
        host = std::move(loaded.model);
        config = host->config();
      }
      ParallelConfig par;
      par.tp_size = cfg.parallel.tp;
      par.tp_rank = out.comm->rank() % cfg.parallel.tp;
      par.ep_size = ep;
      par.ep_rank = out.comm->rank() / cfg.parallel.tp;
      if (ep == 1) {
        STRATA_ASSIGN_OR_RETURN(
            out.comm, make_device_communicator(std::move(out.comm), config, ro, shared_gpu));
      }
      if (ep > 1) {
        // The world stays the control group; the tensor-parallel group gets the device
        // collectives. The expert-parallel group gets NCCL when every rank has its own GPU: the
        // fixed-capacity exchange's all-to-alls (grouped send/recv) run in the decode steps'
        // CUDA graphs and prefill's variable splits on the device; ranks sharing a GPU keep host
        // memory for it (eager steps, model/moe.cpp).
        STRATA_ASSIGN_OR_RETURN(ExpertGroups g, split_expert_groups(*out.comm, par));
        STRATA_ASSIGN_OR_RETURN(g.tp, make_device_communicator(std::move(g.tp), config, ro, false));
        if (ro.device.is_cuda() && !shared_gpu) {
          STRATA_ASSIGN_OR_RETURN(g.ep, make_nccl_communicator(std::move(g.ep), ro.device.index));
        }
        STRATA_ASSIGN_OR_RETURN(
            out.exec, make_expert_parallel_runner(config, par, std::move(host), std::move(g), ro));
      } else if (!shared_gpu || par.tp_size == 1) {
        STRATA_ASSIGN_OR_RETURN(out.exec, make_runner(config, par, std::move(host), *out.comm, ro));
      } else {
        // Every process on one GPU: rank 0 sizes its KV pool within its share of
        // --gpu-memory-utilization first, and the others take as many blocks (the ranks address
        // the same block ids).
        Result<std::unique_ptr<Executor>> e =
            Status(StatusCode::kInternal, "tensor-parallel rank 0 failed to load");
        int64_t blocks = -1;
        if (par.tp_rank == 0) {
          RunnerOptions r0 = ro;
          if (r0.num_kv_blocks <= 0) r0.gpu_memory_utilization /= par.tp_size;
          e = make_runner(config, par, std::move(host), *out.comm, r0);
          if (e.ok()) blocks = (*e)->cache().config().n_blocks;
        }
        STRATA_RETURN_IF_ERROR(
            out.comm->broadcast(&blocks, static_cast<int64_t>(sizeof(blocks)), 0));
        if (par.tp_rank != 0 && blocks > 0) {
          RunnerOptions rn = ro;
          rn.num_kv_blocks = blocks;
          e = make_runner(config, par, std::move(host), *out.comm, rn);
        }
        int32_t failed = e.ok() ? 0 : 1;
        STRATA_RETURN_IF_ERROR(out.comm->all_reduce(&failed, 1, DType::kI32, CommStream::host()));
        if (!e.ok()) return e.status();
        if (failed != 0) {
          return errorf(StatusCode::kInternal, "{} tensor-parallel rank(s) failed to load", failed);
        }
        out.exec = std::move(*e);
      }
    }
  } else if (cfg.parallel.tp == 1 && ep == 1 && pp == 1 && dp == 1 && !dummy) {
    STRATA_ASSIGN_OR_RETURN(LoadedModel loaded, load_model(cfg));
    out.info = std::move(loaded.info);
    out.tokenizer = std::move(loaded.tokenizer);
    out.comm = std::move(loaded.comm);
    config = loaded.model->config();
    if (wdt == DType::kBF16 && !ro.residency.requested()) {
      gguf_formats = gguf_block_formats(*loaded.model);
    }
    STRATA_ASSIGN_OR_RETURN(
        out.exec, make_runner(config, ParallelConfig{}, std::move(loaded.model), *out.comm, ro));
  } else {
    out.comm = make_single_rank_communicator();
    if (dummy && !cfg.model_config.empty()) {
      STRATA_ASSIGN_OR_RETURN(config, model_config_preset(cfg.model_config));
      out.info = make_model_info("dummy:" + cfg.model_config, config);
    } else {
      STRATA_ASSIGN_OR_RETURN(ModelFiles files, open_model(cfg.model, /*with_weights=*/!dummy));
      config = files.config;
      out.info = std::move(files.info);
      out.tokenizer = std::move(files.tokenizer);
      weights = files.weights;
    }
    if (pp > 1) {
      // Pipeline stages as threads of this process, one GPU each (or all on one GPU); with
      // --tensor-parallel-size T each stage is T ranks, rank (s, i) on GPU index + s * T + i.
      STRATA_ASSIGN_OR_RETURN(std::vector<int64_t> bounds,
                              pipeline_bounds(config.n_layers, pp, cfg.parallel.pp_layers));
      std::function<Result<std::unique_ptr<Model>>(const ParallelConfig&)> load;
      if (weights)
        load = [&](const ParallelConfig& par) { return Model::load(config, par, weights); };
      STRATA_ASSIGN_OR_RETURN(
          out.exec, make_in_process_pp_executor(config, load, bounds, ro, cfg.parallel.tp));
    } else if (dp > 1) {
      // Data-parallel replicas as threads of this process, replica r on GPU index + r (or all on
      // one GPU), streamed weights fetched partitioned.
      std::function<Result<std::unique_ptr<Model>>(const ParallelConfig&)> load;
      if (weights)
        load = [&](const ParallelConfig& par) { return Model::load(config, par, weights); };
      STRATA_ASSIGN_OR_RETURN(
          out.exec, make_in_process_dp_executor(config, load, dp, ro, cfg.partitioned_fetch));
    } else if (cfg.parallel.tp > 1 || ep > 1) {
      // Ranks as threads of this process, one GPU each (or all on one GPU when there are fewer).
      std::function<Result<std::unique_ptr<Model>>(const ParallelConfig&)> load;
      if (weights)
        load = [&](const ParallelConfig& par) { return Model::load(config, par, weights); };
      STRATA_ASSIGN_OR_RETURN(out.exec,
                              make_in_process_tp_executor(config, load, cfg.parallel.tp, ro, ep));
    } else {
      std::unique_ptr<Model> host;
      if (weights) {
        STRATA_ASSIGN_OR_RETURN(host, Model::load(config, ParallelConfig{}, weights));
      }
      STRATA_ASSIGN_OR_RETURN(
          out.exec, make_runner(config, ParallelConfig{}, std::move(host), *out.comm, ro));
    }
  }
  out.max_len = out.exec->max_model_len();
  out.info.backend = "CUDA";
  out.info.device_name = out.exec->device_name();
  // A GGUF checkpoint on one GPU keeps its linears' block formats (model/device_layout.cpp).
  out.info.weight_format = gguf_formats.empty() ? std::string(dtype_name(wdt)) : gguf_formats;
  out.info.device_weight_bytes = out.exec->device_weight_bytes();
  out.info.n_gpus = std::max<int64_t>(1, static_cast<int64_t>(out.exec->gpus().size()));
  out.info.kv_cache_blocks = out.exec->cache().config().n_blocks;
  out.info.kv_block_size = eo.block_size;
  return out;
}

}  // namespace strata
