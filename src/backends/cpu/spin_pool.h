// A spinning thread pool for the CPU kernels of a decode step. A decode token of a small model
// runs a few parallel loops per layer of a few microseconds each; an OpenMP region's fork and
// join cost about as much on the machines measured (bench_sync: libgomp's barrier ~8x a
// spinning one at 2 threads). The pool's workers spin on a generation counter between jobs
// (then sleep, after ~kSpinNs without one), so posting a job is one atomic store and joining
// it one counter.
//
// One job at a time: run() returns false when another thread's job holds the pool (in-process
// tensor-parallel ranks call kernels concurrently); callers then use OpenMP. The pool has
// omp_get_max_threads() - 1 workers, made on first use. Off unless STRATA_CPU_SPIN_POOL=1: its
// workers and OpenMP's both spin after their work, and on a 2-vCPU machine where an OpenMP
// region ran in the decode step that oversubscription cost 3-4x (an A/B switch until measured).
#pragma once

#include <cstdint>
#include <functional>

namespace strata::cpu {

// Runs fn(tid, nt) on nt threads (the caller is tid 0; nt capped at the pool's size + 1) and
// returns when all are done; false (nothing ran) when the pool is off, busy, or nt < 2.
bool spin_run(int nt, const std::function<void(int tid, int nt)>& fn);
// Inside spin_run's fn: waits until all nt threads of the job arrive.
void spin_barrier();
// Threads a spin_run job gets (the OpenMP thread count), 1 when the pool is off.
int spin_threads();

// fn(lo, hi) once per thread with its contiguous range [lo, hi) of [0, n) (empty ranges
// skipped), through spin_run, else an OpenMP region.
void parallel_ranges(int64_t n, const std::function<void(int64_t lo, int64_t hi)>& fn);
// fn(i) for i in [0, n) over parallel_ranges' ranges. For loops whose items are independent
// (results do not depend on the thread).
void parallel_for_static(int64_t n, const std::function<void(int64_t i)>& fn);
// The same with items handed out one at a time (an atomic counter; OpenMP's dynamic, 1).
void parallel_for_dynamic(int64_t n, const std::function<void(int64_t i)>& fn);

}  // namespace strata::cpu
