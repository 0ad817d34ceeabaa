#include "chat/chat_template.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "chat/jinja_parse.h"
#include "chat/jinja_value.h"
#include "core/status.h"

namespace strata {

using jinja::Args;
using jinja::Body;
using jinja::Expr;
using jinja::ExprKind;
using jinja::Func;
using jinja::Kind;
using jinja::List;
using jinja::Stmt;
using jinja::StmtKind;
using jinja::Value;

namespace {

constexpr const char* kPrefix = "chat template: ";
constexpr int64_t kMaxRange = 100000;  // jinja2 sandbox MAX_RANGE

Status plain(std::string msg) {
  return Status(StatusCode::kInvalidArgument, std::move(msg));
}

bool starts_with(const std::string& s, const char* p) {
  return s.rfind(p, 0) == 0;
}

Status at_line(const Status& st, int line) {
  if (st.ok() || starts_with(st.message(), kPrefix)) return st;
  return Status(st.code(), fmt::format("{}line {}: {}", kPrefix, line, st.message()));
}

Status undefined_error(const Value& v) {
  return plain(v.s.empty() ? "value is undefined" : v.s);
}

bool is_py_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' ||
         (c >= 0x1c && c <= 0x1f);
}

std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  auto strip_char = [&](char c) {
    if (!chars || chars->kind == Kind::kNone || chars->is_undefined()) return is_py_space(c);
    return chars->s.find(c) != std::string::npos;
  };
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && strip_char(s[b])) ++b;
  if (right)
    while (e > b && strip_char(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::string ascii_upper(std::string s) {
  for (char& c : s)
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
  return s;
}
std::string ascii_lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  return s;
}
bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
std::string py_title(std::string s) {
  bool prev_cased = false;
  for (char& c : s) {
    if (is_alpha(c)) {
      c = prev_cased ? ascii_lower(std::string(1, c))[0] : ascii_upper(std::string(1, c))[0];
      prev_cased = true;
    } else {
      prev_cased = false;
    }
  }
  return s;
}
std::string py_capitalize(const std::string& s) {
  std::string out = ascii_lower(s);
  if (!out.empty()) out[0] = ascii_upper(out.substr(0, 1))[0];
  return out;
}
std::string py_replace(const std::string& s, const std::string& from, const std::string& to,
                       int64_t count, size_t max_bytes, bool& too_big) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between code points (and at both ends).
    auto off = jinja::codepoint_offsets(s);
    int64_t done = 0;
    for (size_t k = 0; k + 1 < off.size(); ++k) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      out.append(s, off[k], off[k + 1] - off[k]);
      if (out.size() > max_bytes) {
        too_big = true;
        return "";
      }
    }
    if (count < 0 || done < count) out += to;
    return out;
  }
  size_t p = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t q = s.find(from, p);
    if (q == std::string::npos) break;
    out.append(s, p, q - p);
    out += to;
    p = q + from.size();
    ++done;
    if (out.size() > max_bytes) {
      too_big = true;
      return "";
    }
  }
  out.append(s, p, std::string::npos);
  return out;
}

// Python slice indices for a sequence of length n.
Result<std::vector<int64_t>> slice_indices(int64_t n, const Value& a, const Value& b,
                                           const Value& c) {
  auto as_int = [](const Value& v, bool& none) -> Result<int64_t> {
    none = v.kind == Kind::kNone || v.is_undefined();
    if (none) return int64_t{0};
    if (v.kind == Kind::kInt) return v.i;
    if (v.kind == Kind::kBool) return int64_t{v.b};
    return plain("slice indices must be integers or None");
  };
  bool none_a, none_b, none_c;
  STRATA_ASSIGN_OR_RETURN(int64_t step, as_int(c, none_c));
  if (none_c) step = 1;
  if (step == 0) return plain("slice step cannot be zero");
  STRATA_ASSIGN_OR_RETURN(int64_t start, as_int(a, none_a));
  STRATA_ASSIGN_OR_RETURN(int64_t stop, as_int(b, none_b));
  auto clamp = [&](int64_t x, bool none, bool is_start) {
    if (none) return step > 0 ? (is_start ? int64_t{0} : n) : (is_start ? n - 1 : int64_t{-1});
    if (x < 0) {
      x += n;
      if (x < 0) x = step > 0 ? 0 : -1;
    } else if (x >= n) {
      x = step > 0 ? n : n - 1;
    }
    return x;
  };
  start = clamp(start, none_a, true);
  stop = clamp(stop, none_b, false);
  std::vector<int64_t> idx;
  if (step > 0) {
    for (int64_t k = start; k < stop; k += step) idx.push_back(k);
  } else {
    for (int64_t k = start; k > stop; k += step) idx.push_back(k);
  }
  return idx;
}

enum class Flow { kNormal, kBreak, kContinue };

