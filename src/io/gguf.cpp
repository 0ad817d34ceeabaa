// GGUF parsing and validation; see gguf.h for the format and the dim-order convention.
#include "io/gguf.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/env.h"
#include "core/status.h"

namespace strata {

namespace {

constexpr uint32_t kGgufMagic = 0x46554747u;  // "GGUF" read as a little-endian u32
constexpr uint64_t kDefaultAlignment = 32;
constexpr int kMaxArrayDepth = 8;                     // nested arrays deeper than this are rejected
constexpr uint64_t kMaxElements = uint64_t{1} << 59;  // per tensor

struct GgmlTypeInfo {
  std::string_view name;
  int64_t block_size;  // 0: unknown id
  int64_t block_bytes;
};

// Block layouts of every ggml type id (gguf-py GGML_QUANT_SIZES), indexed by id, so the
// reader can size and validate tensors of types strata does not compute with. Retired ids
// (4, 5, 31-33, 36-38) have block_size 0.
constexpr GgmlTypeInfo kGgmlTypes[] = {
    {"f32", 1, 4},        {"f16", 1, 2},       {"q4_0", 32, 18},     {"q4_1", 32, 20},
    {"", 0, 0},           {"", 0, 0},          {"q5_0", 32, 22},     {"q5_1", 32, 24},
    {"q8_0", 32, 34},     {"q8_1", 32, 40},    {"q2_k", 256, 84},    {"q3_k", 256, 110},
    {"q4_k", 256, 144},   {"q5_k", 256, 176},  {"q6_k", 256, 210},   {"q8_k", 256, 292},
    {"iq2_xxs", 256, 66}, {"iq2_xs", 256, 74}, {"iq3_xxs", 256, 98}, {"iq1_s", 256, 50},
    {"iq4_nl", 32, 18},   {"iq3_s", 256, 110}, {"iq2_s", 256, 82},   {"iq4_xs", 256, 136},
    {"i8", 1, 1},         {"i16", 1, 2},       {"i32", 1, 4},        {"i64", 1, 8},
    {"f64", 1, 8},        {"iq1_m", 256, 56},  {"bf16", 1, 2},       {"", 0, 0},
    {"", 0, 0},           {"", 0, 0},          {"tq1_0", 256, 54},   {"tq2_0", 256, 66},
    {"", 0, 0},           {"", 0, 0},          {"", 0, 0},           {"mxfp4", 32, 17},
    {"nvfp4", 64, 36},    {"q1_0", 128, 18},
};

GgmlTypeInfo ggml_type_info(uint32_t id) {
  return id < std::size(kGgmlTypes) ? kGgmlTypes[id] : GgmlTypeInfo{"", 0, 0};
}

bool valid_value_type(uint32_t t) {
  return t <= static_cast<uint32_t>(GgufType::kF64);
}

// Fewest bytes one value of `t` can take in the file (for count-vs-remaining checks).
uint64_t min_value_bytes(GgufType t) {
  switch (t) {
    case GgufType::kString:
      return 8;  // the length; the bytes may be empty
    case GgufType::kArray:
      return 12;  // elem type + count
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
    case GgufType::kU16:
    case GgufType::kI16:
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
      return gguf_scalar_size(t);
  }
  return 1;
}

// Bounds-checked little-endian reader over the file image. Errors name the file, what was
// being read and the byte offset.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size, const std::string& name)
      : data_(data), size_(size), name_(name) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  template <class T>
  Status read(T* out, std::string_view what) {
    if (remaining() < sizeof(T)) {
      return errorf(StatusCode::kDataLoss, "{}: truncated: {} at byte {} needs {} bytes, {} remain",
                    name_, what, pos_, sizeof(T), remaining());
    }
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return ok_status();
  }

