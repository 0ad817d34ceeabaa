// Tensor parallelism inside one process (runtime/executor.h, make_in_process_tp_executor): one
// ModelRunner per rank, each over its Megatron shard of the weights, its own KV pool, workspace
// and (on a GPU) its own stream, graphs and cuBLASLt plans; the ranks talk through the in-process
// communicator (host memory on the CPU, the one-shot kernels on a GPU, inside the CUDA graphs).
// Every forward pass runs on all ranks at once, one host thread each (rank 0 on the caller's);
// the engines see rank 0's logits and rank 0's block accounting (every rank's pool has the same
// block ids). This is how tensor-parallel logic is tested on one GPU, and on the CPU in CI.
#include <algorithm>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/status.h"
#include "parallel/inproc_comm.h"
#include "runtime/executor.h"

namespace strata {

namespace {

// N - 1 persistent worker threads plus the caller: run(f) calls f(r) for every rank r at once
// and returns the first error.
class RankPool {
 public:
  explicit RankPool(int n) : n_(n), status_(static_cast<size_t>(n), ok_status()) {
    for (int r = 1; r < n; ++r) threads_.emplace_back([this, r] { work(r); });
  }
  ~RankPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      ++generation_;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  Status run(const std::function<Status(int)>& f) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &f;
      pending_ = n_ - 1;
      ++generation_;
    }
    cv_.notify_all();
    status_[0] = f(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    for (const Status& s : status_) {
      if (!s.ok()) return s;
    }
    return ok_status();
  }

 private:
  void work(int r) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<Status(int)>* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (stop_) return;
        job = job_;
      }
      Status s = (*job)(r);
      std::lock_guard<std::mutex> lock(mu_);
      status_[static_cast<size_t>(r)] = std::move(s);
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }

  int n_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  const std::function<Status(int)>* job_ = nullptr;
  std::vector<Status> status_;
};

class InProcessTpExecutor final : public Executor {
 public:
  InProcessTpExecutor(std::vector<std::unique_ptr<Communicator>> comms,
                      std::vector<std::unique_ptr<Executor>> ranks)
      : comms_(std::move(comms)),
        ranks_(std::move(ranks)),
        pool_(static_cast<int>(ranks_.size())) {}

  const ModelConfig& config() const override { return ranks_[0]->config(); }
  KvPool& cache() override { return ranks_[0]->cache(); }
  std::string backend_name() const override { return ranks_[0]->backend_name(); }
  Status forward(const ForwardBatch& b, float* logits) override {
    scratch_.resize(ranks_.size());
    const size_t n = b.logit_rows.size() * static_cast<size_t>(config().vocab);
    return pool_.run([&](int r) -> Status {
      if (r == 0) return ranks_[0]->forward(b, logits);
      std::vector<float>& s = scratch_[static_cast<size_t>(r)];
      s.resize(n);
      return ranks_[static_cast<size_t>(r)]->forward(b, s.data());
    });
  }
  Status forward_argmax(const ForwardBatch& b, int32_t* ids) override {
    ids_.resize(ranks_.size());
    return pool_.run([&](int r) -> Status {
      if (r == 0) return ranks_[0]->forward_argmax(b, ids);
      std::vector<int32_t>& s = ids_[static_cast<size_t>(r)];
      s.resize(b.logit_rows.size());
      return ranks_[static_cast<size_t>(r)]->forward_argmax(b, s.data());
    });
  }
  size_t block_bytes() const override {
    size_t total = 0;
    for (const auto& e : ranks_) total += e->block_bytes();
    return total;
  }
  Status copy_block_to_host(int32_t block, void* host) override {
    char* p = static_cast<char*>(host);
    for (const auto& e : ranks_) {
      STRATA_RETURN_IF_ERROR(e->copy_block_to_host(block, p));
      p += e->block_bytes();
    }
    return ok_status();
  }
  Status copy_block_from_host(int32_t block, const void* host) override {
    const char* p = static_cast<const char*>(host);
    for (const auto& e : ranks_) {
      STRATA_RETURN_IF_ERROR(e->copy_block_from_host(block, p));
      p += e->block_bytes();
    }
    return ok_status();
  }
  int64_t graph_captures() const override { return ranks_[0]->graph_captures(); }
  int64_t graph_replays() const override { return ranks_[0]->graph_replays(); }
  RankPool& pool() { return pool_; }
  std::vector<std::unique_ptr<Communicator>>& comms() { return comms_; }

 private:
  std::vector<std::unique_ptr<Communicator>> comms_;  // before ranks_: the runners refer to them
  std::vector<std::unique_ptr<Executor>> ranks_;
  RankPool pool_;
  std::vector<std::vector<float>> scratch_;
  std::vector<std::vector<int32_t>> ids_;
};

}  // namespace

Result<std::unique_ptr<Executor>> make_in_process_tp_executor(
    const ModelConfig& config,
    const std::function<Result<std::unique_ptr<Model>>(const ParallelConfig&)>& load, int tp,
    const RunnerOptions& options) {
  if (tp < 1) return errorf(StatusCode::kInvalidArgument, "tensor-parallel size {}", tp);
  std::vector<std::unique_ptr<Communicator>> comms = make_in_process_communicators(tp);
  std::vector<std::unique_ptr<Executor>> ranks;
  RunnerOptions o = options;
  for (int r = 0; r < tp; ++r) {
    ParallelConfig par;
    par.tp_size = tp;
    par.tp_rank = r;
    std::unique_ptr<Model> host;
    if (load) {
      STRATA_ASSIGN_OR_RETURN(host, load(par));
    }
    RunnerOptions ro = o;
    if (o.device.is_cuda() && o.num_kv_blocks <= 0) {
      // Ranks on one GPU share it: each takes its share of --gpu-memory-utilization.
      ro.gpu_memory_utilization = o.gpu_memory_utilization * (r + 1) / tp;
    }
    Result<std::unique_ptr<Executor>> e =
        make_runner(config, par, std::move(host), *comms[static_cast<size_t>(r)], ro);
    if (!e.ok()) return e.status().with_context("tensor-parallel rank " + std::to_string(r));
    if (r == 0) o.num_kv_blocks = (*e)->cache().config().n_blocks;  // the same ids on every rank
    ranks.push_back(std::move(*e));
  }
  auto tp_exec = std::make_unique<InProcessTpExecutor>(std::move(comms), std::move(ranks));
  if (o.device.is_cuda()) {
    // Device collectives: every rank registers its one-shot buffers, all at once.
    const int64_t T = o.max_num_tokens, R = std::max(o.max_logit_rows, o.max_num_seqs);
    const int64_t max_bytes =
        std::max<int64_t>(T * config.hidden * 4, R * ((config.vocab + tp - 1) / tp) * 4);
    InProcessTpExecutor* x = tp_exec.get();
    STRATA_RETURN_IF_ERROR(x->pool().run([&](int r) {
      return init_in_process_device(*x->comms()[static_cast<size_t>(r)], o.device.index, max_bytes);
    }));
  }
  return std::unique_ptr<Executor>(std::move(tp_exec));
}

}  // namespace strata
