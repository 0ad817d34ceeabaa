// LaunchCtx: everything a CUDA launcher needs besides its Params, injected by the caller
// (FasterTransformer habit: stream, cuBLAS handle and workspace come from the owner, never from
// globals). CudaDevice creates and owns the stream, handle and workspace; a LaunchCtx is a plain,
// non-owning value that is cheap to copy (e.g. to run on a second stream with the same handle).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <memory>

namespace strata::cuda {

// cuBLASLt's chosen algorithms per GEMM shape (backends/cuda/linear.cpp). One per CudaDevice: the
// plans belong to the context that tuned them, not to the process.
struct CublasLtPlanCache;
std::shared_ptr<CublasLtPlanCache> make_cublaslt_plan_cache();

struct LaunchCtx {
  cudaStream_t stream = nullptr;        // every launch and async copy goes on this stream
  cublasLtHandle_t cublaslt = nullptr;  // for GEMMs; usable on any stream of this device
  void* workspace = nullptr;            // device scratch for cuBLASLt (and split-K style kernels)
  size_t workspace_bytes = 0;
  CublasLtPlanCache* lt_plans = nullptr;  // owned by the CudaDevice; required by cuBLASLt GEMMs
  int device_index = 0;                   // the CUDA ordinal the stream belongs to
  // Device properties launchers size grids and shared memory from.
  int sm_count = 0;  // multiprocessors (persistent grids)
  int cc_major = 0;  // compute capability, e.g. 9.0 for H100/H200
  int cc_minor = 0;
  size_t max_smem_per_block_optin = 0;  // bytes a block may get after cudaFuncSetAttribute
  size_t l2_bytes = 0;
  // Ranks of one process on GPUs of their own whose programs meet (expert parallelism with
  // tensor parallelism): called by every rank, after draining its stream, before it first runs a
  // cuBLASLt GEMM shape, so that no GPU sits in a collective while cuBLASLt loads a kernel
  // library (that load waits for every GPU of the process to go idle; see linear.cpp). false:
  // the ranks were aborted. Owned by the CudaDevice; null when not needed.
  const std::function<bool()>* first_use_barrier = nullptr;
};

}  // namespace strata::cuda
