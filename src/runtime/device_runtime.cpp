#include "runtime/device_runtime.h"

#include <thread>

#include "core/status.h"

namespace strata {

namespace {

class CpuRuntime final : public DeviceRuntime {
 public:
  CpuRuntime() { ctx_.device = Device::cpu(); }
  Device device() const override { return Device::cpu(); }
  std::string name() const override {
    return "CPU (" + std::to_string(std::thread::hardware_concurrency()) + " threads)";
  }
  ops::Context& ctx() override { return ctx_; }
  Allocator& allocator() override { return alloc_; }
  Result<Buffer> allocate_staging(size_t bytes) override { return allocate_host(bytes); }
  Result<DeviceMemoryInfo> memory_info() const override { return DeviceMemoryInfo{}; }
  Status make_current() override { return ok_status(); }
  size_t attention_workspace_bytes(int64_t, int64_t, int64_t, int64_t) const override {
    return 0;
  }
  Status run(bool, std::pair<int64_t, int64_t>, const std::function<Status()>& body) override {
    return body();
  }
  bool supports_graphs() const override { return false; }
  int64_t graph_captures() const override { return 0; }
  int64_t graph_replays() const override { return 0; }

 private:
  ops::Context ctx_;
  HostAllocator alloc_;
};

}  // namespace

Result<std::unique_ptr<DeviceRuntime>> DeviceRuntime::create(Device device, bool profile) {
  if (device.is_cpu()) return std::unique_ptr<DeviceRuntime>(new CpuRuntime());
  return make_cuda_runtime(device.index, profile);
}

#if !STRATA_HAS_CUDA
Result<std::unique_ptr<DeviceRuntime>> make_cuda_runtime(int, bool) {
  return Status(StatusCode::kUnimplemented,
                "this strata was built without CUDA (configure with -DSTRATA_CUDA=ON on a machine "
                "with the CUDA toolkit)");
}
#endif

}  // namespace strata
