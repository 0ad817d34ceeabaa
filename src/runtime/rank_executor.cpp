// Tensor parallelism across processes (mpirun) for the serving engine: rank 0 runs the scheduler
// and the HTTP server; its executor is a DriverExecutor that, before each call, broadcasts the
// call (a fixed header, then the step's tokens, positions, sequence ids, block tables and logit
// rows) on the control communicator. Ranks 1..N-1 run run_follower(): receive a call, run it on
// their own shard, repeat until the driver says stop. Every rank thus runs the same step with the
// same collectives; only rank 0 samples. KV swap-outs keep each rank's shard of a block in that
// rank's host memory, under the key the driver gives (the host slot's address on rank 0).
// Pipeline stages across processes (make_pipeline_rank) follow the same way: every rank runs
// every step on its stage's layers and its shard; the last stage returns the results to rank 0.
#include <cstring>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "runtime/executor.h"

namespace strata {

namespace {

enum class Call : int32_t { kForward = 1, kArgmax = 2, kSwapOut = 3, kSwapIn = 4, kStop = 5 };

struct CallHeader {
  int32_t call = 0;
  int32_t block = 0;
  uint64_t key = 0;
  int64_t n_tokens = 0;
  int64_t n_seqs = 0;
  int64_t max_blocks_per_seq = 0;
  int64_t n_logit_rows = 0;
};

// The step's arrays, in one buffer: tokens, token_seq, token_pos, block tables, logit rows.
struct StepArrays {
  std::vector<int32_t> data;
  ForwardBatch view(const CallHeader& h) const {
    const int32_t* p = data.data();
    ForwardBatch b;
    const auto T = static_cast<size_t>(h.n_tokens);
    b.tokens = {p, T};
    b.token_seq = {p + T, T};
    b.token_pos = {p + 2 * T, T};
    b.block_tables = p + 3 * T;
    b.max_blocks_per_seq = h.max_blocks_per_seq;
    b.n_seqs = h.n_seqs;
    b.logit_rows = {p + 3 * T + h.n_seqs * h.max_blocks_per_seq,
                    static_cast<size_t>(h.n_logit_rows)};
    return b;
  }
  static int64_t size(const CallHeader& h) {
    return 3 * h.n_tokens + h.n_seqs * h.max_blocks_per_seq + h.n_logit_rows;
  }
};

Status send_call(Communicator& control, CallHeader h, const ForwardBatch* b) {
  STRATA_RETURN_IF_ERROR(control.broadcast(&h, static_cast<int64_t>(sizeof(h)), 0));
  if (b == nullptr) return ok_status();
  std::vector<int32_t> data;
  data.reserve(static_cast<size_t>(StepArrays::size(h)));
  data.insert(data.end(), b->tokens.begin(), b->tokens.end());
  data.insert(data.end(), b->token_seq.begin(), b->token_seq.end());
  data.insert(data.end(), b->token_pos.begin(), b->token_pos.end());
  data.insert(data.end(), b->block_tables, b->block_tables + h.n_seqs * h.max_blocks_per_seq);
  data.insert(data.end(), b->logit_rows.begin(), b->logit_rows.end());
  return control.broadcast(data.data(), static_cast<int64_t>(data.size()), DType::kI32, 0,
                           CommStream::host());
}

CallHeader forward_header(Call c, const ForwardBatch& b) {
  CallHeader h;
  h.call = static_cast<int32_t>(c);
  h.n_tokens = static_cast<int64_t>(b.tokens.size());
  h.n_seqs = b.n_seqs;
  h.max_blocks_per_seq = b.max_blocks_per_seq;
  h.n_logit_rows = static_cast<int64_t>(b.logit_rows.size());
  return h;
}

class DriverExecutor final : public Executor {
 public:
  DriverExecutor(std::unique_ptr<Executor> local, Communicator& control)
      : local_(std::move(local)), control_(control) {}
  ~DriverExecutor() override {
    CallHeader h;
    h.call = static_cast<int32_t>(Call::kStop);
    (void)send_call(control_, h, nullptr);
  }

