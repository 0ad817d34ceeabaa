// RMSNorm: out[r, :] = x[r, :] * 1/sqrt(mean(x[r, :]^2) + eps) * (weight[:] + weight_offset).
// CPU twin: src/backends/cpu/rms_norm.cpp (same RmsNormParams).
//
// Layout: x and out are f32 [n_tokens, hidden] with row strides x_stride / out_stride (elements,
// >= hidden); weight is [hidden] contiguous in f32, f16 or bf16. out may be x itself (in place,
// same stride): every element is read and written by the same thread, and the block-wide
// reduction's barrier separates all reads of the first pass from the writes of the second.
//
// One block per row; each thread strides over the row twice (sum of squares, then scale), the
// second pass reading the row back from L1/L2. Accumulation is f32 per thread, then a warp-shuffle
// and a cross-warp reduction; the CPU twin sums in double, the difference stays below 1e-6
// relative.
//
// Variants (template parameters):
//   W     - weight element type (float, __half, __nv_bfloat16): checkpoints store norm weights in
//           their own dtype, and converting them once to f32 would cost a copy per layer.
//   kVec  - 16-byte accesses of x/out (4 floats, one packed load of 4 weights). Used when hidden
//           and both strides are multiples of 4 and the pointers are aligned; odd sizes (769,
//           5125) and unaligned views take the scalar variant, which handles anything.
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
__global__ void __launch_bounds__(kMaxThreads) rms_norm_kernel(const RmsNormParams p) {
  const int64_t row = blockIdx.x;
  const float* x = p.x + row * p.x_stride;  // [hidden]
  float* out = p.out + row * p.out_stride;  // [hidden], may alias x
  const W* weight = static_cast<const W*>(p.weight);
  const int hidden = static_cast<int>(p.hidden);
  const int tid = static_cast<int>(threadIdx.x);
  const int n_threads = static_cast<int>(blockDim.x);

  float sum_sq = 0.0f;
  if constexpr (kVec) {
    for (int i = tid * kVecWidth; i < hidden; i += n_threads * kVecWidth) {
      float v[kVecWidth];
      load_f32<kVecWidth>(x + i, v);
#pragma unroll
      for (int k = 0; k < kVecWidth; ++k) sum_sq += v[k] * v[k];
    }
  } else {
    for (int i = tid; i < hidden; i += n_threads) sum_sq += x[i] * x[i];
  }
  const float mean_sq = block_reduce_sum(sum_sq) / static_cast<float>(hidden);
  // NOTE: 1/sqrtf rather than rsqrtf: IEEE-rounded like the CPU twin, and it runs once per row.
  const float inv = 1.0f / sqrtf(mean_sq + p.eps);

  if constexpr (kVec) {
    for (int i = tid * kVecWidth; i < hidden; i += n_threads * kVecWidth) {
      float v[kVecWidth];
      float w[kVecWidth];
      load_f32<kVecWidth>(x + i, v);
      load_f32<kVecWidth>(weight + i, w);
      Packed<float, kVecWidth> o;
#pragma unroll
      for (int k = 0; k < kVecWidth; ++k) o.v[k] = v[k] * inv * (w[k] + p.weight_offset);
      store_packed(out + i, o);
    }
  } else {
    for (int i = tid; i < hidden; i += n_threads) {
      out[i] = x[i] * inv * (to_f32(weight[i]) + p.weight_offset);
    }
  }
}

Status invalid(const std::string& message) {
  return Status(StatusCode::kInvalidArgument, "rms_norm: " + message);
}

Status check_params(const RmsNormParams& p) {
  if (p.n_tokens < 0 || p.n_tokens > INT32_MAX) {
    return invalid("n_tokens " + std::to_string(p.n_tokens) + " outside [0, 2^31)");
  }
  if (p.hidden <= 0 || p.hidden > INT32_MAX) {
    return invalid("hidden " + std::to_string(p.hidden) + " outside [1, 2^31)");
  }
  if (p.x_stride < p.hidden || p.out_stride < p.hidden) {
    return invalid("row strides (x " + std::to_string(p.x_stride) + ", out " +
                   std::to_string(p.out_stride) + ") smaller than hidden " +
                   std::to_string(p.hidden));
  }
  if (p.n_tokens > 0 && (p.x == nullptr || p.out == nullptr || p.weight == nullptr)) {
    return invalid("null x, weight or out pointer");
  }
  if (p.x == p.out && p.x_stride != p.out_stride) {
    return invalid("in-place call (out == x) with different strides");
  }
  return ok_status();
}

}  // namespace

Status rms_norm(const LaunchCtx& ctx, const RmsNormParams& p) {
  STRATA_RETURN_IF_ERROR(check_params(p));
  return dispatch_float_dtype(p.weight_dtype, "rms_norm weight", [&]<class W>(TypeTag<W>) {
    if (p.n_tokens == 0) return ok_status();
    const bool vec = p.hidden % kVecWidth == 0 && p.x_stride % kVecWidth == 0 &&
                     p.out_stride % kVecWidth == 0 && is_aligned(p.x, 16) &&
                     is_aligned(p.out, 16) && is_aligned(p.weight, sizeof(W) * kVecWidth);
    const int64_t per_thread = vec ? kVecWidth : 1;
    const int threads = static_cast<int>(std::min<int64_t>(
        kMaxThreads, round_up<int64_t>(ceil_div(p.hidden, per_thread), kWarpSize)));
    const dim3 grid(static_cast<unsigned>(p.n_tokens));
    if (vec) {
      rms_norm_kernel<W, true><<<grid, threads, 0, ctx.stream>>>(p);
    } else {
      rms_norm_kernel<W, false><<<grid, threads, 0, ctx.stream>>>(p);
    }
    return kernel_launch_status("rms_norm_kernel");
  });
}

}  // namespace strata::cuda
