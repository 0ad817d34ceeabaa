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

#include "core/env.h"
#include "core/status.h"
#include "parallel/inproc_comm.h"
#include "runtime/device_runtime.h"
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
  int64_t max_model_len() const override { return ranks_[0]->max_model_len(); }
  std::string device_name() const override {
    const std::string first = ranks_[0]->device_name();
    bool same = true;
    for (const auto& e : ranks_) same = same && e->device_name() == first;
    return (same ? first : first + ", ...") + " (" + std::to_string(ranks_.size()) +
           " tensor-parallel ranks)";
  }
  int64_t device_weight_bytes() const override {
    int64_t total = 0;
    for (const auto& e : ranks_) total += e->device_weight_bytes();
    return total;
  }
  int64_t graph_captures() const override { return ranks_[0]->graph_captures(); }
  int64_t graph_replays() const override { return ranks_[0]->graph_replays(); }

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
  // Rank r runs on GPU index + r when there are that many, else every rank shares GPU index
  // (how tensor parallelism is tested on one GPU; STRATA_TP_ONE_GPU=1 forces it).
  const bool cuda = options.device.is_cuda();
  const bool shared_gpu =
      cuda && (env_config().tp_one_gpu || options.device.index + tp > cuda_device_count());
  auto rank_device = [&](int r) {
    return cuda && !shared_gpu ? Device::cuda(options.device.index + r) : options.device;
  };
  if (shared_gpu && tp > 1 && cuda_lazy_module_loading()) {
    return Status(
        StatusCode::kFailedPrecondition,
        "tensor-parallel ranks sharing one GPU need CUDA_MODULE_LOADING=EAGER in the "
        "environment before the process starts (a kernel loaded lazily waits for the "
        "peer's collective, which waits for it); the strata command sets it for --tp > 1");
  }
  if (cuda && tp > 1) {
    // Device collectives, set up on every rank at once: the one-shot kernels (peers' buffers
    // read directly) for decode-sized messages; across GPUs, NCCL above oneshot_max_bytes. On a
    // shared GPU NCCL cannot run two ranks, so the one-shot kernels take every size.
    const int64_t T = options.max_num_tokens,
                  R = std::max(options.max_logit_rows, options.max_num_seqs);
    const int64_t largest =
        std::max<int64_t>(T * config.hidden * 4, R * ((config.vocab + tp - 1) / tp) * 4);
    const int64_t oneshot_max =
        env_config().oneshot_max_bytes >= 0 ? env_config().oneshot_max_bytes : int64_t{256} << 10;
    std::vector<Status> st(static_cast<size_t>(tp));
    std::vector<std::thread> threads;
    for (int r = 0; r < tp; ++r) {
      threads.emplace_back([&, r] {
        std::unique_ptr<Communicator>& c = comms[static_cast<size_t>(r)];
        const int dev = rank_device(r).index;
        Status s = init_in_process_device(*c, dev,
                                          shared_gpu ? largest : std::max<int64_t>(oneshot_max, 1));
        if (s.ok() && !shared_gpu) {
          Result<std::unique_ptr<Communicator>> nccl =
              make_nccl_communicator(std::move(c), dev, oneshot_max);
          if (nccl.ok()) {
            c = std::move(*nccl);
          } else {
            s = nccl.status();
          }
        }
        st[static_cast<size_t>(r)] = std::move(s);
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < tp; ++r) {
      if (!st[static_cast<size_t>(r)].ok()) {
        return st[static_cast<size_t>(r)].with_context("tensor-parallel rank " + std::to_string(r) +
                                                       " collectives");
      }
    }
  }
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
    ro.device = rank_device(r);
    if (shared_gpu && o.num_kv_blocks <= 0) {
      // Ranks on one GPU share it: each takes its share of --gpu-memory-utilization.
      ro.gpu_memory_utilization = o.gpu_memory_utilization * (r + 1) / tp;
    }
    Result<std::unique_ptr<Executor>> e =
        make_runner(config, par, std::move(host), *comms[static_cast<size_t>(r)], ro);
    if (!e.ok()) return e.status().with_context("tensor-parallel rank " + std::to_string(r));
    if (r == 0) o.num_kv_blocks = (*e)->cache().config().n_blocks;  // the same ids on every rank
    ranks.push_back(std::move(*e));
  }
  return std::unique_ptr<Executor>(
      std::make_unique<InProcessTpExecutor>(std::move(comms), std::move(ranks)));
}

}  // namespace strata
