// Device helpers of the bf16 kernels (norm_bf16.cu, act_bf16.cu, rope_kv_append.cu, convert.cu):
// bf16 values travel as uint16_t bit patterns (backends/kernel_params.h), and these round f32 to
// them (nearest even, as strata::f32_to_bf16 on the host for every non-NaN value) and back.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backends/cuda/common.cuh"

namespace strata::cuda {

// f32 -> bf16 bits, round to nearest even (cvt.rn.bf16.f32; a NaN stays a NaN, its payload not
// kept).
__device__ __forceinline__ uint16_t bf16_bits(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// bf16 bits -> f32 (exact).
__device__ __forceinline__ float bf16_value(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

// Rounds v[0..N) to bf16 and stores them at p as one 2N-byte access (p aligned to 2N bytes).
// Pairs go through cvt.rn.bf16x2.f32, one instruction for two values.
template <int N>
__device__ __forceinline__ void store_bf16(uint16_t* p, const float* v) {
  if constexpr (N % 2 == 0) {
    Packed<uint32_t, N / 2> o;
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
      o.v[k] = *reinterpret_cast<const uint32_t*>(&h);
    }
    store_packed(reinterpret_cast<uint32_t*>(p), o);
  } else {
    Packed<uint16_t, N> o;
#pragma unroll
    for (int k = 0; k < N; ++k) o.v[k] = bf16_bits(v[k]);
    store_packed(p, o);
  }
}

}  // namespace strata::cuda
