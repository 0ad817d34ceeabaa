// Tensor parallelism across processes (mpirun) for the serving engine: rank 0 runs the scheduler
// and the HTTP server; its executor is a DriverExecutor that, before each call, broadcasts the
// call (a fixed header, then the step's tokens, positions, sequence ids, block tables and logit
// rows) on the control communicator. Ranks 1..N-1 run run_follower(): receive a call, run it on
// their own shard, repeat until the driver says stop. Every rank thus runs the same step with the
// same collectives; only rank 0 samples. KV swap-outs keep each rank's shard of a block in that
// rank's host memory, under the key the driver gives (the host slot's address on rank 0).
#include <cstring>
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

}  // namespace

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
