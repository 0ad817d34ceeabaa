// LayerNorm: out[r, :] = (x[r, :] - mean) * 1/sqrt(var + eps) * weight[:] + bias[:], biased
// variance. CPU twin: src/backends/cpu/layer_norm.cpp (same LayerNormParams).
//
// Layout: x and out are f32 [n_tokens, hidden] with row strides x_stride / out_stride (elements,
// >= hidden); weight is [hidden] contiguous in f32, f16 or bf16; bias is optional, [hidden] in any
// of the three. out may be x itself (same stride): each element is read and written by one
// thread, and the reductions' barriers separate every read of the stats passes from the writes.
//
// One block per row, three passes over the row (the later ones hit L1/L2): the mean, then the sum
// of centred squares (two passes like the CPU twin, so a large mean does not cancel the variance
// away), then the output. f32 per thread plus a block reduction; the CPU twin accumulates in
// double, the difference stays around 1e-7 relative for the row sizes of real models.
//
// Variants (template parameters):
//   W    - weight element type (float, __half, __nv_bfloat16), as in rms_norm.cu. The bias dtype is
//          a run-time switch (load_as_f32): a second template axis would triple the instantiations
//          for a side input read once per element.
//   kVec - 16-byte accesses of x/out when hidden and both strides are multiples of 4 and the
//          pointers are aligned; the scalar variant handles anything (769, 5125, odd views).
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

template <class W, bool kVec>
__global__ void __launch_bounds__(kMaxThreads) layer_norm_kernel(const LayerNormParams p) {
  constexpr int kW = kVec ? kVecWidth : 1;
  const int64_t row = blockIdx.x;
  const float* x = p.x + row * p.x_stride;  // [hidden]
  float* out = p.out + row * p.out_stride;  // [hidden], may alias x
  const W* weight = static_cast<const W*>(p.weight);
  const int hidden = static_cast<int>(p.hidden);
  const int step = static_cast<int>(blockDim.x) * kW;
  const int start = static_cast<int>(threadIdx.x) * kW;

  float sum = 0.0f;
  for (int i = start; i < hidden; i += step) {
    float v[kW];
    load_f32<kW>(x + i, v);
#pragma unroll
    for (int k = 0; k < kW; ++k) sum += v[k];
  }
  const float mean = block_reduce_sum(sum) / static_cast<float>(hidden);

  float ss = 0.0f;
  for (int i = start; i < hidden; i += step) {
    float v[kW];
    load_f32<kW>(x + i, v);
#pragma unroll
    for (int k = 0; k < kW; ++k) ss += (v[k] - mean) * (v[k] - mean);
  }
  const float var = block_reduce_sum(ss) / static_cast<float>(hidden);
  // NOTE: 1/sqrtf rather than rsqrtf: IEEE-rounded like the CPU twin, and it runs once per row.
  const float inv = 1.0f / sqrtf(var + p.eps);

  for (int i = start; i < hidden; i += step) {
    float v[kW];
    float w[kW];
    load_f32<kW>(x + i, v);
    load_f32<kW>(weight + i, w);
    Packed<float, kW> o;
#pragma unroll
    for (int k = 0; k < kW; ++k) {
      const float b = p.bias ? load_as_f32(p.bias, p.bias_dtype, i + k) : 0.0f;
      o.v[k] = (v[k] - mean) * inv * w[k] + b;
    }
    store_packed(out + i, o);
  }
}

Status check_params(const LayerNormParams& p) {
  STRATA_RETURN_IF_ERROR(check_matrix("layer_norm", "x", p.x, p.n_tokens, p.hidden, p.x_stride));
  STRATA_RETURN_IF_ERROR(
      check_matrix("layer_norm", "out", p.out, p.n_tokens, p.hidden, p.out_stride));
  if (p.n_tokens > 0 && p.weight == nullptr) return invalid_argument("layer_norm", "null weight");
  if (p.x == p.out && p.x_stride != p.out_stride) {
    return invalid_argument("layer_norm", "in-place call (out == x) with different strides");
  }
  if (p.bias != nullptr && p.bias_dtype != DType::kF32 && p.bias_dtype != DType::kF16 &&
      p.bias_dtype != DType::kBF16) {
    return Status(StatusCode::kUnimplemented, "layer_norm bias: dtype " +
                                                  std::string(dtype_name(p.bias_dtype)) +
                                                  " is not supported by the CUDA backend");
  }
  return ok_status();
}

}  // namespace

Status layer_norm(const LaunchCtx& ctx, const LayerNormParams& p) {
  STRATA_RETURN_IF_ERROR(check_params(p));
  return dispatch_float_dtype(p.weight_dtype, "layer_norm weight", [&]<class W>(TypeTag<W>) {
    if (p.n_tokens == 0) return ok_status();
    const bool vec = p.hidden % kVecWidth == 0 && p.x_stride % kVecWidth == 0 &&
                     p.out_stride % kVecWidth == 0 && is_aligned(p.x, 16) &&
                     is_aligned(p.out, 16) && is_aligned(p.weight, sizeof(W) * kVecWidth);
    const int64_t per_thread = vec ? kVecWidth : 1;
    const int threads = static_cast<int>(std::min<int64_t>(
        kMaxThreads, round_up<int64_t>(ceil_div(p.hidden, per_thread), kWarpSize)));
    const dim3 grid(static_cast<unsigned>(p.n_tokens));
    if (vec) {
      layer_norm_kernel<W, true><<<grid, threads, 0, ctx.stream>>>(p);
    } else {
      layer_norm_kernel<W, false><<<grid, threads, 0, ctx.stream>>>(p);
    }
    return kernel_launch_status("layer_norm_kernel");
  });
}

}  // namespace strata::cuda
