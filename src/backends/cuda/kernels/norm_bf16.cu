// RMSNorm (or LayerNorm, NormBf16Params::kind) into bf16 with the residual add fused in
// (Deep-Fusion, DeepSpeed-Inference III-B):
//   x[r, :] += residual[r, :]            (optional; f32, written back: the residual stream)
//   out[r, :] = bf16(x[r, :] * 1/sqrt(mean(x[r, :]^2) + eps) * (weight[:] + weight_offset))
// so the o_proj/down_proj output joins the residual stream and the next norm reads it in one
// pass, and the next GEMM gets its bf16 input without a separate conversion.
// CPU twin: src/backends/cpu/fused_bf16.cpp (same NormBf16Params).
//
// Layout: x, residual f32 [n_tokens, hidden] and out bf16 [n_tokens, hidden], each with its own
// row stride (elements); weight [hidden] contiguous in f32, f16 or bf16. out must not overlap x.
// Every element of x is read, updated and read again by the same thread, and the block-wide
// reduction's barrier separates the two passes, so the in-place update of x needs no extra sync.
//
// One block per row; each thread strides over the row twice (sum of squares after the add, then
// scale and round), the second pass reading x back from L1/L2. The sum is f32 per thread, then a
// warp-shuffle and cross-warp reduction; the twin sums in double. The difference (a few f32 ulp
// of the final value) moves a bf16 result by at most one ulp, and only when the f32 value lies
// that close to a bf16 rounding midpoint.
//
// Variants (template parameters):
//   W    - weight element type (float, __half, __nv_bfloat16), as rms_norm.cu.
//   kVec - 16-byte accesses of x and residual (4 floats), 8-byte stores of 4 bf16, one packed load
//          of 4 weights, for the first hidden / 4 * 4 columns; the last hidden % 4 columns go
//          scalar. Used when every row starts aligned (strides multiples of 4, pointers aligned);
//          the scalar variant handles any view.
#include <algorithm>
#include <cstdint>
#include <string>

#include "backends/cuda/bf16.cuh"
#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"