  const ModelConfig& config() const override { return local_->config(); }
  KvPool& cache() override { return local_->cache(); }
  std::string backend_name() const override { return local_->backend_name(); }
  Status forward(const ForwardBatch& b, float* logits) override {
    STRATA_RETURN_IF_ERROR(send_call(control_, forward_header(Call::kForward, b), &b));
    return local_->forward(b, logits);
  }
  Status forward_argmax(const ForwardBatch& b, int32_t* ids) override {
    STRATA_RETURN_IF_ERROR(send_call(control_, forward_header(Call::kArgmax, b), &b));
    return local_->forward_argmax(b, ids);
  }
  size_t block_bytes() const override { return local_->block_bytes(); }
  Status copy_block_to_host(int32_t block, void* host) override {
    STRATA_RETURN_IF_ERROR(swap_call(Call::kSwapOut, block, host));
    return local_->copy_block_to_host(block, host);
  }
  Status copy_block_from_host(int32_t block, const void* host) override {
    STRATA_RETURN_IF_ERROR(swap_call(Call::kSwapIn, block, host));
    return local_->copy_block_from_host(block, host);
  }
  int64_t max_model_len() const override { return local_->max_model_len(); }
  std::string device_name() const override { return local_->device_name(); }
  int64_t device_weight_bytes() const override { return local_->device_weight_bytes(); }
  std::vector<int> gpus() const override { return local_->gpus(); }
  int64_t graph_captures() const override { return local_->graph_captures(); }
  int64_t graph_replays() const override { return local_->graph_replays(); }

 private:
  Status swap_call(Call c, int32_t block, const void* host) {
    CallHeader h;
    h.call = static_cast<int32_t>(c);
    h.block = block;
    h.key = reinterpret_cast<uintptr_t>(host);
    return send_call(control_, h, nullptr);
  }

  std::unique_ptr<Executor> local_;
  Communicator& control_;
};

// One rank of pipeline (x tensor) parallelism across processes: the runner of stage par.pp_rank
// over its tensor-parallel shard, owning the groups it talks through (split from the world, so
// declared before the runner, which refers to them). The engines see world rank 0 (stage 0,
// tensor-parallel rank 0); the last stage's rank 0 sends each pass's results there over the
// pipeline group of tensor-parallel rank 0, after the pass (the hidden states went the other way
// in the same group, so the messages cannot cross).
class PipelineRankExecutor final : public Executor {
 public:
  PipelineRankExecutor(const ParallelConfig& par, std::unique_ptr<Communicator> tp_group,
                       std::unique_ptr<Communicator> pipe_group)
      : par_(par), tp_(std::move(tp_group)), pipe_(std::move(pipe_group)) {}
  void set_local(std::unique_ptr<Executor> local) { local_ = std::move(local); }
  Communicator& tp_group() { return *tp_; }
  Communicator& pipe_group() { return *pipe_; }

  const ModelConfig& config() const override { return local_->config(); }
  KvPool& cache() override { return local_->cache(); }
  std::string backend_name() const override { return local_->backend_name(); }
  Status forward(const ForwardBatch& b, float* logits) override {
    const int64_t n = static_cast<int64_t>(b.logit_rows.size()) * config().vocab;
    return run(b, logits, nullptr, n, DType::kF32);
  }
  Status forward_argmax(const ForwardBatch& b, int32_t* ids) override {
    return run(b, nullptr, ids, static_cast<int64_t>(b.logit_rows.size()), DType::kI32);
  }
  size_t block_bytes() const override { return local_->block_bytes(); }
  Status copy_block_to_host(int32_t block, void* host) override {
    return local_->copy_block_to_host(block, host);
  }
  Status copy_block_from_host(int32_t block, const void* host) override {
    return local_->copy_block_from_host(block, host);
  }
  int64_t max_model_len() const override { return local_->max_model_len(); }
  std::string device_name() const override { return local_->device_name(); }
  int64_t device_weight_bytes() const override { return local_->device_weight_bytes(); }
  std::vector<int> gpus() const override { return local_->gpus(); }
  int64_t graph_captures() const override { return local_->graph_captures(); }
  int64_t graph_replays() const override { return local_->graph_replays(); }
  double wait_seconds() const override { return local_->wait_seconds(); }

