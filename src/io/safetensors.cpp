#include "io/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace strata {

namespace {

using nlohmann::json;

constexpr int kMaxJsonDepth = 16;  // a valid header nests 3 deep; anything past this is junk
constexpr size_t kMaxQuotedChars = 160;

struct DTypeRow {
  SafetensorsDType dtype;
  std::string_view name;
  int64_t size;
};

constexpr DTypeRow kDTypeTable[] = {
    {SafetensorsDType::kBool, "BOOL", 1},      {SafetensorsDType::kU8, "U8", 1},
    {SafetensorsDType::kI8, "I8", 1},          {SafetensorsDType::kF8E5M2, "F8_E5M2", 1},
    {SafetensorsDType::kF8E4M3, "F8_E4M3", 1}, {SafetensorsDType::kI16, "I16", 2},
    {SafetensorsDType::kU16, "U16", 2},        {SafetensorsDType::kF16, "F16", 2},
    {SafetensorsDType::kBF16, "BF16", 2},      {SafetensorsDType::kI32, "I32", 4},
    {SafetensorsDType::kU32, "U32", 4},        {SafetensorsDType::kF32, "F32", 4},
    {SafetensorsDType::kF64, "F64", 8},        {SafetensorsDType::kI64, "I64", 8},
    {SafetensorsDType::kU64, "U64", 8},
};

const DTypeRow& dtype_row(SafetensorsDType dt) {
  for (const DTypeRow& row : kDTypeTable) {
    if (row.dtype == dt) return row;
  }
  return kDTypeTable[1];
}

std::string printable(std::string_view text, size_t max_chars = kMaxQuotedChars) {
  return printable_for_message(text, max_chars);
}

// nlohmann's message without its "[json.exception.parse_error.101] " tag.
std::string json_error_text(const std::exception& e) {
  std::string_view text = e.what();
  if (text.substr(0, 1) == "[") {
    const size_t close = text.find("] ");
    if (close != std::string_view::npos) text.remove_prefix(close + 2);
  }
  return printable(text, 300);
}

// Short rendering of a JSON value for messages.
std::string excerpt(const json& value) {
  try {
    return printable(value.dump(-1, ' ', false, json::error_handler_t::replace));
  } catch (const std::exception&) {
    return "<value>";
  }
}

const char* json_kind(const json& value) {
  switch (value.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a float";
    case json::value_t::binary:
      return "binary";
    case json::value_t::discarded:
      return "discarded";
  }
  return "unknown";
}

// A JSON integer in [0, 2^63) (shape dims) or [0, 2^64) (offsets); false for anything else.
bool json_to_u64(const json& value, uint64_t* out) {
  if (value.is_number_unsigned()) {
    *out = value.get<uint64_t>();
    return true;
  }
  if (value.is_number_integer()) {
    const auto v = value.get<int64_t>();
    if (v < 0) return false;
    *out = static_cast<uint64_t>(v);
    return true;
  }
  return false;
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Thrown by the parser callback to stop on input no valid header has; caught in parse().
struct HeaderRejected {
  std::string message;
};

Status parse_entry(const std::string& file, const std::string& key, const json& value,
                   uint64_t data_bytes, SafetensorsEntry* e) {
  const std::string where = fmt::format("{}: tensor '{}'", file, printable(key));
  if (!value.is_object()) {
    return errorf(StatusCode::kDataLoss, "{}: entry is {}, not an object", where, json_kind(value));
  }
  e->name = key;

  const auto dtype_it = value.find("dtype");
  if (dtype_it == value.end()) {
    return errorf(StatusCode::kDataLoss, "{}: entry has no 'dtype'", where);
  }
  if (!dtype_it->is_string()) {
    return errorf(StatusCode::kDataLoss, "{}: 'dtype' is {}, not a string", where,
                  json_kind(*dtype_it));
  }
  const auto& dtype_text = dtype_it->get_ref<const std::string&>();
  if (!parse_safetensors_dtype(dtype_text, &e->dtype)) {
    return errorf(StatusCode::kDataLoss, "{}: unknown dtype '{}'", where, printable(dtype_text));
  }
  const int64_t elem_size = safetensors_dtype_size(e->dtype);

  const auto shape_it = value.find("shape");
  if (shape_it == value.end()) {
    return errorf(StatusCode::kDataLoss, "{}: entry has no 'shape'", where);
  }
  if (!shape_it->is_array()) {
    return errorf(StatusCode::kDataLoss, "{}: 'shape' is {}, not an array", where,
                  json_kind(*shape_it));
  }
  e->shape.clear();
  e->shape.reserve(shape_it->size());
  int64_t numel = 1;
  bool overflow = false;
  for (size_t i = 0; i < shape_it->size(); ++i) {
    const json& d = (*shape_it)[i];
    uint64_t dim = 0;
    if (!json_to_u64(d, &dim) || dim > static_cast<uint64_t>(INT64_MAX)) {
      return errorf(StatusCode::kDataLoss, "{}: shape[{}] is {}, not a non-negative integer", where,
                    i, excerpt(d));
    }
    e->shape.push_back(static_cast<int64_t>(dim));
    if (__builtin_mul_overflow(numel, static_cast<int64_t>(dim), &numel)) overflow = true;
  }
  int64_t need_bytes = 0;
  // A zero dim makes the product 0 even if an earlier partial product overflowed.
  bool has_zero = false;
  for (int64_t d : e->shape) has_zero |= (d == 0);
  if (has_zero) {
    numel = 0;
    overflow = false;
  }
  if (overflow || __builtin_mul_overflow(numel, elem_size, &need_bytes)) {
    return errorf(StatusCode::kDataLoss, "{}: shape {} is too large (element count overflows)",
                  where, e->shape_string());
  }
  e->numel = numel;

  const auto off_it = value.find("data_offsets");
  if (off_it == value.end()) {
    return errorf(StatusCode::kDataLoss, "{}: entry has no 'data_offsets'", where);
  }
  if (!off_it->is_array() || off_it->size() != 2) {
    return errorf(StatusCode::kDataLoss, "{}: 'data_offsets' is {}, not [begin, end]", where,
                  excerpt(*off_it));
  }
  if (!json_to_u64((*off_it)[0], &e->begin) || !json_to_u64((*off_it)[1], &e->end)) {
    return errorf(StatusCode::kDataLoss,
                  "{}: 'data_offsets' {} must hold two non-negative integers", where,
                  excerpt(*off_it));
  }
  if (e->begin > e->end) {
    return errorf(StatusCode::kDataLoss, "{}: data_offsets [{}, {}] begin past end", where,
                  e->begin, e->end);
  }
  if (e->end > data_bytes) {
    return errorf(StatusCode::kDataLoss,
                  "{}: data_offsets [{}, {}] run past the data section ({} bytes; truncated file?)",
                  where, e->begin, e->end, data_bytes);
  }
  if (e->end - e->begin != static_cast<uint64_t>(need_bytes)) {
    return errorf(StatusCode::kDataLoss,
                  "{}: shape {} of {} needs {} bytes but data_offsets [{}, {}] hold {}", where,
                  e->shape_string(), safetensors_dtype_name(e->dtype), need_bytes, e->begin, e->end,
                  e->end - e->begin);
  }
  return ok_status();
}

}  // namespace

bool parse_safetensors_dtype(std::string_view text, SafetensorsDType* out) {
  for (const DTypeRow& row : kDTypeTable) {
    if (row.name == text) {
      *out = row.dtype;
      return true;
    }
  }
  return false;
}

std::string_view safetensors_dtype_name(SafetensorsDType dt) {
  return dtype_row(dt).name;
}

int64_t safetensors_dtype_size(SafetensorsDType dt) {
  return dtype_row(dt).size;
}

Result<DType> to_strata_dtype(SafetensorsDType dt) {
  switch (dt) {
    case SafetensorsDType::kU8:
      return DType::kU8;
    case SafetensorsDType::kI8:
      return DType::kI8;
    case SafetensorsDType::kF8E4M3:
      return DType::kFP8E4M3;
    case SafetensorsDType::kF16:
      return DType::kF16;
    case SafetensorsDType::kBF16:
      return DType::kBF16;
    case SafetensorsDType::kI32:
      return DType::kI32;
    case SafetensorsDType::kF32:
      return DType::kF32;
    case SafetensorsDType::kI64:
      return DType::kI64;
    case SafetensorsDType::kBool:
    case SafetensorsDType::kF8E5M2:
    case SafetensorsDType::kI16:
    case SafetensorsDType::kU16:
    case SafetensorsDType::kU32:
    case SafetensorsDType::kF64:
    case SafetensorsDType::kU64:
      break;
  }
  return errorf(StatusCode::kUnimplemented, "unsupported dtype {}", safetensors_dtype_name(dt));
}

Result<SafetensorsDType> to_safetensors_dtype(DType dt) {
  switch (dt) {
    case DType::kF32:
      return SafetensorsDType::kF32;
    case DType::kF16:
      return SafetensorsDType::kF16;
    case DType::kBF16:
      return SafetensorsDType::kBF16;
    case DType::kI8:
      return SafetensorsDType::kI8;
    case DType::kFP8E4M3:
      return SafetensorsDType::kF8E4M3;
    case DType::kI32:
      return SafetensorsDType::kI32;
    case DType::kI64:
      return SafetensorsDType::kI64;
    case DType::kU8:
      return SafetensorsDType::kU8;
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      break;
  }
  return errorf(StatusCode::kUnimplemented, "dtype {} has no safetensors equivalent",
                dtype_name(dt));
}

std::string SafetensorsEntry::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

Result<std::shared_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<MappedFile> map, MappedFile::open(path));
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<SafetensorsFile> file,
                          parse(map->data(), map->size(), path));
  file->map_ = std::move(map);
  return file;
}

