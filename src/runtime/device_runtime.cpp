#include "runtime/device_runtime.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <omp.h>

#include "core/status.h"
#include "parallel/comm.h"

namespace strata {

namespace {

// The CPU's "copy stream": a thread that runs the copies in order, with the events' semantics
// of the CUDA copier (a wait sees the copies issued before it), so the streaming logic runs
// with copies that really overlap the compute, as on a GPU: a copy issued into a slot whose
// layer has not run yet, or a layer that did not wait for its copy, races here too. The compute
// is synchronous, so whatever ran before mark_free() has finished: a copy needs no wait.
class CpuCopier final : public WeightCopier {
 public:
  CpuCopier(int slots, int staging)
      : ready_rec_(static_cast<size_t>(slots), 0),
        ready_done_(static_cast<size_t>(slots), 0),
        staging_rec_(static_cast<size_t>(staging), 0),
        staging_done_(static_cast<size_t>(staging), 0) {
    thread_ = std::thread([this] { loop(); });
  }
  ~CpuCopier() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Status copy(int slot, void* dst, const void* src, size_t bytes, int staging) override {
    std::lock_guard<std::mutex> lock(mu_);
    Job j{slot, dst, src, bytes, staging, ++ready_rec_[static_cast<size_t>(slot)], 0, nullptr};
    if (staging >= 0) j.staging_seq = ++staging_rec_[static_cast<size_t>(staging)];
    queue_.push_back(j);
    cv_.notify_all();
    return ok_status();
  }
  Status gather(int slot, void* dst, size_t part, Communicator& comm) override {
    std::lock_guard<std::mutex> lock(mu_);
    Job j{slot, dst, nullptr, part, -1, ++ready_rec_[static_cast<size_t>(slot)], 0, &comm};
    queue_.push_back(j);
    cv_.notify_all();
    return ok_status();
  }
  Status wait_ready(int slot) override {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t target = ready_rec_[static_cast<size_t>(slot)];
    wait(lock, [&] { return ready_done_[static_cast<size_t>(slot)] >= target || !error_.ok(); });
    return error_;
  }
  Status mark_free(int) override { return ok_status(); }
  Status wait_staging(int staging) override {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t target = staging_rec_[static_cast<size_t>(staging)];
    wait(lock,
         [&] { return staging_done_[static_cast<size_t>(staging)] >= target || !error_.ok(); });
    return error_;
  }
  Status synchronize() override {
    std::unique_lock<std::mutex> lock(mu_);
    wait(lock, [&] { return (queue_.empty() && busy_ == 0) || !error_.ok(); });
    return error_;
  }