 private:
  // n elements of dtype dt: the pass's logits (f32) or ids (i32).
  Status run(const ForwardBatch& b, float* logits, int32_t* ids, int64_t n, DType dt) {
    void* out = logits != nullptr ? static_cast<void*>(logits) : static_cast<void*>(ids);
    const bool sender = par_.tp_rank == 0 && par_.last_stage();
    const bool receiver = par_.tp_rank == 0 && par_.first_stage();
    if ((sender || receiver) && out == nullptr && n > 0) {
      scratch_.resize(static_cast<size_t>(n));  // 4-byte elements either way
      out = scratch_.data();
    }
    if (receiver) {
      STRATA_RETURN_IF_ERROR(ids != nullptr ? local_->forward_argmax(b, nullptr)
                                            : local_->forward(b, nullptr));
      if (n == 0 || b.tokens.empty()) return ok_status();
      return pipe_->recv(out, n, dt, par_.pp_size - 1, CommStream::host());
    }
    STRATA_RETURN_IF_ERROR(ids != nullptr ? local_->forward_argmax(b, static_cast<int32_t*>(out))
                                          : local_->forward(b, static_cast<float*>(out)));
    if (!sender || n == 0 || b.tokens.empty()) return ok_status();
    return pipe_->send(out, n, dt, 0, CommStream::host());
  }

  ParallelConfig par_;
  std::unique_ptr<Communicator> tp_, pipe_;  // before local_: the runner refers to them
  std::unique_ptr<Executor> local_;
  std::vector<float> scratch_;
};

}  // namespace

Result<std::unique_ptr<Executor>> make_pipeline_rank(
    const ModelConfig& config, const std::vector<int64_t>& bounds, int tp, Communicator& world,
    const std::function<Result<std::unique_ptr<Model>>(const ParallelConfig&)>& load,
    const RunnerOptions& options,
    const std::function<Result<std::unique_ptr<Communicator>>(std::unique_ptr<Communicator>)>&
        device_tp) {
  const int pp = static_cast<int>(bounds.size()) - 1;
  if (pp < 1 || tp < 1 || world.size() != tp * pp) {
    return errorf(StatusCode::kInvalidArgument,
                  "--tensor-parallel-size {} x --pipeline-parallel-size {} needs {} ranks, but {} "
                  "were launched (use mpirun -np {})",
                  tp, pp, tp * pp, world.size(), tp * pp);
  }
  ParallelConfig par;
  par.tp_size = tp;
  par.tp_rank = world.rank() % tp;
  par.pp_size = pp;
  par.pp_rank = world.rank() / tp;
  par.first_layer = bounds[static_cast<size_t>(par.pp_rank)];
  par.last_layer = bounds[static_cast<size_t>(par.pp_rank) + 1];
  // Megatron's numbering (tp fastest): a stage's ranks form its tensor-parallel group; rank i
  // of every stage forms pipeline group i. Every rank splits, in the same order.
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> tp_group,
                          world.split(par.pp_rank, par.tp_rank));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> pipe_group,
                          world.split(par.tp_rank, par.pp_rank));
  Status st = ok_status();
  if (device_tp) {
    Result<std::unique_ptr<Communicator>> d = device_tp(std::move(tp_group));
    if (d.ok()) {
      tp_group = std::move(*d);
    } else {
      st = d.status().with_context("the stage's tensor-parallel group");
    }
  }
  std::unique_ptr<PipelineRankExecutor> rank;
  if (st.ok()) {
    rank = std::make_unique<PipelineRankExecutor>(par, std::move(tp_group), std::move(pipe_group));
  }
  auto make = [&](const RunnerOptions& ro) {
    if (!st.ok()) return;
    std::unique_ptr<Model> host;
    if (load) {
      Result<std::unique_ptr<Model>> m = load(par);
      if (!m.ok()) {
        st = m.status();
        return;
      }
      host = std::move(*m);
    }
    Result<std::unique_ptr<Executor>> e =
        make_runner(config, par, std::move(host), rank->tp_group(), ro, &rank->pipe_group());
    if (e.ok()) {
      rank->set_local(std::move(*e));
    } else {
      st = e.status();
    }
  };
  RunnerOptions ro = options;
  if (ro.device.is_cuda() && ro.num_kv_blocks <= 0) {
    // GPU pools sized from free memory: rank 0 first, then the others take its block count.
    if (world.rank() == 0) make(ro);
    int64_t blocks = world.rank() == 0 && st.ok() ? rank->cache().config().n_blocks : -1;
    STRATA_RETURN_IF_ERROR(world.broadcast(&blocks, static_cast<int64_t>(sizeof(blocks)), 0));
    if (world.rank() != 0) {
      if (blocks > 0) {
        ro.num_kv_blocks = blocks;
        make(ro);
      } else if (st.ok()) {
        st = Status(StatusCode::kInternal, "world rank 0 failed to load");
      }
    }
  } else {
    make(ro);
  }
  // Every rank learns whether all loaded (a rank that returned alone would leave its peers
  // waiting in their first collective).
  int32_t failed = st.ok() ? 0 : 1;
  STRATA_RETURN_IF_ERROR(world.all_reduce(&failed, 1, DType::kI32, CommStream::host()));
  if (!st.ok()) {
    return st.with_context("pipeline stage " + std::to_string(par.pp_rank) +
                           ", tensor-parallel rank " + std::to_string(par.tp_rank));
  }
  if (failed != 0) {
    return errorf(StatusCode::kInternal, "{} pipeline rank(s) failed to load", failed);
  }
  return std::unique_ptr<Executor>(std::move(rank));
}

