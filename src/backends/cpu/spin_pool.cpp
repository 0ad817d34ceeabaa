// The decode kernels' spinning thread pool (spin_pool.h).
#include "backends/cpu/spin_pool.h"

#include <omp.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/env.h"

namespace strata::cpu {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

// How long a worker spins for the next job before it sleeps: longer than the gaps between a
// decode step's loops and between steps, short enough not to hold the cores long after.
constexpr auto kSpin = std::chrono::microseconds(500);

class Pool {
 public:
  explicit Pool(int workers) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this, i] { loop(i + 1); });
  }
  ~Pool() {
    stop_.store(true, std::memory_order_release);
    state_.fetch_add(kGenOne, std::memory_order_release);
    state_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  int size() const { return static_cast<int>(threads_.size()) + 1; }

  bool run(int nt, const std::function<void(int, int)>& fn) {
    if (busy_.exchange(true, std::memory_order_acquire)) return false;
    nt = std::min(nt, size());
    job_ = &fn;
    done_.store(0, std::memory_order_relaxed);
    arrived_.store(0, std::memory_order_relaxed);
    bar_nt_ = nt;
    // The generation and the job's thread count in one word: a worker reads both at once.
    const uint64_t gen = (state_.load(std::memory_order_relaxed) & ~kNtMask) + kGenOne;
    state_.store(gen | static_cast<uint64_t>(nt), std::memory_order_release);
    if (sleepers_.load(std::memory_order_acquire) > 0) state_.notify_all();
    fn(0, nt);
    while (done_.load(std::memory_order_acquire) < nt - 1) cpu_relax();
    busy_.store(false, std::memory_order_release);
    return true;
  }

  void barrier() {
    const int gen = bar_gen_.load(std::memory_order_relaxed);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) == bar_nt_ - 1) {
      arrived_.store(0, std::memory_order_relaxed);
      bar_gen_.fetch_add(1, std::memory_order_release);
      return;
    }
    while (bar_gen_.load(std::memory_order_acquire) == gen) cpu_relax();
  }

 private:
  static constexpr uint64_t kNtMask = 0xFFFF;
  static constexpr uint64_t kGenOne = uint64_t{1} << 16;

  void loop(int tid) {
    // The generation the pool was made with (a job posted before this thread got here must
    // still be seen as new).
    uint64_t seen = 0;
    for (;;) {
      uint64_t s = state_.load(std::memory_order_acquire);
      const auto t0 = std::chrono::steady_clock::now();
      int spins = 0;
      while ((s & ~kNtMask) == seen) {
        cpu_relax();
        if (++spins % 1024 == 0 && std::chrono::steady_clock::now() - t0 > kSpin) {
          sleepers_.fetch_add(1, std::memory_order_acq_rel);
          state_.wait(s, std::memory_order_acquire);
          sleepers_.fetch_sub(1, std::memory_order_acq_rel);
        }
        s = state_.load(std::memory_order_acquire);
      }
      seen = s & ~kNtMask;
      if (stop_.load(std::memory_order_acquire)) return;
      const int nt = static_cast<int>(s & kNtMask);
      if (tid < nt) {
        (*job_)(tid, nt);
        done_.fetch_add(1, std::memory_order_release);
      }
    }
  }

  std::vector<std::thread> threads_;
  const std::function<void(int, int)>* job_ = nullptr;
  int bar_nt_ = 0;
  alignas(64) std::atomic<uint64_t> state_{0};
  alignas(64) std::atomic<int> done_{0};
  alignas(64) std::atomic<int> arrived_{0};
  alignas(64) std::atomic<int> bar_gen_{0};
  alignas(64) std::atomic<int> sleepers_{0};
  std::atomic<bool> busy_{false};
  std::atomic<bool> stop_{false};
};

Pool* pool() {
  static const std::unique_ptr<Pool> p = [] {
    const int n = omp_get_max_threads();
    return !env_config().cpu_spin_pool || n < 2 ? nullptr : std::make_unique<Pool>(n - 1);
  }();
  return p.get();
}

thread_local Pool* t_current = nullptr;  // the pool whose job this thread runs

}  // namespace

bool spin_run(int nt, const std::function<void(int, int)>& fn) {
  Pool* p = pool();
  if (p == nullptr || nt < 2 || omp_in_parallel()) return false;
  const auto job = [&](int tid, int n) {
    t_current = p;
    fn(tid, n);
    t_current = nullptr;
  };
  return p->run(nt, job);
}

void spin_barrier() {
  if (t_current != nullptr) t_current->barrier();
}

int spin_threads() {
  Pool* p = pool();
  return p == nullptr ? 1 : std::min(p->size(), omp_get_max_threads());
}

void parallel_for_static(int64_t n, const std::function<void(int64_t)>& fn) {
  parallel_ranges(n, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) fn(i);
  });
}

void parallel_ranges(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const auto range = [&](int tid, int t) {
    const int64_t b = n * tid / t, e = n * (tid + 1) / t;
    if (b < e) fn(b, e);
  };
  if (spin_run(static_cast<int>(std::min<int64_t>(spin_threads(), n)), range)) return;
  const int nt = static_cast<int>(std::min<int64_t>(omp_get_max_threads(), n));
#pragma omp parallel num_threads(nt)
  range(omp_get_thread_num(), omp_get_num_threads());
}

void parallel_for_dynamic(int64_t n, const std::function<void(int64_t)>& fn) {
  const int nt = static_cast<int>(std::min<int64_t>(spin_threads(), n));
  std::atomic<int64_t> next{0};
  const bool ran = spin_run(nt, [&](int, int) {
    for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < n;
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      fn(i);
    }
  });
  if (ran) return;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) fn(i);
}

}  // namespace strata::cpu
