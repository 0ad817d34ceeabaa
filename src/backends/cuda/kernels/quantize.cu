// quantize_rows: per-row symmetric weight quantization at load time, bf16 -> int8 or fp8 e4m3
// with one f32 scale per row. CPU twin: cpu::quantize_rows (src/backends/cpu/gpu_linear.cpp),
// which yields the same bytes: both divide in IEEE f32 and round to nearest even (int8:
// __float2int_rn / nearbyint; fp8: cvt.rn.satfinite / f32_to_fp8e4m3).
//
// One block per row: a max-reduction of |w|, then every thread quantizes its strided columns.
// Runs once per weight at load, so plain scalar loads are enough.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;

template <bool kI8>
__global__ void __launch_bounds__(kThreads)
    quantize_rows_kernel(const __nv_bfloat16* w, int64_t cols, void* q, float* scale) {
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* wr = w + row * cols;
  float amax = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
    amax = fmaxf(amax, fabsf(__bfloat162float(wr[c])));
  }
  amax = block_reduce_max(amax);
  // An all-zero row gets scale 1, so its q are 0.
  const float s = amax > 0.0f ? amax / (kI8 ? 127.0f : 448.0f) : 1.0f;
  if (threadIdx.x == 0) scale[row] = s;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
    const float v = __bfloat162float(wr[c]) / s;
    if constexpr (kI8) {
      const int r = min(127, max(-127, __float2int_rn(v)));
      static_cast<int8_t*>(q)[row * cols + c] = static_cast<int8_t>(r);
    } else {
      static_cast<__nv_fp8_storage_t*>(q)[row * cols + c] =
          __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    }
  }
}

}  // namespace

Status quantize_rows(const LaunchCtx& ctx, const uint16_t* w_bf16, int64_t rows, int64_t cols,
                     DType q_dtype, void* q, float* scale) {
  if (q_dtype != DType::kI8 && q_dtype != DType::kFP8E4M3) {
    return invalid_argument(
        "quantize_rows", "q_dtype " + std::string(dtype_name(q_dtype)) + " (want i8 or fp8_e4m3)");
  }
  if (rows < 0 || rows > INT32_MAX || cols <= 0) {
    return invalid_argument(
        "quantize_rows", "bad shape [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  }
  if (rows == 0) return ok_status();
  if (w_bf16 == nullptr || q == nullptr || scale == nullptr) {
    return invalid_argument("quantize_rows", "null w, q or scale");
  }
  const auto* w = reinterpret_cast<const __nv_bfloat16*>(w_bf16);
  if (q_dtype == DType::kI8) {
    quantize_rows_kernel<true>
        <<<static_cast<unsigned>(rows), kThreads, 0, ctx.stream>>>(w, cols, q, scale);
  } else {
    quantize_rows_kernel<false>
        <<<static_cast<unsigned>(rows), kThreads, 0, ctx.stream>>>(w, cols, q, scale);
  }
  return kernel_launch_status("quantize_rows_kernel");
}

}  // namespace strata::cuda
