// Buffer: owning handle to a block of memory on some device. What owns it (an aligned heap
// block, a memory-mapped file, a CUDA pool block) is type-erased in `owner_`; copies share it.
// Weight residency (GPU, pinned host, disk-backed mmap) is a property of the buffer.
#pragma once

#include <cstddef>
#include <memory>

#include "core/device.h"
#include "strata/status.h"

namespace strata {

enum class Residency : uint8_t { kHostHeap, kHostMapped, kHostPinned, kDevice };

class Buffer {
 public:
  Buffer() = default;
  Buffer(void* data, size_t bytes, Device device, Residency residency, std::shared_ptr<void> owner)
      : data_(data),
        bytes_(bytes),
        device_(device),
        residency_(residency),
        owner_(std::move(owner)) {}

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  Residency residency() const { return residency_; }
  bool empty() const { return data_ == nullptr; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  Residency residency_ = Residency::kHostHeap;
  std::shared_ptr<void> owner_;
};

// Allocator interface: each backend provides one (CPU: aligned heap; CUDA: device pool).
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Result<Buffer> allocate(size_t bytes) = 0;
  virtual Device device() const = 0;
};

// 64-byte aligned host memory, zero-initialized. Fails with kOutOfMemory naming the size.
Result<Buffer> allocate_host(size_t bytes);

class HostAllocator final : public Allocator {
 public:
  Result<Buffer> allocate(size_t bytes) override { return allocate_host(bytes); }
  Device device() const override { return Device::cpu(); }
};

}  // namespace strata
