// The one-shot reduce-scatter (cuda_kernels.h, oneshot_reduce_scatter): the all-to-all's
// staging (every rank stages its whole input, n_ranks blocks of count elements) with the
// all-reduce's arithmetic on the blocks addressed to this rank: out[i] = the sum over ranks q in
// order 0..n-1 of rank q's in[rank count + i], in f32, rounded once. CPU twin: the in-process
// communicator's host reduce_scatter (reduce_sum_host over the same blocks), so the result is
// bit-identical to it. Same epochs, flags and staging halves as the other one-shot kernels
// (oneshot.cu): block b stages its part of every destination block and, after the flags, reads
// the same part of block `rank` from every peer.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "backends/cuda/bf16.cuh"
#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"

namespace strata::cuda {
namespace {

#include "backends/cuda/kernels/oneshot_common.cuh"

template <class T, bool kVec>
__global__ void __launch_bounds__(kThreads) oneshot_reduce_scatter_kernel(const OneShotParams p) {
  constexpr int64_t kV = kVec ? 16 / static_cast<int64_t>(sizeof(T)) : 1;  // elements per load
  using Load = std::conditional_t<kVec, uint4, T>;
  const int b = static_cast<int>(blockIdx.x);
  const int nb = static_cast<int>(gridDim.x);
  const uint32_t epoch = *p.epoch + 1;
  const int64_t off = static_cast<int64_t>(epoch & 1u) * (p.staging_bytes / 2);
  const int64_t n = p.count / kV;  // loads per destination block
  const int64_t per = (n + nb - 1) / nb;
  const int64_t i0 = std::min<int64_t>(per * b, n);
  const int64_t i1 = std::min<int64_t>(i0 + per, n);
  Load* mine = reinterpret_cast<Load*>(static_cast<char*>(p.staging[p.rank]) + off);
  const Load* in = static_cast<const Load*>(p.in);
  for (int q = 0; q < p.n_ranks; ++q) {
    for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) mine[q * n + i] = in[q * n + i];
  }
  __syncthreads();
  arrive_and_wait(p, b, epoch);
  Load* out = static_cast<Load*>(p.out);
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
    float s[kV];
    for (int q = 0; q < p.n_ranks; ++q) {
      const Load* src =
          reinterpret_cast<const Load*>(static_cast<const char*>(p.staging[q]) + off) + p.rank * n;
      const Load v = __ldcg(src + i);
      const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int64_t k = 0; k < kV; ++k) {
        const float x = widen<T>(e[k]);
        s[k] = q == 0 ? x : __fadd_rn(s[k], x);  // rank order, no contraction: as reduce_sum_host
      }
    }
    Load r;
    T* e = reinterpret_cast<T*>(&r);
#pragma unroll
    for (int64_t k = 0; k < kV; ++k) e[k] = narrow<T>(s[k]);
    out[i] = r;
  }
  publish_epoch(p, nb, epoch);
}

template <class T>
void launch(const LaunchCtx& ctx, const OneShotParams& p, bool vec, dim3 grid) {
  if (vec) {
    oneshot_reduce_scatter_kernel<T, true><<<grid, kThreads, 0, ctx.stream>>>(p);
  } else {
    oneshot_reduce_scatter_kernel<T, false><<<grid, kThreads, 0, ctx.stream>>>(p);
  }
}

}  // namespace

Status oneshot_reduce_scatter_preload() {
  cudaFuncAttributes a{};
  STRATA_CUDA_RETURN_IF_ERROR(
      cudaFuncGetAttributes(&a, oneshot_reduce_scatter_kernel<float, false>));
  STRATA_CUDA_RETURN_IF_ERROR(
      cudaFuncGetAttributes(&a, oneshot_reduce_scatter_kernel<float, true>));
  STRATA_CUDA_RETURN_IF_ERROR(
      cudaFuncGetAttributes(&a, oneshot_reduce_scatter_kernel<uint16_t, false>));
  STRATA_CUDA_RETURN_IF_ERROR(
      cudaFuncGetAttributes(&a, oneshot_reduce_scatter_kernel<uint16_t, true>));
  return ok_status();
}

Status oneshot_reduce_scatter(const LaunchCtx& ctx, const OneShotParams& p) {
  constexpr const char* kOp = "oneshot_reduce_scatter";
  if (p.n_ranks < 1 || p.n_ranks > kOneShotMaxRanks || p.rank < 0 || p.rank >= p.n_ranks ||
      p.count < 0 || p.staging == nullptr || p.flags == nullptr || p.epoch == nullptr ||
      p.done == nullptr || p.error == nullptr) {
    return invalid_argument(kOp, "bad rank, count or registration");
  }
  if (p.dtype != DType::kF32 && p.dtype != DType::kBF16) {
    return invalid_argument(kOp, "dtype must be f32 or bf16");
  }
  const int64_t bytes = dtype_bytes(p.dtype, p.count), total = bytes * p.n_ranks;
  if (total > p.staging_bytes / 2) {
    return invalid_argument(
        kOp, "message of " + std::to_string(total) + " bytes exceeds half the staging buffer");
  }
  if (p.count == 0) return ok_status();
  if (p.in == nullptr || p.out == nullptr) return invalid_argument(kOp, "null in or out");
  auto aligned = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15u) == 0; };
  const bool vec =
      bytes % 16 == 0 && aligned(p.in) && aligned(p.out) && (p.staging_bytes / 2) % 16 == 0;
  const dim3 grid(static_cast<unsigned>(oneshot_blocks(total)));
  if (p.dtype == DType::kF32) {
    launch<float>(ctx, p, vec, grid);
  } else {
    launch<uint16_t>(ctx, p, vec, grid);
  }
  return kernel_launch_status("oneshot_reduce_scatter_kernel");
}

}  // namespace strata::cuda
