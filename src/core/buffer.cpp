#include "core/buffer.h"

#include <sys/mman.h>

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
  // NOTE: large buffers (the KV pool, the swap area) are anonymous mappings: zero pages that the
  // kernel commits on first touch, so a pool sized for the worst case costs no memory until used
  // (the memset below made `strata serve` of a 780 KB model hold 2.1 GB).
  constexpr size_t kMapThreshold = size_t{2} << 20;
  if (bytes >= kMapThreshold) {
    const size_t mapped = (bytes + 4095) / 4096 * 4096;
    void* m = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
      return errorf(StatusCode::kOutOfMemory, "host allocation of {} bytes failed", bytes);
    }
    std::shared_ptr<void> owner(m, [mapped](void* q) { ::munmap(q, mapped); });
    return Buffer(m, bytes, Device::cpu(), Residency::kHostHeap, std::move(owner));
  }
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