struct Scope {
  std::unordered_map<std::string, Value> vars;
  Scope* parent = nullptr;
  Value* find(const std::string& name) {
    for (Scope* s = this; s; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

class Renderer {
 public:
  explicit Renderer(const ChatTemplateOptions& o) : opt_(o) {}

  Result<std::string> run(const jinja::Template& t, const nlohmann::ordered_json& context) {
    Scope root;
    root_ = &root;
    install_globals(root);
    if (!context.is_null()) {
      if (!context.is_object())
        return plain(std::string(kPrefix) + "context must be a JSON object");
      for (auto it = context.begin(); it != context.end(); ++it) {
        auto v = jinja::from_json(it.value());
        if (!v.ok()) return Status(v.status().code(), kPrefix + v.status().message());
        root.vars[it.key()] = std::move(v).value();
      }
    }
    std::string out;
    Flow flow = Flow::kNormal;
    Status st = exec_body(t.body, root, out, flow);
    if (!st.ok()) return at_line(st, 0);
    return out;
  }

 private:
  // ---- limits ---------------------------------------------------------------------------------
  Status charge(int64_t units) {
    work_ += units;
    if (work_ > opt_.max_work)
      return errorf(StatusCode::kOutOfRange, "template exceeded its work limit ({} units)",
                    opt_.max_work);
    return ok_status();
  }
  Status check_size(size_t bytes) const {
    if (bytes > opt_.max_output_bytes)
      return errorf(StatusCode::kOutOfRange, "output exceeds {} bytes", opt_.max_output_bytes);
    return ok_status();
  }
  struct DepthGuard {
    int& d;
    explicit DepthGuard(int& x) : d(x) { ++d; }
    ~DepthGuard() { --d; }
  };
  Status check_depth() const {
    if (depth_ > opt_.max_depth)
      return errorf(StatusCode::kOutOfRange, "recursion deeper than {}", opt_.max_depth);
    return ok_status();
  }

  Value make_func(std::string name, std::function<Result<Value>(Args&)> fn) {
    Value v;
    v.kind = Kind::kFunc;
    v.func = std::make_shared<Func>(Func{std::move(name), std::move(fn)});
    return v;
  }

  void install_globals(Scope& root) {
    root.vars["raise_exception"] = make_func("raise_exception", [](Args& a) -> Result<Value> {
      const Value* m = a.get(0, "message");
      return plain(m ? jinja::to_str(*m) : std::string("raise_exception called"));
    });
    root.vars["strftime_now"] = make_func("strftime_now", [this](Args& a) -> Result<Value> {
      const Value* f = a.get(0, "format");
      if (!f || f->kind != Kind::kString) return plain("strftime_now() expects a format string");
      std::tm tm{};
      if (opt_.now) {
        tm = opt_.now();
      } else {
        std::time_t t = std::time(nullptr);
        localtime_r(&t, &tm);
      }
      if (f->s.empty()) return Value::string("");
      std::vector<char> buf(256);
      while (buf.size() <= 65536) {
        size_t n = std::strftime(buf.data(), buf.size(), f->s.c_str(), &tm);
        if (n > 0) return Value::string(std::string(buf.data(), n));
        buf.resize(buf.size() * 4);
      }
      return Value::string("");
    });
    root.vars["range"] = make_func("range", [this](Args& a) -> Result<Value> {
      int64_t v[3] = {0, 0, 1};
      if (a.pos.empty() || a.pos.size() > 3 || !a.kw.empty())
        return plain("range() expects 1 to 3 integer arguments");
      for (size_t k = 0; k < a.pos.size(); ++k) {
        const Value& x = a.pos[k];
        if (x.kind != Kind::kInt && x.kind != Kind::kBool)
          return plain(
              fmt::format("'{}' object cannot be interpreted as an integer", jinja::type_name(x)));
      }
      auto iv = [&](size_t k) { return a.pos[k].kind == Kind::kBool ? a.pos[k].b : a.pos[k].i; };
      if (a.pos.size() == 1) {
        v[1] = iv(0);
      } else {
        v[0] = iv(0);
        v[1] = iv(1);
        if (a.pos.size() == 3) v[2] = iv(2);
      }
      if (v[2] == 0) return plain("range() arg 3 must not be zero");
      long double count = v[2] > 0 ? (static_cast<long double>(v[1]) - v[0]) / v[2]
                                   : (static_cast<long double>(v[0]) - v[1]) / -v[2];
      if (count > kMaxRange)
        return plain("range too big, the sandbox blocks ranges larger than 100000");
      List items;
      for (int64_t k = v[0]; v[2] > 0 ? k < v[1] : k > v[1]; k += v[2])
        items.push_back(Value::integer(k));
      STRATA_RETURN_IF_ERROR(charge(static_cast<int64_t>(items.size())));
      return Value::make_list(std::move(items));
    });
    auto make_mapping = [](bool ns) {
      return [ns](Args& a) -> Result<Value> {
        Value d = ns ? Value::make_namespace() : Value::make_dict();
        if (a.pos.size() > 1) return plain("expected at most 1 positional argument");
        if (!a.pos.empty()) {
          if (!a.pos[0].is_mapping()) return plain("expected a mapping argument");
          for (const auto& [k, v] : a.pos[0].dict->items) d.dict->set(k, v);
        }
        for (const auto& [k, v] : a.kw) {
          if (ns && starts_with(k, "_"))
            return plain(
                "chat templates cannot store underscore-prefixed attributes on a namespace");
          d.dict->set(k, v);
        }
        return d;
      };
    };
    root.vars["namespace"] = make_func("namespace", make_mapping(true));
    root.vars["dict"] = make_func("dict", make_mapping(false));
  }

  // ---- statements -----------------------------------------------------------------------------
  Status exec_body(const Body& body, Scope& sc, std::string& out, Flow& flow) {
    for (const auto& s : body) {
      Status st = exec(*s, sc, out, flow);
      if (!st.ok()) return at_line(st, s->line);
      if (flow != Flow::kNormal) return ok_status();
    }
    return ok_status();
  }

  Status emit(std::string& out, const std::string& s) {
    out += s;
    STRATA_RETURN_IF_ERROR(charge(1 + static_cast<int64_t>(s.size() / 16)));
    return check_size(out.size());
  }

  Status assign(Scope& sc, const std::vector<std::string>& names, const Value& v) {
    if (names.size() == 1) {
      sc.vars[names[0]] = v;
      return ok_status();
    }
    STRATA_ASSIGN_OR_RETURN(List items, iterate(v));
    if (items.size() != names.size())
      return plain(
          fmt::format("cannot unpack {} values into {} names", items.size(), names.size()));
    for (size_t k = 0; k < names.size(); ++k) sc.vars[names[k]] = items[k];
    return ok_status();
  }

  Status exec(const Stmt& s, Scope& sc, std::string& out, Flow& flow) {
    DepthGuard g(depth_);
    STRATA_RETURN_IF_ERROR(check_depth());
    STRATA_RETURN_IF_ERROR(charge(1));
    switch (s.kind) {
      case StmtKind::kText:
        return emit(out, s.text);
      case StmtKind::kOutput: {
        STRATA_ASSIGN_OR_RETURN(Value v, eval(*s.expr, sc));
        return emit(out, jinja::to_str(v));
      }
      case StmtKind::kIf: {
        for (size_t k = 0; k < s.exprs.size(); ++k) {
          STRATA_ASSIGN_OR_RETURN(Value c, eval(*s.exprs[k], sc));
          if (jinja::truthy(c)) return exec_body(s.bodies[k], sc, out, flow);
        }
        if (s.bodies.size() > s.exprs.size()) return exec_body(s.bodies.back(), sc, out, flow);
        return ok_status();
      }
      case StmtKind::kFor:
        return exec_for(s, sc, out);
      case StmtKind::kSet: {
        Value v;
        if (s.expr) {
          STRATA_ASSIGN_OR_RETURN(v, eval(*s.expr, sc));
        } else {
          std::string captured;
          Flow f = Flow::kNormal;
          STRATA_RETURN_IF_ERROR(exec_body(s.bodies[0], sc, captured, f));
          v = Value::string(std::move(captured));
        }
        if (!s.attr.empty()) {
          Value* ns = sc.find(s.names[0]);
          if (!ns || ns->kind != Kind::kNamespace)
            return plain("cannot assign attribute on non-namespace object");
          if (starts_with(s.attr, "_"))
            return plain(
                "chat templates cannot store underscore-prefixed attributes on a namespace");
          ns->dict->set(s.attr, std::move(v));
          return ok_status();
        }
        return assign(sc, s.names, v);
      }
      case StmtKind::kMacro: {
        const Stmt* m = &s;
        Scope* def_scope = root_;
        sc.vars[s.text] = make_func(s.text, [this, m, def_scope](Args& a) -> Result<Value> {
          return call_macro(*m, *def_scope, a);
        });
        return ok_status();
      }
      case StmtKind::kBreak:
        flow = Flow::kBreak;
        return ok_status();
      case StmtKind::kContinue:
        flow = Flow::kContinue;
        return ok_status();
      case StmtKind::kBlock:
        return exec_body(s.bodies[0], sc, out, flow);
    }
    return ok_status();
  }

  Result<Value> call_macro(const Stmt& m, Scope& parent, Args& a) {
    DepthGuard g(depth_);
    STRATA_RETURN_IF_ERROR(check_depth());
    if (a.pos.size() > m.names.size())
      return plain(
          fmt::format("macro '{}' takes not more than {} argument(s)", m.text, m.names.size()));
    Scope sc;
    sc.parent = &parent;
    for (size_t k = 0; k < m.names.size(); ++k) {
      if (k < a.pos.size()) {
        sc.vars[m.names[k]] = a.pos[k];
        continue;
      }
      bool found = false;
      for (const auto& [name, v] : a.kw) {
        if (name == m.names[k]) {
          sc.vars[m.names[k]] = v;
          found = true;
        }
      }
      if (found) continue;
      if (m.exprs[k]) {
        STRATA_ASSIGN_OR_RETURN(sc.vars[m.names[k]], eval(*m.exprs[k], sc));
      } else {
        sc.vars[m.names[k]] = Value::undefined(fmt::format("'{}' is undefined", m.names[k]));
      }
    }
    for (const auto& [name, v] : a.kw) {
      if (std::find(m.names.begin(), m.names.end(), name) == m.names.end())
        return plain(fmt::format("macro '{}' has no argument '{}'", m.text, name));
    }
    std::string out;
    Flow f = Flow::kNormal;
    STRATA_RETURN_IF_ERROR(exec_body(m.bodies[0], sc, out, f));
    return Value::string(std::move(out));
  }

  Status exec_for(const Stmt& s, Scope& sc, std::string& out) {
    STRATA_ASSIGN_OR_RETURN(Value seq, eval(*s.expr, sc));
    STRATA_ASSIGN_OR_RETURN(List items, iterate(seq));
    Scope inner;
    inner.parent = &sc;
    if (s.expr2) {
      List kept;
      for (const Value& x : items) {
        STRATA_RETURN_IF_ERROR(charge(1));
        STRATA_RETURN_IF_ERROR(assign(inner, s.names, x));
        STRATA_ASSIGN_OR_RETURN(Value c, eval(*s.expr2, inner));
        if (jinja::truthy(c)) kept.push_back(x);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (s.bodies.size() > 1) {
        Flow f = Flow::kNormal;
        return exec_body(s.bodies[1], sc, out, f);
      }
      return ok_status();
    }
    int64_t n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      STRATA_RETURN_IF_ERROR(charge(1));
      Value loop = Value::make_dict();
      auto& d = *loop.dict;
      d.items.emplace_back("index", Value::integer(k + 1));
      d.items.emplace_back("index0", Value::integer(k));
      d.items.emplace_back("revindex", Value::integer(n - k));
      d.items.emplace_back("revindex0", Value::integer(n - k - 1));
      d.items.emplace_back("first", Value::boolean(k == 0));
      d.items.emplace_back("last", Value::boolean(k == n - 1));
      d.items.emplace_back("length", Value::integer(n));
      d.items.emplace_back("depth", Value::integer(1));
      d.items.emplace_back("depth0", Value::integer(0));
      d.items.emplace_back("previtem",
                           k > 0 ? items[k - 1] : Value::undefined("there is no previous item"));
      d.items.emplace_back("nextitem",
                           k + 1 < n ? items[k + 1] : Value::undefined("there is no next item"));
      d.items.emplace_back("cycle", make_func("cycle", [k](Args& a) -> Result<Value> {
                             if (a.pos.empty()) return plain("no items for cycling given");
                             return a.pos[k % a.pos.size()];
                           }));
      inner.vars["loop"] = std::move(loop);
      STRATA_RETURN_IF_ERROR(assign(inner, s.names, items[k]));
      Flow f = Flow::kNormal;
      STRATA_RETURN_IF_ERROR(exec_body(s.bodies[0], inner, out, f));
      if (f == Flow::kBreak) break;
    }
    return ok_status();
  }

  // ---- values ---------------------------------------------------------------------------------
  Result<List> iterate(const Value& v) {
    switch (v.kind) {
      case Kind::kUndefined:
        return List{};
      case Kind::kList:
        return *v.list;
      case Kind::kDict: {
        List keys;
        for (const auto& [k, x] : v.dict->items) keys.push_back(Value::string(k));
        return keys;
      }
      case Kind::kString: {
        List chars;
        auto off = jinja::codepoint_offsets(v.s);
        for (size_t k = 0; k + 1 < off.size(); ++k)
          chars.push_back(Value::string(v.s.substr(off[k], off[k + 1] - off[k])));
        return chars;
      }
      default:
        return plain(fmt::format("'{}' object is not iterable", jinja::type_name(v)));
    }
  }

  Result<Value> eval(const Expr& e, Scope& sc) {
    DepthGuard g(depth_);
    STRATA_RETURN_IF_ERROR(check_depth());
    STRATA_RETURN_IF_ERROR(charge(1));
    auto r = eval_inner(e, sc);
    if (!r.ok()) return at_line(r.status(), e.line);
    return r;
  }

  Result<Value> eval_inner(const Expr& e, Scope& sc) {
    switch (e.kind) {
      case ExprKind::kLiteral:
        return e.value;
      case ExprKind::kName: {
        Value* v = sc.find(e.name);
        if (!v) return Value::undefined(fmt::format("'{}' is undefined", e.name));
        return *v;
      }
      case ExprKind::kList: {
        List items;
        for (const auto& k : e.kids) {
          STRATA_ASSIGN_OR_RETURN(Value v, eval(*k, sc));
          items.push_back(std::move(v));
        }
        return Value::make_list(std::move(items), e.value.tuple);
      }
      case ExprKind::kDict: {
        Value d = Value::make_dict();
        for (size_t k = 0; k + 1 < e.kids.size(); k += 2) {
          STRATA_ASSIGN_OR_RETURN(Value key, eval(*e.kids[k], sc));
          STRATA_ASSIGN_OR_RETURN(Value val, eval(*e.kids[k + 1], sc));
          if (key.kind != Kind::kString) return plain("only string dict keys are supported");
          d.dict->set(key.s, std::move(val));
        }
        return d;
      }
      case ExprKind::kAttr: {
        STRATA_ASSIGN_OR_RETURN(Value obj, eval(*e.kids[0], sc));
        return get_attr(obj, e.name);
      }
      case ExprKind::kIndex: {
        STRATA_ASSIGN_OR_RETURN(Value obj, eval(*e.kids[0], sc));
        STRATA_ASSIGN_OR_RETURN(Value key, eval(*e.kids[1], sc));
        return get_item(obj, key);
      }
      case ExprKind::kSlice: {
        STRATA_ASSIGN_OR_RETURN(Value obj, eval(*e.kids[0], sc));
        Value parts[3] = {Value::none(), Value::none(), Value::none()};
        for (int k = 0; k < 3; ++k)
          if (e.kids[k + 1]) {
            STRATA_ASSIGN_OR_RETURN(parts[k], eval(*e.kids[k + 1], sc));
          }
        return slice(obj, parts[0], parts[1], parts[2]);
      }
      case ExprKind::kCall: {
        STRATA_ASSIGN_OR_RETURN(Value fn, eval(*e.kids[0], sc));
        STRATA_ASSIGN_OR_RETURN(Args a, eval_args(e, sc));
        return call(fn, a);
      }
      case ExprKind::kFilter: {
        STRATA_ASSIGN_OR_RETURN(Value x, eval(*e.kids[0], sc));
        STRATA_ASSIGN_OR_RETURN(Args a, eval_args(e, sc));
        return filter(e.name, x, a);
      }
      case ExprKind::kTest: {
        STRATA_ASSIGN_OR_RETURN(Value x, eval(*e.kids[0], sc));
        STRATA_ASSIGN_OR_RETURN(Args a, eval_args(e, sc));
        STRATA_ASSIGN_OR_RETURN(bool r, test(e.name, x, a));
        return Value::boolean(r != e.negate);
      }
      case ExprKind::kNeg:
      case ExprKind::kPos: {
        STRATA_ASSIGN_OR_RETURN(Value x, eval(*e.kids[0], sc));
        if (x.is_undefined()) return undefined_error(x);
        if (x.kind == Kind::kFloat) return Value::real(e.kind == ExprKind::kNeg ? -x.f : x.f);
        if (x.kind == Kind::kInt || x.kind == Kind::kBool) {
          int64_t i = x.kind == Kind::kBool ? x.b : x.i;
          if (e.kind == ExprKind::kPos) return Value::integer(i);
          if (i == INT64_MIN) return plain("integer overflow");
          return Value::integer(-i);
        }
        return plain(fmt::format("bad operand type for unary {}: '{}'",
                                 e.kind == ExprKind::kNeg ? "-" : "+", jinja::type_name(x)));
      }
      case ExprKind::kNot: {
        STRATA_ASSIGN_OR_RETURN(Value x, eval(*e.kids[0], sc));
        return Value::boolean(!jinja::truthy(x));
      }
      case ExprKind::kAnd: {
        STRATA_ASSIGN_OR_RETURN(Value a, eval(*e.kids[0], sc));
        if (!jinja::truthy(a)) return a;
        return eval(*e.kids[1], sc);
      }
      case ExprKind::kOr: {
        STRATA_ASSIGN_OR_RETURN(Value a, eval(*e.kids[0], sc));
        if (jinja::truthy(a)) return a;
        return eval(*e.kids[1], sc);
      }
      case ExprKind::kCond: {
        STRATA_ASSIGN_OR_RETURN(Value c, eval(*e.kids[0], sc));
        if (jinja::truthy(c)) return eval(*e.kids[1], sc);
        if (e.kids[2]) return eval(*e.kids[2], sc);
        return Value::undefined(
            "the inline if-expression evaluated to false and no else section was defined");
      }
      case ExprKind::kBinary: {
        STRATA_ASSIGN_OR_RETURN(Value a, eval(*e.kids[0], sc));
        STRATA_ASSIGN_OR_RETURN(Value b, eval(*e.kids[1], sc));
        return binary(e.name, a, b);
      }
      case ExprKind::kCompare: {
        STRATA_ASSIGN_OR_RETURN(Value left, eval(*e.kids[0], sc));
        for (size_t k = 0; k < e.ops.size(); ++k) {
          STRATA_ASSIGN_OR_RETURN(Value right, eval(*e.kids[k + 1], sc));
          STRATA_ASSIGN_OR_RETURN(bool r, compare(e.ops[k], left, right));
          if (!r) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
    }
    return plain("unsupported expression");
  }

  Result<Args> eval_args(const Expr& e, Scope& sc) {
    Args a;
    size_t nkw = e.kw_names.size();
    size_t nargs = e.kids.size() - 1;
    for (size_t k = 0; k < nargs; ++k) {
      STRATA_ASSIGN_OR_RETURN(Value v, eval(*e.kids[k + 1], sc));
      if (k < nargs - nkw)
        a.pos.push_back(std::move(v));
      else
        a.kw.emplace_back(e.kw_names[k - (nargs - nkw)], std::move(v));
    }
    return a;
  }

  Result<Value> call(const Value& fn, Args& a) {
    if (fn.is_undefined()) return undefined_error(fn);
    if (fn.kind != Kind::kFunc)
      return plain(fmt::format("'{}' object is not callable", jinja::type_name(fn)));
    return fn.func->fn(a);
  }

  static Result<int64_t> to_index(const Value& v) {
    if (v.kind == Kind::kInt) return v.i;
    if (v.kind == Kind::kBool) return int64_t{v.b};
    return plain("index must be an integer");
  }

  Result<Value> get_item(const Value& obj, const Value& key) {
    switch (obj.kind) {
      case Kind::kUndefined:
        return undefined_error(obj);
      case Kind::kDict:
      case Kind::kNamespace: {
        if (key.kind == Kind::kString) {
          if (const Value* v = obj.dict->find(key.s)) return *v;
          return get_attr(obj, key.s);
        }
        return Value::undefined(
            fmt::format("'dict object' has no attribute '{}'", jinja::to_str(key)));
      }
      case Kind::kList:
      case Kind::kString: {
        if (key.kind == Kind::kString) return get_attr(obj, key.s);
        if (key.kind != Kind::kInt && key.kind != Kind::kBool)
          return Value::undefined(
              fmt::format("{} object has no element {}", jinja::type_name(obj), jinja::repr(key)));
        int64_t i = key.kind == Kind::kBool ? key.b : key.i;
        if (obj.kind == Kind::kList) {
          int64_t n = static_cast<int64_t>(obj.list->size());
          if (i < 0) i += n;
          if (i < 0 || i >= n)
            return Value::undefined(fmt::format("list object has no element {}", key.i));
          return (*obj.list)[i];
        }
        auto off = jinja::codepoint_offsets(obj.s);
        int64_t n = static_cast<int64_t>(off.size()) - 1;
        if (i < 0) i += n;
        if (i < 0 || i >= n)
          return Value::undefined(fmt::format("str object has no element {}", key.i));
        return Value::string(obj.s.substr(off[i], off[i + 1] - off[i]));
      }
      default:
        return Value::undefined(fmt::format("'{}' object has no attribute '{}'",
                                            jinja::type_name(obj), jinja::to_str(key)));
    }
  }

  Result<Value> slice(const Value& obj, const Value& a, const Value& b, const Value& c) {
    if (obj.is_undefined()) return undefined_error(obj);
    if (obj.kind == Kind::kList) {
      STRATA_ASSIGN_OR_RETURN(auto idx,
                              slice_indices(static_cast<int64_t>(obj.list->size()), a, b, c));
      STRATA_RETURN_IF_ERROR(charge(static_cast<int64_t>(idx.size())));
      List out;
      for (int64_t k : idx) out.push_back((*obj.list)[k]);
      return Value::make_list(std::move(out), obj.tuple);
    }
    if (obj.kind == Kind::kString) {
      auto off = jinja::codepoint_offsets(obj.s);
      STRATA_ASSIGN_OR_RETURN(auto idx,
                              slice_indices(static_cast<int64_t>(off.size()) - 1, a, b, c));
      STRATA_RETURN_IF_ERROR(charge(static_cast<int64_t>(idx.size())));
      std::string out;
      for (int64_t k : idx) out.append(obj.s, off[k], off[k + 1] - off[k]);
      return Value::string(std::move(out));
    }
    return plain(fmt::format("'{}' object is not subscriptable", jinja::type_name(obj)));
  }

  // ---- attributes and methods -------------------------------------------------------------------
  Result<Value> get_attr(const Value& obj, const std::string& name) {
    static const char* kUnsafeList[] = {"append", "extend", "insert", "pop",
                                        "remove", "clear",  "sort",   "reverse"};
    static const char* kUnsafeDict[] = {"update", "pop", "popitem", "setdefault", "clear"};
    switch (obj.kind) {
      case Kind::kUndefined:
        return undefined_error(obj);
      case Kind::kDict: {
        for (const char* u : kUnsafeDict)
          if (name == u) return unsafe(obj, name);
        if (name == "get" || name == "items" || name == "keys" || name == "values")
          return method(obj, name);
        if (const Value* v = obj.dict->find(name)) return *v;
        return Value::undefined(fmt::format("'dict object' has no attribute '{}'", name));
      }
      case Kind::kNamespace: {
        if (const Value* v = obj.dict->find(name)) return *v;
        return Value::undefined(fmt::format("'Namespace object' has no attribute '{}'", name));
      }
      case Kind::kList:
        for (const char* u : kUnsafeList)
          if (name == u) return unsafe(obj, name);
        if (name == "index" || name == "count") return method(obj, name);
        break;
      case Kind::kString: {
        static const char* kMethods[] = {
            "strip",    "lstrip",  "rstrip",  "split",   "rsplit",     "startswith",
            "endswith", "upper",   "lower",   "replace", "title",      "capitalize",
            "find",     "rfind",   "count",   "join",    "splitlines", "isdigit",
            "isalpha",  "isalnum", "isspace", "isupper", "islower"};
        for (const char* m : kMethods)
          if (name == m) return method(obj, name);
        break;
      }
      default:
        break;
    }
    return Value::undefined(
        fmt::format("'{}' object has no attribute '{}'", jinja::type_name(obj), name));
  }

  Value unsafe(const Value& obj, const std::string& name) {
    std::string msg = fmt::format("access to attribute '{}' of '{}' object is unsafe.", name,
                                  jinja::type_name(obj));
    return make_func(name, [msg](Args&) -> Result<Value> { return plain(msg); });
  }

  Value method(const Value& self, const std::string& name) {
    return make_func(
        name, [this, self, name](Args& a) -> Result<Value> { return call_method(self, name, a); });
  }

  Result<Value> call_method(const Value& self, const std::string& name, Args& a) {
    if (self.kind == Kind::kDict) {
      if (name == "get") {
        const Value* k = a.get(0, "key");
        if (!k) return plain("get expected at least 1 argument");
        const Value* def = a.get(1, "default");
        if (k->kind == Kind::kString)
          if (const Value* v = self.dict->find(k->s)) return *v;
        return def ? *def : Value::none();
      }
      List out;
      for (const auto& [k, v] : self.dict->items) {
        if (name == "keys")
          out.push_back(Value::string(k));
        else if (name == "values")
          out.push_back(v);
        else
          out.push_back(Value::make_list({Value::string(k), v}, true));
      }
      STRATA_RETURN_IF_ERROR(charge(static_cast<int64_t>(out.size())));
      return Value::make_list(std::move(out));
    }
    if (self.kind == Kind::kList) {
      const Value* x = a.get(0, "value");
      if (!x) return plain(fmt::format("{}() takes exactly one argument", name));
      int64_t count = 0;
      for (size_t k = 0; k < self.list->size(); ++k) {
        if (jinja::equal((*self.list)[k], *x)) {
          if (name == "index") return Value::integer(static_cast<int64_t>(k));
          ++count;
        }
      }
      if (name == "index") return plain("value is not in list");
      return Value::integer(count);
    }
    const std::string& s = self.s;
    STRATA_RETURN_IF_ERROR(charge(1 + static_cast<int64_t>(s.size() / 16)));
    auto str_arg = [&](size_t i, const char* kw) -> const Value* {
      const Value* v = a.get(i, kw);
      return v && v->kind == Kind::kNone ? nullptr : v;
    };
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const Value* chars = str_arg(0, "chars");
      if (chars && chars->kind != Kind::kString)
        return plain(fmt::format("{} arg must be None or str", name));
      return Value::string(py_strip(s, chars, name != "rstrip", name != "lstrip"));
    }
    if (name == "upper") return Value::string(ascii_upper(s));
    if (name == "lower") return Value::string(ascii_lower(s));
    if (name == "title") return Value::string(py_title(s));
    if (name == "capitalize") return Value::string(py_capitalize(s));
    if (name == "startswith" || name == "endswith") {
      const Value* p = a.get(0, "prefix");
      if (!p) return plain(fmt::format("{}() takes at least 1 argument", name));
      std::vector<std::string> cands;
      if (p->kind == Kind::kString) {
        cands.push_back(p->s);
      } else if (p->kind == Kind::kList) {
        for (const Value& x : *p->list) {
          if (x.kind != Kind::kString)
            return plain(fmt::format("{}() tuple must contain only str", name));
          cands.push_back(x.s);
        }
      } else {
        return plain(fmt::format("{} first arg must be str or a tuple of str, not {}", name,
                                 jinja::type_name(*p)));
      }
      for (const auto& c : cands) {
        if (c.size() > s.size()) continue;
        if (name == "startswith" ? s.compare(0, c.size(), c) == 0
                                 : s.compare(s.size() - c.size(), c.size(), c) == 0)
          return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    if (name == "split" || name == "rsplit") {
      const Value* sep = str_arg(0, "sep");
      const Value* mx = a.get(1, "maxsplit");
      int64_t maxsplit = mx && mx->kind == Kind::kInt ? mx->i : -1;
      List out;
      if (sep && sep->kind != Kind::kString) return plain("must be str or None");
      if (sep && sep->s.empty()) return plain("empty separator");
      if (name == "rsplit" && maxsplit >= 0) return plain("rsplit with maxsplit is not supported");
      if (!sep) {
        size_t p = 0;
        while (true) {
          while (p < s.size() && is_py_space(s[p])) ++p;
          if (p >= s.size()) break;
          if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
            size_t e = s.size();
            while (e > p && is_py_space(s[e - 1])) --e;
            out.push_back(Value::string(s.substr(p, e - p)));
            break;
          }
          size_t q = p;
          while (q < s.size() && !is_py_space(s[q])) ++q;
          out.push_back(Value::string(s.substr(p, q - p)));
          p = q;
        }
      } else {
        size_t p = 0;
        while (true) {
          size_t q = s.find(sep->s, p);
          if (q == std::string::npos ||
              (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit)) {
            out.push_back(Value::string(s.substr(p)));
            break;
          }
          out.push_back(Value::string(s.substr(p, q - p)));
          p = q + sep->s.size();
        }
      }
      STRATA_RETURN_IF_ERROR(charge(static_cast<int64_t>(out.size())));
      return Value::make_list(std::move(out));
    }
    if (name == "replace") {
      const Value* from = a.get(0, "old");
      const Value* to = a.get(1, "new");
      const Value* cnt = a.get(2, "count");
      if (!from || !to || from->kind != Kind::kString || to->kind != Kind::kString)
        return plain("replace() arguments must be str");
      bool too_big = false;
      std::string r = py_replace(s, from->s, to->s, cnt && cnt->kind == Kind::kInt ? cnt->i : -1,
                                 opt_.max_output_bytes, too_big);
      if (too_big) return check_size(opt_.max_output_bytes + 1);
      STRATA_RETURN_IF_ERROR(charge(static_cast<int64_t>(r.size() / 16)));
      return Value::string(std::move(r));
    }
    if (name == "find" || name == "rfind" || name == "count") {
      const Value* sub = a.get(0, "sub");
      if (!sub || sub->kind != Kind::kString)
        return plain(fmt::format("{}() argument must be str", name));
      if (name == "count") {
        if (sub->s.empty())
          return Value::integer(static_cast<int64_t>(jinja::codepoint_offsets(s).size()));
        int64_t c = 0;
        for (size_t p = s.find(sub->s); p != std::string::npos;
             p = s.find(sub->s, p + sub->s.size()))
          ++c;
        return Value::integer(c);
      }
      size_t p = name == "find" ? s.find(sub->s) : s.rfind(sub->s);
      if (p == std::string::npos) return Value::integer(-1);
      return Value::integer(static_cast<int64_t>(jinja::codepoint_offsets(s.substr(0, p)).size()) -
                            1);
    }
    if (name == "join") {
      const Value* it = a.get(0, "iterable");
      if (!it) return plain("join() takes exactly one argument");
      STRATA_ASSIGN_OR_RETURN(List items, iterate(*it));
      std::string out;
      for (size_t k = 0; k < items.size(); ++k) {
        if (items[k].kind != Kind::kString) return plain("sequence item: expected str instance");
        if (k) out += s;
        out += items[k].s;
        STRATA_RETURN_IF_ERROR(check_size(out.size()));
      }
      return Value::string(std::move(out));
    }
    if (name == "splitlines") {
      List out;
      size_t p = 0;
      while (p < s.size()) {
        size_t q = s.find('\n', p);
        if (q == std::string::npos) q = s.size();
        std::string line = s.substr(p, q - p);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        out.push_back(Value::string(line));
        p = q + 1;
      }
      return Value::make_list(std::move(out));
    }
    auto all = [&](auto pred) {
      if (s.empty()) return Value::boolean(false);
      for (char c : s)
        if (!pred(c)) return Value::boolean(false);
      return Value::boolean(true);
    };
    if (name == "isdigit") return all([](char c) { return c >= '0' && c <= '9'; });
    if (name == "isalpha") return all(is_alpha);
    if (name == "isalnum") return all([](char c) { return is_alpha(c) || (c >= '0' && c <= '9'); });
    if (name == "isspace") return all(is_py_space);
    if (name == "isupper") return Value::boolean(s != ascii_lower(s) && s == ascii_upper(s));
    if (name == "islower") return Value::boolean(s != ascii_upper(s) && s == ascii_lower(s));
    return plain(fmt::format("'str' object has no attribute '{}'", name));
  }

  // ---- operators --------------------------------------------------------------------------------
  static double num(const Value& v) {
    return v.kind == Kind::kFloat ? v.f : static_cast<double>(v.kind == Kind::kBool ? v.b : v.i);
  }
  static int64_t inum(const Value& v) { return v.kind == Kind::kBool ? v.b : v.i; }

  Status type_error(const std::string& op, const Value& a, const Value& b) {
    if (a.is_undefined()) return undefined_error(a);
    if (b.is_undefined()) return undefined_error(b);
    return plain(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op,
                             jinja::type_name(a), jinja::type_name(b)));
  }

  Result<Value> binary(const std::string& op, const Value& a, const Value& b) {
    if (op == "~") {
      std::string s = jinja::to_str(a) + jinja::to_str(b);
      STRATA_RETURN_IF_ERROR(check_size(s.size()));
      STRATA_RETURN_IF_ERROR(charge(static_cast<int64_t>(s.size() / 16)));
      return Value::string(std::move(s));
    }
    if (a.is_undefined() || b.is_undefined()) return type_error(op, a, b);
    if (a.is_number() && b.is_number()) {
      bool ints = a.kind != Kind::kFloat && b.kind != Kind::kFloat;
      if (ints) {
        int64_t x = inum(a), y = inum(b), r = 0;
        if (op == "+") {
          if (__builtin_add_overflow(x, y, &r)) return plain("integer overflow");
          return Value::integer(r);
        }
        if (op == "-") {
          if (__builtin_sub_overflow(x, y, &r)) return plain("integer overflow");
          return Value::integer(r);
        }
        if (op == "*") {
          if (__builtin_mul_overflow(x, y, &r)) return plain("integer overflow");
          return Value::integer(r);
        }
        if (op == "//" || op == "%") {
          if (y == 0) return plain("integer division or modulo by zero");
          if (x == INT64_MIN && y == -1) return plain("integer overflow");
          int64_t q = x / y, m = x % y;
          if (m != 0 && ((m < 0) != (y < 0))) {
            --q;
            m += y;
          }
          return Value::integer(op == "//" ? q : m);
        }
        if (op == "**") {
          if (y < 0) return Value::real(std::pow(static_cast<double>(x), static_cast<double>(y)));
          int64_t acc = 1;
          for (int64_t k = 0; k < y; ++k) {
            if (__builtin_mul_overflow(acc, x, &acc)) return plain("integer overflow");
            if (acc == 0 || acc == 1) break;
            if (k > 64 && acc == -1) {
              acc = (y % 2) ? -1 : 1;
              break;
            }
          }
          return Value::integer(acc);
        }
      }
      double x = num(a), y = num(b);
      if (op == "+") return Value::real(x + y);
      if (op == "-") return Value::real(x - y);
      if (op == "*") return Value::real(x * y);
      if (op == "/") {
        if (y == 0) return plain("division by zero");
        return Value::real(x / y);
      }
      if (op == "//" || op == "%") {
        if (y == 0) return plain("float floor division by zero");
        double m = std::fmod(x, y);
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        if (op == "%") return Value::real(m);
        return Value::real(std::floor((x - m) / y + 0.5));
      }
      if (op == "**") return Value::real(std::pow(x, y));
    }
    if (op == "+") {
      if (a.kind == Kind::kString && b.kind == Kind::kString) {
        STRATA_RETURN_IF_ERROR(check_size(a.s.size() + b.s.size()));
        STRATA_RETURN_IF_ERROR(charge(static_cast<int64_t>((a.s.size() + b.s.size()) / 16)));
        return Value::string(a.s + b.s);
      }
      if (a.kind == Kind::kList && b.kind == Kind::kList) {
        List out = *a.list;
        out.insert(out.end(), b.list->begin(), b.list->end());
        STRATA_RETURN_IF_ERROR(charge(static_cast<int64_t>(out.size())));
        STRATA_RETURN_IF_ERROR(check_size(out.size() * 16));
        return Value::make_list(std::move(out), a.tuple);
      }
    }
    if (op == "*") {
      const Value* seq = a.kind == Kind::kString || a.kind == Kind::kList ? &a : &b;
      const Value* cnt = seq == &a ? &b : &a;
      if ((seq->kind == Kind::kString || seq->kind == Kind::kList) &&
          (cnt->kind == Kind::kInt || cnt->kind == Kind::kBool)) {
        int64_t n = std::max<int64_t>(0, inum(*cnt));
        size_t unit = seq->kind == Kind::kString ? seq->s.size() : seq->list->size() * 16;
        if (unit && static_cast<uint64_t>(n) > opt_.max_output_bytes / unit)
          return check_size(opt_.max_output_bytes + 1);
        STRATA_RETURN_IF_ERROR(charge(static_cast<int64_t>(unit) * n / 16));
        if (seq->kind == Kind::kString) {
          std::string out;
          for (int64_t k = 0; k < n; ++k) out += seq->s;
          return Value::string(std::move(out));
        }
        List out;
        for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq->list->begin(), seq->list->end());
        return Value::make_list(std::move(out));
      }
    }
    return type_error(op, a, b);
  }

  Result<bool> contains(const Value& container, const Value& x) {
    switch (container.kind) {
      case Kind::kUndefined:
        return false;
      case Kind::kString:
        if (x.kind != Kind::kString)
          return plain(fmt::format("'in <string>' requires string as left operand, not {}",
                                   jinja::type_name(x)));
        return container.s.find(x.s) != std::string::npos;
      case Kind::kList:
        for (const Value& v : *container.list)
          if (jinja::equal(v, x)) return true;
        return false;
      case Kind::kDict:
      case Kind::kNamespace:
        return x.kind == Kind::kString && container.dict->find(x.s) != nullptr;
      default:
        return plain(
            fmt::format("argument of type '{}' is not iterable", jinja::type_name(container)));
    }
  }

  Result<int> order(const Value& a, const Value& b, const std::string& op) {
    if (a.is_number() && b.is_number()) {
      double x = num(a), y = num(b);
      if (a.kind != Kind::kFloat && b.kind != Kind::kFloat) {
        int64_t p = inum(a), q = inum(b);
        return p < q ? -1 : p > q ? 1 : 0;
      }
      if (std::isnan(x) || std::isnan(y)) return 2;  // every ordering is false
      return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.kind == Kind::kString && b.kind == Kind::kString) {
      int c = a.s.compare(b.s);
      return c < 0 ? -1 : c > 0 ? 1 : 0;
    }
    if (a.kind == Kind::kList && b.kind == Kind::kList) {
      size_t n = std::min(a.list->size(), b.list->size());
      for (size_t k = 0; k < n; ++k) {
        if (jinja::equal((*a.list)[k], (*b.list)[k])) continue;
        return order((*a.list)[k], (*b.list)[k], op);
      }
      return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
    }
    if (a.is_undefined()) return undefined_error(a);
    if (b.is_undefined()) return undefined_error(b);
    return plain(fmt::format("'{}' not supported between instances of '{}' and '{}'", op,
                             jinja::type_name(a), jinja::type_name(b)));
  }

  Result<bool> compare(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return jinja::equal(a, b);
    if (op == "!=") return !jinja::equal(a, b);
    if (op == "in") return contains(b, a);
    if (op == "notin") {
      STRATA_ASSIGN_OR_RETURN(bool r, contains(b, a));
      return !r;
    }
    STRATA_ASSIGN_OR_RETURN(int c, order(a, b, op));
    if (c == 2) return false;
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }

  // ---- tests ------------------------------------------------------------------------------------
  Result<bool> test(const std::string& name, const Value& v, const Args& a) {
    const Value* arg = a.get(0, "other");
    auto need_arg = [&]() -> Status {
      if (!arg) return plain(fmt::format("test '{}' needs an argument", name));
      return ok_status();
    };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.kind == Kind::kNone;
    if (name == "string") return v.kind == Kind::kString;
    if (name == "number") return v.is_number();
    if (name == "integer") return v.kind == Kind::kInt;
    if (name == "float") return v.kind == Kind::kFloat;
    if (name == "boolean") return v.kind == Kind::kBool;
    if (name == "true") return v.kind == Kind::kBool && v.b;
    if (name == "false") return v.kind == Kind::kBool && !v.b;
    if (name == "mapping") return v.kind == Kind::kDict;
    if (name == "iterable")
      return v.kind == Kind::kString || v.kind == Kind::kList || v.kind == Kind::kDict ||
             v.is_undefined();
    if (name == "sequence")
      return v.kind == Kind::kString || v.kind == Kind::kList || v.kind == Kind::kDict ||
             v.is_undefined();
    if (name == "callable") return v.kind == Kind::kFunc;
    if (name == "escaped") return false;
    if (name == "filter") return v.kind == Kind::kString && jinja::to_str(v) != "" && false;
    if (name == "test") return false;
    if (name == "lower") return v.kind == Kind::kString && v.s == ascii_lower(v.s);
    if (name == "upper") return v.kind == Kind::kString && v.s == ascii_upper(v.s);
    if (name == "odd" || name == "even") {
      if (v.kind != Kind::kInt && v.kind != Kind::kBool)
        return plain("odd/even test needs an integer");
      int64_t i = inum(v);
      return name == "odd" ? (i % 2 != 0) : (i % 2 == 0);
    }
    if (name == "divisibleby") {
      STRATA_RETURN_IF_ERROR(need_arg());
      if (!v.is_number() || !arg->is_number() || num(*arg) == 0)
        return plain("divisibleby needs non-zero numbers");
      return std::fmod(num(v), num(*arg)) == 0;
    }
    STRATA_RETURN_IF_ERROR(need_arg());
    if (name == "eq" || name == "equalto" || name == "==") return jinja::equal(v, *arg);
    if (name == "ne" || name == "!=") return !jinja::equal(v, *arg);
    if (name == "sameas") {
      if (v.kind != arg->kind) return false;
      if (v.kind == Kind::kNone || v.kind == Kind::kUndefined) return true;
      if (v.kind == Kind::kBool) return v.b == arg->b;
      if (v.kind == Kind::kList) return v.list == arg->list;
      if (v.is_mapping()) return v.dict == arg->dict;
      return jinja::equal(v, *arg);
    }
    if (name == "in") return contains(*arg, v);
    std::string op = name == "lt" || name == "lessthan" || name == "<"      ? "<"
                     : name == "le" || name == "<="                         ? "<="
                     : name == "gt" || name == "greaterthan" || name == ">" ? ">"
                                                                            : ">=";
    return compare(op, v, *arg);
  }

  // ---- filters ----------------------------------------------------------------------------------
  Result<Value> attr_path(const Value& item, const std::string& path) {
    Value cur = item;
    size_t p = 0;
    while (true) {
      size_t q = path.find('.', p);
      std::string part = path.substr(p, q == std::string::npos ? std::string::npos : q - p);
      bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                                 [](char c) { return c >= '0' && c <= '9'; });
      if (digits && part.size() < 18) {
        STRATA_ASSIGN_OR_RETURN(cur, get_item(cur, Value::integer(std::stoll(part))));
      } else {
        STRATA_ASSIGN_OR_RETURN(cur, get_item(cur, Value::string(part)));
      }
      if (q == std::string::npos) return cur;
      p = q + 1;
    }
  }

  Result<Value> select_like(const std::string& name, const Value& v, const Args& a) {
    bool by_attr = name == "selectattr" || name == "rejectattr";
    bool select = name == "select" || name == "selectattr";
    STRATA_ASSIGN_OR_RETURN(List items, iterate(v));
    size_t first = 0;
    std::string attr;
    if (by_attr) {
      if (a.pos.empty() || a.pos[0].kind != Kind::kString)
        return plain(name + " needs an attribute name");
      attr = a.pos[0].s;
      first = 1;
    }
    std::string test_name;
    Args targs;
    if (a.pos.size() > first) {
      if (a.pos[first].kind != Kind::kString) return plain(name + ": test name must be a string");
      test_name = a.pos[first].s;
      static const char* kKnown[] = {"defined", "undefined", "none",        "string",      "number",
                                     "integer", "float",     "boolean",     "true",        "false",
                                     "mapping", "iterable",  "sequence",    "callable",    "lower",
                                     "upper",   "odd",       "even",        "divisibleby", "eq",
                                     "equalto", "==",        "ne",          "!=",          "sameas",
                                     "in",      "lt",        "lessthan",    "<",           "le",
                                     "<=",      "gt",        "greaterthan", ">",           "ge",
                                     ">="};
      if (std::find_if(std::begin(kKnown), std::end(kKnown),
                       [&](const char* k) { return test_name == k; }) == std::end(kKnown))
        return plain(fmt::format("no test named '{}'", test_name));
      targs.pos.assign(a.pos.begin() + first + 1, a.pos.end());
    }
    List out;
    for (const Value& item : items) {
      STRATA_RETURN_IF_ERROR(charge(1));
      Value x = item;
      if (by_attr) {
        STRATA_ASSIGN_OR_RETURN(x, attr_path(item, attr));
      }
      bool r;
      if (test_name.empty()) {
        r = jinja::truthy(x);
      } else {
        STRATA_ASSIGN_OR_RETURN(r, test(test_name, x, targs));
      }
      if (r == select) out.push_back(item);
    }
    return Value::make_list(std::move(out));
  }

  Result<Value> filter(const std::string& name, const Value& v, Args& a) {
    if (name == "safe") return v;
    if (name == "string") return Value::string(jinja::to_str(v));
    if (name == "upper") return Value::string(ascii_upper(jinja::to_str(v)));
    if (name == "lower") return Value::string(ascii_lower(jinja::to_str(v)));
    if (name == "capitalize") return Value::string(py_capitalize(jinja::to_str(v)));
    if (name == "title") return Value::string(py_title(jinja::to_str(v)));
    if (name == "trim") {
      const Value* chars = a.get(0, "chars");
      return Value::string(py_strip(jinja::to_str(v), chars, true, true));
    }
    if (name == "length" || name == "count") {
      switch (v.kind) {
        case Kind::kUndefined:
          return Value::integer(0);
        case Kind::kString:
          return Value::integer(static_cast<int64_t>(jinja::codepoint_offsets(v.s).size()) - 1);
        case Kind::kList:
          return Value::integer(static_cast<int64_t>(v.list->size()));
        case Kind::kDict:
        case Kind::kNamespace:
          return Value::integer(static_cast<int64_t>(v.dict->items.size()));
        default:
          return plain(fmt::format("object of type '{}' has no len()", jinja::type_name(v)));
      }
    }
    if (name == "default" || name == "d") {
      const Value* def = a.get(0, "default_value");
      const Value* boolean = a.get(1, "boolean");
      bool use_default =
          v.is_undefined() || (boolean && jinja::truthy(*boolean) && !jinja::truthy(v));
      if (use_default) return def ? *def : Value::string("");
      return v;
    }
    if (name == "tojson") {
      jinja::JsonDumpOptions o;
      const Value* ea = a.get(0, "ensure_ascii");
      const Value* indent = a.get(1, "indent");
      const Value* seps = a.get(2, "separators");
      const Value* sk = a.get(3, "sort_keys");
      if (ea) o.ensure_ascii = jinja::truthy(*ea);
      if (sk) o.sort_keys = jinja::truthy(*sk);
      if (indent && indent->kind != Kind::kNone) {
        o.has_indent = true;
        o.item_sep = ",";
        if (indent->kind == Kind::kString)
          o.indent = indent->s;
        else if (indent->kind == Kind::kInt)
          o.indent = std::string(std::clamp<int64_t>(indent->i, 0, 64), ' ');
        else
          return plain("tojson indent must be an int or a string");
      }
      if (seps && seps->kind != Kind::kNone) {
        if (seps->kind != Kind::kList || seps->list->size() != 2 ||
            (*seps->list)[0].kind != Kind::kString || (*seps->list)[1].kind != Kind::kString)
          return plain("tojson separators must be a pair of strings");
        o.item_sep = (*seps->list)[0].s;
        o.key_sep = (*seps->list)[1].s;
      }
      STRATA_ASSIGN_OR_RETURN(std::string s, jinja::json_dumps(v, o, opt_.max_output_bytes));
      STRATA_RETURN_IF_ERROR(charge(static_cast<int64_t>(s.size() / 16)));
      return Value::string(std::move(s));
    }
    if (name == "join") {
      const Value* sep = a.get(0, "d");
      const Value* attr = a.get(1, "attribute");
      STRATA_ASSIGN_OR_RETURN(List items, iterate(v));
      std::string s, d = sep ? jinja::to_str(*sep) : "";
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) s += d;
        if (attr) {
          STRATA_ASSIGN_OR_RETURN(Value x, attr_path(items[k], jinja::to_str(*attr)));
          s += jinja::to_str(x);
        } else {
          s += jinja::to_str(items[k]);
        }
        STRATA_RETURN_IF_ERROR(check_size(s.size()));
        STRATA_RETURN_IF_ERROR(charge(1));
      }
      return Value::string(std::move(s));
    }
    if (name == "items") {
      if (v.is_undefined()) return Value::make_list();
      if (!v.is_mapping()) return plain("items filter expects a mapping");
      return call_method(v, "items", a);
    }
    if (name == "list") {
      STRATA_ASSIGN_OR_RETURN(List items, iterate(v));
      return Value::make_list(std::move(items));
    }
    if (name == "first" || name == "last") {
      if (v.kind == Kind::kString || v.kind == Kind::kList) {
        Value idx = Value::integer(name == "first" ? 0 : -1);
        STRATA_ASSIGN_OR_RETURN(Value r, get_item(v, idx));
        if (r.is_undefined())
          return Value::undefined(fmt::format("No {} item, sequence was empty.", name));
        return r;
      }
      STRATA_ASSIGN_OR_RETURN(List items, iterate(v));
      if (items.empty())
        return Value::undefined(fmt::format("No {} item, sequence was empty.", name));
      return name == "first" ? items.front() : items.back();
    }
    if (name == "reverse") {
      if (v.kind == Kind::kString) {
        auto off = jinja::codepoint_offsets(v.s);
        std::string out;
        for (size_t k = off.size() - 1; k > 0; --k)
          out.append(v.s, off[k - 1], off[k] - off[k - 1]);
        return Value::string(std::move(out));
      }
      STRATA_ASSIGN_OR_RETURN(List items, iterate(v));
      std::reverse(items.begin(), items.end());
      return Value::make_list(std::move(items));
    }
    if (name == "int") {
      const Value* def = a.get(0, "default");
      Value d = def ? *def : Value::integer(0);
      if (v.kind == Kind::kInt) return v;
      if (v.kind == Kind::kBool) return Value::integer(v.b);
      if (v.kind == Kind::kFloat) {
        if (std::isnan(v.f) || std::isinf(v.f) || std::fabs(v.f) > 9.2e18) return d;
        return Value::integer(static_cast<int64_t>(v.f));
      }
      if (v.kind == Kind::kString) {
        std::string s = py_strip(v.s, nullptr, true, true);
        char* end = nullptr;
        errno = 0;
        long long i = std::strtoll(s.c_str(), &end, 10);
        if (!s.empty() && end && *end == '\0' && errno == 0) return Value::integer(i);
        double f = std::strtod(s.c_str(), &end);
        if (!s.empty() && end && *end == '\0' && std::isfinite(f) && std::fabs(f) < 9.2e18)
          return Value::integer(static_cast<int64_t>(f));
      }
      return d;
    }
    if (name == "float") {
      const Value* def = a.get(0, "default");
      if (v.is_number()) return Value::real(num(v));
      if (v.kind == Kind::kString) {
        std::string s = py_strip(v.s, nullptr, true, true);
        char* end = nullptr;
        double f = std::strtod(s.c_str(), &end);
        if (!s.empty() && end && *end == '\0') return Value::real(f);
      }
      return def ? *def : Value::real(0.0);
    }
    if (name == "abs") {
      if (v.kind == Kind::kFloat) return Value::real(std::fabs(v.f));
      if (v.kind == Kind::kInt || v.kind == Kind::kBool) {
        int64_t i = inum(v);
        if (i == INT64_MIN) return plain("integer overflow");
        return Value::integer(i < 0 ? -i : i);
      }
      return plain(fmt::format("bad operand type for abs(): '{}'", jinja::type_name(v)));
    }
    if (name == "round") {
      const Value* prec = a.get(0, "precision");
      const Value* method = a.get(1, "method");
      if (!v.is_number()) return plain("round filter expects a number");
      int64_t p = prec && prec->kind == Kind::kInt ? std::clamp<int64_t>(prec->i, -20, 20) : 0;
      std::string m = method ? jinja::to_str(*method) : "common";
      double scale = std::pow(10.0, static_cast<double>(p));
      double x = num(v) * scale;
      if (m == "common")
        x = std::nearbyint(x);
      else if (m == "ceil")
        x = std::ceil(x);
      else if (m == "floor")
        x = std::floor(x);
      else
        return plain("method must be common, ceil or floor");
      return Value::real(x / scale);
    }
    if (name == "replace") {
      const Value* from = a.get(0, "old");
      const Value* to = a.get(1, "new");
      const Value* cnt = a.get(2, "count");
      if (!from || !to) return plain("replace filter needs two arguments");
      bool too_big = false;
      std::string r =
          py_replace(jinja::to_str(v), jinja::to_str(*from), jinja::to_str(*to),
                     cnt && cnt->kind == Kind::kInt ? cnt->i : -1, opt_.max_output_bytes, too_big);
      if (too_big) return check_size(opt_.max_output_bytes + 1);
      return Value::string(std::move(r));
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr")
      return select_like(name, v, a);
    if (name == "map") {
      STRATA_ASSIGN_OR_RETURN(List items, iterate(v));
      const Value* attr = nullptr;
      const Value* def = nullptr;
      for (const auto& [k, x] : a.kw) {
        if (k == "attribute") attr = &x;
        if (k == "default") def = &x;
      }
      List out;
      if (attr) {
        for (const Value& item : items) {
          STRATA_RETURN_IF_ERROR(charge(1));
          STRATA_ASSIGN_OR_RETURN(Value x, attr_path(item, jinja::to_str(*attr)));
          if (x.is_undefined() && def) x = *def;
          out.push_back(std::move(x));
        }
        return Value::make_list(std::move(out));
      }
      if (a.pos.empty() || a.pos[0].kind != Kind::kString)
        return plain("map needs a filter name or attribute=");
      std::string fname = a.pos[0].s;
      if (fname == "map" || fname == "select" || fname == "reject" || fname == "selectattr" ||
          fname == "rejectattr")
        return plain(fmt::format("map with filter '{}' is not supported", fname));
      static const char* kFilters[] = {
          "string",     "upper", "lower",   "trim", "tojson", "length",  "int",   "float",
          "capitalize", "title", "first",   "last", "list",   "abs",     "round", "safe",
          "default",    "d",     "replace", "join", "items",  "reverse", "count"};
      if (std::find_if(std::begin(kFilters), std::end(kFilters),
                       [&](const char* f) { return fname == f; }) == std::end(kFilters))
        return plain(fmt::format("no filter named '{}'", fname));
      Args fargs;
      fargs.pos.assign(a.pos.begin() + 1, a.pos.end());
      fargs.kw = a.kw;
      for (const Value& item : items) {
        STRATA_RETURN_IF_ERROR(charge(1));
        STRATA_ASSIGN_OR_RETURN(Value x, filter(fname, item, fargs));
        out.push_back(std::move(x));
      }
      return Value::make_list(std::move(out));
    }
    if (name == "unique") {
      STRATA_ASSIGN_OR_RETURN(List items, iterate(v));
      List out;
      for (const Value& x : items) {
        STRATA_RETURN_IF_ERROR(charge(static_cast<int64_t>(out.size()) + 1));
        bool seen = false;
        for (const Value& y : out) {
          if (x.kind == Kind::kString && y.kind == Kind::kString
                  ? ascii_lower(x.s) == ascii_lower(y.s)
                  : jinja::equal(x, y)) {
            seen = true;
            break;
          }
        }
        if (!seen) out.push_back(x);
      }
      return Value::make_list(std::move(out));
    }
    if (name == "sort" || name == "min" || name == "max" || name == "dictsort" || name == "sum") {
      STRATA_ASSIGN_OR_RETURN(List items, iterate(v));
      if (name == "dictsort") {
        if (!v.is_mapping()) return plain("dictsort expects a mapping");
        STRATA_ASSIGN_OR_RETURN(Value it, call_method(v, "items", a));
        items = *it.list;
      }
      STRATA_RETURN_IF_ERROR(charge(static_cast<int64_t>(items.size()) * 8));
      const Value* attr = nullptr;
      bool rev = false;
      for (const auto& [k, x] : a.kw) {
        if (k == "attribute") attr = &x;
        if (k == "reverse") rev = jinja::truthy(x);
      }
      if (name == "sort" && !a.pos.empty()) rev = jinja::truthy(a.pos[0]);
      if (name == "sum") {
        Value acc = Value::integer(0);
        for (const Value& x : items) {
          Value y = x;
          if (attr) {
            STRATA_ASSIGN_OR_RETURN(y, attr_path(x, jinja::to_str(*attr)));
          }
          STRATA_ASSIGN_OR_RETURN(acc, binary("+", acc, y));
        }
        return acc;
      }
      std::vector<Value> keys;
      for (const Value& x : items) {
        Value k = x;
        if (attr) {
          STRATA_ASSIGN_OR_RETURN(k, attr_path(x, jinja::to_str(*attr)));
        }
        if (k.kind == Kind::kString) k.s = ascii_lower(k.s);
        keys.push_back(std::move(k));
      }
      std::vector<size_t> idx(items.size());
      for (size_t k = 0; k < idx.size(); ++k) idx[k] = k;
      Status err;
      std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) {
        if (!err.ok()) return false;
        auto r = order(keys[x], keys[y], "<");
        if (!r.ok()) {
          err = r.status();
          return false;
        }
        return *r == -1;
      });
      STRATA_RETURN_IF_ERROR(err);
      if (name == "min" || name == "max") {
        if (idx.empty()) return Value::undefined("No aggregated item, sequence was empty.");
        return items[name == "min" ? idx.front() : idx.back()];
      }
      if (rev) std::reverse(idx.begin(), idx.end());
      List out;
      for (size_t k : idx) out.push_back(items[k]);
      return Value::make_list(std::move(out));
    }
    if (name == "indent") {
      const Value* width = a.get(0, "width");
      const Value* first = a.get(1, "first");
      const Value* blank = a.get(2, "blank");
      std::string ind = width ? (width->kind == Kind::kString
                                     ? width->s
                                     : std::string(std::clamp<int64_t>(width->i, 0, 256), ' '))
                              : std::string(4, ' ');
      std::string s = jinja::to_str(v) + "\n";
      std::vector<std::string> lines;
      size_t p = 0;
      while (p < s.size()) {
        size_t q = s.find('\n', p);
        lines.push_back(s.substr(p, q - p));
        p = q + 1;
      }
      std::string out;
      bool bl = blank && jinja::truthy(*blank);
      for (size_t k = 0; k < lines.size(); ++k) {
        if (k) out += "\n";
        if (k > 0 && (bl || !lines[k].empty())) out += ind;
        out += lines[k];
        STRATA_RETURN_IF_ERROR(check_size(out.size()));
      }
      if (first && jinja::truthy(*first)) out = ind + out;
      return Value::string(std::move(out));
    }
    if (name == "e" || name == "escape") {
      std::string s = jinja::to_str(v), out;
      for (char c : s) {
        switch (c) {
          case '&':
            out += "&amp;";
            break;
          case '<':
            out += "&lt;";
            break;
          case '>':
            out += "&gt;";
            break;
          case '"':
            out += "&#34;";
            break;
          case '\'':
            out += "&#39;";
            break;
          default:
            out += c;
        }
      }
      return Value::string(std::move(out));
    }
    if (name == "wordcount") {
      STRATA_ASSIGN_OR_RETURN(Value parts,
                              call_method(Value::string(jinja::to_str(v)), "split", a));
      return Value::integer(static_cast<int64_t>(parts.list->size()));
    }
    return plain(fmt::format("unknown filter '{}'", name));
  }

  const ChatTemplateOptions& opt_;
  Scope* root_ = nullptr;
  int64_t work_ = 0;
  int depth_ = 0;
};

}  // namespace

