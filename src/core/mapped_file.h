// Read-only memory map of a whole file. Weights are used in place from the map (no copy);
// the map stays alive as long as any Buffer made from it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/buffer.h"
#include "strata/status.h"

namespace strata {

// kMap: the file's pages in place (the page cache, 4 KiB pages). kHugePageCopy: the file read into
// anonymous memory in 2 MiB-aligned transparent huge pages (madvise), where the kernel grants
// them: fewer TLB misses when a CPU decode step streams every weight (STRATA_HUGEPAGES=1).
enum class MapMode { kMap, kHugePageCopy };

class MappedFile {
 public:
  static Result<std::shared_ptr<MappedFile>> open(const std::string& path,
                                                  MapMode mode = MapMode::kMap);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // A Buffer over [offset, offset+bytes) that keeps this map alive.
  Buffer buffer(size_t offset, size_t bytes, const std::shared_ptr<MappedFile>& self) const;

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t unmap_size_ = 0;  // bytes mapped at data_ (the file's size, or the rounded copy)
};

// Whole file into a string (for small text files: config.json, tokenizer.json).
Result<std::string> read_text_file(const std::string& path);

}  // namespace strata
