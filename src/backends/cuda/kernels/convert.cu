// Contiguous f32 <-> bf16 conversion and the deterministic bf16 fill of dummy weights.
//   f32_to_bf16: dst[i] = bf16(src[i]), round to nearest even (as strata::f32_to_bf16 on the
//                host, bit for bit, except that a NaN's payload is not kept).
//   bf16_to_f32: dst[i] = f32(src[i]), exact.
//   fill_random_bf16: dst[i] = bf16(random_uniform(seed, i, scale)) (backends/cuda/random_hash.h),
//                a pure function of (seed, i), so the host recomputes any element exactly.
//
// Grid-stride loops over a grid sized from the SM count (enough blocks to fill the GPU, no more),
// so one kernel handles any n up to 2^63. Variants (template parameter kVec): groups of 4
// elements (16-byte f32 and 8-byte bf16 accesses) when both pointers allow it, then the
// n % 4 tail one by one; the scalar variant takes any alignment.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "backends/cuda/bf16.cuh"
#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/random_hash.h"

namespace strata::cuda {
namespace {

constexpr int kVecWidth = 4;
constexpr int kThreads = 256;

// Blocks for `items` work items of one thread each, capped at a few waves of the GPU (the loops
// are grid-strided).
unsigned grid_for(const LaunchCtx& ctx, int64_t items) {
  const int64_t cap = int64_t{ctx.sm_count > 0 ? ctx.sm_count : 132} * 16;
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div<int64_t>(items, kThreads), 1, cap));
}

__device__ __forceinline__ int64_t thread_index() {
  return int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ int64_t grid_threads() {
  return int64_t{gridDim.x} * blockDim.x;
}

template <bool kVec>
__global__ void f32_to_bf16_kernel(const float* src, uint16_t* dst, int64_t n) {
  const int64_t vec_end = kVec ? n / kVecWidth * kVecWidth : 0;
  for (int64_t i = thread_index() * kVecWidth; i < vec_end; i += grid_threads() * kVecWidth) {
    store_bf16<kVecWidth>(dst + i, load_packed<float, kVecWidth>(src + i).v);
  }
  for (int64_t i = vec_end + thread_index(); i < n; i += grid_threads()) {
    dst[i] = bf16_bits(src[i]);
  }
}

template <bool kVec>
__global__ void bf16_to_f32_kernel(const uint16_t* src, float* dst, int64_t n) {
  const int64_t vec_end = kVec ? n / kVecWidth * kVecWidth : 0;
  for (int64_t i = thread_index() * kVecWidth; i < vec_end; i += grid_threads() * kVecWidth) {
    const Packed<uint16_t, kVecWidth> in = load_packed<uint16_t, kVecWidth>(src + i);
    Packed<float, kVecWidth> out;
#pragma unroll
    for (int k = 0; k < kVecWidth; ++k) out.v[k] = bf16_value(in.v[k]);
    store_packed(dst + i, out);
  }
  for (int64_t i = vec_end + thread_index(); i < n; i += grid_threads()) {
    dst[i] = bf16_value(src[i]);
  }
}

// The hash (two splitmix64 rounds, 64-bit multiplies) dominates; the stores are plain 2-byte
// coalesced writes.
__global__ void fill_random_bf16_kernel(uint16_t* dst, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = thread_index(); i < n; i += grid_threads()) {
    dst[i] = bf16_bits(random_uniform(seed, static_cast<uint64_t>(i), scale));
  }
}

Status check_array(const char* op, const void* src, const void* dst, int64_t n) {
  if (n < 0) return invalid_argument(op, "n " + std::to_string(n) + " is negative");
  if (n > 0 && (src == nullptr || dst == nullptr)) return invalid_argument(op, "null src or dst");
  return ok_status();
}

}  // namespace

Status f32_to_bf16(const LaunchCtx& ctx, const float* src, uint16_t* dst, int64_t n) {
  STRATA_RETURN_IF_ERROR(check_array("f32_to_bf16", src, dst, n));
  if (n == 0) return ok_status();
  if (is_aligned(src, 16) && is_aligned(dst, 8)) {
    f32_to_bf16_kernel<true>
        <<<grid_for(ctx, ceil_div<int64_t>(n, kVecWidth)), kThreads, 0, ctx.stream>>>(src, dst, n);
  } else {
    f32_to_bf16_kernel<false><<<grid_for(ctx, n), kThreads, 0, ctx.stream>>>(src, dst, n);
  }
  return kernel_launch_status("f32_to_bf16_kernel");
}

Status bf16_to_f32(const LaunchCtx& ctx, const uint16_t* src, float* dst, int64_t n) {
  STRATA_RETURN_IF_ERROR(check_array("bf16_to_f32", src, dst, n));
  if (n == 0) return ok_status();
  if (is_aligned(src, 8) && is_aligned(dst, 16)) {
    bf16_to_f32_kernel<true>
        <<<grid_for(ctx, ceil_div<int64_t>(n, kVecWidth)), kThreads, 0, ctx.stream>>>(src, dst, n);
  } else {
    bf16_to_f32_kernel<false><<<grid_for(ctx, n), kThreads, 0, ctx.stream>>>(src, dst, n);
  }
  return kernel_launch_status("bf16_to_f32_kernel");
}

Status fill_random_bf16(const LaunchCtx& ctx, uint16_t* dst, int64_t n, uint64_t seed,
                        float scale) {
  if (n < 0) return invalid_argument("fill_random_bf16", "n " + std::to_string(n) + " is negative");
  if (n > 0 && dst == nullptr) return invalid_argument("fill_random_bf16", "null dst");
  if (!std::isfinite(scale)) {
    return invalid_argument("fill_random_bf16", "scale " + std::to_string(scale) + " not finite");
  }
  if (n == 0) return ok_status();
  fill_random_bf16_kernel<<<grid_for(ctx, n), kThreads, 0, ctx.stream>>>(dst, n, seed, scale);
  return kernel_launch_status("fill_random_bf16_kernel");
}

}  // namespace strata::cuda
