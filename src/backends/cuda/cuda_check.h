// Turning CUDA runtime and cuBLAS(Lt) error codes into Status, flashinfer-style: a failed call
// returns its error to the caller with the call's text, file:line and the library's own error
// string. Nothing here exits or aborts.
//
//   STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, n, kind, ctx.stream));
//   STRATA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(...));
//   kernel<<<grid, block, 0, ctx.stream>>>(...);
//   return kernel_launch_status("rms_norm_kernel");
//
// Host-only header: included by .cpp and .cu files of src/backends/cuda, never by src/core.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "strata/status.h"

namespace strata::cuda {

// "<call> failed at <file>:<line>: <cudaGetErrorString> (<cudaGetErrorName>)".
// cudaErrorMemoryAllocation maps to kOutOfMemory; everything else to kInternal.
Status cuda_error_status(cudaError_t err, const char* call, const char* file, int line);

// Same for cuBLAS/cuBLASLt status codes; CUBLAS_STATUS_ALLOC_FAILED maps to kOutOfMemory.
Status cublas_error_status(cublasStatus_t st, const char* call, const char* file, int line);

// After a kernel launch: the launch error (bad configuration, no kernel image for this GPU,
// a sticky error from earlier work) as "<kernel> launch failed: <cudaGetErrorString> (<name>)".
// Clears the runtime's last-error slot, like cudaGetLastError.
Status kernel_launch_status(const char* kernel_name);

}  // namespace strata::cuda

#define STRATA_CUDA_RETURN_IF_ERROR(call)                                                    \
  do {                                                                                       \
    const cudaError_t strata_cuda_err_ = (call);                                             \
    if (strata_cuda_err_ != cudaSuccess) {                                                   \
      return ::strata::cuda::cuda_error_status(strata_cuda_err_, #call, __FILE__, __LINE__); \
    }                                                                                        \
  } while (0)

#define STRATA_CUBLAS_RETURN_IF_ERROR(call)                                                     \
  do {                                                                                          \
    const cublasStatus_t strata_cublas_st_ = (call);                                            \
    if (strata_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                                           \
      return ::strata::cuda::cublas_error_status(strata_cublas_st_, #call, __FILE__, __LINE__); \
    }                                                                                           \
  } while (0)
