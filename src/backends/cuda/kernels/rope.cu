// Rotary position embedding in place on x [n_tokens, n_heads, head_dim], first rotary_dim dims of
// each head: angle(t, i) = positions[t] * inv_freq[i], cos/sin scaled by attention_factor. Pairs
// are (i, i + rotary_dim/2) in neox style (HF rotate_half) and (2i, 2i + 1) otherwise (GPT-J);
// dims past rotary_dim pass through. CPU twin: src/backends/cpu/rope.cpp (same RopeKernelParams).
//
// Layout: x is f32 with strides token_stride, head_stride, 1 (elements), so q and k can be views
// into one fused qkv output. positions [n_tokens] int32 and inv_freq [rotary_dim/2] f32 are
// device arrays.
//
// One block per token: its threads first fill a shared cos/sin table for the token's position
// (angle and sincos in double, as on the CPU: positions * inv_freq reach 1e5+ radians, where an
// f32 product is already off by ~1e-2), then rotate every (head, pair) of the token. The rotation
// uses __fmul_rn so the compiler cannot contract a * cos - b * sin into an FMA: the result then
// rounds exactly as the CPU twin's.
//
// Variants (template parameters):
//   kNeox - the pair layout (neox vs GPT-J); one branch per element would be uniform but keeps
//           both address patterns live.
//   kVec  - 16-byte accesses: 4 pairs per thread in neox style (x[i..i+3] and x[i+half..]), 2 pairs
//           in GPT-J style (x[2i..2i+3]). Used when the pair count per head and both strides allow
//           it and x is 16-byte aligned; the scalar variant handles any rotary_dim (e.g. 12).
#include <algorithm>
#include <cstdint>
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"

namespace strata::cuda {
namespace {

constexpr int64_t kMaxRotaryDim = 1024;  // same limit as the CPU twin
constexpr int kMaxThreads = 256;

__device__ __forceinline__ void rotate(float& a, float& b, float c, float s) {
  const float a0 = a;
  a = __fsub_rn(__fmul_rn(a0, c), __fmul_rn(b, s));
  b = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a0, s));
}

template <bool kNeox, bool kVec>
__global__ void __launch_bounds__(kMaxThreads) rope_kernel(const RopeKernelParams p) {
  extern __shared__ float table[];  // cos [half], then sin [half]
  const int half = static_cast<int>(p.rotary_dim / 2);
  float* cos_t = table;
  float* sin_t = table + half;
  const int64_t t = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x);
  const int n_threads = static_cast<int>(blockDim.x);

  const double pos = p.positions[t];
  for (int i = tid; i < half; i += n_threads) {
    double s;
    double c;
    sincos(pos * static_cast<double>(p.inv_freq[i]), &s, &c);
    cos_t[i] = static_cast<float>(c) * p.attention_factor;
    sin_t[i] = static_cast<float>(s) * p.attention_factor;
  }
  __syncthreads();

  constexpr int kPairs = kVec ? (kNeox ? 4 : 2) : 1;  // pairs rotated per thread and item
  const int items_per_head = half / kPairs;
  const int n_items = static_cast<int>(p.n_heads) * items_per_head;
  for (int item = tid; item < n_items; item += n_threads) {
    const int64_t h = item / items_per_head;
    const int i = (item % items_per_head) * kPairs;           // first pair of this item
    float* x = p.x + t * p.token_stride + h * p.head_stride;  // [head_dim]
    if constexpr (kNeox) {
      Packed<float, kPairs> a = load_packed<float, kPairs>(x + i);
      Packed<float, kPairs> b = load_packed<float, kPairs>(x + i + half);
#pragma unroll
      for (int k = 0; k < kPairs; ++k) rotate(a.v[k], b.v[k], cos_t[i + k], sin_t[i + k]);
      store_packed(x + i, a);
      store_packed(x + i + half, b);
    } else if constexpr (kVec) {
      Packed<float, 2 * kPairs> v = load_packed<float, 2 * kPairs>(x + 2 * i);
#pragma unroll
      for (int k = 0; k < kPairs; ++k) {
        rotate(v.v[2 * k], v.v[2 * k + 1], cos_t[i + k], sin_t[i + k]);
      }
      store_packed(x + 2 * i, v);
    } else {
      rotate(x[2 * i], x[2 * i + 1], cos_t[i], sin_t[i]);  // odd strides: no 8-byte access
    }
  }
}

Status check_params(const RopeKernelParams& p) {
  if (p.rotary_dim <= 0 || p.rotary_dim % 2 != 0 || p.rotary_dim > p.head_dim ||
      p.rotary_dim > kMaxRotaryDim) {
    return invalid_argument(
        "rope", "rotary_dim " + std::to_string(p.rotary_dim) + " must be even, in (0, head_dim " +
                    std::to_string(p.head_dim) + "] and <= " + std::to_string(kMaxRotaryDim));
  }
  if (p.n_tokens < 0 || p.n_tokens > INT32_MAX) {
    return invalid_argument("rope",
                            "n_tokens " + std::to_string(p.n_tokens) + " outside [0, 2^31)");
  }
  if (p.n_heads <= 0 || p.n_heads * (p.rotary_dim / 2) > INT32_MAX) {
    return invalid_argument("rope", "n_heads " + std::to_string(p.n_heads) + " out of range");
  }
  if (p.head_stride < p.head_dim || p.token_stride < (p.n_heads - 1) * p.head_stride + p.head_dim) {
    return invalid_argument("rope", "strides (token " + std::to_string(p.token_stride) + ", head " +
                                        std::to_string(p.head_stride) + ") too small for " +
                                        std::to_string(p.n_heads) + " heads of " +
                                        std::to_string(p.head_dim));
  }
  if (p.n_tokens > 0 && (p.x == nullptr || p.positions == nullptr || p.inv_freq == nullptr)) {
    return invalid_argument("rope", "null x, positions or inv_freq");
  }
  return ok_status();
}

template <bool kNeox>
Status launch(const LaunchCtx& ctx, const RopeKernelParams& p) {
  const int64_t half = p.rotary_dim / 2;
  const int64_t pairs = kNeox ? 4 : 2;
  const bool vec =
      half % pairs == 0 && p.token_stride % 4 == 0 && p.head_stride % 4 == 0 && is_aligned(p.x, 16);
  const int64_t items = p.n_heads * (vec ? half / pairs : half);
  const int threads = static_cast<int>(
      std::min<int64_t>(kMaxThreads, round_up<int64_t>(std::max(items, half), kWarpSize)));
  const size_t smem = static_cast<size_t>(p.rotary_dim) * sizeof(float);
  const dim3 grid(static_cast<unsigned>(p.n_tokens));
  if (vec) {
    rope_kernel<kNeox, true><<<grid, threads, smem, ctx.stream>>>(p);
  } else {
    rope_kernel<kNeox, false><<<grid, threads, smem, ctx.stream>>>(p);
  }
  return kernel_launch_status("rope_kernel");
}

}  // namespace

Status rope(const LaunchCtx& ctx, const RopeKernelParams& p) {
  STRATA_RETURN_IF_ERROR(check_params(p));
  if (p.n_tokens == 0) return ok_status();
  return p.neox_style ? launch<true>(ctx, p) : launch<false>(ctx, p);
}

}  // namespace strata::cuda
