// Grouped SBI-GeMM expert kernels for i8 weights (the template is in moe_sbi.cuh; one weight
// format per translation unit so CI's two cores compile them in parallel).
#include "backends/cuda/kernels/moe_sbi.cuh"

namespace strata::cuda::sbi {

Status moe_sbi_i8(const LaunchCtx& ctx, const MoeSbiArgs& g, int n_tiles) {
  return moe_sbi_launch<WFormat::kI8>(ctx, g, n_tiles);
}

}  // namespace strata::cuda::sbi
