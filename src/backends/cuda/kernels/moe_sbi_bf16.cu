// Grouped SBI-GeMM expert kernels for bf16 weights (the template is in moe_sbi.cuh; one weight
// format per translation unit so CI's two cores compile them in parallel).
#include "backends/cuda/kernels/moe_sbi.cuh"

namespace strata::cuda::sbi {

Status moe_sbi_bf16(const LaunchCtx& ctx, const MoeSbiArgs& g, int n_tiles) {
  return moe_sbi_launch<WFormat::kBf16>(ctx, g, n_tiles);
}

}  // namespace strata::cuda::sbi
