// Where a tensor's memory lives, and the interface each backend's device implements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "strata/status.h"

namespace strata {

enum class DeviceKind : uint8_t { kCpu, kCuda };

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;

  static Device cpu() { return {DeviceKind::kCpu, 0}; }
  static Device cuda(int i) { return {DeviceKind::kCuda, i}; }
  bool is_cpu() const { return kind == DeviceKind::kCpu; }
  bool is_cuda() const { return kind == DeviceKind::kCuda; }
  bool operator==(const Device&) const = default;
  std::string to_string() const;
};

// Memory numbers a device reports, for "needed vs free" errors and the planner.
struct DeviceMemoryInfo {
  size_t total_bytes = 0;
  size_t free_bytes = 0;
};

// A compute device: what a backend implements so the runtime can ask about it without knowing
// its API. Capability queries follow llama.cpp's backend interface (supports_op by name).
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;  // "cpu (2 threads)", "NVIDIA H100 80GB HBM3"
  virtual Result<DeviceMemoryInfo> memory_info() const = 0;
  virtual Status synchronize() = 0;
};

}  // namespace strata
