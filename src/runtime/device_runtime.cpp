#include "runtime/device_runtime.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "core/status.h"

namespace strata {

namespace {

// The CPU's copies are immediate: the compute before them has finished, the compute after them
// has not started.
class CpuCopier final : public WeightCopier {
 public:
  Status copy(int, void* dst, const void* src, size_t bytes, int) override {
    std::memcpy(dst, src, bytes);
    return ok_status();
  }
  Status wait_ready(int) override { return ok_status(); }
  Status mark_free(int) override { return ok_status(); }
  Status wait_staging(int) override { return ok_status(); }
  Status synchronize() override { return ok_status(); }
};

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
  Result<std::unique_ptr<WeightCopier>> make_weight_copier(int, int) override {
    return std::unique_ptr<WeightCopier>(new CpuCopier());
  }
  size_t attention_workspace_bytes(int64_t, int64_t, int64_t, int64_t) const override { return 0; }
  Status run(bool, std::pair<int64_t, int64_t>, const std::function<Status()>& body) override {
    return body();
  }
  bool supports_graphs() const override { return false; }
  Result<double> time_ms(const std::function<Status()>& fn, int warmup, int iters) override {
    for (int i = 0; i < warmup; ++i) STRATA_RETURN_IF_ERROR(fn());
    std::vector<double> ms;
    for (int i = 0; i < iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      STRATA_RETURN_IF_ERROR(fn());
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    if (ms.empty()) return 0.0;
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }
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
int cuda_device_count() {
  return 0;
}
bool cuda_lazy_module_loading() {
  return false;
}
#endif

}  // namespace strata
