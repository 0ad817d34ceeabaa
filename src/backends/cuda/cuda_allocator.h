// Device memory for strata: a pool carved out of one cudaMalloc arena, and page-locked host
// buffers.
//
// CudaPoolAllocator reserves its arena once, at creation, with a size the caller chooses (e.g. a
// fraction of CudaDevice::memory_info().free_bytes); after that allocate() and the release of a
// Buffer only update a FreeList under a mutex, so no cudaMalloc/cudaFree happens on the hot path.
// A Buffer's owner returns its block to the pool when the last copy of the Buffer goes away; the
// arena itself lives until the allocator and every Buffer from it are gone.
//
// NOTE: a released block may be handed out again at once, while kernels queued earlier may still
// be using it. That is safe when all work runs on one stream (it is ordered after them); work on
// other streams must be synchronized before dropping its Buffers.
#pragma once

#include <cstddef>
#include <memory>

#include "core/buffer.h"
#include "strata/status.h"

namespace strata::cuda {

struct CudaPoolStats {
  size_t capacity_bytes = 0;      // arena size
  size_t used_bytes = 0;          // in live blocks (rounded to the alignment)
  size_t free_bytes = 0;          // capacity - used
  size_t largest_free_block = 0;  // the largest request that can succeed now
  size_t free_blocks = 0;         // > 1 means the free space is fragmented
};

class CudaPoolAllocator final : public Allocator {
 public:
  static constexpr size_t kAlignment = 256;  // every block starts 256-byte aligned

  // One cudaMalloc of `arena_bytes` on device `device_index` (made current). kOutOfMemory names
  // the bytes asked for and the bytes the device has free.
  static Result<std::unique_ptr<CudaPoolAllocator>> create(int device_index, size_t arena_bytes);
  ~CudaPoolAllocator() override;
  CudaPoolAllocator(const CudaPoolAllocator&) = delete;
  CudaPoolAllocator& operator=(const CudaPoolAllocator&) = delete;

  // A block of at least `bytes` (uninitialized; zero bytes gives an empty Buffer). Fails with
  // kOutOfMemory naming the request, the pool's free bytes and its largest free block.
  Result<Buffer> allocate(size_t bytes) override;
  Device device() const override;
  CudaPoolStats stats() const;

 private:
  struct Arena;
  explicit CudaPoolAllocator(std::shared_ptr<Arena> arena);

  std::shared_ptr<Arena> arena_;
};

// Device memory straight from cudaMalloc, one allocation per Buffer, freed with cudaFree when the
// last copy of the Buffer goes: for memory sized once at load (weights, the KV pool, workspaces),
// where a pool's arena would have to be sized before the model is known. kOutOfMemory names what
// was being allocated (`what`), the GiB asked for and the GiB the device has free.
class CudaMallocAllocator final : public Allocator {
 public:
  explicit CudaMallocAllocator(int device_index) : device_index_(device_index) {}
  Result<Buffer> allocate(size_t bytes) override { return allocate(bytes, "device memory"); }
  Result<Buffer> allocate(size_t bytes, const char* what);
  Device device() const override { return Device::cuda(device_index_); }

 private:
  int device_index_;
};

// Page-locked host memory (cudaHostAlloc, portable: pinned for every device), Residency
// kHostPinned, zero-initialized, released with cudaFreeHost. Pinning is slow (milliseconds):
// use it for long-lived staging buffers and host-resident weights, not per step.
Result<Buffer> allocate_pinned_host(size_t bytes);

class CudaPinnedHostAllocator final : public Allocator {
 public:
  Result<Buffer> allocate(size_t bytes) override { return allocate_pinned_host(bytes); }
  Device device() const override { return Device::cpu(); }
};

}  // namespace strata::cuda
