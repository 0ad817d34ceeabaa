#include "backends/cuda/cuda_check.h"

#include <cstdlib>

#include "backends/cuda/launch_ctx.h"
#include "core/env.h"

#include <string>

namespace strata::cuda {

namespace {

std::string where(const char* call, const char* file, int line) {
  return std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": ";
}

}  // namespace

Status cuda_error_status(cudaError_t err, const char* call, const char* file, int line) {
  const StatusCode code =
      err == cudaErrorMemoryAllocation ? StatusCode::kOutOfMemory : StatusCode::kInternal;
  return Status(
      code, where(call, file, line) + cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")");
}

Status cublas_error_status(cublasStatus_t st, const char* call, const char* file, int line) {
  const StatusCode code =
      st == CUBLAS_STATUS_ALLOC_FAILED ? StatusCode::kOutOfMemory : StatusCode::kInternal;
  return Status(code, where(call, file, line) + cublasLtGetStatusString(st) + " (" +
                          cublasLtGetStatusName(st) + ")");
}

Status kernel_launch_status(const char* kernel_name) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return ok_status();
  return Status(StatusCode::kInternal, std::string(kernel_name) +
                                           " launch failed: " + cudaGetErrorString(err) + " (" +
                                           cudaGetErrorName(err) + ")");
}

bool pdl_enabled(const LaunchCtx& ctx) {
  return !env_config().no_pdl && ctx.cc_major >= 9;
}

}  // namespace strata::cuda
