#include "chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/status.h"

namespace strata::jinja {

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return v.tuple ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kFunc:
      return "function";
  }
  return "object";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return v.b;
    case Kind::kInt:
      return v.i != 0;
    case Kind::kFloat:
      return v.f != 0.0;
    case Kind::kString:
      return !v.s.empty();
    case Kind::kList:
      return !v.list->empty();
    case Kind::kDict:
      return !v.dict->items.empty();
    case Kind::kNamespace:
    case Kind::kFunc:
      return true;
  }
  return false;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  size_t p = 0;
  if (sci[0] == '-') {
    sign = "-";
    p = 1;
  }
  size_t e = sci.find('e');
  std::string digits;
  for (size_t k = p; k < e; ++k)
    if (sci[k] != '.') digits += sci[k];
  int exp = std::atoi(sci.c_str() + e + 1);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  int n = static_cast<int>(digits.size());
  std::string out = sign;
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      if (n <= exp + 1) {
        out += digits + std::string(exp + 1 - n, '0') + ".0";
      } else {
        out += digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
      }
    } else {
      out += "0." + std::string(-exp - 1, '0') + digits;
    }
  } else {
    out += digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
  }
  return out;
}

static std::string str_repr(const std::string& s) {
  char quote = '\'';
  if (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) quote = '"';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == quote || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

std::string repr(const Value& v) {
  switch (v.kind) {
    case Kind::kString:
      return str_repr(v.s);
    case Kind::kUndefined:
      return "Undefined";
    default:
      return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return v.b ? "True" : "False";
    case Kind::kInt:
      return std::to_string(v.i);
    case Kind::kFloat:
      return float_repr(v.f);
    case Kind::kString:
      return v.s;
    case Kind::kList: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += repr((*v.list)[k]);
      }
      if (v.tuple && v.list->size() == 1) out += ",";
      out += v.tuple ? ")" : "]";
      return out;
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      std::string out = v.kind == Kind::kNamespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, x] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += str_repr(k) + ": " + repr(x);
      }
      out += v.kind == Kind::kNamespace ? "}>" : "}";
      return out;
    }
    case Kind::kFunc:
      return "<function " + v.func->name + ">";
  }
  return "";
}

static double as_double(const Value& v) {
  if (v.kind == Kind::kFloat) return v.f;
  if (v.kind == Kind::kBool) return v.b ? 1 : 0;
  return static_cast<double>(v.i);
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::kFloat && b.kind != Kind::kFloat) {
      int64_t x = a.kind == Kind::kBool ? a.b : a.i;
      int64_t y = b.kind == Kind::kBool ? b.b : b.i;
      return x == y;
    }
    return as_double(a) == as_double(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.s == b.s;
    case Kind::kList: {
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    }
    case Kind::kDict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, x] : a.dict->items) {
        const Value* y = b.dict->find(k);
        if (!y || !equal(x, *y)) return false;
      }
      return true;
    }
    case Kind::kNamespace:
      return a.dict == b.dict;
    case Kind::kFunc:
      return a.func == b.func;
    default:
      return false;
  }
}

static void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  size_t k = 0;
  while (k < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[k]);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof(b), "\\u%04x", c);
          out += b;
        } else if (c >= 0x80 && ensure_ascii) {
          // Decode one code point; invalid bytes are written as themselves.
          uint32_t cp = 0;
          int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
          if (len == 1 || k + len > s.size()) {
            out += static_cast<char>(c);
            break;
          }
          cp = c & (0x3F >> (len - 1));
          for (int m = 1; m < len; ++m)
            cp = (cp << 6) | (static_cast<unsigned char>(s[k + m]) & 0x3F);
          k += len - 1;
          char b[16];
          if (cp >= 0x10000) {
            cp -= 0x10000;
            std::snprintf(b, sizeof(b), "\\u%04x\\u%04x", 0xD800 + (cp >> 10),
                          0xDC00 + (cp & 0x3FF));
          } else {
            std::snprintf(b, sizeof(b), "\\u%04x", cp);
          }
          out += b;
        } else {
          out += static_cast<char>(c);
        }
    }
    ++k;
  }
  out += '"';
}

