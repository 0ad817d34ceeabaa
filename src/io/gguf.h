// GGUF reader (versions 2 and 3; little-endian files, read on a little-endian host).
//
// Layout: "GGUF" magic, u32 version, u64 tensor count, u64 metadata count, the metadata
// key/value pairs (typed, see GgufType), the tensor infos (name, n_dims, dims, ggml type,
// offset), padding to `general.alignment` (default 32), then the tensor data section.
//
// GgufFile::open maps the file (core/mapped_file.h) and tensor views point into the map: data
// is used in place, never copied. GgufFile::parse reads a buffer the caller keeps alive; open
// and the fuzzer both go through it. Everything a file can get wrong (magic, version, counts
// that do not fit in the remaining bytes, strings past EOF, misaligned or overlapping tensor
// data, too many dims, rows that are not whole blocks, duplicate names) is a Status naming the
// file and the key or tensor, checked before anything is allocated from a count in the file.
//
// NOTE: ggml lists dims innermost-first (ne[0] is the contiguous row length). strata shapes are
// outermost-first, so the reader reverses the dims once, here: a file tensor with ne = [576,
// 1536] is a [1536, 576] strata Tensor (out_features x in_features, rows contiguous). Nothing
// outside this file deals with ggml's order.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/mapped_file.h"
#include "core/tensor.h"
#include "strata/status.h"
#include "strata/types.h"

namespace strata {

// Metadata value types, with GGUF's ids.
enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// "u32", "string", "array", ...
std::string_view gguf_type_name(GgufType type);

// One metadata value. Integers keep their signedness (u8..u64 as uint64_t, i8..i64 as
// int64_t), f32/f64 are held as double (exact for f32). Arrays (all items of elem_type()) are
// stored compactly: scalar items as the file's packed little-endian bytes, strings as a
// vector of strings, nested arrays as values; memory stays within a small multiple of the
// file's bytes whatever the counts say.
class GgufValue {
 public:
  using Array = std::vector<GgufValue>;
  using Strings = std::vector<std::string>;

  GgufValue() = default;
  static GgufValue make_uint(GgufType type, uint64_t v) { return GgufValue(type, v); }
  static GgufValue make_int(GgufType type, int64_t v) { return GgufValue(type, v); }
  static GgufValue make_float(GgufType type, double v) { return GgufValue(type, v); }
  static GgufValue make_bool(bool v) { return GgufValue(GgufType::kBool, v); }
  static GgufValue make_string(std::string v) { return GgufValue(GgufType::kString, std::move(v)); }
  // `raw`: the packed little-endian items of a scalar elem_type, as laid out in the file.
  static GgufValue make_scalar_array(GgufType elem_type, std::vector<uint8_t> raw);
  static GgufValue make_string_array(Strings items);
  static GgufValue make_nested_array(Array items);

  GgufType type() const { return type_; }
  GgufType elem_type() const { return elem_type_; }  // arrays only
  bool is_unsigned() const { return std::holds_alternative<uint64_t>(v_); }
  bool is_signed() const { return std::holds_alternative<int64_t>(v_); }
  bool is_integer() const { return is_unsigned() || is_signed(); }
  bool is_float() const { return std::holds_alternative<double>(v_); }

  // Typed reads; each returns a zero value when the value holds another kind (check first).
  uint64_t as_uint() const;  // u8, u16, u32, u64
  int64_t as_int() const;    // i8, i16, i32, i64
  double as_float() const;   // f32, f64
  bool as_bool() const;
  const std::string& as_string() const;
  // Any integer type as int64_t; false when it does not fit.
  bool to_int64(int64_t* out) const;

  // Arrays of any element type: item count and item i (0 <= i < array_size()) as a value.
  size_t array_size() const;
  GgufValue item(size_t i) const;
  // Direct access by element kind (empty when the value is not that kind of array).
  const Strings& as_strings() const;              // array of strings
  const Array& as_array() const;                  // array of arrays
  const std::vector<uint8_t>& raw_items() const;  // array of scalars: packed bytes

  std::string to_string(size_t max_items = 8) const;  // for `strata info` and messages

 private:
  template <class T>
  GgufValue(GgufType type, T v) : type_(type), v_(std::move(v)) {}

