// Element-wise row ops on f32 matrices: add (out = a + b), add_bias (x[r, :] += bias[:]), scale
// (x *= s) and softcap (x = cap * tanh(x / cap)). CPU twin: src/backends/cpu/elementwise.cpp.
//
// Layout: every matrix is f32 [rows, cols] with its own row stride (elements, >= cols), so column
// slices of a fused projection work in place. add's out may alias a or b (same stride): each
// element is read and written by the same thread. bias is [cols] contiguous, f32/f16/bf16.
//
// Grid: blockIdx.x covers chunks of a row's columns, blockIdx.y walks the rows (see
// elementwise_grid in common.cuh); each thread handles one element or one 16-byte vector.
//
// Variants (template parameters):
//   kVec - 16-byte accesses (4 floats). Used when cols and every stride are multiples of 4 and the
//          pointers are 16-byte aligned; odd widths (769, 5125) and unaligned views take the
//          scalar variant.
//   B    - add_bias's bias element type: checkpoints keep biases in their own dtype.
#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"

namespace strata::cuda {
namespace {

constexpr int kVecWidth = 4;

template <bool kVec>
__global__ void add_kernel(const AddParams p) {
  constexpr int kW = kVec ? kVecWidth : 1;
  const int64_t i = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * kW;
  if (i >= p.cols) return;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const float* a = p.a + r * p.a_stride + i;
    const float* b = p.b + r * p.b_stride + i;
    float* o = p.out + r * p.out_stride + i;
    if constexpr (kVec) {
      const Packed<float, kW> va = load_packed<float, kW>(a);
      const Packed<float, kW> vb = load_packed<float, kW>(b);
      Packed<float, kW> vo;
#pragma unroll
      for (int k = 0; k < kW; ++k) vo.v[k] = va.v[k] + vb.v[k];
      store_packed(o, vo);
    } else {
      *o = *a + *b;
    }
  }
}

template <class B, bool kVec>
__global__ void add_bias_kernel(const AddBiasParams p) {
  constexpr int kW = kVec ? kVecWidth : 1;
  const int64_t i = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * kW;
  if (i >= p.cols) return;
  float bias[kW];
  load_f32<kW>(static_cast<const B*>(p.bias) + i, bias);
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    float* x = p.x + r * p.stride + i;
    Packed<float, kW> v = load_packed<float, kW>(x);
#pragma unroll
    for (int k = 0; k < kW; ++k) v.v[k] += bias[k];
    store_packed(x, v);
  }
}

template <bool kVec>
__global__ void scale_kernel(const ScaleParams p) {
  constexpr int kW = kVec ? kVecWidth : 1;
  const int64_t i = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * kW;
  if (i >= p.cols) return;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    float* x = p.x + r * p.stride + i;
    Packed<float, kW> v = load_packed<float, kW>(x);
#pragma unroll
    for (int k = 0; k < kW; ++k) v.v[k] *= p.s;
    store_packed(x, v);
  }
}

// inv = 1 / cap, computed once on the host in f32 exactly as the CPU twin does.
template <bool kVec>
__global__ void softcap_kernel(const SoftcapParams p, float inv) {
  constexpr int kW = kVec ? kVecWidth : 1;
  const int64_t i = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * kW;
  if (i >= p.cols) return;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    float* x = p.x + r * p.stride + i;
    Packed<float, kW> v = load_packed<float, kW>(x);
#pragma unroll
    for (int k = 0; k < kW; ++k) v.v[k] = p.cap * tanhf(v.v[k] * inv);
    store_packed(x, v);
  }
}

bool vec_ok(int64_t cols, int64_t stride, const void* ptr) {
  return cols % kVecWidth == 0 && stride % kVecWidth == 0 && is_aligned(ptr, 16);
}

}  // namespace

