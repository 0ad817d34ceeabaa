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

class MappedFile {
 public:
  static Result<std::shared_ptr<MappedFile>> open(const std::string& path);
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
};

// Whole file into a string (for small text files: config.json, tokenizer.json).
Result<std::string> read_text_file(const std::string& path);

}  // namespace strata