 private:
  struct Job {
    int slot;
    void* dst;
    const void* src;
    size_t bytes;
    int staging;
    int64_t ready_seq, staging_seq;
    Communicator* comm;  // a gather: the all-gather of `bytes` per rank in place at dst
  };
  // Runs the oldest queued copy on this thread (lock held on entry and exit).
  void run_one(std::unique_lock<std::mutex>& lock) {
    const Job j = queue_.front();
    queue_.pop_front();
    ++busy_;
    lock.unlock();
    Status st = ok_status();
    if (j.comm != nullptr) {
      const int64_t n = static_cast<int64_t>(j.bytes);
      st = j.comm->all_gather(static_cast<uint8_t*>(j.dst) + n * j.comm->rank(), n, DType::kU8,
                              j.dst, CommStream::host());
    } else if (j.bytes > 0) {
      std::memcpy(j.dst, j.src, j.bytes);
    }
    lock.lock();
    --busy_;
    if (!st.ok() && error_.ok()) error_ = st.with_context("weight streaming all-gather");
    int64_t& r = ready_done_[static_cast<size_t>(j.slot)];
    r = std::max(r, j.ready_seq);
    if (j.staging >= 0) {
      int64_t& st = staging_done_[static_cast<size_t>(j.staging)];
      st = std::max(st, j.staging_seq);
    }
    cv_.notify_all();
  }
  // Waits for `done`, running queued copies itself meanwhile: the copy thread may not get a core
  // while OpenMP's workers spin (the copies then run here, in order, as a stream would).
  template <class Pred>
  void wait(std::unique_lock<std::mutex>& lock, Pred done) {
    while (!done()) {
      if (!queue_.empty() && busy_ == 0) {
        run_one(lock);
      } else {
        cv_.wait(lock);
      }
    }
  }
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      // One job at a time, in order, as a stream runs them (a gather is a collective: its
      // peers must see this rank's gathers in issue order).
      cv_.wait(lock, [&] { return stop_ || (!queue_.empty() && busy_ == 0); });
      if (queue_.empty()) return;  // stopping, nothing left
      run_one(lock);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  int busy_ = 0;  // copies running
  bool stop_ = false;
  Status error_;  // a gather that failed (a peer aborted): every later wait returns it
  std::vector<int64_t> ready_rec_, ready_done_, staging_rec_, staging_done_;
  std::thread thread_;
};

// KV offload's two copy streams on the CPU: a thread per direction runs its queue in order; a
// queued wait holds its stream until the event it snapshotted is done. Events are (stream, count
// of that stream's operations): done once the stream has finished that many.
class CpuKvCopier final : public KvCopier {
 public:
  explicit CpuKvCopier(int events) : events_(static_cast<size_t>(events)) {
    for (int s = 0; s < 2; ++s) threads_[s] = std::thread([this, s] { loop(s); });
  }
  ~CpuKvCopier() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  Status copy(KvStream dir, std::span<const Copy> copies) override {
    if (dir == KvStream::kCompute) {
      return Status(StatusCode::kInvalidArgument, "KvCopier::copy: not a copy stream");
    }
    std::lock_guard<std::mutex> lock(mu_);
    Op op;
    op.copies.assign(copies.begin(), copies.end());
    push(index(dir), std::move(op));
    return ok_status();
  }
  Status record(KvStream s, int event) override {
    std::lock_guard<std::mutex> lock(mu_);
    // The compute is synchronous: what was issued on it is done.
    events_.at(static_cast<size_t>(event)) =
        s == KvStream::kCompute ? Event{-1, 0} : Event{index(s), issued_[index(s)]};
    return ok_status();
  }
  Status wait(KvStream s, int event) override {
    std::unique_lock<std::mutex> lock(mu_);
    const Event ev = events_.at(static_cast<size_t>(event));
    if (s == KvStream::kCompute) {
      cv_.wait(lock, [&] { return is_done(ev); });
      return ok_status();
    }
    Op op;
    op.wait = ev;
    push(index(s), std::move(op));
    return ok_status();
  }
  Status synchronize() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_[0] == issued_[0] && done_[1] == issued_[1]; });
    return ok_status();
  }

 private:
  struct Event {
    int stream = -1;  // -1: always done
    int64_t count = 0;
  };
  struct Op {
    std::vector<Copy> copies;
    Event wait;  // stream -1: no wait
  };
  static int index(KvStream s) { return s == KvStream::kToHost ? 0 : 1; }
  bool is_done(const Event& ev) const { return ev.stream < 0 || done_[ev.stream] >= ev.count; }
  void push(int s, Op op) {
    queue_[s].push_back(std::move(op));
    ++issued_[s];
    cv_.notify_all();
  }
  void loop(int s) {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_[s].empty(); });
      if (queue_[s].empty()) return;  // stopping, nothing left
      Op op = std::move(queue_[s].front());
      queue_[s].pop_front();
      cv_.wait(lock, [&] { return is_done(op.wait); });
      lock.unlock();
      for (const Copy& c : op.copies) std::memcpy(c.dst, c.src, c.bytes);
      lock.lock();
      ++done_[s];
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_[2];
  int64_t issued_[2] = {0, 0}, done_[2] = {0, 0};
  std::vector<Event> events_;
  bool stop_ = false;
  std::thread threads_[2];
};

// The host clock around each named section (CPU ops run synchronously, so a section's time is
// its ops' wall time, OpenMP fork and join included); a table at exit, decode steps and other
// passes apart, as the CUDA runtime's event profile prints it.
class ClockProfiler final : public ops::Profiler {
 public:
  ~ClockProfiler() override {
    const std::string title = "CPU profile (host clock per section, " +
                              std::to_string(omp_get_max_threads()) + " OpenMP threads)";
    print_profile_table(title.c_str(), order_, totals_);
  }
  void set_prefix(const char* prefix) { prefix_ = prefix; }
  void section(const char* name) override {
    const auto now = std::chrono::steady_clock::now();
    if (!running_.empty()) {
      auto [it, fresh] = totals_.try_emplace(running_, 0, 0.0);
      if (fresh) order_.push_back(running_);
      it->second.first++;
      it->second.second += std::chrono::duration<double, std::milli>(now - begin_).count();
    }
    running_.clear();
    if (name == nullptr) return;
    running_ = std::string(prefix_) + name;
    begin_ = now;
  }