Result<std::shared_ptr<SafetensorsFile>> SafetensorsFile::parse(const uint8_t* data, size_t size,
                                                                std::string name) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->name_ = std::move(name);
  const std::string& file = f->name_;

  if (size < 8) {
    return errorf(StatusCode::kDataLoss,
                  "{}: file is {} bytes, too short for the 8-byte header length", file, size);
  }
  const uint64_t n = read_u64_le(data);
  if (n > kSafetensorsMaxHeaderBytes) {
    return errorf(StatusCode::kDataLoss,
                  "{}: header length {} is absurd (limit {}); not a safetensors file?", file, n,
                  kSafetensorsMaxHeaderBytes);
  }
  if (n > size - 8) {
    return errorf(StatusCode::kDataLoss,
                  "{}: header length {} runs past the end of the file ({} bytes)", file, n, size);
  }
  f->header_bytes_ = n;
  f->data_section_ = data + 8 + n;
  f->data_bytes_ = size - 8 - n;

  // Parse the header. The callback stops absurd nesting early and catches a tensor name given
  // twice (nlohmann would keep the last one silently).
  json header;
  try {
    std::unordered_set<std::string> keys;
    auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
      if ((event == json::parse_event_t::object_start ||
           event == json::parse_event_t::array_start) &&
          depth > kMaxJsonDepth) {
        throw HeaderRejected{fmt::format("header JSON nests deeper than {} levels", kMaxJsonDepth)};
      }
      if (event == json::parse_event_t::key && depth == 1 && parsed.is_string()) {
        const auto& key = parsed.get_ref<const std::string&>();
        if (!keys.insert(key).second) {
          throw HeaderRejected{
              fmt::format("tensor '{}' appears twice in the header", printable(key))};
        }
      }
      return true;
    };
    const auto* begin = reinterpret_cast<const char*>(data + 8);
    header = json::parse(begin, begin + n, callback);
  } catch (const HeaderRejected& e) {
    return errorf(StatusCode::kDataLoss, "{}: {}", file, e.message);
  } catch (const json::exception& e) {
    return errorf(StatusCode::kDataLoss, "{}: header is not valid JSON: {}", file,
                  json_error_text(e));
  } catch (const std::bad_alloc&) {
    return errorf(StatusCode::kOutOfMemory, "{}: out of memory parsing the {}-byte header", file,
                  n);
  } catch (const std::exception& e) {
    return errorf(StatusCode::kDataLoss, "{}: cannot parse the header: {}", file,
                  json_error_text(e));
  }
  if (!header.is_object()) {
    return errorf(StatusCode::kDataLoss, "{}: header is {}, not a JSON object", file,
                  json_kind(header));
  }

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    if (key == "__metadata__") {
      if (!it->is_object()) {
        return errorf(StatusCode::kDataLoss, "{}: __metadata__ is {}, not an object", file,
                      json_kind(*it));
      }
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          return errorf(StatusCode::kDataLoss, "{}: __metadata__ value of '{}' is {}, not a string",
                        file, printable(m.key()), json_kind(*m));
        }
        f->metadata_.emplace(m.key(), m->get<std::string>());
      }
      continue;
    }
    SafetensorsEntry entry;
    STRATA_RETURN_IF_ERROR(parse_entry(file, key, *it, f->data_bytes_, &entry));
    f->tensor_bytes_ += entry.bytes();
    f->entries_.emplace(key, std::move(entry));
  }
  header = json();  // free the DOM before building the index

  // No two tensors may share a byte. Empty tensors occupy nothing.
  std::vector<const SafetensorsEntry*> by_offset;
  by_offset.reserve(f->entries_.size());
  for (const auto& [key, entry] : f->entries_) {
    if (entry.bytes() > 0) by_offset.push_back(&entry);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
              return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
            });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const SafetensorsEntry& a = *by_offset[i - 1];
    const SafetensorsEntry& b = *by_offset[i];
    if (b.begin < a.end) {
      return errorf(StatusCode::kDataLoss,
                    "{}: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap in the data section", file,
                    printable(a.name), a.begin, a.end, printable(b.name), b.begin, b.end);
    }
  }
  // NOTE: gaps between tensors and trailing bytes are accepted (the reference writer never
  // makes them, but they cannot make a read go wrong).

  f->names_.reserve(f->entries_.size());
  for (const auto& [key, entry] : f->entries_) f->names_.push_back(key);
  return f;
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  const auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

