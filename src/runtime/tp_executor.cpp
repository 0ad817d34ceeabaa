// Tensor parallelism inside one process (runtime/executor.h, make_in_process_tp_executor): one
// ModelRunner per rank, each over its Megatron shard of the weights, its own KV pool, workspace
// and (on a GPU) its own stream, graphs and cuBLASLt plans; the ranks talk through the in-process
// communicator (host memory on the CPU, the one-shot kernels on a GPU, inside the CUDA graphs).
// Every forward pass runs on all ranks at once, one host thread each (rank 0 on the caller's);
// the engines see rank 0's logits and rank 0's block accounting (every rank's pool has the same
// block ids). This is how tensor-parallel logic is tested on one GPU, and on the CPU in CI.
// Pipeline stages (make_in_process_pp_executor) run the same way: one runner per stage over its
// layer range, the hidden states passed stage to stage with send/recv, the last stage's results
// sent back to stage 0. Data-parallel replicas (make_in_process_dp_executor) run the same way:
// one runner per replica over the whole model, each forward pass's sequences split among them,
// streamed layers fetched partitioned (each replica its part, then an all-gather).
#include <omp.h>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <omp.h>

#include "core/env.h"
#include "core/status.h"
#include "parallel/inproc_comm.h"
#include "runtime/device_runtime.h"
#include "runtime/executor.h"
#include "runtime/pipeline_schedule.h"
#include "runtime/stage_gate.h"

namespace strata {

namespace {

// N - 1 persistent worker threads plus the caller: run(f) calls f(r) for every rank r at once
// and returns the first error (in time). A rank that fails, or a run that takes longer than the
// deadline (STRATA_COLLECTIVE_TIMEOUT), calls on_fail once: it aborts the communicators, so the
// ranks blocked on a peer that will never arrive return instead of hanging.
class RankPool {
 public:
  // Each worker's CPU ops use its share of the caller's OpenMP threads (n teams of all the
  // threads would oversubscribe the cores and spin against each other).
  RankPool(int n, std::function<void()> on_fail, std::chrono::seconds deadline)
      : n_(n),
        threads_per_rank_(std::max(1, omp_get_max_threads() / std::max(1, n))),
        on_fail_(std::move(on_fail)),
        deadline_(deadline),
        done_(static_cast<size_t>(n), true) {
    for (int r = 1; r < n; ++r) threads_.emplace_back([this, r] { work(r); });
    if (n > 1) watchdog_ = std::thread([this] { watch(); });
  }
  ~RankPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      ++generation_;
    }
    cv_.notify_all();
    watch_cv_.notify_all();
    for (std::thread& t : threads_) t.join();
    if (watchdog_.joinable()) watchdog_.join();
  }
  Status run(const std::function<Status(int)>& f) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_) {
        return Status(StatusCode::kFailedPrecondition,
                      "the ranks' communicators were aborted by an earlier failure: " +
                          first_error_.message());
      }
      job_ = &f;
      pending_ = n_;
      std::fill(done_.begin(), done_.end(), false);
      started_ = std::chrono::steady_clock::now();
      running_ = true;
      ++generation_;
    }
    cv_.notify_all();
    watch_cv_.notify_all();
    const int caller_threads = omp_get_max_threads();
    if (n_ > 1) omp_set_num_threads(threads_per_rank_);
    Status st0 = f(0);
    if (n_ > 1) omp_set_num_threads(caller_threads);
    finish(0, std::move(st0));
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    running_ = false;
    watch_cv_.notify_all();
    return failed_ ? first_error_ : ok_status();
  }

 private:
  void finish(int r, Status s) {
    bool fire = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_[static_cast<size_t>(r)] = true;
      if (!s.ok() && !failed_) {
        failed_ = true;
        fire = true;
        first_error_ = std::move(s);
      }
      if (--pending_ == 0) done_cv_.notify_all();
    }
    if (fire && on_fail_) on_fail_();
  }
  void work(int r) {
    omp_set_num_threads(threads_per_rank_);  // this thread's own setting
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
      finish(r, (*job)(r));
    }
  }
  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      watch_cv_.wait(lock, [&] { return stop_ || running_; });
      if (stop_) return;
      const uint64_t gen = generation_;
      auto over = [&] { return stop_ || !running_ || generation_ != gen; };
      if (watch_cv_.wait_until(lock, started_ + deadline_, over)) continue;
      if (!failed_) {
        std::string slow;
        for (int r = 0; r < n_; ++r) {
          if (!done_[static_cast<size_t>(r)])
            slow += (slow.empty() ? "" : ", ") + std::to_string(r);
        }
        failed_ = true;
        first_error_ = errorf(StatusCode::kDeadlineExceeded,
                              "rank(s) {} still running a forward pass after {} s (a collective "
                              "waiting for a peer?); the communicators were aborted "
                              "(STRATA_COLLECTIVE_TIMEOUT sets the limit)",
                              slow, deadline_.count());
        lock.unlock();
        if (on_fail_) on_fail_();
        lock.lock();
      }
      watch_cv_.wait(lock, over);
    }
  }

  int n_;
  int threads_per_rank_;
  std::function<void()> on_fail_;
  std::chrono::seconds deadline_;
  std::vector<std::thread> threads_;
  std::thread watchdog_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_, watch_cv_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  bool running_ = false;
  bool failed_ = false;
  Status first_error_;
  std::vector<bool> done_;
  std::chrono::steady_clock::time_point started_;
  const std::function<Status(int)>* job_ = nullptr;
};

// Ranks or stages as threads of one process: one runner each, run together by a RankPool. What
// does not depend on how a forward pass is split among them lives here: rank 0's config and
// block accounting (every runner's pool has the same block ids), swaps (a block is every
// runner's slice of it, concatenated) and the device facts.
class InProcessGroupExecutor : public Executor {
 public:
  // `comms`: every communicator the runners refer to (destroyed after them). `also_abort`
  // (optional) wakes ranks blocked on communicators owned elsewhere (a tensor-parallel stage's
  // ranks waiting on the pipeline group).
  InProcessGroupExecutor(std::vector<std::unique_ptr<Communicator>> comms,
                         std::vector<std::unique_ptr<Executor>> ranks, std::string label,
                         std::function<void()> also_abort = nullptr)
      : comms_(std::move(comms)),
        ranks_(std::move(ranks)),
        also_abort_(std::move(also_abort)),
        pool_(
            static_cast<int>(ranks_.size()), [this] { abort_all(); },
            std::chrono::seconds(env_config().collective_timeout_s)),
        label_(std::move(label)) {}
  // The runners first (their CUDA graphs hold NCCL's references to the communicators they
  // captured), then every communicator on a thread of its own, all at once: tearing down an NCCL
  // communicator may wait for its peers in the node (as setting one up does), which one thread
  // destroying them in turn would never let happen. A 70B TP = 2 bench on two H200s printed its
  // results and did not exit within 150 s (2026-11-26; not diagnosed, this is the likely cause).
  ~InProcessGroupExecutor() override {
    ranks_.clear();
    std::vector<std::thread> threads;
    threads.reserve(comms_.size());
    for (auto& c : comms_) threads.emplace_back([&c] { c.reset(); });
    for (std::thread& t : threads) t.join();
  }

