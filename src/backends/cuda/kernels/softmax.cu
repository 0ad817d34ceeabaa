// Row-wise softmax in place (x[r, :] = exp(x - max) / sum) and argmax (out[r] = index of the
// largest x[r, :], the first on ties; NaN never wins; a row with no value above -inf gives 0).
// CPU twin: src/backends/cpu/softmax.cpp (same SoftmaxParams / ArgmaxParams).
//
// Layout: x is f32 [rows, cols] with row stride `stride` (elements, >= cols); argmax's out is
// int32 [rows].
//
// One block per row. softmax makes three passes like the CPU twin (max; exp written back and
// summed; scale by 1/sum), the later passes reading from L1/L2. The sum is f32 per thread plus a
// block reduction (the CPU twin sums in double): with every term in (0, 1] the relative error
// stays near 1e-6 even for 150k-entry vocabulary rows.
//
// Variants (template parameters):
//   kVec - 16-byte accesses when cols and stride are multiples of 4 and x is 16-byte aligned;
//          the scalar variant handles any width (vocabularies like 32001, 151936 + padding).
#include <algorithm>
#include <cstdint>
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"

namespace strata::cuda {
namespace {

constexpr int kVecWidth = 4;
constexpr int kMaxThreads = 1024;

template <bool kVec>
__global__ void __launch_bounds__(kMaxThreads) softmax_kernel(const SoftmaxParams p) {
  constexpr int kW = kVec ? kVecWidth : 1;
  float* x = p.x + int64_t{blockIdx.x} * p.stride;  // [cols]
  const int cols = static_cast<int>(p.cols);
  const int step = static_cast<int>(blockDim.x) * kW;
  const int start = static_cast<int>(threadIdx.x) * kW;

  float m = -INFINITY;
  for (int i = start; i < cols; i += step) {
    const Packed<float, kW> v = load_packed<float, kW>(x + i);
#pragma unroll
    for (int k = 0; k < kW; ++k) m = v.v[k] > m ? v.v[k] : m;  // NaN never becomes the max
  }
  m = block_reduce_max(m);

  float sum = 0.0f;
  for (int i = start; i < cols; i += step) {
    Packed<float, kW> v = load_packed<float, kW>(x + i);
#pragma unroll
    for (int k = 0; k < kW; ++k) {
      v.v[k] = expf(v.v[k] - m);
      sum += v.v[k];
    }
    store_packed(x + i, v);
  }
  const float inv = 1.0f / block_reduce_sum(sum);

  for (int i = start; i < cols; i += step) {
    Packed<float, kW> v = load_packed<float, kW>(x + i);
#pragma unroll
    for (int k = 0; k < kW; ++k) v.v[k] *= inv;
    store_packed(x + i, v);
  }
}

// (value, index) pairs: b replaces a when larger, or equal with a smaller index. Indices start at
// INT32_MAX ("none") with value -inf, so any value above -inf wins and NaN (all comparisons
// false) never does.
__device__ __forceinline__ void argmax_merge(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

__global__ void __launch_bounds__(kMaxThreads) argmax_kernel(const ArgmaxParams p) {
  __shared__ float warp_v[kWarpSize];
  __shared__ int warp_i[kWarpSize];
  const float* x = p.x + int64_t{blockIdx.x} * p.stride;  // [cols]
  const int cols = static_cast<int>(p.cols);
  float best_v = -INFINITY;
  int best_i = INT32_MAX;
  for (int i = static_cast<int>(threadIdx.x); i < cols; i += static_cast<int>(blockDim.x)) {
    const float v = x[i];
    if (v > best_v) {  // strictly larger: a thread's own scan keeps the first index on ties
      best_v = v;
      best_i = i;
    }
  }
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const float ov = __shfl_xor_sync(0xffffffffu, best_v, offset);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, offset);
    argmax_merge(best_v, best_i, ov, oi);
  }
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  if (lane == 0) {
    warp_v[warp] = best_v;
    warp_i[warp] = best_i;
  }
  __syncthreads();
  if (warp == 0) {
    const int n_warps = static_cast<int>(blockDim.x) / kWarpSize;
    best_v = lane < n_warps ? warp_v[lane] : -INFINITY;
    best_i = lane < n_warps ? warp_i[lane] : INT32_MAX;
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      const float ov = __shfl_xor_sync(0xffffffffu, best_v, offset);
      const int oi = __shfl_xor_sync(0xffffffffu, best_i, offset);
      argmax_merge(best_v, best_i, ov, oi);
    }
    if (lane == 0) p.out[blockIdx.x] = best_i == INT32_MAX ? 0 : best_i;
  }
}

int row_threads(int64_t cols, int per_thread) {
  return static_cast<int>(std::min<int64_t>(
      kMaxThreads, round_up<int64_t>(ceil_div<int64_t>(cols, per_thread), kWarpSize)));
}

}  // namespace

Status softmax(const LaunchCtx& ctx, const SoftmaxParams& p) {
  STRATA_RETURN_IF_ERROR(check_matrix("softmax", "x", p.x, p.rows, p.cols, p.stride));
  if (p.rows == 0) return ok_status();
  const bool vec = p.cols % kVecWidth == 0 && p.stride % kVecWidth == 0 && is_aligned(p.x, 16);
  const int threads = row_threads(p.cols, vec ? kVecWidth : 1);
  const dim3 grid(static_cast<unsigned>(p.rows));
  if (vec) {
    softmax_kernel<true><<<grid, threads, 0, ctx.stream>>>(p);
  } else {
    softmax_kernel<false><<<grid, threads, 0, ctx.stream>>>(p);
  }
  return kernel_launch_status("softmax_kernel");
}

Status argmax(const LaunchCtx& ctx, const ArgmaxParams& p) {
  STRATA_RETURN_IF_ERROR(check_matrix("argmax", "x", p.x, p.rows, p.cols, p.stride));
  if (p.rows > 0 && p.out == nullptr) return invalid_argument("argmax", "null out");
  if (p.rows == 0) return ok_status();
  argmax_kernel<<<dim3(static_cast<unsigned>(p.rows)), row_threads(p.cols, 4), 0, ctx.stream>>>(p);
  return kernel_launch_status("argmax_kernel");
}

}  // namespace strata::cuda