  Status read_string(std::string* out, std::string_view what) {
    const size_t at = pos_;
    uint64_t len = 0;
    STRATA_RETURN_IF_ERROR(read(&len, what));
    if (len > remaining()) {
      return errorf(StatusCode::kDataLoss,
                    "{}: {}: string length {} at byte {} runs past the end of the file ({} bytes "
                    "remain)",
                    name_, what, len, at, remaining());
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return ok_status();
  }

  // The next n bytes (n already checked against the remaining bytes by the caller).
  Status read_bytes(std::vector<uint8_t>* out, size_t n, std::string_view what) {
    if (n > remaining()) {
      return errorf(StatusCode::kDataLoss, "{}: truncated: {} at byte {} needs {} bytes, {} remain",
                    name_, what, pos_, n, remaining());
    }
    out->assign(data_ + pos_, data_ + pos_ + n);
    pos_ += n;
    return ok_status();
  }

  // Error unless `count` items of at least `min_bytes` each fit in the remaining bytes.
  Status check_count(uint64_t count, uint64_t min_bytes, std::string_view what) const {
    if (min_bytes != 0 && count > remaining() / min_bytes) {
      return errorf(StatusCode::kDataLoss,
                    "{}: {} count {} cannot fit in the {} remaining bytes (at least {} bytes "
                    "each)",
                    name_, what, count, remaining(), min_bytes);
    }
    return ok_status();
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& name_;
};

template <class T>
Status read_scalar(Reader& r, GgufType type, std::string_view what, GgufValue* out) {
  T v{};
  STRATA_RETURN_IF_ERROR(r.read(&v, what));
  if constexpr (std::is_floating_point_v<T>) {
    *out = GgufValue::make_float(type, static_cast<double>(v));
  } else if constexpr (std::is_signed_v<T>) {
    *out = GgufValue::make_int(type, static_cast<int64_t>(v));
  } else {
    *out = GgufValue::make_uint(type, static_cast<uint64_t>(v));
  }
  return ok_status();
}

// `what` names the value in messages: "key 'tokenizer.ggml.tokens'".
Status read_value(Reader& r, const std::string& file, std::string_view what, GgufType type,
                  int depth, GgufValue* out) {
  switch (type) {
    case GgufType::kU8:
      return read_scalar<uint8_t>(r, type, what, out);
    case GgufType::kI8:
      return read_scalar<int8_t>(r, type, what, out);
    case GgufType::kU16:
      return read_scalar<uint16_t>(r, type, what, out);
    case GgufType::kI16:
      return read_scalar<int16_t>(r, type, what, out);
    case GgufType::kU32:
      return read_scalar<uint32_t>(r, type, what, out);
    case GgufType::kI32:
      return read_scalar<int32_t>(r, type, what, out);
    case GgufType::kU64:
      return read_scalar<uint64_t>(r, type, what, out);
    case GgufType::kI64:
      return read_scalar<int64_t>(r, type, what, out);
    case GgufType::kF32:
      return read_scalar<float>(r, type, what, out);
    case GgufType::kF64:
      return read_scalar<double>(r, type, what, out);
    case GgufType::kBool: {
      const size_t at = r.pos();
      uint8_t b = 0;
      STRATA_RETURN_IF_ERROR(r.read(&b, what));
      if (b > 1) {
        return errorf(StatusCode::kDataLoss, "{}: {}: bool at byte {} has value {}", file, what, at,
                      b);
      }
      *out = GgufValue::make_bool(b != 0);
      return ok_status();
    }
    case GgufType::kString: {
      std::string s;
      STRATA_RETURN_IF_ERROR(r.read_string(&s, what));
      *out = GgufValue::make_string(std::move(s));
      return ok_status();
    }
    case GgufType::kArray: {
      if (depth >= kMaxArrayDepth) {
        return errorf(StatusCode::kDataLoss, "{}: {}: arrays nested deeper than {}", file, what,
                      kMaxArrayDepth);
      }
      uint32_t elem_raw = 0;
      uint64_t count = 0;
      const size_t at = r.pos();
      STRATA_RETURN_IF_ERROR(r.read(&elem_raw, what));
      if (!valid_value_type(elem_raw)) {
        return errorf(StatusCode::kDataLoss,
                      "{}: {}: array at byte {} has unknown element "
                      "type {}",
                      file, what, at, elem_raw);
      }
      const auto elem = static_cast<GgufType>(elem_raw);
      STRATA_RETURN_IF_ERROR(r.read(&count, what));
      STRATA_RETURN_IF_ERROR(
          r.check_count(count, min_value_bytes(elem), fmt::format("{}: array", what)));
      const auto n = static_cast<size_t>(count);
      if (elem == GgufType::kString) {
        GgufValue::Strings items(n);
        for (std::string& item : items) STRATA_RETURN_IF_ERROR(r.read_string(&item, what));
        *out = GgufValue::make_string_array(std::move(items));
      } else if (elem == GgufType::kArray) {
        GgufValue::Array items(n);
        for (GgufValue& item : items) {
          STRATA_RETURN_IF_ERROR(read_value(r, file, what, elem, depth + 1, &item));
        }
        *out = GgufValue::make_nested_array(std::move(items));
      } else {
        const size_t items_at = r.pos();
        std::vector<uint8_t> raw;
        STRATA_RETURN_IF_ERROR(r.read_bytes(&raw, n * gguf_scalar_size(elem), what));
        if (elem == GgufType::kBool) {
          for (size_t i = 0; i < n; ++i) {
            if (raw[i] > 1) {
              return errorf(StatusCode::kDataLoss, "{}: {}: bool at byte {} has value {}", file,
                            what, items_at + i, raw[i]);
            }
          }
        }
        *out = GgufValue::make_scalar_array(elem, std::move(raw));
      }
      return ok_status();
    }
  }
  return errorf(StatusCode::kInternal, "{}: {}: bad value type", file, what);
}

bool is_pow2(uint64_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}

}  // namespace

// ---- names and type mapping -------------------------------------------------------------------

std::string_view gguf_type_name(GgufType type) {
  switch (type) {
    case GgufType::kU8:
      return "u8";
    case GgufType::kI8:
      return "i8";
    case GgufType::kU16:
      return "u16";
    case GgufType::kI16:
      return "i16";
    case GgufType::kU32:
      return "u32";
    case GgufType::kI32:
      return "i32";
    case GgufType::kF32:
      return "f32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kU64:
      return "u64";
    case GgufType::kI64:
      return "i64";
    case GgufType::kF64:
      return "f64";
  }
  return "?";
}

size_t gguf_scalar_size(GgufType type) {
  switch (type) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      return 1;
    case GgufType::kU16:
    case GgufType::kI16:
      return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
      return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
      return 8;
    case GgufType::kString:
    case GgufType::kArray:
      return 0;
  }
  return 0;
}

std::string_view ggml_type_name(uint32_t ggml_type) {
  return ggml_type_info(ggml_type).name;
}

std::optional<DType> dtype_from_ggml(uint32_t ggml_type) {
  switch (ggml_type) {
    case 0:
      return DType::kF32;
    case 1:
      return DType::kF16;
    case 2:
      return DType::kQ4_0;
    case 3:
      return DType::kQ4_1;
    case 6:
      return DType::kQ5_0;
    case 7:
      return DType::kQ5_1;
    case 8:
      return DType::kQ8_0;
    case 12:
      return DType::kQ4_K;
    case 13:
      return DType::kQ5_K;
    case 14:
      return DType::kQ6_K;
    case 24:
      return DType::kI8;
    case 26:
      return DType::kI32;
    case 27:
      return DType::kI64;
    case 30:
      return DType::kBF16;
    default:
      return std::nullopt;
  }
}

// ---- GgufValue --------------------------------------------------------------------------------

uint64_t GgufValue::as_uint() const {
  const auto* p = std::get_if<uint64_t>(&v_);
  return p ? *p : 0;
}
int64_t GgufValue::as_int() const {
  const auto* p = std::get_if<int64_t>(&v_);
  return p ? *p : 0;
}
double GgufValue::as_float() const {
  const auto* p = std::get_if<double>(&v_);
  return p ? *p : 0.0;
}
bool GgufValue::as_bool() const {
  const auto* p = std::get_if<bool>(&v_);
  return p ? *p : false;
}
const std::string& GgufValue::as_string() const {
  static const std::string kEmpty;
  const auto* p = std::get_if<std::string>(&v_);
  return p ? *p : kEmpty;
}
const GgufValue::Strings& GgufValue::as_strings() const {
  static const Strings kEmpty;
  const auto* p = std::get_if<Strings>(&v_);
  return p ? *p : kEmpty;
}
const GgufValue::Array& GgufValue::as_array() const {
  static const Array kEmpty;
  const auto* p = std::get_if<Array>(&v_);
  return p ? *p : kEmpty;
}
const std::vector<uint8_t>& GgufValue::raw_items() const {
  static const std::vector<uint8_t> kEmpty;
  const auto* p = std::get_if<std::vector<uint8_t>>(&v_);
  return p ? *p : kEmpty;
}

GgufValue GgufValue::make_scalar_array(GgufType elem_type, std::vector<uint8_t> raw) {
  GgufValue v(GgufType::kArray, std::move(raw));
  v.elem_type_ = elem_type;
  return v;
}
GgufValue GgufValue::make_string_array(Strings items) {
  GgufValue v(GgufType::kArray, std::move(items));
  v.elem_type_ = GgufType::kString;
  return v;
}
GgufValue GgufValue::make_nested_array(Array items) {
  GgufValue v(GgufType::kArray, std::move(items));
  v.elem_type_ = GgufType::kArray;
  return v;
}

size_t GgufValue::array_size() const {
  if (type_ != GgufType::kArray) return 0;
  if (elem_type_ == GgufType::kString) return as_strings().size();
  if (elem_type_ == GgufType::kArray) return as_array().size();
  const size_t size = gguf_scalar_size(elem_type_);
  return size == 0 ? 0 : raw_items().size() / size;
}

namespace {
template <class T>
T load_item(const std::vector<uint8_t>& raw, size_t i) {
  T v;
  std::memcpy(&v, raw.data() + i * sizeof(T), sizeof(T));
  return v;
}
}  // namespace

GgufValue GgufValue::item(size_t i) const {
  if (i >= array_size()) return GgufValue();
  const std::vector<uint8_t>& raw = raw_items();
  switch (elem_type_) {
    case GgufType::kU8:
      return make_uint(elem_type_, load_item<uint8_t>(raw, i));
    case GgufType::kI8:
      return make_int(elem_type_, load_item<int8_t>(raw, i));
    case GgufType::kU16:
      return make_uint(elem_type_, load_item<uint16_t>(raw, i));
    case GgufType::kI16:
      return make_int(elem_type_, load_item<int16_t>(raw, i));
    case GgufType::kU32:
      return make_uint(elem_type_, load_item<uint32_t>(raw, i));
    case GgufType::kI32:
      return make_int(elem_type_, load_item<int32_t>(raw, i));
    case GgufType::kU64:
      return make_uint(elem_type_, load_item<uint64_t>(raw, i));
    case GgufType::kI64:
      return make_int(elem_type_, load_item<int64_t>(raw, i));
    case GgufType::kF32:
      return make_float(elem_type_, load_item<float>(raw, i));
    case GgufType::kF64:
      return make_float(elem_type_, load_item<double>(raw, i));
    case GgufType::kBool:
      return make_bool(raw[i] != 0);
    case GgufType::kString:
      return make_string(as_strings()[i]);
    case GgufType::kArray:
      return as_array()[i];
  }
  return GgufValue();
}

bool GgufValue::to_int64(int64_t* out) const {
  if (const auto* u = std::get_if<uint64_t>(&v_)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(*u);
    return true;
  }
  if (const auto* i = std::get_if<int64_t>(&v_)) {
    *out = *i;
    return true;
  }
  return false;
}

std::string GgufValue::to_string(size_t max_items) const {
  switch (type_) {
    case GgufType::kU8:
    case GgufType::kU16:
    case GgufType::kU32:
    case GgufType::kU64:
      return std::to_string(as_uint());
    case GgufType::kI8:
    case GgufType::kI16:
    case GgufType::kI32:
    case GgufType::kI64:
      return std::to_string(as_int());
    case GgufType::kF32:
    case GgufType::kF64:
      return fmt::format("{}", as_float());
    case GgufType::kBool:
      return as_bool() ? "true" : "false";
    case GgufType::kString: {
      std::string s = as_string();
      if (s.size() > 80) s = s.substr(0, 77) + "...";
      std::string q = "\"";
      for (char c : s) {
        if (c == '\n') {
          q += "\\n";
        } else if (c == '"') {
          q += "\\\"";
        } else {
          q += c;
        }
      }
      return q + "\"";
    }
    case GgufType::kArray: {
      const size_t n = array_size();
      std::string s = fmt::format("{}[{}] [", gguf_type_name(elem_type_), n);
      for (size_t i = 0; i < n && i < max_items; ++i) {
        if (i) s += ", ";
        s += item(i).to_string(max_items);
      }
      if (n > max_items) s += ", ...";
      return s + "]";
    }
  }
  return "?";
}

// ---- GgufTensorInfo ---------------------------------------------------------------------------

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[static_cast<size_t>(i)];
  return n;
}

