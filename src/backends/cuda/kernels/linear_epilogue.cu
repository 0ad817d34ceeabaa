// Helpers of cublaslt_linear's scratch paths (linear.cpp), where cuBLASLt cannot produce the
// final output itself:
//   linear_epilogue          - f32 GEMM result D -> out: * x_scale[t] * w_scale[m] + bias[m]
//                              (+ out), f32 or bf16 (one rounding), for fp8 weights (the per-row
//                              and per-token scales) and for bf16 out with an f32 bias.
//   quantize_activations_fp8 - bf16 x -> fp8 e4m3 with one scale per token, the B operand of the
//                              fp8 GEMM (per token rather than per tensor: one outlier token does
//                              not flatten the others' resolution, at the same cost).
//   quantize_activations_i8  - bf16 x -> int8 with one scale per token (max|x| / 127, round to
//                              nearest even, clamp), the B operand of the int8 x int8 GEMM of
//                              int8 weights above the crossover; the epilogue then reads the
//                              int32 D (linear_epilogue_kernel<true>).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/gpu_linear_internal.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;

// kI32: D is the int32 result of the int8 GEMM (converted to f32 with round-to-nearest).
template <bool kI32>
__global__ void __launch_bounds__(kThreads) linear_epilogue_kernel(const LinearEpilogueArgs a) {
  const int64_t m = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  if (m >= a.m) return;
  const float ws = a.w_scale ? a.w_scale[m] : 1.0f;
  const float b = a.bias ? a.bias[m] : 0.0f;
  for (int64_t t = blockIdx.y; t < a.n_tokens; t += gridDim.y) {
    const int64_t di = t * a.d_stride + m;
    float v = kI32 ? __int2float_rn(a.d_i32[di]) : a.d[di];
    if (a.x_scale) v *= a.x_scale[t];
    // An explicit fma, so that the CPU twin (std::fma) rounds the same way.
    v = __fmaf_rn(v, ws, b);
    const int64_t o = t * a.out_stride + m;
    if (a.out_bf16) {
      static_cast<__nv_bfloat16*>(a.out)[o] = __float2bfloat16_rn(v);
    } else {
      float* out = static_cast<float*>(a.out) + o;
      *out = a.accumulate ? *out + v : v;
    }
  }
}

// max |x[0, k)| over the block (every thread gets it): the per-token scale of the quantizers.
__device__ float row_absmax(const __nv_bfloat16* xr, int64_t k) {
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < k; i += kThreads) {
    amax = fmaxf(amax, fabsf(__bfloat162float(xr[i])));
  }
  return block_reduce_max(amax);
}

__global__ void __launch_bounds__(kThreads)
    quantize_activations_kernel(const __nv_bfloat16* x, int64_t x_stride, int64_t k, uint8_t* q,
                                int64_t q_stride, float* x_scale) {
  const int64_t t = blockIdx.x;
  const __nv_bfloat16* xr = x + t * x_stride;
  const float amax = row_absmax(xr, k);
  const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
  if (threadIdx.x == 0) x_scale[t] = s;
  for (int64_t i = threadIdx.x; i < k; i += kThreads) {
    q[t * q_stride + i] =
        __nv_cvt_float_to_fp8(__bfloat162float(xr[i]) / s, __NV_SATFINITE, __NV_E4M3);
  }
}

// One block per token, as quantize_activations_kernel.
__global__ void __launch_bounds__(kThreads)
    quantize_activations_i8_kernel(const __nv_bfloat16* x, int64_t x_stride, int64_t k, int8_t* q,
                                   int64_t q_stride, float* x_scale) {
  const int64_t t = blockIdx.x;
  const __nv_bfloat16* xr = x + t * x_stride;
  const float amax = row_absmax(xr, k);
  const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
  if (threadIdx.x == 0) x_scale[t] = s;
  for (int64_t i = threadIdx.x; i < k; i += kThreads) {
    // IEEE division (no fast math), round to nearest even, clamp: as the CPU twin.
    const int v = __float2int_rn(__fdiv_rn(__bfloat162float(xr[i]), s));
    q[t * q_stride + i] = static_cast<int8_t>(v < -127 ? -127 : v > 127 ? 127 : v);
  }
}

}  // namespace

Status linear_epilogue(const LaunchCtx& ctx, const LinearEpilogueArgs& a) {
  if (a.n_tokens == 0) return ok_status();
  const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(a.m, kThreads)),
                  static_cast<unsigned>(a.n_tokens < 65535 ? a.n_tokens : 65535));
  if (a.d_i32 != nullptr) {
    linear_epilogue_kernel<true><<<grid, kThreads, 0, ctx.stream>>>(a);
  } else {
    linear_epilogue_kernel<false><<<grid, kThreads, 0, ctx.stream>>>(a);
  }
  return kernel_launch_status("linear_epilogue_kernel");
}

Status quantize_activations_fp8(const LaunchCtx& ctx, const uint16_t* x, int64_t x_stride,
                                int64_t n_tokens, int64_t k, uint8_t* q, int64_t q_stride,
                                float* x_scale) {
  if (n_tokens == 0) return ok_status();
  quantize_activations_kernel<<<static_cast<unsigned>(n_tokens), kThreads, 0, ctx.stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(x), x_stride, k, q, q_stride, x_scale);
  return kernel_launch_status("quantize_activations_kernel");
}

Status quantize_activations_i8(const LaunchCtx& ctx, const uint16_t* x, int64_t x_stride,
                               int64_t n_tokens, int64_t k, int8_t* q, int64_t q_stride,
                               float* x_scale) {
  if (n_tokens == 0) return ok_status();
  quantize_activations_i8_kernel<<<static_cast<unsigned>(n_tokens), kThreads, 0, ctx.stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(x), x_stride, k, q, q_stride, x_scale);
  return kernel_launch_status("quantize_activations_i8_kernel");
}

}  // namespace strata::cuda
