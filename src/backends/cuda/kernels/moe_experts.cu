// The grouped expert MLP of the device layout (backends/moe_params.h, MoeExpertsParams; CPU
// twin cpu::moe_experts): argument checks, then two grouped GEMMs over the stacked experts, both
// reading the group sizes on the device (graph-capturable, no host sync):
//   gate/up  act = bf16(silu(x Wg^T s) * (x Wu^T s'))    SiLU * up in the GEMM's epilogue
//   down     y_perm = (act Wd^T) s                        f32 or bf16 (y_dtype)
// Decode-size groups (the host bound max_rows_per_expert <= kMoeSbiMaxRows) run on the grouped
// SBI-GeMM (moe_sbi.cuh: blocks for the experts with rows only, each chosen expert's weights read
// once); larger ones on the tiled tensor-core GEMMs (moe_gemm_bf16.cu for bf16 weights,
// moe_gemm.cu for 8-bit ones). All round where the twin does (f32 sums, one bf16 rounding of
// act), so they differ from it only in summation order.
#include <cstdint>
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/kernels/moe_experts.h"

namespace strata::cuda {
namespace {

std::string num(int64_t v) {
  return std::to_string(v);
}

Status check(const MoeExpertsParams& p) {
  constexpr const char* kOp = "moe_experts";
  if (p.w_dtype != DType::kBF16 && p.w_dtype != DType::kI8 && p.w_dtype != DType::kFP8E4M3) {
    return Status(StatusCode::kUnimplemented, std::string(kOp) + ": weight dtype " +
                                                  std::string(dtype_name(p.w_dtype)) +
                                                  " (want bf16, i8 or fp8_e4m3)");
  }
  const bool quantized = p.w_dtype != DType::kBF16;
  if (quantized != (p.gate_up_scale != nullptr) || quantized != (p.down_scale != nullptr)) {
    return invalid_argument(kOp, "row scales must be given exactly for int8 / fp8 weights");
  }
  if (p.n_experts < 1 || p.n_experts > 65535) {
    return invalid_argument(kOp, num(p.n_experts) + " experts outside [1, 65535]");
  }
  if (p.n_rows < 0 || p.n_rows > INT32_MAX) {
    return invalid_argument(kOp, num(p.n_rows) + " rows outside [0, 2^31)");
  }
  if (p.hidden < 1 || p.ffn < 1 || p.hidden > INT32_MAX / 2 || p.ffn > INT32_MAX / 2) {
    return invalid_argument(
        kOp, "hidden " + num(p.hidden) + " / ffn " + num(p.ffn) + " outside [1, 2^30)");
  }
  // 16-byte loads of x, act and weight rows: 8 bf16 or 16 8-bit values.
  const int64_t align = quantized ? 16 : 8;
  if (p.hidden % align != 0 || p.ffn % align != 0) {
    return Status(StatusCode::kUnimplemented,
                  std::string(kOp) + ": hidden " + num(p.hidden) + " and ffn " + num(p.ffn) +
                      " must be multiples of " + num(align) + " for " +
                      std::string(dtype_name(p.w_dtype)) + " experts (16-byte loads)");
  }
  if (p.y_dtype != DType::kF32 && p.y_dtype != DType::kBF16) {
    return invalid_argument(
        kOp, "y dtype " + std::string(dtype_name(p.y_dtype)) + " (want f32 or bf16)");
  }
  if (p.gate_up_expert_stride < 2 * p.ffn * p.hidden || p.down_expert_stride < p.hidden * p.ffn) {
    return invalid_argument(kOp, "an expert stride is below its matrix's size");
  }
  if (p.n_rows == 0) return ok_status();
  if (p.x_perm == nullptr || p.offsets == nullptr || p.gate_up == nullptr || p.down == nullptr ||
      p.act == nullptr || p.y_perm == nullptr) {
    return invalid_argument(kOp, "null x_perm, offsets, weights, act or y_perm");
  }
  const int64_t esize = quantized ? 1 : 2;
  if (!is_aligned(p.x_perm, 16) || !is_aligned(p.act, 16) || !is_aligned(p.gate_up, 16) ||
      !is_aligned(p.down, 16) || (p.gate_up_expert_stride * esize) % 16 != 0 ||
      (p.down_expert_stride * esize) % 16 != 0) {
    return invalid_argument(kOp, "x_perm, act and the expert weights must be 16-byte aligned");
  }
  return ok_status();
}

Status run_sbi(const LaunchCtx& ctx, DType wdt, const sbi::MoeSbiArgs& g, int n_tiles) {
  if (wdt == DType::kBF16) return sbi::moe_sbi_bf16(ctx, g, n_tiles);
  if (wdt == DType::kI8) return sbi::moe_sbi_i8(ctx, g, n_tiles);
  return sbi::moe_sbi_fp8(ctx, g, n_tiles);
}

}  // namespace

Status moe_experts(const LaunchCtx& ctx, const MoeExpertsParams& p) {
  STRATA_RETURN_IF_ERROR(check(p));
  if (p.n_rows == 0) return ok_status();
  const int64_t esize = p.w_dtype == DType::kBF16 ? 2 : 1;
  const int64_t bound = p.max_rows_per_expert > 0 && p.max_rows_per_expert < p.n_rows
                            ? p.max_rows_per_expert
                            : p.n_rows;
  if (bound <= kMoeSbiMaxRows) {
    const int n_tiles = bound <= 8 ? 1 : bound <= 16 ? 2 : bound <= 32 ? 4 : 8;
    sbi::MoeSbiArgs g;
    g.offsets = p.offsets;
    g.n_rows = static_cast<int>(p.n_rows);
    g.n_experts = static_cast<int>(p.n_experts);
    sbi::Args& a = g.base;
    a.x = p.x_perm;
    a.x_stride = p.hidden;
    a.w = static_cast<const uint8_t*>(p.gate_up);
    a.w_stride_bytes = p.hidden * esize;
    a.w_scale = p.gate_up_scale;
    a.out = p.act;
    a.out_stride = p.ffn;
    a.out_bf16 = true;
    a.gated = true;
    a.k = static_cast<int>(p.hidden);
    a.m = static_cast<int>(p.ffn);
    g.w_expert_bytes = p.gate_up_expert_stride * esize;
    g.scale_expert = 2 * p.ffn;
    STRATA_RETURN_IF_ERROR(run_sbi(ctx, p.w_dtype, g, n_tiles));
    a.x = p.act;
    a.x_stride = p.ffn;
    a.w = static_cast<const uint8_t*>(p.down);
    a.w_stride_bytes = p.ffn * esize;
    a.w_scale = p.down_scale;
    a.out = p.y_perm;
    a.out_stride = p.hidden;
    a.out_bf16 = p.y_dtype == DType::kBF16;
    a.gated = false;
    a.k = static_cast<int>(p.ffn);
    a.m = static_cast<int>(p.hidden);
    g.w_expert_bytes = p.down_expert_stride * esize;
    g.scale_expert = p.hidden;
    return run_sbi(ctx, p.w_dtype, g, n_tiles);
  }
  MoeGemmArgs a;
  a.x = p.x_perm;
  a.w = static_cast<const uint8_t*>(p.gate_up);
  a.w_row_bytes = p.hidden * esize;
  a.w_expert_bytes = p.gate_up_expert_stride * esize;
  a.w_scale = p.gate_up_scale;
  a.scale_expert = 2 * p.ffn;
  a.out = p.act;
  a.offsets = p.offsets;
  a.n_rows = static_cast<int>(p.n_rows);
  a.n_experts = static_cast<int>(p.n_experts);
  a.k = static_cast<int>(p.hidden);
  a.m = static_cast<int>(p.ffn);
  a.gated = true;
  // bf16 experts on the pipelined tile (moe_gemm_bf16.cu), 8-bit ones converted on the way into
  // the plain tile (moe_gemm.cu).
  auto gemm = [&](const MoeGemmArgs& g) {
    return p.w_dtype == DType::kBF16 ? moe_gemm_bf16(ctx, g) : moe_gemm(ctx, g, p.w_dtype);
  };
  STRATA_RETURN_IF_ERROR(gemm(a));
  a.x = p.act;
  a.w = static_cast<const uint8_t*>(p.down);
  a.w_row_bytes = p.ffn * esize;
  a.w_expert_bytes = p.down_expert_stride * esize;
  a.w_scale = p.down_scale;
  a.scale_expert = p.hidden;
  a.out = p.y_perm;
  a.out_bf16 = p.y_dtype == DType::kBF16;
  a.k = static_cast<int>(p.ffn);
  a.m = static_cast<int>(p.hidden);
  a.gated = false;
  return gemm(a);
}

}  // namespace strata::cuda
