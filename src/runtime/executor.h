// Executor: one model's forward pass on its device, with the paged KV pool it addresses. The
// engines (Engine, ServingEngine) drive an Executor and never ask which device runs it. There is
// one implementation, the ModelRunner (runtime/executor.cpp): it owns the device runtime, the
// model (its weights in the layout the device reads), the KV pool, the workspace, the step
// packer and the CUDA-graph cache, and runs the family's layer program through the ops.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "memory/kv_pool.h"
#include "model/config.h"
#include "model/model.h"
#include "parallel/comm.h"
#include "runtime/weight_streamer.h"
#include "strata/engine.h"
#include "strata/status.h"
#include "text/tokenizer.h"

namespace strata {

class Executor {
 public:
  virtual ~Executor() = default;
  virtual const ModelConfig& config() const = 0;
  virtual KvPool& cache() = 0;
  virtual std::string backend_name() const = 0;  // "CPU", "CUDA"
  // logits [logit_rows, vocab] f32 on the host, the full vocabulary on every rank.
  virtual Status forward(const ForwardBatch& batch, float* logits) = 0;
  // ids[i] = argmax of logit row i (first index on ties), computed on the device.
  virtual Status forward_argmax(const ForwardBatch& batch, int32_t* ids) = 0;
  // Swapping a preempted sequence's KV: one block (every layer's K and V) to or from a host
  // slot of block_bytes() bytes.
  virtual size_t block_bytes() const = 0;
  virtual Status copy_block_to_host(int32_t block, void* host) = 0;
  virtual Status copy_block_from_host(int32_t block, const void* host) = 0;
  virtual int64_t max_model_len() const = 0;
  // The device's name; "N x name" over several ranks of one process.
  virtual std::string device_name() const = 0;
  // Weight bytes this executor holds on its device(s).
  virtual int64_t device_weight_bytes() const = 0;
  // The distinct GPUs this executor's ranks run on (CUDA ordinals; empty on the CPU), for
  // per-machine peaks (MFU, bandwidth) of several GPUs.
  virtual std::vector<int> gpus() const { return {}; }
  // CUDA-graph counters (0 on the CPU).
  virtual int64_t graph_captures() const = 0;
  virtual int64_t graph_replays() const = 0;
  // Seconds spent blocked on another rank's data (a pipeline stage waiting for its input).
  virtual double wait_seconds() const { return 0.0; }
  // The pipeline bubble of the forward passes so far (idle stage-time over all stage-time,
  // measured), or -1 when this executor is not a pipeline.
  virtual double measured_bubble() const { return -1.0; }
  virtual void reset_pipeline_stats() {}

  // Forward passes in flight at once (seed 000's generation schedule for pipeline stages: while
  // stage s runs one step's micro-batch, stage s + 1 runs the previous one). 1: submit() runs
  // the pass before it returns. A pipelined executor returns at once, having copied the batch;
  // the caller keeps at most pipeline_depth() passes outstanding, of disjoint sequences, keeps
  // `logits` / `ids` alive until their wait(), and waits before anything else touches the
  // executor (swaps, synchronous forward passes).
  virtual int pipeline_depth() const { return 1; }
  // With ids != null: forward_argmax into ids; else forward into logits.
  virtual Status submit(const ForwardBatch& batch, float* logits, int32_t* ids) {
    done_.push_back(ids != nullptr ? forward_argmax(batch, ids) : forward(batch, logits));
    return ok_status();
  }
  // Blocks until the oldest submitted pass has finished; its status.
  virtual Status wait() {
    if (done_.empty())
      return Status(StatusCode::kFailedPrecondition, "wait() with nothing submitted");
    Status s = std::move(done_.front());
    done_.erase(done_.begin());
    return s;
  }