namespace strata::cuda {
namespace {

// Launched with PDL only for prefill-sized batches: on an H100 it took Llama-3-8B prefill 1x2048
// from 567 to 607 TFLOP/s (the kernel starts while the GEMM before it drains), while for decode
// steps PDL on the small kernels made a step slower (5.81 -> 6.63 ms at batch 1).
constexpr int64_t kPdlMinTokens = 16;

constexpr const char* kOp = "norm_bf16";
constexpr int kVecWidth = 4;
constexpr int kMaxThreads = 1024;

template <class W, bool kVec>
__global__ void __launch_bounds__(kMaxThreads) norm_bf16_kernel(const NormBf16Params p) {
  pdl_trigger();  // single-wave kernel: let the next (PDL) kernel start
  pdl_wait();     // launched with PDL: x comes from the kernel before
  const int64_t row = blockIdx.x;
  float* x = p.x + row * p.x_stride;  // [hidden], updated in place with the residual
  const float* res = p.residual == nullptr ? nullptr : p.residual + row * p.residual_stride;
  uint16_t* out = p.out + row * p.out_stride;  // [hidden]
  const W* weight = static_cast<const W*>(p.weight);
  const int hidden = static_cast<int>(p.hidden);
  const int tid = static_cast<int>(threadIdx.x);
  const int n_threads = static_cast<int>(blockDim.x);
  const int vec_end = kVec ? hidden / kVecWidth * kVecWidth : 0;  // columns done 4 at a time

  float sum_sq = 0.0f;
  for (int i = tid * kVecWidth; i < vec_end; i += n_threads * kVecWidth) {
    Packed<float, kVecWidth> v = load_packed<float, kVecWidth>(x + i);
    if (res != nullptr) {
      const Packed<float, kVecWidth> r = load_packed<float, kVecWidth>(res + i);
#pragma unroll
      for (int k = 0; k < kVecWidth; ++k) v.v[k] += r.v[k];
      store_packed(x + i, v);
    }
#pragma unroll
    for (int k = 0; k < kVecWidth; ++k) sum_sq += v.v[k] * v.v[k];
  }
  for (int i = vec_end + tid; i < hidden; i += n_threads) {
    float v = x[i];
    if (res != nullptr) {
      v += res[i];
      x[i] = v;
    }
    sum_sq += v * v;
  }
  const float mean_sq = block_reduce_sum(sum_sq) / static_cast<float>(hidden);
  // NOTE: 1/sqrtf rather than rsqrtf: IEEE-rounded like the CPU twin, and it runs once per row.
  const float inv = 1.0f / sqrtf(mean_sq + p.eps);

  for (int i = tid * kVecWidth; i < vec_end; i += n_threads * kVecWidth) {
    float v[kVecWidth];
    float w[kVecWidth];
    load_f32<kVecWidth>(x + i, v);
    load_f32<kVecWidth>(weight + i, w);
#pragma unroll
    for (int k = 0; k < kVecWidth; ++k) v[k] = v[k] * inv * (w[k] + p.weight_offset);
    store_bf16<kVecWidth>(out + i, v);
  }
  for (int i = vec_end + tid; i < hidden; i += n_threads) {
    out[i] = bf16_bits(x[i] * inv * (to_f32(weight[i]) + p.weight_offset));
  }
}

// LayerNorm into bf16 (GPT-2, NeoX): x += residual (optional), then three passes over the row:
// the mean, the centred sum of squares (so a large mean does not cancel the variance away), and
// out = bf16((x - mean) * 1/sqrt(var + eps) * w + b). The sums are in double, as the twin's: an
// f32 mean can be off by an ulp of |mean|, and x - mean near zero then differs from the twin's by
// many bf16 ulps (measured on an H100 with a mean of 30: 15 of 13M outputs more than 1 ulp off).
// LayerNorm models are the small ones, so the double arithmetic costs nothing that matters. Bias
// in the weight's dtype (or none).
template <class W, bool kVec>
__global__ void __launch_bounds__(kMaxThreads) layer_norm_bf16_kernel(const NormBf16Params p) {
  pdl_trigger();
  pdl_wait();
  const int64_t row = blockIdx.x;
  float* x = p.x + row * p.x_stride;
  const float* res = p.residual == nullptr ? nullptr : p.residual + row * p.residual_stride;
  uint16_t* out = p.out + row * p.out_stride;
  const W* weight = static_cast<const W*>(p.weight);
  const W* bias = static_cast<const W*>(p.bias);
  const int hidden = static_cast<int>(p.hidden);
  const int tid = static_cast<int>(threadIdx.x);
  const int n_threads = static_cast<int>(blockDim.x);
  const int vec_end = kVec ? hidden / kVecWidth * kVecWidth : 0;

  double sum = 0.0;
  for (int i = tid * kVecWidth; i < vec_end; i += n_threads * kVecWidth) {
    Packed<float, kVecWidth> v = load_packed<float, kVecWidth>(x + i);
    if (res != nullptr) {
      const Packed<float, kVecWidth> r = load_packed<float, kVecWidth>(res + i);
#pragma unroll
      for (int k = 0; k < kVecWidth; ++k) v.v[k] += r.v[k];
      store_packed(x + i, v);
    }
#pragma unroll
    for (int k = 0; k < kVecWidth; ++k) sum += v.v[k];
  }
  for (int i = vec_end + tid; i < hidden; i += n_threads) {
    float v = x[i];
    if (res != nullptr) {
      v += res[i];
      x[i] = v;
    }
    sum += v;
  }
  const double mean_d = block_reduce_sum_double(sum) / static_cast<double>(hidden);
  double ss = 0.0;
  for (int i = tid; i < hidden; i += n_threads) {
    const double d = static_cast<double>(x[i]) - mean_d;
    ss += d * d;
  }
  const double var = block_reduce_sum_double(ss) / static_cast<double>(hidden);
  // As the twin: mean and 1/sqrt(var + eps) in double, rounded to f32 once each.
  const float mean = static_cast<float>(mean_d);
  const float inv = static_cast<float>(1.0 / sqrt(var + static_cast<double>(p.eps)));
  for (int i = tid * kVecWidth; i < vec_end; i += n_threads * kVecWidth) {
    float v[kVecWidth];
    float w[kVecWidth];
    float b[kVecWidth] = {};
    load_f32<kVecWidth>(x + i, v);
    load_f32<kVecWidth>(weight + i, w);
    if (bias != nullptr) load_f32<kVecWidth>(bias + i, b);
#pragma unroll
    for (int k = 0; k < kVecWidth; ++k) {
      v[k] = __fadd_rn(__fmul_rn(__fmul_rn(v[k] - mean, inv), w[k]), b[k]);  // no FMA: as the twin
    }
    store_bf16<kVecWidth>(out + i, v);
  }
  for (int i = vec_end + tid; i < hidden; i += n_threads) {
    const float b = bias != nullptr ? to_f32(bias[i]) : 0.0f;
    out[i] = bf16_bits(__fadd_rn(__fmul_rn(__fmul_rn(x[i] - mean, inv), to_f32(weight[i])), b));
  }
}

// Whether the byte ranges [a, a + a_bytes) and [b, b + b_bytes) overlap.
bool overlaps(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  const auto a0 = reinterpret_cast<uintptr_t>(a);
  const auto b0 = reinterpret_cast<uintptr_t>(b);
  return a0 < b0 + static_cast<uintptr_t>(b_bytes) && b0 < a0 + static_cast<uintptr_t>(a_bytes);
}

Status check_params(const NormBf16Params& p) {
  if (p.n_tokens < 0 || p.n_tokens > INT32_MAX) {
    return invalid_argument(kOp, "n_tokens " + std::to_string(p.n_tokens) + " outside [0, 2^31)");
  }
  if (p.hidden <= 0 || p.hidden > INT32_MAX) {
    return invalid_argument(kOp, "hidden " + std::to_string(p.hidden) + " outside [1, 2^31)");
  }
  STRATA_RETURN_IF_ERROR(check_matrix(kOp, "x", p.x, p.n_tokens, p.hidden, p.x_stride));
  STRATA_RETURN_IF_ERROR(check_matrix(kOp, "out", p.out, p.n_tokens, p.hidden, p.out_stride));
  if (p.residual != nullptr) {
    STRATA_RETURN_IF_ERROR(
        check_matrix(kOp, "residual", p.residual, p.n_tokens, p.hidden, p.residual_stride));
  }
  if (p.n_tokens > 0 && p.weight == nullptr) return invalid_argument(kOp, "null weight");
  if (p.n_tokens > 0 &&
      overlaps(p.x, ((p.n_tokens - 1) * p.x_stride + p.hidden) * int64_t{sizeof(float)}, p.out,
               ((p.n_tokens - 1) * p.out_stride + p.hidden) * int64_t{sizeof(uint16_t)})) {
    return invalid_argument(kOp, "out overlaps x");
  }
  return ok_status();
}

}  // namespace

Status norm_bf16(const LaunchCtx& ctx, const NormBf16Params& p) {
  STRATA_RETURN_IF_ERROR(check_params(p));
  if (p.kind == NormKind::kLayer && p.bias != nullptr && p.bias_dtype != p.weight_dtype) {
    return invalid_argument(kOp, "LayerNorm bias dtype must equal the weight dtype");
  }
  return dispatch_float_dtype(p.weight_dtype, "norm_bf16 weight", [&]<class W>(TypeTag<W>) {
    if (p.n_tokens == 0) return ok_status();
    const bool res_vec =
        p.residual == nullptr || (p.residual_stride % kVecWidth == 0 && is_aligned(p.residual, 16));
    const bool vec = p.x_stride % kVecWidth == 0 && p.out_stride % kVecWidth == 0 &&
                     is_aligned(p.x, 16) && is_aligned(p.out, 8) && res_vec &&
                     is_aligned(p.weight, sizeof(W) * kVecWidth) &&
                     (p.bias == nullptr || is_aligned(p.bias, sizeof(W) * kVecWidth));
    const int64_t per_thread = vec ? kVecWidth : 1;
    const int threads = static_cast<int>(std::min<int64_t>(
        kMaxThreads, round_up<int64_t>(ceil_div(p.hidden, per_thread), kWarpSize)));
    const dim3 grid(static_cast<unsigned>(p.n_tokens));
    const bool pdl = p.n_tokens > kPdlMinTokens;
    if (p.kind == NormKind::kLayer) {
      if (vec) {
        (void)launch_pdl(ctx, pdl, layer_norm_bf16_kernel<W, true>, grid, dim3(threads), 0, p);
      } else {
        (void)launch_pdl(ctx, pdl, layer_norm_bf16_kernel<W, false>, grid, dim3(threads), 0, p);
      }
      return kernel_launch_status("layer_norm_bf16_kernel");
    }
    if (vec) {
      (void)launch_pdl(ctx, pdl, norm_bf16_kernel<W, true>, grid, dim3(threads), 0, p);
    } else {
      (void)launch_pdl(ctx, pdl, norm_bf16_kernel<W, false>, grid, dim3(threads), 0, p);
    }
    return kernel_launch_status("norm_bf16_kernel");
  });
}

}  // namespace strata::cuda
