// GGUF Q8_0 weights on the GPU: the decode kernel and the dequantizer (gguf_gemv.cuh; one format
// per translation unit so CI's two cores compile them in parallel).
#include "backends/cuda/kernels/gguf_gemv.cuh"

namespace strata::cuda::gguf {

Status gemv_q8_0(const LaunchCtx& ctx, const sbi::Args& a) {
  return gemv_launch<DType::kQ8_0>(ctx, a);
}

Status dequant_q8_0(const LaunchCtx& ctx, const uint8_t* w, int64_t row_bytes, int64_t rows,
                    int64_t k, uint16_t* out, int64_t out_stride) {
  return dequant_launch<DType::kQ8_0>(ctx, w, row_bytes, rows, k, out, out_stride);
}

}  // namespace strata::cuda::gguf