  // KV offload (--kv-offload, serving/kv_offload.h): a host pool of `host_blocks` KV blocks
  // (pinned on a GPU) beside the device pool, and two copy streams, one per direction. Each
  // transfer moves the odd layers first, then the even ones, and a load of a layer waits for
  // the last store of that layer: while the even layers of a store go device -> host, the odd
  // layers of the next load come host -> device, so both directions of the link are busy (the
  // slots a load fills may be the ones the store is reading). kUnimplemented for executors over
  // several ranks (tensor, pipeline or expert parallelism).
  virtual Status kv_offload_enable(int64_t host_blocks) {
    (void)host_blocks;
    return Status(StatusCode::kUnimplemented,
                  "--kv-offload needs a single-rank executor (no --tp, --pp or --ep)");
  }
  // Host -> device: device_blocks[i] <- host_blocks[i], queued on the copy stream.
  virtual Status kv_offload_load(std::span<const int32_t> device_blocks,
                                 std::span<const int32_t> host_blocks) {
    (void)device_blocks;
    (void)host_blocks;
    return Status(StatusCode::kUnimplemented, "kv offload");
  }
  // The forward passes submitted from now on wait for the loads queued so far.
  virtual Status kv_offload_wait_loads() {
    return Status(StatusCode::kUnimplemented, "kv offload");
  }
  // Device -> host after the forward passes submitted so far: host_blocks[i] <- device_blocks[i].
  virtual Status kv_offload_store(std::span<const int32_t> device_blocks,
                                  std::span<const int32_t> host_blocks) {
    (void)device_blocks;
    (void)host_blocks;
    return Status(StatusCode::kUnimplemented, "kv offload");
  }
  // Blocks until every queued offload copy is done.
  virtual Status kv_offload_synchronize() { return ok_status(); }

  // Weight streaming: the residency plan (null when none was asked for) and the streaming
  // counters (false when no layer is streamed).
  virtual const ResidencyPlan* residency_plan() const { return nullptr; }
  virtual bool stream_stats(StreamStats* out) const {
    (void)out;
    return false;
  }
  // Data-parallel replicas (make_in_process_dp_executor): their number, each replica's
  // streaming counters (empty when not data-parallel or not streaming), and for a runner the
  // streamed layers (their host blobs are shared with the other replicas).
  virtual int data_parallel_size() const { return 1; }
  virtual std::vector<StreamStats> replica_stream_stats() const { return {}; }
  virtual std::shared_ptr<const StreamedWeights> streamed_weights() const { return nullptr; }
  // Partitioned fetch: a forward pass's weight traffic without its compute — every streamed
  // layer fetched (this rank's part, and the all-gather with the other replicas) and released.
  // A replica with no sequence in a step runs this so its peers' all-gathers find it.
  virtual Status stream_pass() { return ok_status(); }