std::string GgufTensorInfo::shape_string() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[static_cast<size_t>(i)]);
  }
  return s + "]";
}

// ---- GgufFile ---------------------------------------------------------------------------------

Result<GgufFile> GgufFile::open(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(
      std::shared_ptr<MappedFile> map,
      MappedFile::open(path, env_config().hugepages ? MapMode::kHugePageCopy : MapMode::kMap));
  STRATA_ASSIGN_OR_RETURN(GgufFile f, parse(map->data(), map->size(), path));
  f.map_ = std::move(map);
  return f;
}

Result<GgufFile> GgufFile::parse(const uint8_t* data, size_t size, std::string name) {
  GgufFile f;
  f.name_ = std::move(name);
  f.data_ = data;
  f.size_ = size;
  const std::string& file = f.name_;
  Reader r(data, size, file);

  uint32_t magic = 0;
  STRATA_RETURN_IF_ERROR(r.read(&magic, "magic"));
  if (magic != kGgufMagic) {
    return errorf(StatusCode::kDataLoss, "{}: not a GGUF file (magic {:02x} {:02x} {:02x} {:02x})",
                  file, magic & 0xff, (magic >> 8) & 0xff, (magic >> 16) & 0xff, magic >> 24);
  }
  STRATA_RETURN_IF_ERROR(r.read(&f.version_, "version"));
  if (f.version_ == 1) {
    return errorf(StatusCode::kUnimplemented,
                  "{}: GGUF version 1 is not supported (only versions 2 and 3); re-convert the "
                  "model with a current converter",
                  file);
  }
  if (f.version_ != 2 && f.version_ != 3) {
    const bool swapped = f.version_ == 0x02000000u || f.version_ == 0x03000000u;
    return errorf(StatusCode::kUnimplemented, "{}: GGUF version {} is not supported (2 or 3){}",
                  file, f.version_, swapped ? "; this looks like a big-endian file" : "");
  }
  uint64_t n_tensors = 0;
  uint64_t n_kv = 0;
  STRATA_RETURN_IF_ERROR(r.read(&n_tensors, "tensor count"));
  STRATA_RETURN_IF_ERROR(r.read(&n_kv, "metadata count"));
  // A KV takes at least 13 bytes (key length, type, one byte of value); a tensor info at least
  // 24 (name length, n_dims, type, offset).
  STRATA_RETURN_IF_ERROR(r.check_count(n_kv, 13, "metadata"));
  STRATA_RETURN_IF_ERROR(r.check_count(n_tensors, 24, "tensor"));

  // ---- metadata
  f.kvs_.reserve(static_cast<size_t>(n_kv));
  for (uint64_t i = 0; i < n_kv; ++i) {
    GgufKv kv;
    STRATA_RETURN_IF_ERROR(r.read_string(&kv.key, fmt::format("metadata key #{}", i)));
    uint32_t type_raw = 0;
    const size_t type_at = r.pos();
    STRATA_RETURN_IF_ERROR(r.read(&type_raw, kv.key));
    if (!valid_value_type(type_raw)) {
      return errorf(StatusCode::kDataLoss, "{}: key '{}' at byte {} has unknown value type {}",
                    file, kv.key, type_at, type_raw);
    }
    STRATA_RETURN_IF_ERROR(read_value(r, file, fmt::format("key '{}'", kv.key),
                                      static_cast<GgufType>(type_raw), 0, &kv.value));
    if (f.kv_index_.count(kv.key) != 0) {
      return errorf(StatusCode::kDataLoss, "{}: duplicate metadata key '{}'", file, kv.key);
    }
    f.kv_index_.emplace(kv.key, f.kvs_.size());
    f.kvs_.push_back(std::move(kv));
  }

  if (const GgufValue* a = f.find("general.alignment")) {
    int64_t v = 0;
    if (!a->to_int64(&v) || !is_pow2(static_cast<uint64_t>(v)) || v > (1 << 30)) {
      return errorf(StatusCode::kDataLoss,
                    "{}: key 'general.alignment' is {} ({}), expected a power of two", file,
                    a->to_string(), gguf_type_name(a->type()));
    }
    f.alignment_ = static_cast<uint64_t>(v);
  } else {
    f.alignment_ = kDefaultAlignment;
  }

  // ---- tensor infos
  f.tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    STRATA_RETURN_IF_ERROR(r.read_string(&t.name, fmt::format("tensor #{} name", i)));
    const std::string what = fmt::format("tensor '{}'", t.name);
    uint32_t n_dims = 0;
    STRATA_RETURN_IF_ERROR(r.read(&n_dims, what));
    if (n_dims > static_cast<uint32_t>(kMaxDims)) {
      return errorf(StatusCode::kDataLoss, "{}: tensor '{}' has {} dims (at most {})", file, t.name,
                    n_dims, kMaxDims);
    }
    t.ndim = static_cast<int>(n_dims);
    std::array<uint64_t, kMaxDims> ne{};
    for (uint32_t d = 0; d < n_dims; ++d) STRATA_RETURN_IF_ERROR(r.read(&ne[d], what));
    STRATA_RETURN_IF_ERROR(r.read(&t.ggml_type, what));
    STRATA_RETURN_IF_ERROR(r.read(&t.offset, what));

    // Element count. The product of the non-zero dims is capped at 2^59 so that any partial
    // product of the dims (Tensor::numel multiplies them in another order) and the byte size
    // (at most 8 bytes per value) fit in int64_t.
    uint64_t numel = 1;
    uint64_t nonzero = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      if (ne[d] == 0) {
        numel = 0;
        continue;
      }
      if (ne[d] > kMaxElements || nonzero > kMaxElements / ne[d]) {
        std::string dims;
        for (uint32_t e = n_dims; e-- > 0;)
          dims += fmt::format("{}{}", dims.empty() ? "" : ", ", ne[e]);
        return errorf(StatusCode::kDataLoss,
                      "{}: tensor '{}' has absurd dims [{}] (more than 2^59 elements)", file,
                      t.name, dims);
      }
      nonzero *= ne[d];
      numel *= ne[d];
    }
    // ggml ne[] is innermost-first; strata is outermost-first.
    for (uint32_t d = 0; d < n_dims; ++d) {
      t.shape[n_dims - 1 - d] = static_cast<int64_t>(ne[d]);
    }
    const GgmlTypeInfo ti = ggml_type_info(t.ggml_type);
    if (ti.block_size == 0) {
      return errorf(StatusCode::kDataLoss, "{}: tensor '{}' has unknown ggml type id {}", file,
                    t.name, t.ggml_type);
    }
    const uint64_t inner = n_dims > 0 ? ne[0] : 1;
    if (inner % static_cast<uint64_t>(ti.block_size) != 0) {
      return errorf(StatusCode::kDataLoss,
                    "{}: tensor '{}' ({}) has rows of {} values, not a multiple of the {}-value "
                    "block",
                    file, t.name, ti.name, inner, ti.block_size);
    }
    t.bytes = numel / static_cast<uint64_t>(ti.block_size) * static_cast<uint64_t>(ti.block_bytes);
    t.dtype = dtype_from_ggml(t.ggml_type);
    if (t.offset % f.alignment_ != 0) {
      return errorf(StatusCode::kDataLoss,
                    "{}: tensor '{}' data offset {} is not a multiple of the alignment {}", file,
                    t.name, t.offset, f.alignment_);
    }
    if (f.tensor_index_.count(t.name) != 0) {
      return errorf(StatusCode::kDataLoss, "{}: duplicate tensor name '{}'", file, t.name);
    }
    f.tensor_index_.emplace(t.name, f.tensors_.size());
    f.tensors_.push_back(std::move(t));
  }

  // ---- data section: starts at the next multiple of the alignment.
  const uint64_t info_end = r.pos();
  f.data_offset_ = (info_end + f.alignment_ - 1) / f.alignment_ * f.alignment_;
  if (!f.tensors_.empty() && f.data_offset_ > size) {
    return errorf(StatusCode::kDataLoss,
                  "{}: tensor data section would start at byte {}, past the end of the file ({} "
                  "bytes)",
                  file, f.data_offset_, size);
  }
  const uint64_t data_bytes = f.data_offset_ <= size ? size - f.data_offset_ : 0;
  std::vector<size_t> order;
  order.reserve(f.tensors_.size());
  for (size_t i = 0; i < f.tensors_.size(); ++i) {
    const GgufTensorInfo& t = f.tensors_[i];
    if (t.offset > data_bytes || t.bytes > data_bytes - t.offset) {
      return errorf(StatusCode::kDataLoss,
                    "{}: tensor '{}' data [{}, +{}) runs past the end of the file (data section "
                    "at byte {} holds {} bytes)",
                    file, t.name, t.offset, t.bytes, f.data_offset_, data_bytes);
    }
    if (t.bytes > 0) order.push_back(i);
  }
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return f.tensors_[a].offset < f.tensors_[b].offset; });
  for (size_t j = 1; j < order.size(); ++j) {
    const GgufTensorInfo& prev = f.tensors_[order[j - 1]];
    const GgufTensorInfo& cur = f.tensors_[order[j]];
    if (cur.offset < prev.offset + prev.bytes) {
      return errorf(StatusCode::kDataLoss, "{}: tensors '{}' [{}, +{}) and '{}' [{}, +{}) overlap",
                    file, prev.name, prev.offset, prev.bytes, cur.name, cur.offset, cur.bytes);
    }
  }
  return f;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

