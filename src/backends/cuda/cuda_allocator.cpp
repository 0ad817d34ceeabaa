#include "backends/cuda/cuda_allocator.h"

#include <cstring>
#include <mutex>
#include <utility>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/free_list.h"
#include "core/status.h"

namespace strata::cuda {

namespace {

double gib(size_t bytes) {
  return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0);
}

}  // namespace

// The arena and its free list. Shared by the allocator and by every live Buffer's owner.
struct CudaPoolAllocator::Arena {
  Arena(int device_index, char* base, size_t bytes)
      : device_index(device_index), base(base), free_list(bytes, kAlignment) {}
  ~Arena() {
    // The last Buffer or the allocator is gone. Errors are dropped (destructor; at exit the
    // runtime may be unloading already).
    if (cudaSetDevice(device_index) == cudaSuccess) (void)cudaFree(base);
    (void)cudaGetLastError();
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  void release(size_t offset, size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex);
    free_list.release(offset, bytes);
  }

  const int device_index;
  char* const base;
  std::mutex mutex;
  FreeList free_list;  // guarded by mutex
};

Result<std::unique_ptr<CudaPoolAllocator>> CudaPoolAllocator::create(int device_index,
                                                                     size_t arena_bytes) {
  STRATA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_index));
  void* base = nullptr;
  const cudaError_t err = cudaMalloc(&base, arena_bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
    const StatusCode code =
        err == cudaErrorMemoryAllocation ? StatusCode::kOutOfMemory : StatusCode::kInternal;
    return errorf(code,
                  "cuda:{}: cannot reserve a pool of {} bytes ({:.2f} GiB): {} bytes ({:.2f} GiB) "
                  "free of {} on the device: {}",
                  device_index, arena_bytes, gib(arena_bytes), free_bytes, gib(free_bytes),
                  total_bytes, cudaGetErrorString(err));
  }
  auto arena = std::make_shared<Arena>(device_index, static_cast<char*>(base), arena_bytes);
  return std::unique_ptr<CudaPoolAllocator>(new CudaPoolAllocator(std::move(arena)));
}

CudaPoolAllocator::CudaPoolAllocator(std::shared_ptr<Arena> arena) : arena_(std::move(arena)) {}

CudaPoolAllocator::~CudaPoolAllocator() = default;

Device CudaPoolAllocator::device() const {
  return Device::cuda(arena_->device_index);
}

Result<Buffer> CudaPoolAllocator::allocate(size_t bytes) {
  if (bytes == 0) return Buffer(nullptr, 0, device(), Residency::kDevice, nullptr);
  std::optional<size_t> offset;
  {
    std::lock_guard<std::mutex> lock(arena_->mutex);
    offset = arena_->free_list.allocate(bytes);
    if (!offset) {
      const FreeList& fl = arena_->free_list;
      return errorf(StatusCode::kOutOfMemory,
                    "cuda:{} pool: cannot allocate {} bytes ({:.2f} GiB): {} bytes ({:.2f} GiB) "
                    "free in the pool of {} bytes, largest free block {} bytes in {} free blocks",
                    arena_->device_index, bytes, gib(bytes), fl.free_bytes(), gib(fl.free_bytes()),
                    fl.capacity(), fl.largest_free_block(), fl.free_block_count());
    }
  }
  char* data = arena_->base + *offset;
  // The owner keeps the arena alive and gives the block back when the last Buffer copy dies.
  std::shared_ptr<void> owner(
      data, [arena = arena_, off = *offset, bytes](void*) { arena->release(off, bytes); });
  return Buffer(data, bytes, device(), Residency::kDevice, std::move(owner));
}

CudaPoolStats CudaPoolAllocator::stats() const {
  std::lock_guard<std::mutex> lock(arena_->mutex);
  const FreeList& fl = arena_->free_list;
  return CudaPoolStats{.capacity_bytes = fl.capacity(),
                       .used_bytes = fl.used_bytes(),
                       .free_bytes = fl.free_bytes(),
                       .largest_free_block = fl.largest_free_block(),
                       .free_blocks = fl.free_block_count()};
}

Result<Buffer> CudaMallocAllocator::allocate(size_t bytes, const char* what) {
  if (bytes == 0) return Buffer(nullptr, 0, device(), Residency::kDevice, nullptr);
  STRATA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_index_));
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    return errorf(StatusCode::kOutOfMemory,
                  "cuda: out of memory allocating {} ({:.2f} GiB needed, {:.2f} GiB free of "
                  "{:.2f} GiB)",
                  what, gib(bytes), gib(free_b), gib(total_b));
  }
  const int dev = device_index_;
  std::shared_ptr<void> owner(p, [dev](void* q) {
    (void)cudaSetDevice(dev);
    (void)cudaFree(q);
  });
  return Buffer(p, bytes, device(), Residency::kDevice, std::move(owner));
}

Result<Buffer> allocate_pinned_host(size_t bytes) {
  if (bytes == 0) return Buffer(nullptr, 0, Device::cpu(), Residency::kHostPinned, nullptr);
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return errorf(
        err == cudaErrorMemoryAllocation ? StatusCode::kOutOfMemory : StatusCode::kInternal,
        "pinned host allocation of {} bytes ({:.2f} GiB) failed: {}", bytes, gib(bytes),
        cudaGetErrorString(err));
  }
  std::memset(p, 0, bytes);
  std::shared_ptr<void> owner(p, [](void* q) { (void)cudaFreeHost(q); });
  return Buffer(p, bytes, Device::cpu(), Residency::kHostPinned, std::move(owner));
}

}  // namespace strata::cuda
