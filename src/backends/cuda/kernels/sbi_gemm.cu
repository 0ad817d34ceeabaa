// SBI-GeMM host side: the GPU linear layer's argument checks (shared with cublaslt_linear), the
// block-shape choice, and batches of more than 64 tokens run as 64-token slices. The kernels:
// sbi_gemm.cuh (template), sbi_gemm_{bf16,i8,fp8}.cu (one weight format each).
//
// Block shape: n_tiles = ceil(n_tokens / 8) rounded up to 1, 2, 4 or 8. m-tiles per block (MT)
// start at 2 for 9..32 tokens (each block reads x once, so more m-tiles per block means fewer
// x re-reads, which matter once x has 16+ tokens) and 1 otherwise, and halve while the grid would
// have fewer than kMinBlocksPerSm blocks per SM. Gated launches pair MT gate tiles with MT up
// tiles (2 MT tiles per block) and start at MT = 1.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/gpu_linear_internal.h"
#include "backends/cuda/kernels/gguf_fragments.h"
#include "core/env.h"

namespace strata::cuda {

namespace {

constexpr int kDefaultSmCount = 132;  // H100 SXM, when the LaunchCtx does not say

std::string num(int64_t v) {
  return std::to_string(v);
}

}  // namespace

Status check_gpu_linear(const char* op, const GpuLinearParams& p) {
  const bool gguf = dtype_info(p.w_dtype).is_quantized;
  if (gguf && !gguf::gpu_format(p.w_dtype)) {
    return Status(StatusCode::kUnimplemented, std::string(op) + ": weight dtype " +
                                                  std::string(dtype_name(p.w_dtype)) +
                                                  " (GGUF formats on the GPU: q8_0, q4_0, q4_k, "
                                                  "q5_k, q6_k)");
  }
  if (!gguf && p.w_dtype != DType::kBF16 && p.w_dtype != DType::kI8 &&
      p.w_dtype != DType::kFP8E4M3) {
    return Status(StatusCode::kUnimplemented, std::string(op) + ": weight dtype " +
                                                  std::string(dtype_name(p.w_dtype)) +
                                                  " (want bf16, i8 or fp8_e4m3)");
  }
  if (p.out_dtype != DType::kF32 && p.out_dtype != DType::kBF16) {
    return Status(StatusCode::kUnimplemented, std::string(op) + ": out dtype " +
                                                  std::string(dtype_name(p.out_dtype)) +
                                                  " (want f32 or bf16)");
  }
  const bool quantized = p.w_dtype == DType::kI8 || p.w_dtype == DType::kFP8E4M3;
  if (quantized && p.w_scale == nullptr) {
    return invalid_argument(op, std::string(dtype_name(p.w_dtype)) + " weights need w_scale");
  }
  if (!quantized && p.w_scale != nullptr) {
    return invalid_argument(op,
                            "w_scale given for " + std::string(dtype_name(p.w_dtype)) + " weights");
  }
  if (gguf && (p.in_features % 256 != 0 || p.w_stride != p.in_features)) {
    return invalid_argument(op, std::string(dtype_name(p.w_dtype)) +
                                    " weights need in_features a multiple of 256 and dense rows "
                                    "(in_features " +
                                    num(p.in_features) + ", w_stride " + num(p.w_stride) + ")");
  }
  if (p.accumulate && p.out_dtype != DType::kF32) {
    return invalid_argument(op, "accumulate needs f32 out");
  }
  if (p.n_tokens < 0 || p.n_tokens > INT32_MAX) {
    return invalid_argument(op, "n_tokens " + num(p.n_tokens) + " outside [0, 2^31)");
  }
  if (p.in_features <= 0 || p.in_features > INT32_MAX || p.in_features % 8 != 0) {
    return invalid_argument(
        op, "in_features " + num(p.in_features) + " is not a positive multiple of 8 below 2^31");
  }
  // Weight rows (2 out_features when gated) index as int in the kernels.
  if (p.out_features <= 0 || p.out_features > INT32_MAX / 2) {
    return invalid_argument(op, "out_features " + num(p.out_features) + " outside [1, 2^30)");
  }
  if (p.x_stride < p.in_features || p.w_stride < p.in_features || p.out_stride < p.out_features) {
    return invalid_argument(
        op, "a row stride is below its row length (x_stride " + num(p.x_stride) + ", w_stride " +
                num(p.w_stride) + " vs in_features " + num(p.in_features) + ", out_stride " +
                num(p.out_stride) + " vs out_features " + num(p.out_features) + ")");
  }
  if (p.n_tokens == 0) return ok_status();
  if (p.x == nullptr || p.w == nullptr || p.out == nullptr) {
    return invalid_argument(op, "null x, w or out");
  }
  // 16-byte loads of x and weight rows.
  if (!is_aligned(p.x, 16) || p.x_stride % 8 != 0) {
    return invalid_argument(
        op, "x rows are not 16-byte aligned (x_stride " + num(p.x_stride) + " elements)");
  }
  if (gguf) {  // any row alignment: the decode kernel takes 16-byte aligned rows, the rest
               // goes through the dequantizer
    if (!is_aligned(p.w, 2)) return invalid_argument(op, "GGUF weights are not 2-byte aligned");
    return ok_status();
  }
  const int64_t w_row_bytes = p.w_stride * (quantized ? 1 : 2);
  if (!is_aligned(p.w, 16) || w_row_bytes % 16 != 0) {
    return invalid_argument(
        op, "weight rows are not 16-byte aligned (w_stride " + num(p.w_stride) + " elements)");
  }
  return ok_status();
}

namespace sbi {

Status sbi_gemm_with_m_tiles(const LaunchCtx& ctx, const GpuLinearParams& p, int m_tiles) {
  STRATA_RETURN_IF_ERROR(check_gpu_linear("sbi_gemm", p));
  if (dtype_info(p.w_dtype).is_quantized) return gguf_linear(ctx, p);  // GGUF blocks
  if (m_tiles != 0 && m_tiles != 1 && m_tiles != 2 && m_tiles != 4) {
    return invalid_argument("sbi_gemm", "m_tiles " + std::to_string(m_tiles) + " not 0, 1, 2, 4");
  }
  if (p.n_tokens == 0) return ok_status();
  const bool quantized = p.w_dtype != DType::kBF16;
  const int64_t out_elem = p.out_dtype == DType::kF32 ? 4 : 2;
  const int sms = ctx.sm_count > 0 ? ctx.sm_count : kDefaultSmCount;
  const int m = static_cast<int>(p.out_features);

  Args a;
  a.x_stride = p.x_stride;
  a.w = static_cast<const uint8_t*>(p.w);
  a.w_stride_bytes = p.w_stride * (quantized ? 1 : 2);
  a.w_scale = p.w_scale;
  a.bias = p.bias;
  a.out_stride = p.out_stride;
  a.out_bf16 = p.out_dtype == DType::kBF16;
  a.accumulate = p.accumulate;
  a.gated = p.gated_silu;
  a.k = static_cast<int>(p.in_features);
  a.m = m;
  const int prefetch =
      env_config().sbi_prefetch >= 0 ? env_config().sbi_prefetch : kDefaultPrefetch;
  a.prefetch = prefetch;
  for (int64_t t0 = 0; t0 < p.n_tokens; t0 += kMaxLaunchTokens) {
    const int n = static_cast<int>(std::min<int64_t>(kMaxLaunchTokens, p.n_tokens - t0));
    a.x = p.x + t0 * p.x_stride;
    a.out = static_cast<char*>(p.out) + t0 * p.out_stride * out_elem;
    a.n_tokens = n;

    Config c;
    c.n_tiles = n <= 8 ? 1 : n <= 16 ? 2 : n <= 32 ? 4 : 8;
    int mt = m_tiles;
    if (mt == 0) {
      mt = !p.gated_silu && (c.n_tiles == 2 || c.n_tiles == 4) ? 2 : 1;
      while (mt > 1 && ceil_div(m, 16 * mt) < kMinBlocksPerSm * sms) mt /= 2;
    }
    c.tiles = p.gated_silu ? 2 * mt : mt;
    if (p.w_dtype == DType::kBF16) {
      STRATA_RETURN_IF_ERROR(launch_bf16(ctx, a, c));
    } else if (p.w_dtype == DType::kI8) {
      STRATA_RETURN_IF_ERROR(launch_i8(ctx, a, c));
    } else {
      STRATA_RETURN_IF_ERROR(launch_fp8(ctx, a, c));
    }
  }
  return ok_status();
}

}  // namespace sbi

Status sbi_gemm(const LaunchCtx& ctx, const GpuLinearParams& p) {
  return sbi::sbi_gemm_with_m_tiles(ctx, p, 0);
}

int64_t sbi_max_tokens() {
  return sbi::kMaxTokensDefault;
}

}  // namespace strata::cuda