Status GgufFile::key_error(std::string_view key, const GgufValue* v,
                           std::string_view expected) const {
  if (v == nullptr) return errorf(StatusCode::kNotFound, "{}: key '{}' missing", name_, key);
  std::string got(gguf_type_name(v->type()));
  if (v->type() == GgufType::kArray)
    got = fmt::format("array of {}", gguf_type_name(v->elem_type()));
  return errorf(StatusCode::kInvalidArgument, "{}: key '{}' has type {}, expected {}", name_, key,
                got, expected);
}

Result<const GgufValue*> GgufFile::typed(std::string_view key, GgufType type) const {
  const GgufValue* v = find(key);
  if (v == nullptr || v->type() != type) return key_error(key, v, gguf_type_name(type));
  return v;
}

Result<const GgufValue*> GgufFile::typed_array(std::string_view key, GgufType elem) const {
  const GgufValue* v = find(key);
  if (v == nullptr || v->type() != GgufType::kArray || v->elem_type() != elem) {
    return key_error(key, v, fmt::format("array of {}", gguf_type_name(elem)));
  }
  return v;
}

Result<uint8_t> GgufFile::get_u8(std::string_view key) const {
  STRATA_ASSIGN_OR_RETURN(const GgufValue* v, typed(key, GgufType::kU8));
  return static_cast<uint8_t>(v->as_uint());
}
Result<int8_t> GgufFile::get_i8(std::string_view key) const {
  STRATA_ASSIGN_OR_RETURN(const GgufValue* v, typed(key, GgufType::kI8));
  return static_cast<int8_t>(v->as_int());
}
Result<uint16_t> GgufFile::get_u16(std::string_view key) const {
  STRATA_ASSIGN_OR_RETURN(const GgufValue* v, typed(key, GgufType::kU16));
  return static_cast<uint16_t>(v->as_uint());
}
Result<int16_t> GgufFile::get_i16(std::string_view key) const {
  STRATA_ASSIGN_OR_RETURN(const GgufValue* v, typed(key, GgufType::kI16));
  return static_cast<int16_t>(v->as_int());
}
Result<uint32_t> GgufFile::get_u32(std::string_view key) const {
  STRATA_ASSIGN_OR_RETURN(const GgufValue* v, typed(key, GgufType::kU32));
  return static_cast<uint32_t>(v->as_uint());
}
Result<int32_t> GgufFile::get_i32(std::string_view key) const {
  STRATA_ASSIGN_OR_RETURN(const GgufValue* v, typed(key, GgufType::kI32));
  return static_cast<int32_t>(v->as_int());
}
Result<uint64_t> GgufFile::get_u64(std::string_view key) const {
  STRATA_ASSIGN_OR_RETURN(const GgufValue* v, typed(key, GgufType::kU64));
  return v->as_uint();
}
Result<int64_t> GgufFile::get_i64(std::string_view key) const {
  STRATA_ASSIGN_OR_RETURN(const GgufValue* v, typed(key, GgufType::kI64));
  return v->as_int();
}
Result<float> GgufFile::get_f32(std::string_view key) const {
  STRATA_ASSIGN_OR_RETURN(const GgufValue* v, typed(key, GgufType::kF32));
  return static_cast<float>(v->as_float());
}
Result<double> GgufFile::get_f64(std::string_view key) const {
  STRATA_ASSIGN_OR_RETURN(const GgufValue* v, typed(key, GgufType::kF64));
  return v->as_float();
}
Result<bool> GgufFile::get_bool(std::string_view key) const {
  STRATA_ASSIGN_OR_RETURN(const GgufValue* v, typed(key, GgufType::kBool));
  return v->as_bool();
}
Result<std::string> GgufFile::get_string(std::string_view key) const {
  STRATA_ASSIGN_OR_RETURN(const GgufValue* v, typed(key, GgufType::kString));
  return v->as_string();
}