std::unique_ptr<Executor> make_driver_executor(std::unique_ptr<Executor> local,
                                               Communicator& control) {
  return std::make_unique<DriverExecutor>(std::move(local), control);
}

Status run_follower(Executor& local, Communicator& control) {
  std::unordered_map<uint64_t, std::vector<uint8_t>> swapped;  // key -> this rank's block shard
  StepArrays arrays;
  std::vector<float> logits;
  std::vector<int32_t> ids;
  for (;;) {
    CallHeader h;
    STRATA_RETURN_IF_ERROR(control.broadcast(&h, static_cast<int64_t>(sizeof(h)), 0));
    switch (static_cast<Call>(h.call)) {
      case Call::kStop:
        return ok_status();
      case Call::kForward:
      case Call::kArgmax: {
        if (h.n_tokens < 0 || h.n_seqs < 0 || h.max_blocks_per_seq < 0 || h.n_logit_rows < 0) {
          return Status(StatusCode::kInternal, "tensor-parallel follower: a malformed step");
        }
        arrays.data.resize(static_cast<size_t>(StepArrays::size(h)));
        STRATA_RETURN_IF_ERROR(control.broadcast(arrays.data.data(),
                                                 static_cast<int64_t>(arrays.data.size()),
                                                 DType::kI32, 0, CommStream::host()));
        const ForwardBatch b = arrays.view(h);
        // The driver's error ends the server; a follower's own error ends it too (its peers'
        // collectives then fail or time out), so both stop here.
        if (static_cast<Call>(h.call) == Call::kForward) {
          logits.resize(static_cast<size_t>(h.n_logit_rows * local.config().vocab));
          STRATA_RETURN_IF_ERROR(local.forward(b, logits.data()));
        } else {
          ids.resize(static_cast<size_t>(h.n_logit_rows));
          STRATA_RETURN_IF_ERROR(local.forward_argmax(b, ids.data()));
        }
        break;
      }
      case Call::kSwapOut: {
        std::vector<uint8_t>& slot = swapped[h.key];
        slot.resize(local.block_bytes());
        STRATA_RETURN_IF_ERROR(local.copy_block_to_host(h.block, slot.data()));
        break;
      }
      case Call::kSwapIn: {
        auto it = swapped.find(h.key);
        if (it == swapped.end()) {
          return Status(StatusCode::kInternal,
                        "tensor-parallel follower: swap-in of a block it never swapped out");
        }
        STRATA_RETURN_IF_ERROR(local.copy_block_from_host(h.block, it->second.data()));
        swapped.erase(it);
        break;
      }
      default:
        return errorf(StatusCode::kInternal, "tensor-parallel follower: unknown call {}", h.call);
    }
  }
}

}  // namespace strata
