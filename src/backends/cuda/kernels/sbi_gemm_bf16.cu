// SBI-GeMM kernels for bf16 weights (the template is in sbi_gemm.cuh; one weight format per
// translation unit so CI's two cores compile them in parallel).
#include "backends/cuda/kernels/sbi_gemm.cuh"

namespace strata::cuda::sbi {

Status launch_bf16(const LaunchCtx& ctx, const Args& a, Config c) {
  return sbi_launch<WFormat::kBf16>(ctx, a, c);
}

}  // namespace strata::cuda::sbi