Result<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr || !v->is_integer()) return key_error(key, v, "an integer");
  int64_t out = 0;
  if (!v->to_int64(&out)) {
    return errorf(StatusCode::kOutOfRange, "{}: key '{}' value {} does not fit in i64", name_, key,
                  v->as_uint());
  }
  return out;
}

Result<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr || !v->is_float()) return key_error(key, v, "f32 or f64");
  return v->as_float();
}

Result<std::vector<std::string>> GgufFile::get_string_array(std::string_view key) const {
  STRATA_ASSIGN_OR_RETURN(const GgufValue* v, typed_array(key, GgufType::kString));
  return v->as_strings();
}

Result<std::vector<float>> GgufFile::get_f32_array(std::string_view key) const {
  STRATA_ASSIGN_OR_RETURN(const GgufValue* v, typed_array(key, GgufType::kF32));
  std::vector<float> out(v->array_size());
  if (!out.empty()) std::memcpy(out.data(), v->raw_items().data(), out.size() * sizeof(float));
  return out;
}

Result<std::vector<int32_t>> GgufFile::get_i32_array(std::string_view key) const {
  STRATA_ASSIGN_OR_RETURN(const GgufValue* v, typed_array(key, GgufType::kI32));
  std::vector<int32_t> out(v->array_size());
  if (!out.empty()) std::memcpy(out.data(), v->raw_items().data(), out.size() * sizeof(int32_t));
  return out;
}

