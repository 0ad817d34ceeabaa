// The protocol pieces shared by the one-shot collective kernels (oneshot.cu,
// oneshot_reduce_scatter.cu): block size, the flag arrive / wait of one block, the epoch
// publication, and the f32 widening / narrowing of the summed element types. Device code only;
// included inside an anonymous namespace of strata::cuda.
#pragma once

constexpr int kThreads = 256;
constexpr int64_t kSpinLimit = int64_t{20} * 1000 * 1000 * 1000;  // clock cycles (~10 s)

__device__ __forceinline__ uint32_t load_volatile(const uint32_t* p) {
  return *reinterpret_cast<const volatile uint32_t*>(p);
}

// Steps 2 and 3 of the protocol for block b (after the block staged its chunk and synchronized):
// raise my flag for b at every peer (unless !signal: another block raises it), wait for every
// peer's flag for b, then order the reads.
__device__ __forceinline__ void arrive_and_wait(const OneShotParams& p, int b, uint32_t epoch,
                                                bool signal = true) {
  if (signal && threadIdx.x == 0) {
    __threadfence_system();
    for (int q = 0; q < p.n_ranks; ++q) {
      *reinterpret_cast<volatile uint32_t*>(p.flags[q] + p.rank * kOneShotMaxBlocks + b) = epoch;
    }
  }
  if (threadIdx.x < p.n_ranks) {
    const uint32_t* f = p.flags[p.rank] + threadIdx.x * kOneShotMaxBlocks + b;
    const int64_t t0 = clock64();
    while (static_cast<int32_t>(load_volatile(f) - epoch) < 0) {
      if (clock64() - t0 > kSpinLimit) {
        atomicExch(p.error, 1u);
        break;
      }
      __nanosleep(64);
    }
  }
  __syncthreads();
  __threadfence();
}

// Step 5: the last of the nb blocks to finish publishes the epoch.
__device__ __forceinline__ void publish_epoch(const OneShotParams& p, int nb, uint32_t epoch) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(p.done, 1u) == static_cast<uint32_t>(nb - 1)) {
      *p.done = 0;
      *p.epoch = epoch;
    }
  }
}

template <class T>
__device__ __forceinline__ float widen(T v);
template <>
__device__ __forceinline__ float widen<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float widen<uint16_t>(uint16_t v) {
  return bf16_value(v);
}

template <class T>
__device__ __forceinline__ T narrow(float v);
template <>
__device__ __forceinline__ float narrow<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ uint16_t narrow<uint16_t>(float v) {
  return bf16_bits(v);
}