Result<const SafetensorsEntry*> SafetensorsFile::info(std::string_view name) const {
  const SafetensorsEntry* e = find(name);
  if (!e) {
    return errorf(StatusCode::kNotFound, "{}: tensor '{}' not found", name_, printable(name));
  }
  return e;
}

Result<Tensor> SafetensorsFile::tensor(std::string_view name) const {
  STRATA_ASSIGN_OR_RETURN(const SafetensorsEntry* e, info(name));
  const std::string where = fmt::format("{}: tensor '{}'", name_, printable(name));
  Result<DType> dt = to_strata_dtype(e->dtype);
  if (!dt.ok()) {
    return errorf(
        StatusCode::kUnimplemented,
        "{}: unsupported dtype {} (strata reads F32, F16, BF16, F8_E4M3, I8, U8, I32, I64)", where,
        safetensors_dtype_name(e->dtype));
  }
  if (e->shape.size() > static_cast<size_t>(kMaxDims)) {
    return errorf(StatusCode::kUnimplemented,
                  "{}: shape {} has {} dims; strata tensors have at most {}", where,
                  e->shape_string(), e->shape.size(), kMaxDims);
  }
  const uint8_t* p = data_section_ + e->begin;
  const auto elem = static_cast<uintptr_t>(safetensors_dtype_size(e->dtype));
  if (e->numel > 0 && reinterpret_cast<uintptr_t>(p) % elem != 0) {
    return errorf(StatusCode::kUnimplemented,
                  "{}: data at file offset {} is not aligned to its {}-byte elements", where,
                  data_offset() + e->begin, elem);
  }
  Tensor t;
  t.data = const_cast<uint8_t*>(p);  // read-only map: the view must not be written
  t.dtype = *dt;
  t.ndim = static_cast<int>(e->shape.size());
  int64_t stride = 1;
  for (int k = t.ndim - 1; k >= 0; --k) {
    const auto i = static_cast<size_t>(k);
    t.shape[i] = e->shape[i];
    t.stride[i] = stride;
    stride *= e->shape[i];
  }
  t.device = Device::cpu();
  return t;
}

