// Gated activation into bf16 (or, with gated = false, the plain activation of a GPT-2 / NeoX MLP:
// out[r, c] = bf16(act(in[r, c]))): out[r, c] = bf16(act(gate[r, c]) * up[r, c]) with gate and up the
// two halves of the fused gate/up GEMM's f32 output row (gate = in[r, 0:ffn], up =
// in[r, ffn:2ffn]); the bf16 result is the down_proj GEMM's input. silu, gelu (tanh
// approximation), gelu (erf) and relu, as activation.cu.
// CPU twin: src/backends/cpu/fused_bf16.cpp (same GatedActBf16Params).
//
// Layout: in f32 [n_tokens, 2 * ffn_dim] and out bf16 [n_tokens, ffn_dim], each with its own row
// stride (elements); out must not overlap in.
//
// Rounding: the f32 arithmetic is written with __fmul_rn/__fadd_rn/__fdiv_rn so that nvcc cannot
// contract a multiply and an add into an FMA: every operation then rounds as in the twin (the
// host build has no FMA), relu is bit-exact, and the other activations differ from the twin only
// by expf/tanhf/erff (CUDA: within 2 ulp), which moves a bf16 result by at most one ulp for
// inputs where 1 + tanh(.) / 1 + erf(.) does not cancel badly (|gate| below ~3.5 for gelu).
//
// Grid: as the element-wise ops (elementwise_grid in common.cuh): one element or one group of 4
// per thread, blockIdx.y walking the rows.
// Variants (template parameters):
//   A    - the activation, resolved at compile time.
//   kVec - 16-byte loads of gate and up and an 8-byte store of 4 bf16, when ffn_dim and the
//          strides are multiples of 4 and the pointers aligned; the scalar variant takes any shape.
#include <cstdint>
#include <string>

#include "backends/cuda/bf16.cuh"
#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"

namespace strata::cuda {
namespace {

constexpr const char* kOp = "gated_act_bf16";
constexpr int kVecWidth = 4;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;

// activation.cpp's formulas, operation for operation (left to right), without contraction.
template <Activation A>
__device__ __forceinline__ float apply(float x) {
  if constexpr (A == Activation::kSilu) {
    return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x)));
  } else if constexpr (A == Activation::kGeluTanh) {
    const float cube = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, x), x), x);
    const float t = tanhf(__fmul_rn(kSqrt2OverPi, __fadd_rn(x, cube)));
    return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, t));
  } else if constexpr (A == Activation::kGeluErf) {
    const float e = erff(__fmul_rn(x, kInvSqrt2));
    return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, e));
  } else {
    return x > 0.0f ? x : 0.0f;
  }
}

template <Activation A, bool kVec>
__global__ void gated_act_bf16_kernel(const GatedActBf16Params p) {
  pdl_trigger();  // single-wave kernel: let the next (PDL) kernel prefetch its weights
  constexpr int kW = kVec ? kVecWidth : 1;
  const int64_t i = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * kW;
  if (i >= p.ffn_dim) return;
  for (int64_t r = blockIdx.y; r < p.n_tokens; r += gridDim.y) {
    const float* gate = p.in + r * p.in_stride;
    const Packed<float, kW> g = load_packed<float, kW>(gate + i);
    const Packed<float, kW> u = load_packed<float, kW>(gate + p.ffn_dim + i);
    float o[kW];
#pragma unroll
    for (int k = 0; k < kW; ++k) o[k] = __fmul_rn(apply<A>(g.v[k]), u.v[k]);
    store_bf16<kW>(p.out + r * p.out_stride + i, o);
  }
}

// bf16 input (the gate/up GEMM's bf16 output): 4 values per thread.
template <Activation A>
__global__ void gated_act_bf16_in_kernel(const GatedActBf16Params p) {
  pdl_trigger();
  const int64_t i0 = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * 4;
  if (i0 >= p.ffn_dim) return;
  for (int64_t r = blockIdx.y; r < p.n_tokens; r += gridDim.y) {
    const uint16_t* gate = p.in_bf16 + r * p.in_stride;
    uint16_t* out = p.out + r * p.out_stride;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t i = i0 + k;
      if (i < p.ffn_dim) {
        out[i] =
            bf16_bits(__fmul_rn(apply<A>(bf16_value(gate[i])), bf16_value(gate[p.ffn_dim + i])));
      }
    }
  }
}

// Plain (ungated) MLPs (GPT-2, NeoX): out[r, i] = bf16(act(in[r, i])), in [n_tokens, ffn_dim] in
// f32 or bf16 (kBf16In); one element per thread.
template <Activation A, bool kBf16In>
__global__ void act_bf16_kernel(const GatedActBf16Params p) {
  pdl_trigger();
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= p.ffn_dim) return;
  for (int64_t r = blockIdx.y; r < p.n_tokens; r += gridDim.y) {
    const float v = kBf16In ? bf16_value(p.in_bf16[r * p.in_stride + i]) : p.in[r * p.in_stride + i];
    p.out[r * p.out_stride + i] = bf16_bits(apply<A>(v));
  }
}