  const ModelConfig& config() const override { return ranks_[0]->config(); }
  KvPool& cache() override { return ranks_[0]->cache(); }
  std::string backend_name() const override { return ranks_[0]->backend_name(); }
  // Batch-sharded attention (KvPoolConfig::n_owners > 1): a block is one rank's, whole, so the
  // host slot is one rank's block, which only the rank holding it copies.
  bool split_pool() { return ranks_[0]->cache().config().n_owners > 1; }
  size_t block_bytes() const override {
    if (ranks_[0]->cache().config().n_owners > 1) return ranks_[0]->block_bytes();
    size_t total = 0;
    for (const auto& e : ranks_) total += e->block_bytes();
    return total;
  }
  Status copy_block_to_host(int32_t block, void* host) override {
    char* p = static_cast<char*>(host);
    const bool split = split_pool();
    for (const auto& e : ranks_) {
      STRATA_RETURN_IF_ERROR(e->copy_block_to_host(block, p));
      if (!split) p += e->block_bytes();
    }
    return ok_status();
  }
  Status copy_block_from_host(int32_t block, const void* host) override {
    const char* p = static_cast<const char*>(host);
    const bool split = split_pool();
    for (const auto& e : ranks_) {
      STRATA_RETURN_IF_ERROR(e->copy_block_from_host(block, p));
      if (!split) p += e->block_bytes();
    }
    return ok_status();
  }
  int64_t max_model_len() const override { return ranks_[0]->max_model_len(); }
  std::string device_name() const override {
    const std::string first = ranks_[0]->device_name();
    bool same = true;
    for (const auto& e : ranks_) same = same && e->device_name() == first;
    return (same ? first : first + ", ...") + " (" + std::to_string(ranks_.size()) + " " + label_ +
           ")";
  }
  int64_t device_weight_bytes() const override {
    int64_t total = 0;
    for (const auto& e : ranks_) total += e->device_weight_bytes();
    return total;
  }
  std::vector<int> gpus() const override {
    std::vector<int> all;
    for (const auto& e : ranks_) {
      for (int g : e->gpus()) {
        if (std::find(all.begin(), all.end(), g) == all.end()) all.push_back(g);
      }
    }
    return all;
  }
  int64_t graph_captures() const override { return ranks_[0]->graph_captures(); }
  int64_t graph_replays() const override { return ranks_[0]->graph_replays(); }

 protected:
  // A rank failed or ran past the deadline: wake every rank blocked on a peer.
  void abort_all() {
    for (const auto& c : comms_) {
      if (c != nullptr) c->abort();
    }
    if (also_abort_) also_abort_();
  }

  std::vector<std::unique_ptr<Communicator>> comms_;  // before ranks_: the runners refer to them
  std::vector<std::unique_ptr<Executor>> ranks_;
  std::function<void()> also_abort_;
  RankPool pool_;

 private:
  std::string label_;  // "tensor-parallel ranks", "pipeline stages"
};

// Tensor-parallel ranks: every rank runs every forward pass; the engines get rank 0's results.
class InProcessTpExecutor final : public InProcessGroupExecutor {
 public:
  InProcessTpExecutor(std::vector<std::unique_ptr<Communicator>> comms,
                      std::vector<std::unique_ptr<Executor>> ranks,
                      std::function<void()> also_abort = nullptr)
      : InProcessGroupExecutor(std::move(comms), std::move(ranks), "tensor-parallel ranks",
                               std::move(also_abort)) {}

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
  // A pipeline stage's ranks wait for their inputs together: rank 0's time stands for them.
  double wait_seconds() const override { return ranks_[0]->wait_seconds(); }
  Status forward_argmax(const ForwardBatch& b, int32_t* ids) override {
    ids_.resize(ranks_.size());
    return pool_.run([&](int r) -> Status {
      if (r == 0) return ranks_[0]->forward_argmax(b, ids);
      std::vector<int32_t>& s = ids_[static_cast<size_t>(r)];
      s.resize(b.logit_rows.size());
      return ranks_[static_cast<size_t>(r)]->forward_argmax(b, s.data());
    });
  }

 private:
  std::vector<std::vector<float>> scratch_;
  std::vector<std::vector<int32_t>> ids_;
};

// Pipeline stages as threads: each forward pass is cut into micro-batches (contiguous token
// ranges) that every stage runs in order; a stage's send is buffered, so stage s starts
// micro-batch m + 1 while stage s + 1 still runs m. The KV of a prompt chunk is written by a
// stage before it runs the next chunk of the same sequence, so chunks see their prefix as in
// chunked prefill. The last stage writes the results straight into the caller's buffers.
class InProcessPpExecutor final : public InProcessGroupExecutor {
 public:
  // `stages`: one runner per stage, or with tensor parallelism one InProcessTpExecutor per stage
  // (its own ranks and threads). `comms`: the pipeline groups and the one-rank stages'
  // tensor-parallel groups.
  // `gated`: the stages pass through the StageGate and start a pass only once its inputs are
  // ready (stages_gated() in stage_gate.h); else a stage's receive waits for its inputs.
  InProcessPpExecutor(std::vector<std::unique_ptr<Communicator>> comms,
                      std::vector<std::unique_ptr<Executor>> stages, int64_t min_tokens, bool gated)
      : InProcessGroupExecutor(std::move(comms), std::move(stages), "pipeline stages"),
        min_tokens_(min_tokens),
        busy_(ranks_.size(), 0.0),
        gated_(gated),
        gate_(static_cast<int>(ranks_.size())) {}

  Status forward(const ForwardBatch& b, float* logits) override { return run(b, logits, nullptr); }
  Status forward_argmax(const ForwardBatch& b, int32_t* ids) override {
    return run(b, nullptr, ids);
  }
  ~InProcessPpExecutor() override { stop_stages(); }

  double measured_bubble() const override {
    std::lock_guard<std::mutex> lock(amu_);
    return strata::measured_bubble(busy_, wall_);
  }
  void reset_pipeline_stats() override {
    std::lock_guard<std::mutex> lock(amu_);
    std::fill(busy_.begin(), busy_.end(), 0.0);
    wall_ = 0.0;
    first_start_set_ = false;
  }

  // The generation schedule across steps: every submitted pass is one micro-batch that flows
  // through the stages on their own threads; stage s runs pass j while stage s + 1 runs pass
  // j - 1, so with as many passes in flight as stages no stage waits.
  int pipeline_depth() const override { return static_cast<int>(ranks_.size()); }
  Status submit(const ForwardBatch& b, float* logits, int32_t* ids) override {
    start_stages();
    auto job = std::make_shared<AsyncJob>();
    job->tokens.assign(b.tokens.begin(), b.tokens.end());
    job->seq.assign(b.token_seq.begin(), b.token_seq.end());
    job->pos.assign(b.token_pos.begin(), b.token_pos.end());
    job->rows.assign(b.logit_rows.begin(), b.logit_rows.end());
    job->tables.assign(b.block_tables, b.block_tables + b.n_seqs * b.max_blocks_per_seq);
    job->b = b;
    job->b.tokens = job->tokens;
    job->b.token_seq = job->seq;
    job->b.token_pos = job->pos;
    job->b.logit_rows = job->rows;
    job->b.block_tables = job->tables.data();
    job->logits = logits;
    job->ids = ids;
    {
      std::lock_guard<std::mutex> lock(amu_);
      if (!first_start_set_) {
        first_start_ = std::chrono::steady_clock::now();
        first_start_set_ = true;
      }
      jobs_.push_back(std::move(job));
      ++submitted_;
    }
    acv_.notify_all();
    return ok_status();
  }
  Status wait() override {
    std::unique_lock<std::mutex> lock(amu_);
    if (jobs_.empty()) {
      return Status(StatusCode::kFailedPrecondition, "wait() with nothing submitted");
    }
    std::shared_ptr<AsyncJob> job = jobs_.front();
    done_cv_.wait(lock, [&] { return job->done; });
    jobs_.pop_front();
    ++first_job_;
    return job->status;
  }

 private:
  struct Micro {
    ForwardBatch b;
    std::vector<int32_t> rows;  // logit rows within the micro-batch
    int64_t out_offset = 0;     // its first result row in the caller's buffers
  };