Result<Buffer> SafetensorsFile::buffer(std::string_view name) const {
  STRATA_ASSIGN_OR_RETURN(const SafetensorsEntry* e, info(name));
  const size_t bytes = static_cast<size_t>(e->bytes());
  if (map_) return map_->buffer(static_cast<size_t>(data_offset() + e->begin), bytes, map_);
  return Buffer(const_cast<uint8_t*>(data_section_ + e->begin), bytes, Device::cpu(),
                Residency::kHostMapped, nullptr);
}

// ---- writer ------------------------------------------------------------------------------

Status write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  struct Item {
    const std::string* name;
    const Tensor* tensor;
    SafetensorsDType dtype;
    uint64_t bytes;
  };
  std::vector<Item> items;
  items.reserve(tensors.size());
  std::set<std::string_view> seen;
  for (const auto& [name, t] : tensors) {
    const std::string where = fmt::format("{}: tensor '{}'", path, printable(name));
    if (name == "__metadata__") {
      return errorf(StatusCode::kInvalidArgument, "{}: '__metadata__' is reserved", where);
    }
    if (!seen.insert(name).second) {
      return errorf(StatusCode::kInvalidArgument, "{}: name given twice", where);
    }
    if (!t.device.is_cpu()) {
      return errorf(StatusCode::kInvalidArgument, "{}: on {}; copy it to the CPU first", where,
                    t.device.to_string());
    }
    if (!t.is_contiguous()) {
      return errorf(StatusCode::kInvalidArgument, "{}: not contiguous", where);
    }
    Result<SafetensorsDType> dt = to_safetensors_dtype(t.dtype);
    if (!dt.ok()) return dt.status().with_context(where);
    const int64_t numel = t.numel();
    if (numel < 0) {
      return errorf(StatusCode::kInvalidArgument, "{}: negative shape {}", where, t.shape_string());
    }
    const auto bytes = static_cast<uint64_t>(numel * safetensors_dtype_size(*dt));
    if (bytes > 0 && t.data == nullptr) {
      return errorf(StatusCode::kInvalidArgument, "{}: no data", where);
    }
    items.push_back({&name, &t, *dt, bytes});
  }
  // Largest elements first keeps every tensor aligned to its element size: all offsets stay
  // multiples of the current element size because every earlier tensor's size is.
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return safetensors_dtype_size(a.dtype) > safetensors_dtype_size(b.dtype);
  });

  std::string header_text;
  try {
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    uint64_t offset = 0;
    for (const Item& item : items) {
      std::vector<int64_t> shape(item.tensor->shape.begin(),
                                 item.tensor->shape.begin() + item.tensor->ndim);
      header[*item.name] = {{"dtype", safetensors_dtype_name(item.dtype)},
                            {"shape", shape},
                            {"data_offsets", {offset, offset + item.bytes}}};
      offset += item.bytes;
    }
    header_text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: cannot encode the header (names and metadata must be UTF-8): {}", path,
                  json_error_text(e));
  }
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  const std::string tmp = path + ".tmp";
  std::FILE* out = std::fopen(tmp.c_str(), "wb");
  if (!out) {
    return errorf(StatusCode::kIoError, "{}: cannot create: {}", tmp, std::strerror(errno));
  }
  uint8_t len[8];
  uint64_t n = header_text.size();
  for (int i = 0; i < 8; ++i, n >>= 8) len[i] = static_cast<uint8_t>(n & 0xff);
  bool ok = std::fwrite(len, 1, 8, out) == 8 &&
            std::fwrite(header_text.data(), 1, header_text.size(), out) == header_text.size();
  for (const Item& item : items) {
    if (!ok) break;
    if (item.bytes == 0) continue;
    ok = std::fwrite(item.tensor->data, 1, item.bytes, out) == item.bytes;
  }
  const int write_errno = errno;
  if (std::fclose(out) != 0) ok = false;
  if (!ok) {
    std::remove(tmp.c_str());
    return errorf(StatusCode::kIoError, "{}: write failed: {}", tmp, std::strerror(write_errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return errorf(StatusCode::kIoError, "{}: cannot rename {} into place: {}", path, tmp,
                  std::strerror(err));
  }
  return ok_status();
}

}  // namespace strata