static Status json_dump_into(const Value& v, const JsonDumpOptions& o, int level, size_t max_bytes,
                             std::string& out) {
  if (out.size() > max_bytes)
    return errorf(StatusCode::kOutOfRange, "tojson output exceeds {} bytes", max_bytes);
  if (level > 512) return Status(StatusCode::kOutOfRange, "tojson: value nested too deeply");
  auto newline = [&](int lvl) {
    if (!o.has_indent) return;
    out += '\n';
    for (int k = 0; k < lvl; ++k) out += o.indent;
  };
  switch (v.kind) {
    case Kind::kNone:
      out += "null";
      return ok_status();
    case Kind::kBool:
      out += v.b ? "true" : "false";
      return ok_status();
    case Kind::kInt:
      out += std::to_string(v.i);
      return ok_status();
    case Kind::kFloat:
      if (std::isnan(v.f))
        out += "NaN";
      else if (std::isinf(v.f))
        out += v.f < 0 ? "-Infinity" : "Infinity";
      else
        out += float_repr(v.f);
      return ok_status();
    case Kind::kString:
      json_string(v.s, o.ensure_ascii, out);
      return ok_status();
    case Kind::kList: {
      if (v.list->empty()) {
        out += "[]";
        return ok_status();
      }
      out += '[';
      newline(level + 1);
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) {
          out += o.item_sep;
          newline(level + 1);
        }
        STRATA_RETURN_IF_ERROR(json_dump_into((*v.list)[k], o, level + 1, max_bytes, out));
      }
      newline(level);
      out += ']';
      return ok_status();
    }
    case Kind::kDict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return ok_status();
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      out += '{';
      newline(level + 1);
      bool first = true;
      for (const auto* kv : items) {
        if (!first) {
          out += o.item_sep;
          newline(level + 1);
        }
        first = false;
        json_string(kv->first, o.ensure_ascii, out);
        out += o.key_sep;
        STRATA_RETURN_IF_ERROR(json_dump_into(kv->second, o, level + 1, max_bytes, out));
      }
      newline(level);
      out += '}';
      return ok_status();
    }
    default:
      return errorf(StatusCode::kInvalidArgument, "Object of type {} is not JSON serializable",
                    type_name(v));
  }
}

Result<std::string> json_dumps(const Value& v, const JsonDumpOptions& options, size_t max_bytes) {
  std::string out;
  STRATA_RETURN_IF_ERROR(json_dump_into(v, options, 0, max_bytes, out));
  if (out.size() > max_bytes)
    return errorf(StatusCode::kOutOfRange, "tojson output exceeds {} bytes", max_bytes);
  return out;
}

Result<Value> from_json(const nlohmann::ordered_json& j, int depth) {
  if (depth > 256) return Status(StatusCode::kInvalidArgument, "context nested too deeply");
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::integer(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::real(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value::real(j.get<double>());
    case nlohmann::json::value_t::string:
      return Value::string(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& x : j) {
        STRATA_ASSIGN_OR_RETURN(Value v, from_json(x, depth + 1));
        items.push_back(std::move(v));
      }
      return Value::make_list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Value d = Value::make_dict();
      for (auto it = j.begin(); it != j.end(); ++it) {
        STRATA_ASSIGN_OR_RETURN(Value v, from_json(it.value(), depth + 1));
        d.dict->items.emplace_back(it.key(), std::move(v));
      }
      return d;
    }
    default:
      return Status(StatusCode::kInvalidArgument, "unsupported JSON value in context");
  }
}

bool is_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

std::vector<size_t> codepoint_offsets(std::string_view s) {
  std::vector<size_t> off;
  off.reserve(s.size() + 1);
  size_t k = 0;
  while (k < s.size()) {
    off.push_back(k);
    unsigned char c = static_cast<unsigned char>(s[k]);
    size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (len > 1) {
      if (k + len > s.size()) {
        len = 1;
      } else {
        for (size_t m = 1; m < len; ++m)
          if ((static_cast<unsigned char>(s[k + m]) & 0xC0) != 0x80) len = 1;
      }
    }
    k += len;
  }
  off.push_back(s.size());
  return off;
}

}  // namespace strata::jinja