template <Activation A>
Status launch(const LaunchCtx& ctx, const GatedActBf16Params& p) {
  if (!p.gated) {
    const dim3 grid = elementwise_grid(p.n_tokens, p.ffn_dim, 1);
    if (p.in_bf16 != nullptr) {
      act_bf16_kernel<A, true><<<grid, kElementwiseThreads, 0, ctx.stream>>>(p);
    } else {
      act_bf16_kernel<A, false><<<grid, kElementwiseThreads, 0, ctx.stream>>>(p);
    }
    return kernel_launch_status("act_bf16_kernel");
  }
  if (p.in_bf16 != nullptr) {
    const dim3 grid = elementwise_grid(p.n_tokens, p.ffn_dim, 4);
    gated_act_bf16_in_kernel<A><<<grid, kElementwiseThreads, 0, ctx.stream>>>(p);
    return kernel_launch_status("gated_act_bf16_in_kernel");
  }
  const bool vec = p.ffn_dim % kVecWidth == 0 && p.in_stride % kVecWidth == 0 &&
                   p.out_stride % kVecWidth == 0 && is_aligned(p.in, 16) && is_aligned(p.out, 8);
  const dim3 grid = elementwise_grid(p.n_tokens, p.ffn_dim, vec ? kVecWidth : 1);
  if (vec) {
    gated_act_bf16_kernel<A, true><<<grid, kElementwiseThreads, 0, ctx.stream>>>(p);
  } else {
    gated_act_bf16_kernel<A, false><<<grid, kElementwiseThreads, 0, ctx.stream>>>(p);
  }
  return kernel_launch_status("gated_act_bf16_kernel");
}

Status check_params(const GatedActBf16Params& p) {
  // 2 * ffn_dim columns of `in` must fit check_matrix's int32 range too.
  if (p.ffn_dim <= 0 || p.ffn_dim > INT32_MAX / 2) {
    return invalid_argument(kOp, "ffn_dim " + std::to_string(p.ffn_dim) + " outside [1, 2^30)");
  }
  const int64_t in_cols = p.gated ? 2 * p.ffn_dim : p.ffn_dim;
  if (p.in_bf16 != nullptr) {
    STRATA_RETURN_IF_ERROR(
        check_matrix(kOp, "in_bf16", p.in_bf16, p.n_tokens, in_cols, p.in_stride));
    STRATA_RETURN_IF_ERROR(check_matrix(kOp, "out", p.out, p.n_tokens, p.ffn_dim, p.out_stride));
    return ok_status();  // the executor's buffers never overlap; no overlap check for bf16 in
  }
  STRATA_RETURN_IF_ERROR(check_matrix(kOp, "in", p.in, p.n_tokens, in_cols, p.in_stride));
  STRATA_RETURN_IF_ERROR(check_matrix(kOp, "out", p.out, p.n_tokens, p.ffn_dim, p.out_stride));
  if (p.n_tokens > 0) {
    const auto in0 = reinterpret_cast<uintptr_t>(p.in);
    const auto out0 = reinterpret_cast<uintptr_t>(p.out);
    const auto in_end = in0 + static_cast<uintptr_t>(
                                  ((p.n_tokens - 1) * p.in_stride + in_cols) * sizeof(float));
    const auto out_end =
        out0 +
        static_cast<uintptr_t>(((p.n_tokens - 1) * p.out_stride + p.ffn_dim) * sizeof(uint16_t));
    if (in0 < out_end && out0 < in_end) return invalid_argument(kOp, "out overlaps in");
  }
  return ok_status();
}

}  // namespace

Status gated_act_bf16(const LaunchCtx& ctx, const GatedActBf16Params& p) {
  STRATA_RETURN_IF_ERROR(check_params(p));
  switch (p.act) {
    case Activation::kSilu:
      return p.n_tokens == 0 ? ok_status() : launch<Activation::kSilu>(ctx, p);
    case Activation::kGeluTanh:
      return p.n_tokens == 0 ? ok_status() : launch<Activation::kGeluTanh>(ctx, p);
    case Activation::kGeluErf:
      return p.n_tokens == 0 ? ok_status() : launch<Activation::kGeluErf>(ctx, p);
    case Activation::kRelu:
      return p.n_tokens == 0 ? ok_status() : launch<Activation::kRelu>(ctx, p);
  }
  return invalid_argument(kOp, "unknown activation " + std::to_string(static_cast<int>(p.act)));
}

}  // namespace strata::cuda
