// The streamed 8-bit GEMM for int8 weights and activations (exact int32 sums; the template is in
// stream8_gemm.cuh).
#include "backends/cuda/kernels/stream8_gemm.cuh"

namespace strata::cuda::stream8 {

Status launch_i8(const LaunchCtx& ctx, const Args& a, int splits) {
  return launch<true>(ctx, a, splits);
}

}  // namespace strata::cuda::stream8