Result<ChatTemplate> ChatTemplate::parse(const std::string& source) {
  auto t = jinja::parse_template(source);
  if (!t.ok()) return Status(t.status().code(), kPrefix + t.status().message());
  return ChatTemplate(std::shared_ptr<const jinja::Template>(std::move(t).value()));
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& context) const {
  return render(context, ChatTemplateOptions{});
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& context,
                                         const ChatTemplateOptions& options) const {
  Renderer r(options);
  return r.run(*program_, context);
}

Result<std::string> apply_chat_template(
    const std::string& tmpl, const nlohmann::ordered_json& messages, bool add_generation_prompt,
    const std::string& bos_token, const std::string& eos_token, const nlohmann::ordered_json& tools,
    const nlohmann::ordered_json& extra, const ChatTemplateOptions& options) {
  STRATA_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::parse(tmpl));
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  ctx["messages"] = messages;
  ctx["tools"] = tools;  // transformers always passes tools (None when absent) and documents
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = add_generation_prompt;
  ctx["bos_token"] = bos_token;
  ctx["eos_token"] = eos_token;
  if (extra.is_object())
    for (auto it = extra.begin(); it != extra.end(); ++it) ctx[it.key()] = it.value();
  return t.render(ctx, options);
}

std::string plain_chat_prompt(const nlohmann::ordered_json& messages,
                              const std::string& bos_token) {
  std::string text = bos_token;
  bool first = true;
  if (!messages.is_array()) return text;
  for (const auto& m : messages) {
    if (!m.is_object() || !m.contains("content") || !m["content"].is_string()) continue;
    if (!first) text += "\n\n";
    text += m["content"].get<std::string>();
    first = false;
  }
  return text;
}

}  // namespace strata
