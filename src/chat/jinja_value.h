// Values of the chat-template interpreter (src/chat/chat_template.cpp): Python's object model cut
// down to what Jinja templates see (None, bool, int, float, str, list/tuple, dict, namespace,
// callables) plus jinja2's Undefined, and the Python-compatible formatting (str(), repr(),
// json.dumps) that decides the bytes a template renders.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/status.h"

namespace strata::jinja {

enum class Kind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kDict,
  kNamespace,
  kFunc
};

struct Value;
struct Dict;
struct Func;
using List = std::vector<Value>;

struct Value {
  Kind kind = Kind::kUndefined;
  bool tuple = false;  // a list that prints as a Python tuple (from items())
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // the string; for Undefined the reason an error would give
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;  // dict or namespace
  std::shared_ptr<Func> func;

  static Value undefined(std::string hint) {
    Value v;
    v.s = std::move(hint);
    return v;
  }
  static Value none() {
    Value v;
    v.kind = Kind::kNone;
    return v;
  }
  static Value boolean(bool x) {
    Value v;
    v.kind = Kind::kBool;
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.kind = Kind::kInt;
    v.i = x;
    return v;
  }
  static Value real(double x) {
    Value v;
    v.kind = Kind::kFloat;
    v.f = x;
    return v;
  }
  static Value string(std::string x) {
    Value v;
    v.kind = Kind::kString;
    v.s = std::move(x);
    return v;
  }
  static Value make_list(List items = {}, bool is_tuple = false);
  static Value make_dict();
  static Value make_namespace();

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_number() const {
    return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool;
  }
  bool is_mapping() const { return kind == Kind::kDict || kind == Kind::kNamespace; }
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const {
    for (const auto& [k, v] : items)
      if (k == key) return &v;
    return nullptr;
  }
  void set(const std::string& key, Value v) {
    for (auto& [k, old] : items) {
      if (k == key) {
        old = std::move(v);
        return;
      }
    }
    items.emplace_back(key, std::move(v));
  }
};

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // Positional `index` or keyword `name`; nullptr when neither was passed.
  const Value* get(size_t index, std::string_view name) const {
    if (index < pos.size()) return &pos[index];
    for (const auto& [k, v] : kw)
      if (k == name) return &v;
    return nullptr;
  }
};

struct Func {
  std::string name;
  std::function<Result<Value>(Args&)> fn;
};

inline Value Value::make_list(List items, bool is_tuple) {
  Value v;
  v.kind = Kind::kList;
  v.tuple = is_tuple;
  v.list = std::make_shared<List>(std::move(items));
  return v;
}
inline Value Value::make_dict() {
  Value v;
  v.kind = Kind::kDict;
  v.dict = std::make_shared<Dict>();
  return v;
}
inline Value Value::make_namespace() {
  Value v;
  v.kind = Kind::kNamespace;
  v.dict = std::make_shared<Dict>();
  return v;
}

// Python's type name: "str", "int", "NoneType", "dict", ...
const char* type_name(const Value& v);
// Python truthiness (Undefined is false).
bool truthy(const Value& v);
// str(v) as jinja2 prints it; Undefined prints as "".
std::string to_str(const Value& v);
// repr(v) as Python writes it inside a printed list or dict.
std::string repr(const Value& v);
// repr(float): shortest round-trip digits, exponent outside [1e-4, 1e16).
std::string float_repr(double d);
// Python ==.
bool equal(const Value& a, const Value& b);

struct JsonDumpOptions {
  std::string indent;  // empty: one line
  bool has_indent = false;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// json.dumps(v, ...) as transformers' tojson filter calls it.
Result<std::string> json_dumps(const Value& v, const JsonDumpOptions& options, size_t max_bytes);

// nlohmann JSON (from the caller's context) to a Value; depth-limited.
Result<Value> from_json(const nlohmann::ordered_json& j, int depth = 0);

// UTF-8 code point boundaries of `s` (size()+1 offsets, the last is s.size()); invalid bytes
// count as one code point each, so every byte string has a well-defined length.
std::vector<size_t> codepoint_offsets(std::string_view s);
bool is_ascii(std::string_view s);

}  // namespace strata::jinja