 private:
  const char* prefix_ = "";
  std::string running_;  // empty: no section running
  std::chrono::steady_clock::time_point begin_;
  std::map<std::string, std::pair<int64_t, double>> totals_;  // calls, total ms
  std::vector<std::string> order_;                            // first seen first
};

class CpuRuntime final : public DeviceRuntime {
 public:
  explicit CpuRuntime(bool profile) {
    ctx_.device = Device::cpu();
    if (profile) {
      profiler_ = std::make_unique<ClockProfiler>();
      ctx_.profiler = profiler_.get();
    }
  }
  Device device() const override { return Device::cpu(); }
  std::string name() const override {
    return "CPU (" + std::to_string(std::thread::hardware_concurrency()) + " threads)";
  }
  ops::Context& ctx() override { return ctx_; }
  Allocator& allocator() override { return alloc_; }
  Result<Buffer> allocate_staging(size_t bytes) override { return allocate_host(bytes); }
  Result<DeviceMemoryInfo> memory_info() const override { return DeviceMemoryInfo{}; }
  Status make_current() override { return ok_status(); }
  Result<std::unique_ptr<WeightCopier>> make_weight_copier(int slots, int staging) override {
    return std::unique_ptr<WeightCopier>(new CpuCopier(slots, staging));
  }
  Result<std::unique_ptr<KvCopier>> make_kv_copier(int events) override {
    return std::unique_ptr<KvCopier>(new CpuKvCopier(events));
  }
  size_t attention_workspace_bytes(int64_t, int64_t, int64_t, int64_t) const override { return 0; }
  Status run(bool, std::pair<int64_t, int64_t>, const std::function<Status()>& body) override {
    return body();
  }
  bool supports_graphs() const override { return false; }
  Result<double> time_ms(const std::function<Status()>& fn, int warmup, int iters) override {
    for (int i = 0; i < warmup; ++i) STRATA_RETURN_IF_ERROR(fn());
    std::vector<double> ms;
    for (int i = 0; i < iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      STRATA_RETURN_IF_ERROR(fn());
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    if (ms.empty()) return 0.0;
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }
  int64_t graph_captures() const override { return 0; }
  int64_t graph_replays() const override { return 0; }
  void begin_step(bool decode) override {
    if (profiler_) profiler_->set_prefix(decode ? "decode/" : "prefill/");
  }

 private:
  std::unique_ptr<ClockProfiler> profiler_;  // declared before ctx_, which points at it
  ops::Context ctx_;
  HostAllocator alloc_;
};

}  // namespace

void print_profile_table(const char* title, const std::vector<std::string>& order,
                         const std::map<std::string, std::pair<int64_t, double>>& totals) {
  if (totals.empty()) return;
  double total = 0;
  for (const auto& [k, v] : totals) total += v.second;
  std::fprintf(stderr, "strata: %s\n", title);
  std::fprintf(stderr, "  %-22s %8s %12s %10s %7s\n", "section", "calls", "total ms", "us/call",
               "share");
  for (const std::string& k : order) {
    const auto it = totals.find(k);
    if (it == totals.end()) continue;
    const auto& v = it->second;
    std::fprintf(stderr, "  %-22s %8lld %12.3f %10.1f %6.1f%%\n", k.c_str(),
                 static_cast<long long>(v.first), v.second,
                 1e3 * v.second / static_cast<double>(std::max<int64_t>(1, v.first)),
                 100.0 * v.second / total);
  }
}

Result<std::unique_ptr<DeviceRuntime>> DeviceRuntime::create(Device device, bool profile) {
  if (device.is_cpu()) return std::unique_ptr<DeviceRuntime>(new CpuRuntime(profile));
  return make_cuda_runtime(device.index, profile);
}

#if !STRATA_HAS_CUDA
Result<std::unique_ptr<DeviceRuntime>> make_cuda_runtime(int, bool) {
  return Status(StatusCode::kUnimplemented,
                "this strata was built without CUDA (configure with -DSTRATA_CUDA=ON on a machine "
                "with the CUDA toolkit)");
}
int cuda_device_count() {
  return 0;
}
bool cuda_lazy_module_loading() {
  return false;
}
#endif

}  // namespace strata
