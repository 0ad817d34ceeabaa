// What one synchronization of the CPU threads costs on this machine: an empty OpenMP parallel
// region (fork + join), an OpenMP barrier inside one region, and a spinning barrier on one
// atomic counter (the shape of llama.cpp's thread-pool barrier), at the thread counts given.
// The decode step of a small model runs a few of these per layer (docs/performance.md).
//
//   ninja -C build bench_sync && ./build/bench/bench_sync [threads...]   (default: 2 and all)
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// Centralized sense-free barrier: arrivals count up; the last one resets the count and bumps
// the generation the others spin on.
struct alignas(64) SpinBarrier {
  alignas(64) std::atomic<int> count{0};
  alignas(64) std::atomic<int> generation{0};
  void wait(int n) {
    const int gen = generation.load(std::memory_order_relaxed);
    if (count.fetch_add(1, std::memory_order_acq_rel) == n - 1) {
      count.store(0, std::memory_order_relaxed);
      generation.fetch_add(1, std::memory_order_release);
      return;
    }
    while (generation.load(std::memory_order_acquire) == gen) _mm_pause();
  }
};

double us_per(Clock::time_point t0, int iters) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
}

// Best of 5 runs of `iters` repetitions, us per repetition.
template <typename F>
double best_us(int iters, F&& f) {
  double best = 1e30;
  for (int run = 0; run < 5; ++run) best = std::min(best, f(iters));
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> counts;
  for (int i = 1; i < argc; ++i) counts.push_back(std::atoi(argv[i]));
  if (counts.empty()) counts = {2, omp_get_num_procs()};
  constexpr int kIters = 20000;
  std::printf("%8s %16s %16s %16s\n", "threads", "region us", "omp barrier us", "spin barrier us");
  for (const int n : counts) {
    if (n < 1) continue;
    omp_set_num_threads(n);
    const double region = best_us(kIters, [&](int iters) {
      volatile int sink = 0;
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) {
#pragma omp parallel
        {
          if (omp_get_thread_num() == 0) sink = sink + 1;
        }
      }
      return us_per(t0, iters);
    });
    const double omp_barrier = best_us(kIters, [&](int iters) {
      double us = 0;
#pragma omp parallel
      {
#pragma omp barrier
        const auto t0 = Clock::now();
        for (int i = 0; i < iters; ++i) {
#pragma omp barrier
        }
        if (omp_get_thread_num() == 0) us = us_per(t0, iters);
      }
      return us;
    });
    const double spin = best_us(kIters, [&](int iters) {
      SpinBarrier b;
      double us = 0;
#pragma omp parallel
      {
        const int team = omp_get_num_threads();
        b.wait(team);
        const auto t0 = Clock::now();
        for (int i = 0; i < iters; ++i) b.wait(team);
        if (omp_get_thread_num() == 0) us = us_per(t0, iters);
      }
      return us;
    });
    std::printf("%8d %16.2f %16.2f %16.2f\n", n, region, omp_barrier, spin);
  }
  return 0;
}