Result<std::vector<int64_t>> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue* v = find(key);
  const bool ints = v != nullptr && v->type() == GgufType::kArray &&
                    (v->elem_type() == GgufType::kU8 || v->elem_type() == GgufType::kI8 ||
                     v->elem_type() == GgufType::kU16 || v->elem_type() == GgufType::kI16 ||
                     v->elem_type() == GgufType::kU32 || v->elem_type() == GgufType::kI32 ||
                     v->elem_type() == GgufType::kU64 || v->elem_type() == GgufType::kI64);
  if (!ints) return key_error(key, v, "array of integers");
  std::vector<int64_t> out(v->array_size());
  for (size_t i = 0; i < out.size(); ++i) {
    const GgufValue e = v->item(i);
    if (!e.to_int64(&out[i])) {
      return errorf(StatusCode::kOutOfRange, "{}: key '{}' item {} ({}) does not fit in i64", name_,
                    key, i, e.as_uint());
    }
  }
  return out;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Result<Tensor> GgufFile::tensor(std::string_view name) const {
  const GgufTensorInfo* info = find_tensor(name);
  if (info == nullptr) {
    return errorf(StatusCode::kNotFound, "{}: tensor '{}' not found", name_, name);
  }
  if (!info->dtype.has_value()) {
    return errorf(StatusCode::kUnimplemented,
                  "{}: tensor '{}' has ggml type {} (id {}), which strata does not support", name_,
                  name, ggml_type_name(info->ggml_type), info->ggml_type);
  }
  Tensor t;
  // NOTE: the map is read-only; Tensor's data pointer is non-const by design of the view type.
  t.data = const_cast<uint8_t*>(tensor_data(*info));
  t.dtype = *info->dtype;
  t.ndim = info->ndim;
  t.shape = info->shape;
  int64_t s = 1;
  for (int k = t.ndim - 1; k >= 0; --k) {
    t.stride[static_cast<size_t>(k)] = s;
    s *= t.shape[static_cast<size_t>(k)];
  }
  t.device = Device::cpu();
  return t;
}

}  // namespace strata
