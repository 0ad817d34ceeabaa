// The streamed 8-bit GEMM for fp8 e4m3 weights and activations (the template is in
// stream8_gemm.cuh; one weight format per translation unit so CI's two cores compile them in
// parallel).
#include "backends/cuda/kernels/stream8_gemm.cuh"

namespace strata::cuda::stream8 {

Status launch_fp8(const LaunchCtx& ctx, const Args& a, int splits) {
  return launch<false>(ctx, a, splits);
}

}  // namespace strata::cuda::stream8