  // Contiguous token ranges, cut only where the logit rows stay in order.
  std::vector<Micro> split(const ForwardBatch& b) const {
    const int64_t n = static_cast<int64_t>(b.tokens.size());
    const int P = static_cast<int>(ranks_.size());
    bool decode = true, ordered = true;
    for (int64_t i = 1; i < n; ++i) {
      if (b.token_seq[static_cast<size_t>(i)] == b.token_seq[static_cast<size_t>(i - 1)])
        decode = false;
    }
    for (size_t i = 1; i < b.logit_rows.size(); ++i) {
      if (b.logit_rows[i] <= b.logit_rows[i - 1]) ordered = false;
    }
    // Every micro-batch reads the stage's weights once more, so a decode step is cut only when
    // its groups stay large (min_tokens each): a small decode batch is bound by the weight
    // stream, and halving it halves nothing but the GEMM rows.
    int64_t m = decode ? std::clamp<int64_t>(n / std::max<int64_t>(1, min_tokens_), 1, P)
                       : prompt_micro_batches(P, n, min_tokens_);
    if (!ordered) m = 1;
    m = std::clamp<int64_t>(m, 1, std::max<int64_t>(n, 1));
    std::vector<Micro> out(static_cast<size_t>(m));
    size_t row = 0;
    int64_t offset = 0;
    for (int64_t k = 0; k < m; ++k) {
      const int64_t t0 = n * k / m, t1 = n * (k + 1) / m;
      Micro& mb = out[static_cast<size_t>(k)];
      mb.b = b;
      mb.b.tokens = b.tokens.subspan(static_cast<size_t>(t0), static_cast<size_t>(t1 - t0));
      mb.b.token_seq = b.token_seq.subspan(static_cast<size_t>(t0), static_cast<size_t>(t1 - t0));
      mb.b.token_pos = b.token_pos.subspan(static_cast<size_t>(t0), static_cast<size_t>(t1 - t0));
      while (row < b.logit_rows.size() && b.logit_rows[row] < t1) {
        mb.rows.push_back(static_cast<int32_t>(b.logit_rows[row] - t0));
        ++row;
      }
      mb.out_offset = offset;
      offset += static_cast<int64_t>(mb.rows.size());
    }
    for (Micro& mb : out) mb.b.logit_rows = mb.rows;
    return out;
  }

  Status run(const ForwardBatch& b, float* logits, int32_t* ids) {
    if (b.tokens.empty()) return ok_status();
    {
      std::lock_guard<std::mutex> lock(amu_);
      if (!jobs_.empty()) {
        return Status(StatusCode::kFailedPrecondition,
                      "a synchronous forward pass while pipelined passes are in flight");
      }
    }
    const std::vector<Micro> micro = split(b);
    const int P = static_cast<int>(ranks_.size());
    const int64_t V = config().vocab;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<double> busy(static_cast<size_t>(P), 0.0);
    // Micro-batches each stage has finished; a stage starts micro-batch k once the one before it
    // has finished k (its inputs are then ready: see StageGate).
    std::vector<int64_t> finished(static_cast<size_t>(P), 0);
    bool failed = false;
    std::mutex fmu;
    std::condition_variable fcv;
    Status st = pool_.run([&](int s) -> Status {
      Executor& e = *ranks_[static_cast<size_t>(s)];
      double busy_s = 0.0;
      Status r = ok_status();
      for (size_t k = 0; k < micro.size() && r.ok(); ++k) {
        const Micro& mb = micro[k];
        if (gated_ && s > 0) {
          std::unique_lock<std::mutex> lock(fmu);
          fcv.wait(lock, [&] {
            return failed || finished[static_cast<size_t>(s - 1)] > static_cast<int64_t>(k);
          });
          if (failed) break;
        }
        const int mode = s < P - 1 ? 0 : (logits != nullptr ? 1 : 2);
        const StageGate::Key key{static_cast<int64_t>(mb.b.tokens.size()),
                                 static_cast<int64_t>(mb.rows.size()), mode};
        const bool alone = gated_ && gate_.enter(s, key);
        const double wait0 = e.wait_seconds();
        const auto s0 = std::chrono::steady_clock::now();
        if (mode == 0) {
          r = e.forward(mb.b, nullptr);
        } else if (mode == 1) {
          r = e.forward(mb.b, logits + mb.out_offset * V);
        } else {
          r = e.forward_argmax(mb.b, ids + mb.out_offset);
        }
        busy_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count() -
                  (e.wait_seconds() - wait0);
        if (gated_) gate_.leave(s, key, alone, r.ok());
        {
          std::lock_guard<std::mutex> lock(fmu);
          if (r.ok()) {
            ++finished[static_cast<size_t>(s)];
          } else {
            failed = true;
          }
        }
        fcv.notify_all();
      }
      busy[static_cast<size_t>(s)] = busy_s;
      return r;
    });
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (st.ok()) {
      std::lock_guard<std::mutex> lock(amu_);
      wall_ += wall;
      for (int s = 0; s < P; ++s) busy_[static_cast<size_t>(s)] += busy[static_cast<size_t>(s)];
    }
    return st;
  }

  struct AsyncJob {
    std::vector<int32_t> tokens, seq, pos, rows, tables;
    ForwardBatch b;
    float* logits = nullptr;
    int32_t* ids = nullptr;
    int stages_done = 0;  // stages that have finished this pass
    bool done = false;
    Status status;
  };

  void start_stages() {
    if (!stage_threads_.empty()) return;
    const int n = static_cast<int>(ranks_.size());
    const int threads = std::max(1, omp_get_max_threads() / n);  // as RankPool's ranks
    for (int s = 0; s < n; ++s) {
      stage_threads_.emplace_back([this, s, threads] {
        omp_set_num_threads(threads);
        stage_loop(s);
      });
    }
  }
  void stop_stages() {
    {
      std::lock_guard<std::mutex> lock(amu_);
      stopping_ = true;
    }
    acv_.notify_all();
    for (std::thread& t : stage_threads_) t.join();
    stage_threads_.clear();
  }
  // Stage s runs every submitted pass in order: receive (stage > 0), its layers, send (or, on
  // the last stage, the results into the caller's buffers).
  void stage_loop(int s) {
    const int P = static_cast<int>(ranks_.size());
    Executor& e = *ranks_[static_cast<size_t>(s)];
    int64_t next = 0;  // absolute index of the next pass this stage runs
    for (;;) {
      std::shared_ptr<AsyncJob> job;
      {
        std::unique_lock<std::mutex> lock(amu_);
        acv_.wait(lock, [&] { return stopping_ || next < submitted_; });
        if (next >= submitted_) return;  // stopping, nothing left
        job = jobs_[static_cast<size_t>(next - first_job_)];
      }
      ++next;
      Status st = ok_status();
      {
        // Gated: inputs ready first (the stage before has finished this pass: see StageGate);
        // else the stage's receive waits for them. An earlier stage failed: skip (the aborted
        // group wakes the rest).
        std::unique_lock<std::mutex> lock(amu_);
        if (gated_) {
          done_cv_.wait(lock, [&] { return !job->status.ok() || job->stages_done >= s; });
        }
        st = job->status;
      }
      const int mode = s < P - 1 ? 0 : (job->ids != nullptr ? 2 : 1);
      const StageGate::Key key{static_cast<int64_t>(job->b.tokens.size()),
                               static_cast<int64_t>(job->b.logit_rows.size()), mode};
      const bool alone = gated_ && st.ok() && gate_.enter(s, key);
      const double wait0 = e.wait_seconds();
      const auto t0 = std::chrono::steady_clock::now();
      if (st.ok()) {
        if (mode == 0) {
          st = e.forward(job->b, nullptr);
        } else if (mode == 2) {
          st = e.forward_argmax(job->b, job->ids);
        } else {
          st = e.forward(job->b, job->logits);
        }
        if (gated_) gate_.leave(s, key, alone, st.ok());
      }
      const auto t1 = std::chrono::steady_clock::now();
      bool abort = false;
      {
        std::lock_guard<std::mutex> lock(amu_);
        busy_[static_cast<size_t>(s)] +=
            std::chrono::duration<double>(t1 - t0).count() - (e.wait_seconds() - wait0);
        if (!st.ok() && job->status.ok()) {
          job->status = st;
          abort = true;
        }
        job->stages_done = s + 1;
        if (s == P - 1) {
          job->done = true;
          wall_ = std::chrono::duration<double>(t1 - first_start_).count();
        }
      }
      if (abort) {
        // The later stages would wait for this pass's hidden states forever.
        abort_all();
        std::lock_guard<std::mutex> lock(amu_);
        job->done = true;
      }
      done_cv_.notify_all();
    }
  }