  GgufType type_ = GgufType::kU8;
  GgufType elem_type_ = GgufType::kU8;
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<uint8_t>, Strings, Array>
      v_;
};

// Bytes of one item of a fixed-size metadata type (0 for string and array).
size_t gguf_scalar_size(GgufType type);

struct GgufKv {
  std::string key;
  GgufValue value;
};

struct GgufTensorInfo {
  std::string name;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};  // OUTERMOST-first (reversed from the file)
  uint32_t ggml_type = 0;                 // the file's type id
  std::optional<DType> dtype;             // none when strata has no DType for ggml_type
  uint64_t offset = 0;                    // relative to the data section
  uint64_t bytes = 0;

  int64_t numel() const;
  std::string shape_string() const;  // "[1536, 576]"
};

// Name of a ggml type id ("q4_k", "iq2_xxs"), or "" when the id is unknown.
std::string_view ggml_type_name(uint32_t ggml_type);

class GgufFile {
 public:
  // Map `path` and parse it; tensor views stay valid while this object (or a Buffer from
  // mapping()) lives.
  static Result<GgufFile> open(const std::string& path);
  // Parse a GGUF image in memory. `data` must outlive the result; `name` prefixes messages.
  static Result<GgufFile> parse(const uint8_t* data, size_t size, std::string name);

  const std::string& name() const { return name_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // file offset of the data section
  size_t file_size() const { return size_; }
  const std::shared_ptr<MappedFile>& mapping() const { return map_; }  // null after parse()

  // ---- metadata -----------------------------------------------------------------------------
  const std::vector<GgufKv>& metadata() const { return kvs_; }  // file order
  const GgufValue* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Exact-type getters: "<file>: key 'k' missing" (kNotFound) or "<file>: key 'k' has type
  // i32, expected u32" (kInvalidArgument).
  Result<uint8_t> get_u8(std::string_view key) const;
  Result<int8_t> get_i8(std::string_view key) const;
  Result<uint16_t> get_u16(std::string_view key) const;
  Result<int16_t> get_i16(std::string_view key) const;
  Result<uint32_t> get_u32(std::string_view key) const;
  Result<int32_t> get_i32(std::string_view key) const;
  Result<uint64_t> get_u64(std::string_view key) const;
  Result<int64_t> get_i64(std::string_view key) const;
  Result<float> get_f32(std::string_view key) const;
  Result<double> get_f64(std::string_view key) const;
  Result<bool> get_bool(std::string_view key) const;
  Result<std::string> get_string(std::string_view key) const;
  // Lenient getters for loaders: any integer type (range-checked), f32 or f64.
  Result<int64_t> get_int(std::string_view key) const;
  Result<double> get_float(std::string_view key) const;

  Result<std::vector<std::string>> get_string_array(std::string_view key) const;
  Result<std::vector<float>> get_f32_array(std::string_view key) const;
  Result<std::vector<int32_t>> get_i32_array(std::string_view key) const;
  // Any integer element type, range-checked.
  Result<std::vector<int64_t>> get_int_array(std::string_view key) const;

  // ---- tensors ------------------------------------------------------------------------------
  const std::vector<GgufTensorInfo>& tensor_infos() const { return tensors_; }  // file order
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  // View of the tensor's bytes in the file (read-only memory: never write through it).
  // Errors: unknown name (kNotFound), ggml type strata does not support (kUnimplemented).
  Result<Tensor> tensor(std::string_view name) const;
  // Raw bytes of a tensor, for any ggml type.
  const uint8_t* tensor_data(const GgufTensorInfo& info) const {
    return data_ + data_offset_ + info.offset;
  }

 private:
  GgufFile() = default;
  Status key_error(std::string_view key, const GgufValue* v, std::string_view expected) const;
  Result<const GgufValue*> typed(std::string_view key, GgufType type) const;
  Result<const GgufValue*> typed_array(std::string_view key, GgufType elem) const;

  std::string name_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::shared_ptr<MappedFile> map_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GgufKv> kvs_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// ggml type id -> strata DType, or none (strata cannot compute with that type).
std::optional<DType> dtype_from_ggml(uint32_t ggml_type);

}  // namespace strata
