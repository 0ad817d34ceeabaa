#include "backends/cuda/cuda_device.h"

#include "backends/cuda/cuda_check.h"
#include "core/log.h"
#include "core/status.h"

namespace strata::cuda {

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // leave no error behind for the next launch check
    return 0;
  }
  return count;
}

Result<std::unique_ptr<CudaDevice>> CudaDevice::create(int index,
                                                       const CudaDeviceOptions& options) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    // No driver, a driver older than the toolkit, or no device: one line that says so, rather
    // than CUDA's "CUDA driver version is insufficient for CUDA runtime version" alone.
    return errorf(StatusCode::kNotFound,
                  "--device cuda: no usable NVIDIA GPU on this machine ({}); use --device cpu",
                  cudaGetErrorString(err));
  }
  if (count == 0) {
    return errorf(StatusCode::kNotFound,
                  "--device cuda: no NVIDIA GPU on this machine; use --device cpu");
  }
  if (index < 0 || index >= count) {
    return errorf(StatusCode::kOutOfRange, "CUDA device {} requested but {} device(s) visible",
                  index, count);
  }

  // Owned from here on: an early return releases whatever was created so far.
  std::unique_ptr<CudaDevice> dev(new CudaDevice());
  LaunchCtx& ctx = dev->ctx_;
  ctx.device_index = index;
  STRATA_CUDA_RETURN_IF_ERROR(cudaSetDevice(index));

  cudaDeviceProp props{};
  STRATA_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&props, index));
  dev->name_ = props.name;
  ctx.sm_count = props.multiProcessorCount;
  ctx.cc_major = props.major;
  ctx.cc_minor = props.minor;
  ctx.max_smem_per_block_optin = props.sharedMemPerBlockOptin;
  ctx.l2_bytes = static_cast<size_t>(props.l2CacheSize);

  // NOTE: non-blocking so the legacy default stream never serializes with ours (and CUDA-graph
  // capture on it is not disturbed by other libraries' default-stream work).
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking));
  STRATA_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&ctx.cublaslt));
  dev->lt_plans_ = make_cublaslt_plan_cache();
  ctx.lt_plans = dev->lt_plans_.get();
  if (options.workspace_bytes > 0) {
    STRATA_CUDA_RETURN_IF_ERROR(cudaMalloc(&ctx.workspace, options.workspace_bytes));
    ctx.workspace_bytes = options.workspace_bytes;
  }
  log_debug("cuda:{}: {} (sm_{}{}, {} SMs), workspace {} bytes", index, dev->name_, ctx.cc_major,
            ctx.cc_minor, ctx.sm_count, ctx.workspace_bytes);
  return dev;
}

CudaDevice::~CudaDevice() {
  // Errors are dropped: a destructor cannot return them, and at process exit the runtime may
  // already be unloading (cudaErrorCudartUnloading).
  if (cudaSetDevice(ctx_.device_index) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  if (ctx_.stream != nullptr) (void)cudaStreamSynchronize(ctx_.stream);
  if (ctx_.workspace != nullptr) (void)cudaFree(ctx_.workspace);
  if (ctx_.cublaslt != nullptr) (void)cublasLtDestroy(ctx_.cublaslt);
  if (ctx_.stream != nullptr) (void)cudaStreamDestroy(ctx_.stream);
  (void)cudaGetLastError();
}

Status CudaDevice::reserve_workspace(size_t bytes) {
  if (bytes <= ctx_.workspace_bytes) return ok_status();
  STRATA_RETURN_IF_ERROR(make_current());
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx_.stream));
  void* p = nullptr;
  STRATA_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
  if (ctx_.workspace != nullptr) STRATA_CUDA_RETURN_IF_ERROR(cudaFree(ctx_.workspace));
  ctx_.workspace = p;
  ctx_.workspace_bytes = bytes;
  log_debug("cuda:{}: workspace grown to {} bytes", ctx_.device_index, bytes);
  return ok_status();
}

Status CudaDevice::make_current() const {
  STRATA_CUDA_RETURN_IF_ERROR(cudaSetDevice(ctx_.device_index));
  return ok_status();
}

Result<DeviceMemoryInfo> CudaDevice::memory_info() const {
  STRATA_RETURN_IF_ERROR(make_current());
  DeviceMemoryInfo info;
  const cudaError_t err = cudaMemGetInfo(&info.free_bytes, &info.total_bytes);
  if (err != cudaSuccess) {
    return cuda_error_status(err, "cudaMemGetInfo(&free, &total)", __FILE__, __LINE__);
  }
  return info;
}

Status CudaDevice::synchronize() {
  STRATA_RETURN_IF_ERROR(make_current());
  STRATA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return ok_status();
}

}  // namespace strata::cuda
