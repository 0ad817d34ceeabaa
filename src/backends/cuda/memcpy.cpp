// Host <-> device copies and stream waits for the ops layer (ops::upload / download /
// synchronize), so that code above the backends never calls the CUDA runtime itself.
#include <cuda_runtime.h>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"

namespace strata::cuda {

Status copy_h2d(const LaunchCtx& ctx, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return ok_status();
  STRATA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx.stream));
  return ok_status();
}

Status copy_d2h(const LaunchCtx& ctx, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return ok_status();
  STRATA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx.stream));
  return ok_status();
}

Status copy_d2d_on_stream(void* stream, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return ok_status();
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                              static_cast<cudaStream_t>(stream)));
  return ok_status();
}

Status stream_synchronize(const LaunchCtx& ctx) {
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
  return ok_status();
}

}  // namespace strata::cuda
