#include "core/buffer.h"

#include <cstdlib>
#include <cstring>

#include "core/status.h"

namespace strata {

std::string Device::to_string() const {
  switch (kind) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda:" + std::to_string(index);
  }
  return "unknown";
}

Result<Buffer> allocate_host(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = rounded ? std::aligned_alloc(64, rounded) : nullptr;
  if (rounded && !p) {
    return errorf(StatusCode::kOutOfMemory, "host allocation of {} bytes failed", bytes);
  }
  if (p) std::memset(p, 0, rounded);
  std::shared_ptr<void> owner(p, [](void* q) { std::free(q); });
  return Buffer(p, bytes, Device::cpu(), Residency::kHostHeap, std::move(owner));
}

}  // namespace strata
