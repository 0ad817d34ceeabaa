#include "backends/cuda/free_list.h"

#include <iterator>

#include "core/log.h"

namespace strata::cuda {

FreeList::FreeList(size_t capacity, size_t alignment)
    : capacity_(capacity / alignment * alignment), alignment_(alignment) {
  STRATA_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0);
  if (capacity_ > 0) insert_free(0, capacity_);
}

size_t FreeList::block_size(size_t bytes) const {
  if (bytes == 0) return alignment_;
  if (bytes > capacity_) return bytes;  // cannot fit anyway; avoids overflow when rounding
  return (bytes + alignment_ - 1) / alignment_ * alignment_;
}

std::optional<size_t> FreeList::allocate(size_t bytes) {
  const size_t size = block_size(bytes);
  auto fit = by_size_.lower_bound({size, 0});
  if (fit == by_size_.end()) return std::nullopt;
  const auto [block_size, offset] = *fit;
  erase_free(by_offset_.find(offset));
  if (block_size > size) insert_free(offset + size, block_size - size);
  return offset;
}

void FreeList::release(size_t offset, size_t bytes) {
  size_t size = block_size(bytes);
  STRATA_CHECK(offset % alignment_ == 0 && offset + size <= capacity_);
  auto next = by_offset_.lower_bound(offset);
  // The released range must not overlap a free block (that would be a double free).
  STRATA_CHECK(next == by_offset_.end() || offset + size <= next->first);
  if (next != by_offset_.begin()) {
    auto prev = std::prev(next);
    STRATA_CHECK(prev->first + prev->second <= offset);
    if (prev->first + prev->second == offset) {  // merge with the free block before
      offset = prev->first;
      size += prev->second;
      erase_free(prev);
    }
  }
  if (next != by_offset_.end() && offset + size == next->first) {  // and the one after
    size += next->second;
    erase_free(next);
  }
  insert_free(offset, size);
}

size_t FreeList::largest_free_block() const {
  return by_size_.empty() ? 0 : by_size_.rbegin()->first;
}

void FreeList::insert_free(size_t offset, size_t size) {
  by_offset_.emplace(offset, size);
  by_size_.emplace(size, offset);
  free_bytes_ += size;
}

void FreeList::erase_free(std::map<size_t, size_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  free_bytes_ -= it->second;
  by_offset_.erase(it);
}

}  // namespace strata::cuda