 private:
  std::vector<Status> done_;  // the default submit(): finished passes not yet waited for
};

// How a ModelRunner lays a model out on its device.
struct RunnerOptions {
  Device device = Device::cpu();
  // The activation dtype: f32 runs the CPU reference on the weights as stored; bf16 runs the
  // device layout (GPU kernels, or their CPU twins with device = cpu).
  DType act_dtype = DType::kF32;
  DType weight_dtype = DType::kBF16;  // device layout: kBF16, kI8 or kFP8E4M3
  int64_t max_num_tokens = 2048;      // most tokens in one forward pass (workspace size)
  int64_t max_num_seqs = 64;          // most sequences in one forward pass (graph buckets)
  int64_t max_logit_rows = 512;       // most rows of logits one forward pass returns
  int64_t max_model_len = 0;          // context length; 0 = the model's
  int64_t block_size = 16;
  int64_t num_kv_blocks = 0;            // 0: fill gpu_memory_utilization (GPU) / one sequence (CPU)
  double gpu_memory_utilization = 0.9;  // share of total device memory strata may hold
  bool cuda_graphs = true;              // replay captured decode steps
  bool profile = false;                 // time named sections (eager launches; no graphs)
  uint64_t seed = 0;                    // random weights
  // Pipeline stages: a prompt step is cut into micro-batches of at least this many tokens.
  int64_t pp_min_micro_batch_tokens = 256;
  // Weight streaming (device layout only): --gpu-weight-budget, --offload-weights, prefetch.
  ResidencyOptions residency;
  // Data-parallel replicas: the group whose ranks split every streamed layer's fetch (partitioned
  // fetch, runtime/weight_streamer.h; null: whole layers), and another replica's streamed
  // weights whose pinned host blobs this runner shares instead of making its own (null: its own).
  // fetch_group must outlive the runner.
  Communicator* fetch_group = nullptr;
  std::shared_ptr<const StreamedWeights> shared_host_blobs;
  // Tests: each forward pass appends every sparse layer's routing here (ForwardArgs,
  // moe_route_trace; turns CUDA graphs off). Must outlive the runner.
  std::vector<int32_t>* moe_route_trace = nullptr;
  // Expert parallelism: steps of at most this many tokens take the fixed-capacity exchange
  // (model/moe_ep.h: no host synchronization, so decode steps run in CUDA graphs); larger ones
  // the variable-split one. -1: max_num_seqs (every graph-sized decode step); 0: never (every
  // step eager, variable splits).
  int64_t moe_ep_fixed_tokens = -1;
  // CUDA: called before the first run of each cuBLASLt GEMM shape (cuda::LaunchCtx::
  // first_use_barrier); set by make_in_process_ep_executor on GPUs of their own.
  std::function<bool()> plan_barrier;
  // The 2d FFN layout (ParallelConfig::ffn_layout): the rank's X and Y groups (split_ffn_groups;
  // must outlive the runner). The in-process executors split them themselves, and give their
  // ranks' ParallelConfig ffn_layout and ws2d_x (--ffn-layout, --ffn-2d-x).
  Communicator* ffn_x_group = nullptr;
  Communicator* ffn_y_group = nullptr;
  FfnLayout ffn_layout = FfnLayout::k1D;
  int ws2d_x = 0;
  int64_t ffn_gather_min_tokens = 0;  // --ffn-gather-min-tokens (ParallelConfig's)
  // The in-process executors give it to their ranks' ParallelConfig (--attn-layout).
  AttnLayout attn_layout = AttnLayout::kHeadSharded;
};

// The 2d FFN layout's groups of one tensor-parallel rank (ParallelConfig::grid_*), split from its
// tensor-parallel group `tp`: X, the ranks of its grid column (same j, ordered by i), and Y, those
// of its row (same i, ordered by j). Every rank of tp must call it at once. Both null for the
// other layouts.
struct FfnGroups {
  std::unique_ptr<Communicator> x, y;
};
Result<FfnGroups> split_ffn_groups(Communicator& tp, const ParallelConfig& par);

// Message sizes of tensor-parallel ranks' device collectives: the largest one a forward pass
// sends (a step's f32 hidden states, or a shard's logit rows), and the size up to which the
// one-shot kernels take a message when NCCL is there for larger ones (STRATA_ONESHOT_MAX_BYTES,
// 256 KiB by default).
struct OneShotSizes {
  int64_t largest = 0;
  int64_t oneshot_max = 0;
};
OneShotSizes oneshot_sizes(const ModelConfig& config, const RunnerOptions& options, int tp);

// A runner over `host` (the model loaded as stored on the CPU; moved to the device layout when
// options ask for it), or over random weights of `config` when host is null. `comm` is the
// tensor-parallel group (the layer program's collectives); `pipeline` the pipeline group when
// par.pp_size > 1 (stage par.pp_rank = its rank); `expert` the expert-parallel group when
// par.ep_size > 1 (rank par.ep_rank). All must outlive the runner.
Result<std::unique_ptr<Executor>> make_runner(const ModelConfig& config, const ParallelConfig& par,
                                              std::unique_ptr<Model> host, Communicator& comm,
                                              const RunnerOptions& options,
                                              Communicator* pipeline = nullptr,
                                              Communicator* expert = nullptr);
// make_runner for a tensor-parallel rank of any FFN layout: it splits the 2d layout's groups
// from `comm` (every rank of comm must call it at once) and owns them.
Result<std::unique_ptr<Executor>> make_layout_runner(const ModelConfig& config,
                                                     const ParallelConfig& par,
                                                     std::unique_ptr<Model> host,
                                                     Communicator& comm,
                                                     const RunnerOptions& options);

// Tensor parallelism inside one process: `tp` ranks as threads, each a ModelRunner over its
// Megatron shard (load(par) returns the host model sharded for rank par.tp_rank; null `load`
// means random weights), talking through the in-process communicator — host memory on the CPU,
// the one-shot kernels on a GPU (all ranks on options.device). The executor runs every forward
// pass on all ranks at once and returns rank 0's results. How TP is tested on one GPU and in CI.
// ep > 1: tp x ep ranks (ParallelConfig: world rank = ep_rank tp + tp_rank), each rank with
// its tensor-parallel and its expert-parallel group (mixture-of-experts models: experts
// partitioned over the expert-parallel group, tokens split among the ranks around the
// all-to-alls, model/moe.cpp); load(par) then returns rank (par.tp_rank, par.ep_rank)'s shard.
Result<std::unique_ptr<Executor>> make_in_process_tp_executor(
    const ModelConfig& config,
    const std::function<Result<std::unique_ptr<Model>>(const ParallelConfig&)>& load, int tp,
    const RunnerOptions& options, int ep = 1);

// Data-parallel replicas inside one process: `dp` ranks as threads, each a ModelRunner over the
// whole model (load(ParallelConfig{}) per replica; null: random weights of options.seed) with
// its own KV pool, on GPU index + r when there are that many GPUs, else all on GPU index
// (STRATA_TP_ONE_GPU=1 forces it); on the CPU, threads sharing the cores. A forward pass splits
// its sequences among the replicas (a sequence stays on the replica that prefilled it: the
// replica is chosen when its position 0 is in the batch and remembered by its first block), runs
// the shares at once and puts the results back in the batch's order. Every replica's pool has
// the block ids of the engines' one block accounting (each holds only its own sequences' KV).
// Swaps move every replica's copy of a block, and a swapped-out first block's replica travels
// with its host slot, so a sequence swapped back in under new block ids stays where its KV is.
// Weight streaming: streamed layers' pinned host blobs are shared by all replicas; with
// `partitioned` (and dp > 1) each replica fetches 1/dp of every streamed layer and an
// all-gather over the replicas (in-process: host memory on the CPU, the one-shot kernels on one
// GPU, NCCL across GPUs) completes it on all of them (ZeRO-Inference's partitioned fetch).
Result<std::unique_ptr<Executor>> make_in_process_dp_executor(
    const ModelConfig& config,
    const std::function<Result<std::unique_ptr<Model>>(const ParallelConfig&)>& load, int dp,
    const RunnerOptions& options, bool partitioned = true);

// Pipeline parallelism inside one process: stage s (a thread) runs layers [bounds[s],
// bounds[s + 1]) (runtime/pipeline_schedule.h, pipeline_bounds) with its own KV pool for those
// layers, on GPU index + s when there are that many GPUs, else all stages share GPU index. The
// embedding runs on stage 0, the head on the last stage; hidden states pass with send/recv
// (through pinned host memory on a GPU). Each forward pass is cut into micro-batches that flow
// through the stages as a pipeline (stage s runs micro-batch m while stage s + 1 runs m - 1):
// a prompt step into prompt_micro_batches() chunks of at least options.pp_min_micro_batch_tokens
// tokens, a decode step into up to `stages` groups of at least that many sequences (each
// micro-batch reads the weights again: small decode batches stay whole). load(par) returns the host
// model holding stage par.pp_rank's layers (null: random weights).
// With tp > 1 each stage is a tensor-parallel group of tp ranks (threads, as
// make_in_process_tp_executor): tp x pp runners, world rank pp_rank * tp + tp_rank (Megatron's
// numbering, tp fastest) on GPU index + world rank when there are that many; rank i of stage s
// sends its hidden states to rank i of stage s + 1 (one pipeline group per tensor-parallel rank).
Result<std::unique_ptr<Executor>> make_in_process_pp_executor(
    const ModelConfig& config,
    const std::function<Result<std::unique_ptr<Model>>(const ParallelConfig&)>& load,
    const std::vector<int64_t>& bounds, const RunnerOptions& options, int tp = 1);

// Tensor parallelism across processes, for the serving engine: on rank 0, an executor that
// broadcasts every call (the step's arrays, swaps) on `control` before running it on `local`;
// on the other ranks, run_follower() replays those calls on their own shard until rank 0's
// driver is destroyed (ok) or a call fails (the error). `control` must outlive both.
std::unique_ptr<Executor> make_driver_executor(std::unique_ptr<Executor> local,
                                               Communicator& control);
Status run_follower(Executor& local, Communicator& control);

// Pipeline (x tensor) parallelism across processes: this process's rank of `world` (tp x pp
// ranks, world rank = pp_rank * tp + tp_rank as Megatron numbers them) runs stage pp_rank's
// layers [bounds[pp_rank], bounds[pp_rank + 1]) over its tensor-parallel shard (load(par); null:
// random weights). The world is split into the stage's tensor-parallel group and the pipeline
// group of its tensor-parallel rank; hidden states pass stage to stage with send/recv, and the
// last stage's rank 0 sends each pass's logits or ids to world rank 0 (the engines' results;
// the other ranks' are unspecified). Every rank of `world` must call it; all fail if one does.
// Serve it as tensor parallelism is served: make_driver_executor on rank 0, run_follower on the
// others. On GPUs, `device_tp` turns the stage's tensor-parallel group into one with device
// collectives (NCCL / CUDA IPC one-shot); when options.num_kv_blocks is 0, world rank 0 sizes its
// KV pool first and every other rank takes as many blocks (the driver's block ids address every
// stage's pool). Hidden states between stages go through host memory either way.
Result<std::unique_ptr<Executor>> make_pipeline_rank(
    const ModelConfig& config, const std::vector<int64_t>& bounds, int tp, Communicator& world,
    const std::function<Result<std::unique_ptr<Model>>(const ParallelConfig&)>& load,
    const RunnerOptions& options,
    const std::function<Result<std::unique_ptr<Communicator>>(std::unique_ptr<Communicator>)>&
        device_tp = {});

// An executor for EngineConfig (device, weights, quantization, load format), with what the
// engines need beside it. Member order matters: `exec` may refer to `comm`.
struct LoadedExecutor {
  ModelInfo info;
  int64_t max_len = 0;                   // context length
  std::unique_ptr<Communicator> comm;    // the world (rank 0 drives the other ranks through it)
  std::unique_ptr<Tokenizer> tokenizer;  // null when the model has none (or dummy presets)
  std::unique_ptr<Executor> exec;
};

struct ExecutorOptions {
  int64_t block_size = 16;
  int64_t cpu_blocks = 0;    // CPU pool size in blocks; 0: from cpu_kv_bytes, else
  int64_t cpu_kv_bytes = 0;  // cpu_seqs sequences of max_len
  int64_t cpu_seqs = 1;
  int64_t cpu_kv_max_bytes = 0;  // > 0: a cap on the pool sized from cpu_seqs
  int64_t cuda_blocks = 0;       // CUDA pool size in blocks; 0 = fill --gpu-memory-utilization
};

Result<LoadedExecutor> load_executor(const EngineConfig& config, const ExecutorOptions& options);

}  // namespace strata
