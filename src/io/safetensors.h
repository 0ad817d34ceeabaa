// safetensors reader and writer.
//
// Format: u64 little-endian header length N, N bytes of UTF-8 JSON
//   {"__metadata__": {str: str}, name: {"dtype": "BF16", "shape": [..], "data_offsets": [b, e]}}
// then the data section; offsets are relative to the data start. The file is memory-mapped and
// tensors are views into the map (no copy): a Tensor from SafetensorsFile::tensor() is valid as
// long as the SafetensorsFile (or a Buffer from buffer()) is alive, and is read-only.
//
// Everything in the header is validated when the file is opened: header length, JSON syntax and
// UTF-8, each entry's dtype, shape (non-negative, overflow-checked product), data_offsets (in
// the data section, begin <= end, byte size == numel * element size) and that no two tensors
// share a byte. Dtypes that strata cannot compute with (F64, I16, U16, U32, U64, BOOL, F8_E5M2)
// parse fine and are listed; asking for one as a Tensor is the error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/buffer.h"
#include "core/mapped_file.h"
#include "core/status.h"
#include "core/tensor.h"
#include "strata/status.h"
#include "strata/types.h"

namespace strata {

// Every element type the safetensors format defines (the names are the file's spelling).
enum class SafetensorsDType : uint8_t {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
};

// "BF16" -> kBF16; false for any other spelling.
bool parse_safetensors_dtype(std::string_view text, SafetensorsDType* out);
std::string_view safetensors_dtype_name(SafetensorsDType dt);
int64_t safetensors_dtype_size(SafetensorsDType dt);  // bytes per element
// The strata DType for a safetensors dtype; kUnimplemented for the ones strata cannot use.
Result<DType> to_strata_dtype(SafetensorsDType dt);
// The safetensors dtype for a strata DType; kUnimplemented for block-quantized types.
Result<SafetensorsDType> to_safetensors_dtype(DType dt);

// One header entry, as validated.
struct SafetensorsEntry {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::kU8;
  std::vector<int64_t> shape;  // any rank; tensor() accepts at most kMaxDims
  uint64_t begin = 0;          // data_offsets, relative to the data section
  uint64_t end = 0;
  int64_t numel = 1;

  uint64_t bytes() const { return end - begin; }
  std::string shape_string() const;  // "[72, 1031]"
};

class SafetensorsFile {
 public:
  // Memory-map `path` and validate it. Messages start with `path`.
  static Result<std::shared_ptr<SafetensorsFile>> open(const std::string& path);
  // Validate an image already in memory; `name` starts the messages. The bytes are not copied:
  // they must outlive the returned object and every Tensor taken from it. open() uses this.
  static Result<std::shared_ptr<SafetensorsFile>> parse(const uint8_t* data, size_t size,
                                                        std::string name);

  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return name_; }  // the path given to open(), or parse()'s name
  // Tensor names, sorted.
  const std::vector<std::string>& names() const { return names_; }
  size_t size() const { return names_.size(); }
  bool has(std::string_view name) const { return entries_.find(name) != entries_.end(); }
  // The entry, or nullptr when the file has no tensor `name`.
  const SafetensorsEntry* find(std::string_view name) const;
  // The entry, or kNotFound naming the file and the tensor.
  Result<const SafetensorsEntry*> info(std::string_view name) const;
  // A contiguous CPU view into the file. Errors (naming file and tensor): not found, dtype strata
  // cannot use, more than kMaxDims dims, data not aligned to the element size.
  Result<Tensor> tensor(std::string_view name) const;
  // The tensor's bytes as a Buffer that keeps the file mapped (Residency::kHostMapped). For an
  // image from parse() the Buffer does not own anything.
  Result<Buffer> buffer(std::string_view name) const;

  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  uint64_t header_bytes() const { return header_bytes_; }     // N, the JSON length
  uint64_t data_offset() const { return 8 + header_bytes_; }  // file offset of the data section
  uint64_t data_bytes() const { return data_bytes_; }
  uint64_t tensor_bytes() const { return tensor_bytes_; }  // sum of every tensor's bytes
  const std::shared_ptr<MappedFile>& mapping() const { return map_; }  // null for parse()

 private:
  SafetensorsFile() = default;

  std::string name_;
  std::shared_ptr<MappedFile> map_;  // null for parse()
  const uint8_t* data_section_ = nullptr;
  uint64_t header_bytes_ = 0;
  uint64_t data_bytes_ = 0;
  uint64_t tensor_bytes_ = 0;
  std::map<std::string, SafetensorsEntry, std::less<>> entries_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

// printable_for_message (user text in one-line messages) is in core/status.h.

// Largest header accepted (the reference implementation's limit).
constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// Write `tensors` (contiguous CPU tensors, unique names) to `path` in safetensors format,
// readable by the Hugging Face library: tensors ordered by element size (largest first, then as
// given) so every tensor is aligned, header padded to 8 bytes. Writes `path`.tmp, then renames.
Status write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace strata
