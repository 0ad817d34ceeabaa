// CudaDevice: one GPU as a strata::DeviceBackend. It owns the stream, the cuBLASLt handle and the
// cuBLASLt workspace that every launcher receives through launch_ctx(); nothing CUDA is global.
// Creating one on a machine without a GPU or driver fails with a Status ("no CUDA device: ...").
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "backends/cuda/launch_ctx.h"
#include "core/device.h"
#include "strata/status.h"

namespace strata::cuda {

// CUDA devices visible to this process; 0 when there is no GPU or no driver. Never fails.
int cuda_device_count();

struct CudaDeviceOptions {
  // Device scratch for cuBLASLt, allocated once at creation (32 MiB is what NVIDIA recommends
  // for Hopper GEMMs).
  size_t workspace_bytes = size_t{32} << 20;
};

class CudaDevice final : public DeviceBackend {
 public:
  // Selects device `index` (cudaSetDevice), reads its properties, creates a non-blocking stream,
  // a cuBLASLt handle and the workspace. Errors: kNotFound "no CUDA device: <reason>" without a
  // GPU/driver, kOutOfRange for an index past the visible devices, kInternal/kOutOfMemory when a
  // CUDA call fails (the message names the call).
  static Result<std::unique_ptr<CudaDevice>> create(int index, const CudaDeviceOptions& options);
  static Result<std::unique_ptr<CudaDevice>> create(int index) {
    return create(index, CudaDeviceOptions{});
  }
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  Device device() const override { return Device::cuda(ctx_.device_index); }
  std::string name() const override { return name_; }     // "NVIDIA H100 80GB HBM3"
  Result<DeviceMemoryInfo> memory_info() const override;  // cudaMemGetInfo
  Status synchronize() override;  // waits for all work this process queued on the device

  // Stream, cuBLASLt handle, workspace and properties for launchers; valid while this lives.
  const LaunchCtx& launch_ctx() const { return ctx_; }
  int index() const { return ctx_.device_index; }
  // Makes this device current on the calling thread (each host thread must, before launching).
  Status make_current() const;
  // Grows the cuBLASLt workspace (LaunchCtx::workspace) to at least `bytes`: drains the stream and
  // reallocates. Call before anything captures the workspace's address in a CUDA graph.
  Status reserve_workspace(size_t bytes);
  // LaunchCtx::first_use_barrier (empty: none).
  void set_first_use_barrier(std::function<bool()> f) {
    first_use_barrier_ = std::move(f);
    ctx_.first_use_barrier = first_use_barrier_ ? &first_use_barrier_ : nullptr;
  }

 private:
  CudaDevice() = default;

  LaunchCtx ctx_;
  std::shared_ptr<CublasLtPlanCache> lt_plans_;
  std::function<bool()> first_use_barrier_;
  std::string name_;
};

}  // namespace strata::cuda