  int64_t min_tokens_;
  std::vector<double> busy_;  // per stage: seconds computing (not waiting for its input)
  const bool gated_;          // passes go through gate_
  StageGate gate_;            // new shapes run alone (see stage_gate.h)
  double wall_ = 0.0;
  // Pipelined passes (submit / wait).
  mutable std::mutex amu_;
  std::condition_variable acv_, done_cv_;
  std::deque<std::shared_ptr<AsyncJob>> jobs_;  // submitted, not yet waited for
  int64_t submitted_ = 0;                       // passes ever submitted
  int64_t first_job_ = 0;                       // absolute index of jobs_.front()
  bool stopping_ = false;
  std::vector<std::thread> stage_threads_;
  std::chrono::steady_clock::time_point first_start_;
  bool first_start_set_ = false;
};

// Data-parallel replicas: each forward pass's sequences split among the replicas, each running
// its share at once with the others; the results put back in the batch's order. A sequence stays
// with the replica that saw its position 0 (its KV is there), found again by its first block id
// (sequences sharing a cached prefix share that block, and so the replica that holds it).
class InProcessDpExecutor final : public InProcessGroupExecutor {
 public:
  InProcessDpExecutor(std::vector<std::unique_ptr<Communicator>> comms,
                      std::vector<std::unique_ptr<Executor>> ranks)
      : InProcessGroupExecutor(std::move(comms), std::move(ranks), "data-parallel replicas"),
        shares_(ranks_.size()) {}

  Status forward(const ForwardBatch& b, float* logits) override { return run(b, logits, nullptr); }
  Status forward_argmax(const ForwardBatch& b, int32_t* ids) override {
    return run(b, nullptr, ids);
  }
  int data_parallel_size() const override { return static_cast<int>(ranks_.size()); }
  // Swaps move every replica's copy of a block; a sequence's first block also carries its
  // replica through the host slot, so the sequence swapped back in under a new first block
  // stays on the replica that holds its KV.
  Status copy_block_to_host(int32_t block, void* host) override {
    STRATA_RETURN_IF_ERROR(InProcessGroupExecutor::copy_block_to_host(block, host));
    auto it = home_.find(block);
    if (it != home_.end()) {
      swapped_[host] = it->second;
    } else {
      swapped_.erase(host);
    }
    return ok_status();
  }
  Status copy_block_from_host(int32_t block, const void* host) override {
    STRATA_RETURN_IF_ERROR(InProcessGroupExecutor::copy_block_from_host(block, host));
    auto it = swapped_.find(host);
    if (it != swapped_.end()) home_[block] = it->second;
    return ok_status();
  }
  const ResidencyPlan* residency_plan() const override { return ranks_[0]->residency_plan(); }
  bool stream_stats(StreamStats* out) const override { return ranks_[0]->stream_stats(out); }
  std::vector<StreamStats> replica_stream_stats() const override {
    std::vector<StreamStats> all;
    for (const auto& e : ranks_) {
      StreamStats st;
      if (!e->stream_stats(&st)) return {};
      all.push_back(st);
    }
    return all;
  }

 private:
  struct Share {
    std::vector<int32_t> tokens, seq, pos, tables, rows;
    std::vector<int64_t> out;  // per result row: its row in the caller's results
    int64_t n_seqs = 0;
    std::vector<float> logits;
    std::vector<int32_t> ids;
  };

  std::vector<int> assign(const ForwardBatch& b) {
    const int N = static_cast<int>(ranks_.size());
    const int64_t mb = b.max_blocks_per_seq;
    std::vector<int> rep(static_cast<size_t>(b.n_seqs), -1);
    std::vector<bool> fresh(static_cast<size_t>(b.n_seqs), false);
    for (size_t i = 0; i < b.tokens.size(); ++i) {
      if (b.token_pos[i] == 0) fresh[static_cast<size_t>(b.token_seq[i])] = true;
    }
    for (int64_t q = 0; q < b.n_seqs; ++q) {
      const int32_t key = mb > 0 ? b.block_tables[q * mb] : -1;
      int& r = rep[static_cast<size_t>(q)];
      if (!fresh[static_cast<size_t>(q)]) {
        auto it = home_.find(key);
        if (it != home_.end()) r = it->second;
      }
      if (r < 0) {
        r = static_cast<int>(next_++ % N);
        if (key >= 0) home_[key] = r;
      }
    }
    return rep;
  }

  Status run(const ForwardBatch& b, float* logits, int32_t* ids) {
    if (b.tokens.empty()) return ok_status();
    const std::vector<int> rep = assign(b);
    const int64_t mb = b.max_blocks_per_seq;
    const int64_t V = config().vocab;
    for (Share& sh : shares_) sh = Share{};
    std::vector<int32_t> local_seq(static_cast<size_t>(b.n_seqs), -1);
    for (int64_t q = 0; q < b.n_seqs; ++q) {
      Share& sh = shares_[static_cast<size_t>(rep[static_cast<size_t>(q)])];
      local_seq[static_cast<size_t>(q)] = static_cast<int32_t>(sh.n_seqs++);
      sh.tables.insert(sh.tables.end(), b.block_tables + q * mb, b.block_tables + (q + 1) * mb);
    }
    std::vector<int32_t> local_tok(b.tokens.size());
    for (size_t i = 0; i < b.tokens.size(); ++i) {
      const int32_t q = b.token_seq[i];
      Share& sh = shares_[static_cast<size_t>(rep[static_cast<size_t>(q)])];
      local_tok[i] = static_cast<int32_t>(sh.tokens.size());
      sh.tokens.push_back(b.tokens[i]);
      sh.seq.push_back(local_seq[static_cast<size_t>(q)]);
      sh.pos.push_back(b.token_pos[i]);
    }
    for (size_t k = 0; k < b.logit_rows.size(); ++k) {
      const auto t = static_cast<size_t>(b.logit_rows[k]);
      Share& sh = shares_[static_cast<size_t>(rep[static_cast<size_t>(b.token_seq[t])])];
      sh.rows.push_back(local_tok[t]);
      sh.out.push_back(static_cast<int64_t>(k));
    }
    STRATA_RETURN_IF_ERROR(pool_.run([&](int r) -> Status {
      Share& sh = shares_[static_cast<size_t>(r)];
      Executor& e = *ranks_[static_cast<size_t>(r)];
      // No sequence here this step: the weights still stream (the peers' all-gathers need
      // this replica's part of every layer).
      if (sh.tokens.empty()) return e.stream_pass();
      ForwardBatch sb;
      sb.tokens = sh.tokens;
      sb.token_seq = sh.seq;
      sb.token_pos = sh.pos;
      sb.block_tables = sh.tables.data();
      sb.max_blocks_per_seq = mb;
      sb.n_seqs = sh.n_seqs;
      sb.logit_rows = sh.rows;
      if (ids != nullptr) {
        sh.ids.resize(sh.rows.size());
        return e.forward_argmax(sb, sh.ids.data());
      }
      if (logits == nullptr) return e.forward(sb, nullptr);  // no results wanted
      sh.logits.resize(sh.rows.size() * static_cast<size_t>(V));
      return e.forward(sb, sh.logits.data());
    }));
    if (logits == nullptr && ids == nullptr) return ok_status();
    for (const Share& sh : shares_) {
      for (size_t k = 0; k < sh.out.size(); ++k) {
        if (ids == nullptr) {
          std::copy_n(sh.logits.data() + k * static_cast<size_t>(V), V, logits + sh.out[k] * V);
        } else {
          ids[sh.out[k]] = sh.ids[k];
        }
      }
    }
    return ok_status();
  }

