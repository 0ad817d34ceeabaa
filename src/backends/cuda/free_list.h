// FreeList: the bookkeeping of CudaPoolAllocator, kept free of CUDA so it can be tested on any
// machine. It hands out aligned [offset, offset + size) ranges of an arena [0, capacity):
// best fit (the smallest free block that is large enough, lowest offset on ties), splitting off
// the rest, and on release merging the block with free neighbours so fragmentation does not
// accumulate. O(log n) per call in the number of free blocks. Not thread-safe (the pool locks).
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace strata::cuda {

class FreeList {
 public:
  // alignment must be a power of two; capacity is rounded down to a multiple of it.
  FreeList(size_t capacity, size_t alignment);

  // Bytes a request of `bytes` occupies: rounded up to the alignment, at least one unit.
  size_t block_size(size_t bytes) const;
  // Offset of a block of block_size(bytes) bytes, or nullopt when no free block is large enough.
  std::optional<size_t> allocate(size_t bytes);
  // Returns a block from allocate(bytes) (same `bytes`). Releasing a range that is not
  // allocated (double free, wrong size) is a broken invariant and fails STRATA_CHECK.
  void release(size_t offset, size_t bytes);

  size_t capacity() const { return capacity_; }
  size_t alignment() const { return alignment_; }
  size_t free_bytes() const { return free_bytes_; }
  size_t used_bytes() const { return capacity_ - free_bytes_; }
  size_t largest_free_block() const;
  size_t free_block_count() const { return by_offset_.size(); }

 private:
  void insert_free(size_t offset, size_t size);
  void erase_free(std::map<size_t, size_t>::iterator it);

  size_t capacity_;
  size_t alignment_;
  size_t free_bytes_ = 0;
  std::map<size_t, size_t> by_offset_;           // free blocks: offset -> size
  std::set<std::pair<size_t, size_t>> by_size_;  // free blocks: (size, offset), for best fit
};

}  // namespace strata::cuda
