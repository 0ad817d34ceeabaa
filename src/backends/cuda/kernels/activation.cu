// Activations: act(x) in place (ActParams) and the gated form out = act(gate) * up of
// SwiGLU/GeGLU MLPs (GatedActParams), for silu, gelu (tanh approximation), gelu (erf) and relu.
// CPU twin: src/backends/cpu/activation.cpp (same formulas, same f32 constants).
//
// Layout: f32 matrices [rows, cols] with their own row strides (elements), so gate and up may be
// the two column halves of one fused gate_up projection output. out must not partially overlap
// gate or up; out == up or out == gate with the same stride is fine (same thread reads, then
// writes, each element).
//
// Grid: as the element-wise ops (elementwise_grid in common.cuh): one element or one 16-byte
// vector per thread, blockIdx.y walking the rows.
//
// Variants (template parameters):
//   A    - the activation, resolved at compile time so the inner loop has no switch.
//   kVec - 16-byte accesses (4 floats) when the width and all strides are multiples of 4 and the
//          pointers 16-byte aligned; the scalar variant takes any shape.
// NOTE: expf/tanhf/erff are the accurate (non-fast-math) device functions, within 2 ulp of the
// host's; gelu's 1 + tanh(.) / 1 + erf(.) cancels for large negative inputs, where both backends
// lose relative (not absolute) accuracy.
#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"

namespace strata::cuda {
namespace {

constexpr int kVecWidth = 4;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;

template <Activation A>
__device__ __forceinline__ float apply(float x) {
  if constexpr (A == Activation::kSilu) {
    return x / (1.0f + expf(-x));
  } else if constexpr (A == Activation::kGeluTanh) {
    return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
  } else if constexpr (A == Activation::kGeluErf) {
    return 0.5f * x * (1.0f + erff(x * kInvSqrt2));
  } else {
    return x > 0.0f ? x : 0.0f;
  }
}

template <Activation A, bool kVec>
__global__ void gated_act_kernel(const GatedActParams p) {
  constexpr int kW = kVec ? kVecWidth : 1;
  const int64_t i = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * kW;
  if (i >= p.ffn_dim) return;
  for (int64_t r = blockIdx.y; r < p.n_tokens; r += gridDim.y) {
    const Packed<float, kW> g = load_packed<float, kW>(p.gate + r * p.gate_stride + i);
    const Packed<float, kW> u = load_packed<float, kW>(p.up + r * p.up_stride + i);
    Packed<float, kW> o;
#pragma unroll
    for (int k = 0; k < kW; ++k) o.v[k] = apply<A>(g.v[k]) * u.v[k];
    store_packed(p.out + r * p.out_stride + i, o);
  }
}

template <Activation A, bool kVec>
__global__ void act_kernel(const ActParams p) {
  constexpr int kW = kVec ? kVecWidth : 1;
  const int64_t i = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * kW;
  if (i >= p.cols) return;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    float* x = p.x + r * p.stride + i;
    Packed<float, kW> v = load_packed<float, kW>(x);
#pragma unroll
    for (int k = 0; k < kW; ++k) v.v[k] = apply<A>(v.v[k]);
    store_packed(x, v);
  }
}

bool vec_ok(int64_t cols, int64_t stride, const void* ptr) {
  return cols % kVecWidth == 0 && stride % kVecWidth == 0 && is_aligned(ptr, 16);
}

template <Activation A>
Status launch_gated(const LaunchCtx& ctx, const GatedActParams& p) {
  const bool vec = vec_ok(p.ffn_dim, p.gate_stride, p.gate) &&
                   vec_ok(p.ffn_dim, p.up_stride, p.up) && vec_ok(p.ffn_dim, p.out_stride, p.out);
  const dim3 grid = elementwise_grid(p.n_tokens, p.ffn_dim, vec ? kVecWidth : 1);
  if (vec) {
    gated_act_kernel<A, true><<<grid, kElementwiseThreads, 0, ctx.stream>>>(p);
  } else {
    gated_act_kernel<A, false><<<grid, kElementwiseThreads, 0, ctx.stream>>>(p);
  }
  return kernel_launch_status("gated_act_kernel");
}

template <Activation A>
Status launch_act(const LaunchCtx& ctx, const ActParams& p) {
  const bool vec = vec_ok(p.cols, p.stride, p.x);
  const dim3 grid = elementwise_grid(p.rows, p.cols, vec ? kVecWidth : 1);
  if (vec) {
    act_kernel<A, true><<<grid, kElementwiseThreads, 0, ctx.stream>>>(p);
  } else {
    act_kernel<A, false><<<grid, kElementwiseThreads, 0, ctx.stream>>>(p);
  }
  return kernel_launch_status("act_kernel");
}

Status bad_activation(const char* op, Activation a) {
  return invalid_argument(op, "unknown activation " + std::to_string(static_cast<int>(a)));
}

}  // namespace

Status gated_act(const LaunchCtx& ctx, const GatedActParams& p) {
  STRATA_RETURN_IF_ERROR(
      check_matrix("gated_act", "gate", p.gate, p.n_tokens, p.ffn_dim, p.gate_stride));
  STRATA_RETURN_IF_ERROR(check_matrix("gated_act", "up", p.up, p.n_tokens, p.ffn_dim, p.up_stride));
  STRATA_RETURN_IF_ERROR(
      check_matrix("gated_act", "out", p.out, p.n_tokens, p.ffn_dim, p.out_stride));
  if ((p.out == p.gate && p.out_stride != p.gate_stride) ||
      (p.out == p.up && p.out_stride != p.up_stride)) {
    return invalid_argument("gated_act", "out aliases gate or up with a different stride");
  }
  if (p.n_tokens == 0) return ok_status();
  switch (p.act) {
    case Activation::kSilu:
      return launch_gated<Activation::kSilu>(ctx, p);
    case Activation::kGeluTanh:
      return launch_gated<Activation::kGeluTanh>(ctx, p);
    case Activation::kGeluErf:
      return launch_gated<Activation::kGeluErf>(ctx, p);
    case Activation::kRelu:
      return launch_gated<Activation::kRelu>(ctx, p);
  }
  return bad_activation("gated_act", p.act);
}

Status act(const LaunchCtx& ctx, const ActParams& p) {
  STRATA_RETURN_IF_ERROR(check_matrix("act", "x", p.x, p.rows, p.cols, p.stride));
  if (p.rows == 0) return ok_status();
  switch (p.act) {
    case Activation::kSilu:
      return launch_act<Activation::kSilu>(ctx, p);
    case Activation::kGeluTanh:
      return launch_act<Activation::kGeluTanh>(ctx, p);
    case Activation::kGeluErf:
      return launch_act<Activation::kGeluErf>(ctx, p);
    case Activation::kRelu:
      return launch_act<Activation::kRelu>(ctx, p);
  }
  return bad_activation("act", p.act);
}

}  // namespace strata::cuda