  std::vector<Share> shares_;
  std::unordered_map<int32_t, int> home_;         // first block id -> replica
  std::unordered_map<const void*, int> swapped_;  // host slot of a swapped-out block -> replica
  uint64_t next_ = 0;                             // round robin over new sequences
};

using LoadFn = std::function<Result<std::unique_ptr<Model>>(const ParallelConfig&)>;

// Ranks sharing one GPU with lazily loaded kernels deadlock: a kernel's first load waits for the
// GPU to go idle, while a peer's collective spins waiting for this rank.
Status lazy_loading_error(const char* kind, const char* flag) {
  return errorf(StatusCode::kFailedPrecondition,
                "{}-parallel ranks sharing one GPU need CUDA_MODULE_LOADING=EAGER in the "
                "environment before the process starts (a kernel loaded lazily waits for the "
                "peer's collective, which waits for it); the strata command sets it for {} > 1",
                kind, flag);
}

namespace {

// tp x ep ranks as threads (make_in_process_tp_executor with ep > 1): world rank w = ep_rank tp
// + tp_rank; each rank's tensor-parallel group (the ranks of its ep_rank) and expert-parallel
// group (the ranks of its tp_rank) are in-process communicators of their own. On a GPU both get
// the one-shot device collectives (the expert-parallel groups' sized for the fixed-capacity
// exchange of decode steps), so every rank may share one GPU and decode steps run in CUDA
// graphs. On a shared GPU prefill's variable splits are copies between the ranks' device buffers
// (the in-process all_to_all_v); on GPUs of their own both groups are NCCL above the one-shot
// sizes. Either way they stay on the device.
Result<std::unique_ptr<Executor>> make_in_process_ep_executor(
    const ModelConfig& config,
    const std::function<Result<std::unique_ptr<Model>>(const ParallelConfig&)>& load, int tp,
    int ep, const RunnerOptions& options) {
  const int W = tp * ep;
  if (config.n_experts > 0 && config.n_experts % ep != 0) {
    return errorf(StatusCode::kInvalidArgument,
                  "{} experts cannot be split over expert-parallel size {} (the number of experts "
                  "must be a multiple of it)",
                  config.n_experts, ep);
  }
  std::vector<std::unique_ptr<Communicator>> tp_comms(static_cast<size_t>(W)),
      ep_comms(static_cast<size_t>(W));
  for (int e = 0; e < ep; ++e) {
    std::vector<std::unique_ptr<Communicator>> g = make_in_process_communicators(tp);
    for (int t = 0; t < tp; ++t) tp_comms[static_cast<size_t>(e * tp + t)] = std::move(g[t]);
  }
  for (int t = 0; t < tp; ++t) {
    std::vector<std::unique_ptr<Communicator>> g = make_in_process_communicators(ep);
    for (int e = 0; e < ep; ++e) ep_comms[static_cast<size_t>(e * tp + t)] = std::move(g[e]);
  }
  const bool cuda = options.device.is_cuda();
  const bool shared_gpu =
      cuda && (env_config().tp_one_gpu || options.device.index + W > cuda_device_count());
  auto rank_device = [&](int w) {
    return cuda && !shared_gpu ? Device::cuda(options.device.index + w) : options.device;
  };
  if (shared_gpu && cuda_lazy_module_loading()) {
    return lazy_loading_error("expert", "--ep");
  }
  // On GPUs of their own, each group's device collectives are NCCL above the one-shot kernels'
  // sizes (as make_tp_group's): prefill's all-gathers and variable-split all-to-alls then run
  // as NCCL collectives (model/moe.cpp). Ranks sharing a GPU
  // cannot run NCCL: the one-shot kernels take every size there. Every rank of every group at
  // once (NCCL's init is collective within a group).
  auto with_nccl = [&](std::vector<std::unique_ptr<Communicator>>& comms, int64_t oneshot_max,
                       const char* what) -> Status {
    if (shared_gpu) return ok_status();
    std::vector<Status> st(static_cast<size_t>(W));
    std::vector<std::thread> threads;
    for (int w = 0; w < W; ++w) {
      threads.emplace_back([&, w] {
        std::unique_ptr<Communicator>& c = comms[static_cast<size_t>(w)];
        Result<std::unique_ptr<Communicator>> n =
            make_nccl_communicator(std::move(c), rank_device(w).index, oneshot_max);
        if (n.ok()) {
          c = std::move(*n);
        } else {
          st[static_cast<size_t>(w)] = n.status();
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (int w = 0; w < W; ++w) {
      if (!st[static_cast<size_t>(w)].ok()) {
        return st[static_cast<size_t>(w)].with_context("rank " + std::to_string(w) + " " + what);
      }
    }
    return ok_status();
  };
  if (cuda && tp > 1) {
    // The tensor-parallel groups' device collectives: the one-shot kernels (for every size on a
    // shared GPU; the layer output's gathered chunks are padded to a multiple of the world: W
    // rows more), NCCL above them on GPUs of their own.
    const OneShotSizes sizes = oneshot_sizes(config, options, tp);
    const int64_t largest = shared_gpu ? sizes.largest + W * config.hidden * 4
                                       : std::max<int64_t>(sizes.oneshot_max, 1);
    std::vector<Status> st(static_cast<size_t>(W));
    std::vector<std::thread> threads;
    for (int w = 0; w < W; ++w) {
      threads.emplace_back([&, w] {
        st[static_cast<size_t>(w)] = init_in_process_device(*tp_comms[static_cast<size_t>(w)],
                                                            rank_device(w).index, largest);
      });
    }
    for (std::thread& t : threads) t.join();
    for (int w = 0; w < W; ++w) {
      if (!st[static_cast<size_t>(w)].ok()) {
        return st[static_cast<size_t>(w)].with_context("rank " + std::to_string(w) +
                                                       " tensor-parallel collectives");
      }
    }
    STRATA_RETURN_IF_ERROR(with_nccl(tp_comms, largest, "tensor-parallel NCCL"));
  }
  // The expert-parallel groups' device collectives (the one-shot kernels) for the fixed-capacity
  // exchange of decode-sized steps (model/moe_ep.h): its f32 rows back, the largest message, are
  // ep blocks of C = P min(k, E / ep) rows for chunks of P = ceil(Tf / W) tokens, so these runs
  // can be graph-captured. Larger steps take the eager variable exchange (model/moe.cpp:
  // device-to-device copies on a shared GPU, NCCL on GPUs of their own).
  const int64_t fixed_tokens =
      std::min(options.moe_ep_fixed_tokens < 0 ? options.max_num_seqs : options.moe_ep_fixed_tokens,
               options.max_num_tokens);
  int64_t ep_oneshot_max = 0;  // the expert-parallel groups' messages for the one-shot kernels
  if (cuda && fixed_tokens > 0 && config.n_experts > 0) {
    const int64_t P = (fixed_tokens + W - 1) / W;
    const int64_t C = P * std::min<int64_t>(config.n_experts_used, config.n_experts / ep);
    const int64_t largest = std::max<int64_t>(ep * C, P) * config.hidden * 4;
    std::vector<Status> st(static_cast<size_t>(W));
    std::vector<std::thread> threads;
    for (int w = 0; w < W; ++w) {
      threads.emplace_back([&, w] {
        st[static_cast<size_t>(w)] = init_in_process_device(*ep_comms[static_cast<size_t>(w)],
                                                            rank_device(w).index, largest);
      });
    }
    for (std::thread& t : threads) t.join();
    for (int w = 0; w < W; ++w) {
      if (!st[static_cast<size_t>(w)].ok()) {
        return st[static_cast<size_t>(w)].with_context("rank " + std::to_string(w) +
                                                       " expert-parallel collectives");
      }
    }
    // NCCL's grouped send/recv beat the one-shot all-to-all from ~8 tokens per GPU (4 x H200,
    // bench/results/2026-11-26-h200x4-s4/moe): the one-shot kernels keep steps of up to 4.
    const int64_t P4 = std::min<int64_t>(P, 4);
    ep_oneshot_max =
        std::max<int64_t>(ep * P4 * std::min<int64_t>(config.n_experts_used, config.n_experts / ep),
                          P4) *
        config.hidden * 4;
  }
  if (cuda && ep > 1) {
    STRATA_RETURN_IF_ERROR(with_nccl(ep_comms, ep_oneshot_max, "expert-parallel NCCL"));
  }
  // Every rank meets the others before (and after) it first runs a cuBLASLt GEMM shape
  // (cuda::LaunchCtx::first_use_barrier): the tensor-parallel groups are not in step between the
  // expert exchanges, so without it one group's GPUs can sit in the exchange waiting for a rank
  // whose host thread waits for cuBLASLt's lock while another rank loads a kernel library (which
  // waits for every GPU to go idle); TP x EP decode stopped at a new batch size on 4 x H200
  // (bench/results/2026-11-26-h200x4-s4/diag). The ranks run the same GEMM shapes in the same
  // order (every rank routes every token), so they meet at the same shapes. On a shared GPU
  // too: a kernel library's load waits for that GPU, where a peer's one-shot exchange may spin.
  std::vector<std::unique_ptr<Communicator>> first_use =
      cuda && W > 1 ? make_in_process_communicators(W)
                    : std::vector<std::unique_ptr<Communicator>>{};
  std::vector<std::unique_ptr<Executor>> ranks;
  RunnerOptions o = options;
  for (int w = 0; w < W; ++w) {
    ParallelConfig par;
    par.tp_size = tp;
    par.tp_rank = w % tp;
    par.ep_size = ep;
    par.ep_rank = w / tp;
    std::unique_ptr<Model> host;
    if (load) {
      STRATA_ASSIGN_OR_RETURN(host, load(par));
    }
    RunnerOptions ro = o;
    ro.device = rank_device(w);
    if (!first_use.empty()) {
      Communicator* c = first_use[static_cast<size_t>(w)].get();
      ro.plan_barrier = [c] { return c->barrier().ok(); };
    }
    // Rank 0's routing only (one vector). The trace keeps rank 0 eager; the others must run
    // eagerly too, or their first graph-sized steps (run, then captured, then replayed) would
    // make other collective calls than rank 0's and wait for it forever.
    if (o.moe_route_trace != nullptr) ro.cuda_graphs = false;
    if (w > 0) ro.moe_route_trace = nullptr;
    if (shared_gpu && o.num_kv_blocks <= 0) {
      ro.gpu_memory_utilization = o.gpu_memory_utilization * (w + 1) / W;
    }
    Result<std::unique_ptr<Executor>> e =
        make_runner(config, par, std::move(host), *tp_comms[static_cast<size_t>(w)], ro, nullptr,
                    ep_comms[static_cast<size_t>(w)].get());
    if (!e.ok()) {
      return e.status().with_context("rank " + std::to_string(w) + " (tensor-parallel rank " +
                                     std::to_string(par.tp_rank) + ", expert-parallel rank " +
                                     std::to_string(par.ep_rank) + ")");
    }
    if (w == 0) o.num_kv_blocks = (*e)->cache().config().n_blocks;  // the same ids on every rank
    ranks.push_back(std::move(*e));
  }
  std::vector<std::unique_ptr<Communicator>> comms;
  for (auto& c : tp_comms) comms.push_back(std::move(c));
  for (auto& c : ep_comms) comms.push_back(std::move(c));
  for (auto& c : first_use) comms.push_back(std::move(c));
  return std::unique_ptr<Executor>(
      std::make_unique<InProcessTpExecutor>(std::move(comms), std::move(ranks)));
}

}  // namespace

// Where the `world` ranks of one process run (world rank w = pp_rank * tp + tp_rank): on GPU
// index + w when there are that many, else all on GPU index (STRATA_TP_ONE_GPU=1 forces it),
// each with its share of --gpu-memory-utilization.
struct Placement {
  bool cuda = false;
  bool shared_gpu = false;
  int world = 1;
  Device device(const RunnerOptions& o, int w) const {
    return cuda && !shared_gpu ? Device::cuda(o.device.index + w) : o.device;
  }
};

Placement place(const RunnerOptions& o, int world, bool tp_one_gpu) {
  Placement p;
  p.cuda = o.device.is_cuda();
  p.world = world;
  p.shared_gpu = p.cuda && (tp_one_gpu || o.device.index + world > cuda_device_count());
  return p;
}

// One tensor-parallel group of `tp` ranks as threads: world ranks [w0, w0 + tp). `stage` holds
// the pipeline fields (pp_size 1 without stages); with stages, pipes[i] is rank i's pipeline
// group. `o` gives every runner's options; its num_kv_blocks is set by the first runner made
// when it is 0, so every rank (and every stage) addresses the same block ids.
Result<std::unique_ptr<InProcessTpExecutor>> make_tp_group(
    const ModelConfig& config, const LoadFn& load, int tp, const ParallelConfig& stage,
    const std::vector<Communicator*>& pipes, int w0, const Placement& where, RunnerOptions& o,
    std::function<void()> also_abort) {
  const std::string where_s =
      stage.pp_size > 1 ? "pipeline stage " + std::to_string(stage.pp_rank) + ", " : "";
  // With the ranks on GPUs of their own the layouts' collectives go through NCCL: the 2d
  // groups are NCCL communicators split from the rank's (NcclCommunicator::split), the
  // weight-gathered all-gathers and reduce-scatters and batch-sharded attention's all-to-alls
  // are NCCL's device collectives (FfnLayoutCuda / AttnLayoutCuda pass on 4 x H200, 2026-11-26).
  std::vector<std::unique_ptr<Communicator>> comms = make_in_process_communicators(tp);
  if (where.cuda && tp > 1) {
    // Device collectives, set up on every rank at once: the one-shot kernels (peers' buffers
    // read directly) for decode-sized messages; across GPUs, NCCL above oneshot_max_bytes. On a
    // shared GPU NCCL cannot run two ranks, so the one-shot kernels take every size.
    const OneShotSizes sizes = oneshot_sizes(config, o, tp);
    const int64_t largest = sizes.largest, oneshot_max = sizes.oneshot_max;
    std::vector<Status> st(static_cast<size_t>(tp));
    std::vector<std::thread> threads;
    for (int r = 0; r < tp; ++r) {
      threads.emplace_back([&, r] {
        std::unique_ptr<Communicator>& c = comms[static_cast<size_t>(r)];
        const int dev = where.device(o, w0 + r).index;
        Status s = init_in_process_device(
            *c, dev, where.shared_gpu ? largest : std::max<int64_t>(oneshot_max, 1));
        if (s.ok() && !where.shared_gpu) {
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
        return st[static_cast<size_t>(r)].with_context(where_s + "tensor-parallel rank " +
                                                       std::to_string(r) + " collectives");
      }
    }
  }
  // The 2d FFN layout's X and Y groups, split on every rank at once (the communicator's
  // collectives block until all ranks arrive); the executor owns them with the rest.
  std::vector<FfnGroups> groups(static_cast<size_t>(tp));
  if (o.ffn_layout == FfnLayout::k2D) {
    std::vector<Status> st(static_cast<size_t>(tp));
    std::vector<std::thread> threads;
    for (int r = 0; r < tp; ++r) {
      threads.emplace_back([&, r] {
        ParallelConfig par = stage;
        par.tp_size = tp;
        par.tp_rank = r;
        par.ffn_layout = o.ffn_layout;
        par.ws2d_x = o.ws2d_x;
        const auto i = static_cast<size_t>(r);
        // No grid: every rank's load below fails alike, naming the flags.
        if (par.grid_x() < 2 || tp % par.grid_x() != 0) return;
        Result<FfnGroups> g = split_ffn_groups(*comms[i], par);
        if (!g.ok()) {
          st[i] = g.status();
          return;
        }
        groups[i] = std::move(*g);
        // Across GPUs the groups are NCCL's already (split() of an NCCL communicator).
        if (where.cuda && where.shared_gpu) {
          // The groups' device collectives (one-shot kernels, one GPU): all-reduces of the
          // partial sums (in pieces when larger) and the X all-gather of [T, hidden / X] f32,
          // which must fit whole: a step's hidden states cover both.
          const int64_t bytes = oneshot_sizes(config, o, tp).largest;
          const int dev = where.device(o, w0 + r).index;
          Status s = init_in_process_device(*groups[i].x, dev, bytes);
          // Every rank registers with both groups, even after a failure (no rank left waiting).
          Status sy = init_in_process_device(*groups[i].y, dev, bytes);
          st[i] = s.ok() ? sy : s;
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (const Status& s : st) STRATA_RETURN_IF_ERROR(s);
  }
  // Ranks sharing one GPU meet before and after each first run of a cuBLASLt GEMM shape
  // (cuda::LaunchCtx::first_use_barrier): a kernel library loaded then waits for the GPU to go
  // idle, which it does not while a peer's one-shot collective spins for this rank. With the 1d
  // FFN and head-sharded attention every rank runs the same GEMM shapes in the same order (the
  // other layouts split tokens unevenly over the ranks, so their shapes may differ).
  std::vector<std::unique_ptr<Communicator>> first_use =
      where.cuda && where.shared_gpu && tp > 1 && o.ffn_layout == FfnLayout::k1D &&
              o.ffn_gather_min_tokens == 0 && o.attn_layout == AttnLayout::kHeadSharded
          ? make_in_process_communicators(tp)
          : std::vector<std::unique_ptr<Communicator>>{};
  std::vector<std::unique_ptr<Executor>> ranks;
  const double util = o.gpu_memory_utilization;
  for (int r = 0; r < tp; ++r) {
    ParallelConfig par = stage;
    par.tp_size = tp;
    par.tp_rank = r;
    par.ffn_layout = o.ffn_layout;
    par.ws2d_x = o.ws2d_x;
    par.ffn_gather_min_tokens = o.ffn_gather_min_tokens;
    par.attn_layout = o.attn_layout;
    std::unique_ptr<Model> host;
    if (load) {
      Result<std::unique_ptr<Model>> m = load(par);
      if (!m.ok()) {
        return m.status().with_context(where_s + "tensor-parallel rank " + std::to_string(r));
      }
      host = std::move(*m);
    }
    RunnerOptions ro = o;
    ro.device = where.device(o, w0 + r);
    ro.ffn_x_group = groups[static_cast<size_t>(r)].x.get();
    ro.ffn_y_group = groups[static_cast<size_t>(r)].y.get();
    if (!first_use.empty()) {
      Communicator* c = first_use[static_cast<size_t>(r)].get();
      ro.plan_barrier = [c] { return c->barrier().ok(); };
    }
    // Rank 0's routing only; every rank eager with it (see make_in_process_ep_executor).
    if (o.moe_route_trace != nullptr) ro.cuda_graphs = false;
    if (r > 0 || w0 > 0) ro.moe_route_trace = nullptr;
    if (where.shared_gpu && o.num_kv_blocks <= 0) {
      // Ranks on one GPU share it: each takes its share of --gpu-memory-utilization.
      ro.gpu_memory_utilization = util * (w0 + r + 1) / where.world;
    }
    Communicator* pipe = pipes.empty() ? nullptr : pipes[static_cast<size_t>(r)];
    Result<std::unique_ptr<Executor>> e =
        make_runner(config, par, std::move(host), *comms[static_cast<size_t>(r)], ro, pipe);
    if (!e.ok())
      return e.status().with_context(where_s + "tensor-parallel rank " + std::to_string(r));
    if (o.num_kv_blocks <= 0) o.num_kv_blocks = (*e)->cache().config().n_blocks;
    ranks.push_back(std::move(*e));
  }
  for (FfnGroups& g : groups) {
    if (g.x) comms.push_back(std::move(g.x));
    if (g.y) comms.push_back(std::move(g.y));
  }
  for (std::unique_ptr<Communicator>& c : first_use) comms.push_back(std::move(c));
  return std::make_unique<InProcessTpExecutor>(std::move(comms), std::move(ranks),
                                               std::move(also_abort));
}

// The FFN layouts other than 1d (and batch-sharded attention) run in tensor-parallel groups of
// their own (make_tp_group); the executors that would drop RunnerOptions::ffn_layout or
// attn_layout refuse them instead.
Status only_1d_ffn(const RunnerOptions& o, const char* what) {
  if (o.attn_layout != AttnLayout::kHeadSharded) {
    return errorf(StatusCode::kUnimplemented, "--attn-layout {} with {} is not built yet",
                  attn_layout_name(o.attn_layout), what);
  }
  if (o.ffn_layout == FfnLayout::k1D && o.ffn_gather_min_tokens == 0) return ok_status();
  if (o.ffn_layout == FfnLayout::k1D) {
    return errorf(StatusCode::kUnimplemented, "--ffn-gather-min-tokens with {} is not built yet",
                  what);
  }
  return errorf(StatusCode::kUnimplemented, "--ffn-layout {} with {} is not built yet",
                ffn_layout_name(o.ffn_layout), what);
}

}  // namespace

Result<std::unique_ptr<Executor>> make_in_process_tp_executor(const ModelConfig& config,
                                                              const LoadFn& load, int tp,
                                                              const RunnerOptions& options,
                                                              int ep) {
  if (tp < 1) return errorf(StatusCode::kInvalidArgument, "tensor-parallel size {}", tp);
  if (ep < 1) return errorf(StatusCode::kInvalidArgument, "expert-parallel size {}", ep);
  if (ep > 1) {
    STRATA_RETURN_IF_ERROR(only_1d_ffn(options, "expert parallelism"));
    return make_in_process_ep_executor(config, load, tp, ep, options);
  }
  const Placement where = place(options, tp, env_config().tp_one_gpu);
  if (where.shared_gpu && tp > 1 && cuda_lazy_module_loading()) {
    return lazy_loading_error("tensor", "--tp");
  }
  RunnerOptions o = options;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<InProcessTpExecutor> group,
                          make_tp_group(config, load, tp, ParallelConfig{}, {}, 0, where, o, {}));
  return std::unique_ptr<Executor>(std::move(group));
}

Result<std::unique_ptr<Executor>> make_in_process_dp_executor(const ModelConfig& config,
                                                              const LoadFn& load, int dp,
                                                              const RunnerOptions& options,
                                                              bool partitioned) {
  if (dp < 1) return errorf(StatusCode::kInvalidArgument, "data-parallel size {}", dp);
  STRATA_RETURN_IF_ERROR(only_1d_ffn(options, "data-parallel replicas"));
  const Placement where = place(options, dp, env_config().tp_one_gpu);
  // Replicas sharing one GPU gather the layer parts with device copies ordered on the host
  // (device_runtime_cuda.cpp, CudaCopier::gather_shared): no kernel waits for a peer, so lazy
  // module loading is no hazard there.
  const bool fetch = partitioned && dp > 1 && options.residency.requested();
  // The replicas' group (the partitioned fetch's all-gathers) and each replica's one-rank
  // tensor-parallel group.
  std::vector<std::unique_ptr<Communicator>> group = make_in_process_communicators(dp);
  if (fetch && where.cuda && !where.shared_gpu) {
    // One GPU each: the layer parts' all-gathers through NCCL (every size), set up on all
    // replicas at once.
    std::vector<Status> st(static_cast<size_t>(dp));
    std::vector<std::thread> threads;
    for (int r = 0; r < dp; ++r) {
      threads.emplace_back([&, r] {
        std::unique_ptr<Communicator>& c = group[static_cast<size_t>(r)];
        Result<std::unique_ptr<Communicator>> nccl =
            make_nccl_communicator(std::move(c), where.device(options, r).index, 0);
        if (nccl.ok()) {
          c = std::move(*nccl);
        } else {
          st[static_cast<size_t>(r)] = nccl.status();
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < dp; ++r) {
      if (!st[static_cast<size_t>(r)].ok()) {
        return st[static_cast<size_t>(r)].with_context("data-parallel replica " +
                                                       std::to_string(r) + " fetch group");
      }
    }
  }
  std::vector<std::unique_ptr<Communicator>> singles;
  std::vector<std::unique_ptr<Executor>> ranks;
  RunnerOptions o = options;
  std::shared_ptr<const StreamedWeights> shared;
  for (int r = 0; r < dp; ++r) {
    std::unique_ptr<Model> host;
    if (load) {
      Result<std::unique_ptr<Model>> m = load(ParallelConfig{});
      if (!m.ok()) return m.status().with_context("data-parallel replica " + std::to_string(r));
      host = std::move(*m);
    }
    RunnerOptions ro = o;
    ro.device = where.device(o, r);
    if (o.moe_route_trace != nullptr) ro.cuda_graphs = false;  // every replica alike
    if (r > 0) ro.moe_route_trace = nullptr;  // replica 0's routing only (one vector)
    if (where.shared_gpu && o.num_kv_blocks <= 0) {
      ro.gpu_memory_utilization = o.gpu_memory_utilization * (r + 1) / dp;
    }
    ro.fetch_group = fetch ? group[static_cast<size_t>(r)].get() : nullptr;
    ro.shared_host_blobs = shared;  // one pinned host copy of the streamed layers
    singles.push_back(make_single_rank_communicator());
    Result<std::unique_ptr<Executor>> e =
        make_runner(config, ParallelConfig{}, std::move(host), *singles.back(), ro);
    if (!e.ok()) return e.status().with_context("data-parallel replica " + std::to_string(r));
    if (r == 0) {
      o.num_kv_blocks = (*e)->cache().config().n_blocks;  // the same block ids on every replica
      shared = (*e)->streamed_weights();
      if (shared && shared->tier != LayerTier::kHost) shared.reset();
    }
    ranks.push_back(std::move(*e));
  }
  std::vector<std::unique_ptr<Communicator>> comms;
  for (auto& c : group) comms.push_back(std::move(c));
  for (auto& c : singles) comms.push_back(std::move(c));
  return std::unique_ptr<Executor>(
      std::make_unique<InProcessDpExecutor>(std::move(comms), std::move(ranks)));
}

Result<std::unique_ptr<Executor>> make_in_process_pp_executor(const ModelConfig& config,
                                                              const LoadFn& load,
                                                              const std::vector<int64_t>& bounds,
                                                              const RunnerOptions& options,
                                                              int tp) {
  STRATA_RETURN_IF_ERROR(only_1d_ffn(options, "pipeline stages"));
  const int pp = static_cast<int>(bounds.size()) - 1;
  if (pp < 1 || bounds.front() != 0 || bounds.back() != config.n_layers) {
    return errorf(StatusCode::kInvalidArgument, "pipeline bounds for {} stages of {} layers", pp,
                  config.n_layers);
  }
  if (tp < 1) return errorf(StatusCode::kInvalidArgument, "tensor-parallel size {}", tp);
  // Stage s on GPU index + s when there are that many, else all stages share GPU index, each
  // with its share of --gpu-memory-utilization (with tensor parallelism, rank (s, i) on GPU
  // index + s * tp + i). Hidden states go through pinned host memory, so no device collective
  // is involved between stages.
  const Placement where = place(options, tp * pp, tp > 1 && env_config().tp_one_gpu);
  if (where.shared_gpu && tp > 1 && cuda_lazy_module_loading()) {
    return lazy_loading_error("tensor", "--tp");
  }
  // The pipeline groups: one per tensor-parallel rank i, linking rank i of every stage (hidden
  // states go from (stage s, rank i) to (stage s + 1, rank i)); pipes[i][s] is stage s's end.
  std::vector<std::vector<std::unique_ptr<Communicator>>> pipes;
  for (int i = 0; i < tp; ++i) pipes.push_back(make_in_process_communicators(pp));
  std::vector<Communicator*> all_pipes;
  for (auto& g : pipes) {
    for (auto& c : g) all_pipes.push_back(c.get());
  }
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<std::unique_ptr<Executor>> stages;
  RunnerOptions o = options;
  for (int s = 0; s < pp; ++s) {
    ParallelConfig par;
    par.pp_size = pp;
    par.pp_rank = s;
    par.first_layer = bounds[static_cast<size_t>(s)];
    par.last_layer = bounds[static_cast<size_t>(s) + 1];
    if (tp > 1) {
      std::vector<Communicator*> stage_pipes;
      for (int i = 0; i < tp; ++i)
        stage_pipes.push_back(pipes[static_cast<size_t>(i)][static_cast<size_t>(s)].get());
      // A stage's rank that fails wakes the other stages' ranks blocked on the pipeline too.
      auto abort_pipes = [all_pipes] {
        for (Communicator* c : all_pipes) c->abort();
      };
      STRATA_ASSIGN_OR_RETURN(
          std::unique_ptr<InProcessTpExecutor> group,
          make_tp_group(config, load, tp, par, stage_pipes, s * tp, where, o, abort_pipes));
      stages.push_back(std::move(group));
      continue;
    }
    comms.push_back(make_single_rank_communicator());
    std::unique_ptr<Model> host;
    if (load) {
      Result<std::unique_ptr<Model>> m = load(par);
      if (!m.ok()) return m.status().with_context("pipeline stage " + std::to_string(s));
      host = std::move(*m);
    }
    RunnerOptions ro = o;
    ro.device = where.device(o, s);
    if (where.shared_gpu && o.num_kv_blocks <= 0) {
      ro.gpu_memory_utilization = o.gpu_memory_utilization * (s + 1) / pp;
    }
    Result<std::unique_ptr<Executor>> e = make_runner(config, par, std::move(host), *comms.back(),
                                                      ro, pipes[0][static_cast<size_t>(s)].get());
    if (!e.ok()) return e.status().with_context("pipeline stage " + std::to_string(s));
    if (s == 0) o.num_kv_blocks = (*e)->cache().config().n_blocks;  // the same ids on every stage
    stages.push_back(std::move(*e));
  }
  for (auto& g : pipes) {
    for (auto& c : g) comms.push_back(std::move(c));
  }
  const bool gated = stages_gated(where.cuda, tp, env_config().pp_stage_gate);
  return std::unique_ptr<Executor>(std::make_unique<InProcessPpExecutor>(
      std::move(comms), std::move(stages), options.pp_min_micro_batch_tokens, gated));
}

}  // namespace strata
