// The GPU linear layer for GGUF block-format weights (see gguf_linear in gpu_linear_internal.h):
// the decode kernel up to 64 tokens (it reads the blocks once per call), else tiles of rows
// dequantized to bf16 and the bf16 linear.
//
// NOTE: the prefill path writes and re-reads every weight as bf16 (4 bytes of traffic per weight
// on top of the blocks) and allocates its tile per call from the stream-ordered pool; a GEMM
// reading the blocks itself (dequantizing into shared memory) would save both. Correctness first.
#include <algorithm>
#include <cstdint>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/gpu_linear_internal.h"
#include "core/status.h"

namespace strata::cuda {

namespace gguf {

namespace {
constexpr int64_t kTileBytes = int64_t{64} << 20;  // bf16 tile of the prefill path

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}
}  // namespace

Status dequant(const LaunchCtx& ctx, DType dt, const uint8_t* w, int64_t row_bytes, int64_t rows,
               int64_t k, uint16_t* out, int64_t out_stride) {
  switch (dt) {
    case DType::kQ8_0:
      return dequant_q8_0(ctx, w, row_bytes, rows, k, out, out_stride);
    case DType::kQ4_0:
      return dequant_q4_0(ctx, w, row_bytes, rows, k, out, out_stride);
    case DType::kQ4_K:
      return dequant_q4_k(ctx, w, row_bytes, rows, k, out, out_stride);
    case DType::kQ5_K:
      return dequant_q5_k(ctx, w, row_bytes, rows, k, out, out_stride);
    case DType::kQ6_K:
      return dequant_q6_k(ctx, w, row_bytes, rows, k, out, out_stride);
    default:
      return errorf(StatusCode::kUnimplemented, "gguf dequant: no GPU kernel for {}",
                    dtype_name(dt));
  }
}

int64_t tile_rows(int64_t m, int64_t k, bool gated) {
  const int64_t per_row = 2 * k * (gated ? 2 : 1);
  const int64_t rows = std::max<int64_t>(16, kTileBytes / per_row / 16 * 16);
  return std::min(rows, (m + 15) / 16 * 16);
}

bool gemv_eligible(const GpuLinearParams& p) {
  const int64_t row_bytes = dtype_bytes(p.w_dtype, p.w_stride);
  return p.n_tokens <= sbi::kMaxLaunchTokens && row_bytes % 16 == 0 && aligned16(p.w) &&
         p.in_features % 256 == 0;
}

}  // namespace gguf

namespace {

Status gemv(const LaunchCtx& ctx, const GpuLinearParams& p) {
  sbi::Args a;
  a.x = p.x;
  a.x_stride = p.x_stride;
  a.w = static_cast<const uint8_t*>(p.w);
  a.w_stride_bytes = dtype_bytes(p.w_dtype, p.w_stride);
  a.bias = p.bias;
  a.out = p.out;
  a.out_stride = p.out_stride;
  a.out_bf16 = p.out_dtype == DType::kBF16;
  a.accumulate = p.accumulate;
  a.gated = p.gated_silu;
  a.n_tokens = static_cast<int>(p.n_tokens);
  a.k = static_cast<int>(p.in_features);
  a.m = static_cast<int>(p.out_features);
  switch (p.w_dtype) {
    case DType::kQ8_0:
      return gguf::gemv_q8_0(ctx, a);
    case DType::kQ4_0:
      return gguf::gemv_q4_0(ctx, a);
    case DType::kQ4_K:
      return gguf::gemv_q4_k(ctx, a);
    case DType::kQ5_K:
      return gguf::gemv_q5_k(ctx, a);
    case DType::kQ6_K:
      return gguf::gemv_q6_k(ctx, a);
    default:
      return errorf(StatusCode::kUnimplemented, "gguf_linear: no GPU kernel for {}",
                    dtype_name(p.w_dtype));
  }
}

// Tiles of rows: dequantize (gate and up rows side by side when gated), then the bf16 linear.
Status via_tiles(const LaunchCtx& ctx, const GpuLinearParams& p) {
  const int64_t m = p.out_features, k = p.in_features;
  const int64_t row_bytes = dtype_bytes(p.w_dtype, p.w_stride);
  const int64_t tile = gguf::tile_rows(m, k, p.gated_silu);
  const int64_t tile_w_rows = p.gated_silu ? 2 * tile : tile;
  // A gated tile's bias would be [its gate biases | its up biases]: p.bias as it is only when
  // the tile is the whole matrix.
  if (p.gated_silu && p.bias != nullptr && tile < m) {
    return errorf(StatusCode::kUnimplemented,
                  "gguf_linear: gated weights with biases and more than one {}-row tile", tile);
  }
  void* buf = nullptr;
  STRATA_CUDA_RETURN_IF_ERROR(
      cudaMallocAsync(&buf, static_cast<size_t>(tile_w_rows * k * 2), ctx.stream));
  auto* wt = static_cast<uint16_t*>(buf);
  const auto* w = static_cast<const uint8_t*>(p.w);
  const int64_t out_elem = p.out_dtype == DType::kF32 ? 4 : 2;
  Status st = ok_status();
  for (int64_t r0 = 0; r0 < m && st.ok(); r0 += tile) {
    const int64_t n = std::min(tile, m - r0);
    st = gguf::dequant(ctx, p.w_dtype, w + r0 * row_bytes, row_bytes, n, k, wt, k);
    if (st.ok() && p.gated_silu) {
      st = gguf::dequant(ctx, p.w_dtype, w + (m + r0) * row_bytes, row_bytes, n, k, wt + n * k, k);
    }
    if (!st.ok()) break;
    GpuLinearParams q = p;
    q.w = wt;
    q.w_dtype = DType::kBF16;
    q.w_stride = k;
    q.out_features = n;
    q.out = static_cast<char*>(p.out) + r0 * out_elem;
    q.bias = p.bias != nullptr ? p.bias + r0 : nullptr;
    st = linear(ctx, q);
  }
  const cudaError_t e = cudaFreeAsync(buf, ctx.stream);
  STRATA_RETURN_IF_ERROR(st);
  STRATA_CUDA_RETURN_IF_ERROR(e);
  return ok_status();
}

}  // namespace

Status gguf_linear(const LaunchCtx& ctx, const GpuLinearParams& p) {
  STRATA_RETURN_IF_ERROR(check_gpu_linear("gguf_linear", p));
  if (p.n_tokens == 0) return ok_status();
  if (p.gated_silu && p.n_tokens > sbi::kMaxLaunchTokens) {
    return errorf(StatusCode::kInvalidArgument,
                  "gguf_linear: gated_silu with {} tokens (at most {})", p.n_tokens,
                  sbi::kMaxLaunchTokens);
  }
  if (gguf::gemv_eligible(p)) return gemv(ctx, p);
  return via_tiles(ctx, p);
}

}  // namespace strata::cuda