Status add(const LaunchCtx& ctx, const AddParams& p) {
  STRATA_RETURN_IF_ERROR(check_matrix("add", "a", p.a, p.rows, p.cols, p.a_stride));
  STRATA_RETURN_IF_ERROR(check_matrix("add", "b", p.b, p.rows, p.cols, p.b_stride));
  STRATA_RETURN_IF_ERROR(check_matrix("add", "out", p.out, p.rows, p.cols, p.out_stride));
  if ((p.out == p.a && p.out_stride != p.a_stride) ||
      (p.out == p.b && p.out_stride != p.b_stride)) {
    return invalid_argument("add", "out aliases an input with a different stride");
  }
  if (p.rows == 0) return ok_status();
  const bool vec = vec_ok(p.cols, p.a_stride, p.a) && vec_ok(p.cols, p.b_stride, p.b) &&
                   vec_ok(p.cols, p.out_stride, p.out);
  const dim3 grid = elementwise_grid(p.rows, p.cols, vec ? kVecWidth : 1);
  if (vec) {
    add_kernel<true><<<grid, kElementwiseThreads, 0, ctx.stream>>>(p);
  } else {
    add_kernel<false><<<grid, kElementwiseThreads, 0, ctx.stream>>>(p);
  }
  return kernel_launch_status("add_kernel");
}

Status add_bias(const LaunchCtx& ctx, const AddBiasParams& p) {
  STRATA_RETURN_IF_ERROR(check_matrix("add_bias", "x", p.x, p.rows, p.cols, p.stride));
  if (p.rows > 0 && p.bias == nullptr) return invalid_argument("add_bias", "null bias");
  return dispatch_float_dtype(p.bias_dtype, "add_bias bias", [&]<class B>(TypeTag<B>) {
    if (p.rows == 0) return ok_status();
    const bool vec = vec_ok(p.cols, p.stride, p.x) && is_aligned(p.bias, sizeof(B) * kVecWidth);
    const dim3 grid = elementwise_grid(p.rows, p.cols, vec ? kVecWidth : 1);
    if (vec) {
      add_bias_kernel<B, true><<<grid, kElementwiseThreads, 0, ctx.stream>>>(p);
    } else {
      add_bias_kernel<B, false><<<grid, kElementwiseThreads, 0, ctx.stream>>>(p);
    }
    return kernel_launch_status("add_bias_kernel");
  });
}

Status scale(const LaunchCtx& ctx, const ScaleParams& p) {
  STRATA_RETURN_IF_ERROR(check_matrix("scale", "x", p.x, p.rows, p.cols, p.stride));
  if (p.rows == 0) return ok_status();
  const bool vec = vec_ok(p.cols, p.stride, p.x);
  const dim3 grid = elementwise_grid(p.rows, p.cols, vec ? kVecWidth : 1);
  if (vec) {
    scale_kernel<true><<<grid, kElementwiseThreads, 0, ctx.stream>>>(p);
  } else {
    scale_kernel<false><<<grid, kElementwiseThreads, 0, ctx.stream>>>(p);
  }
  return kernel_launch_status("scale_kernel");
}

Status softcap(const LaunchCtx& ctx, const SoftcapParams& p) {
  STRATA_RETURN_IF_ERROR(check_matrix("softcap", "x", p.x, p.rows, p.cols, p.stride));
  if (!(p.cap > 0.0f)) {
    return invalid_argument("softcap", "cap " + std::to_string(p.cap) + " must be > 0");
  }
  if (p.rows == 0) return ok_status();
  const float inv = 1.0f / p.cap;
  const bool vec = vec_ok(p.cols, p.stride, p.x);
  const dim3 grid = elementwise_grid(p.rows, p.cols, vec ? kVecWidth : 1);
  if (vec) {
    softcap_kernel<true><<<grid, kElementwiseThreads, 0, ctx.stream>>>(p, inv);
  } else {
    softcap_kernel<false><<<grid, kElementwiseThreads, 0, ctx.stream>>>(p, inv);
  }
  return kernel_launch_status("softcap_kernel");
}

Status copy_rows(const LaunchCtx& ctx, const CopyRowsParams& p) {
  if (p.rows < 0 || p.row_bytes < 0 || (p.rows > 0 && (p.src == nullptr || p.dst == nullptr)) ||
      (p.rows > 1 && (p.src_stride < p.row_bytes || p.dst_stride < p.row_bytes))) {
    return invalid_argument("copy_rows", "invalid rows, row size, strides or pointers");
  }
  if (p.rows == 0 || p.row_bytes == 0) return ok_status();
  const size_t sp = static_cast<size_t>(p.rows > 1 ? p.src_stride : p.row_bytes);
  const size_t dp = static_cast<size_t>(p.rows > 1 ? p.dst_stride : p.row_bytes);
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(p.dst, dp, p.src, sp,
                                                static_cast<size_t>(p.row_bytes),
                                                static_cast<size_t>(p.rows),
                                                cudaMemcpyDeviceToDevice, ctx.stream));
  return ok_status();
}

}  // namespace strata::cuda
