#include "chat/jinja_parse.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "core/status.h"

namespace strata::jinja {
namespace {

constexpr int kMaxParseDepth = 128;

enum class Tok : uint8_t {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  Tok type;
  size_t offset;
  std::string text;
  int64_t ival = 0;
  double fval = 0;
};

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {
    for (size_t k = 0; k < src_.size(); ++k)
      if (src_[k] == '\n') newlines_.push_back(k);
  }
  int line_of(size_t offset) const {
    return 1 + static_cast<int>(std::lower_bound(newlines_.begin(), newlines_.end(), offset) -
                                newlines_.begin());
  }
  Status error(size_t offset, const std::string& msg) const {
    return errorf(StatusCode::kInvalidArgument, "line {}: {}", line_of(offset), msg);
  }

  Status run(std::vector<Token>& out) {
    size_t pos = 0, n = src_.size();
    while (pos < n) {
      size_t start = pos;
      while (true) {
        start = src_.find('{', start);
        if (start == std::string::npos || start + 1 >= n) {
          start = std::string::npos;
          break;
        }
        char c = src_[start + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++start;
      }
      if (start == std::string::npos) {
        out.push_back({Tok::kText, pos, src_.substr(pos)});
        break;
      }
      std::string text = src_.substr(pos, start - pos);
      char kind = src_[start + 1];
      size_t p = start + 2;
      char sign = 0;
      if (p < n && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      if (sign == '-') {
        size_t e = text.size();
        while (e > 0 && is_space(text[e - 1])) --e;
        text.resize(e);
      } else if (sign != '+' && kind != '{') {
        size_t nl = text.rfind('\n');
        size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        bool line_starting = pos == 0 || src_[pos - 1] == '\n';
        if (l_pos > 0 || line_starting) {
          bool all_ws = l_pos < text.size();
          for (size_t k = l_pos; k < text.size(); ++k)
            if (!is_space(text[k])) all_ws = false;
          if (all_ws) text.resize(l_pos);
        }
      }
      if (!text.empty()) out.push_back({Tok::kText, pos, std::move(text)});
      if (kind == '#') {
        size_t e = src_.find("#}", p);
        if (e == std::string::npos) return error(start, "missing end of comment tag");
        size_t after = e + 2;
        if (e > p && src_[e - 1] == '-') {
          while (after < n && is_space(src_[after])) ++after;
        } else if (!(e > p && src_[e - 1] == '+')) {
          if (after < n && src_[after] == '\n') ++after;
        }
        pos = after;
        continue;
      }
      out.push_back({kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, start, ""});
      STRATA_ASSIGN_OR_RETURN(pos, lex_tag(p, kind == '{', out));
    }
    out.push_back({Tok::kEof, n, ""});
    return ok_status();
  }

 private:
  Result<size_t> lex_tag(size_t p, bool var, std::vector<Token>& out) {
    size_t n = src_.size();
    int depth = 0;
    const char close = var ? '}' : '%';
    while (true) {
      while (p < n && is_space(src_[p])) ++p;
      if (p >= n)
        return error(p, var ? "unexpected end of template, expected '}}'"
                            : "unexpected end of template, expected '%}'");
      if (depth == 0) {
        size_t after = std::string::npos;
        if (src_[p] == '-' && p + 2 < n && src_[p + 1] == close && src_[p + 2] == '}') {
          after = p + 3;
          while (after < n && is_space(src_[after])) ++after;
        } else if (!var && src_[p] == '+' && p + 2 < n && src_[p + 1] == '%' &&
                   src_[p + 2] == '}') {
          after = p + 3;
        } else if (src_[p] == close && p + 1 < n && src_[p + 1] == '}') {
          after = p + 2;
          if (!var && after < n && src_[after] == '\n') ++after;
        }
        if (after != std::string::npos) {
          out.push_back({var ? Tok::kVarEnd : Tok::kBlockEnd, p, ""});
          return after;
        }
      }
      char c = src_[p];
      if (is_name_start(c)) {
        size_t s = p;
        while (p < n && (is_name_start(src_[p]) || is_digit(src_[p]))) ++p;
        out.push_back({Tok::kName, s, src_.substr(s, p - s)});
      } else if (is_digit(c)) {
        STRATA_ASSIGN_OR_RETURN(p, lex_number(p, out));
      } else if (c == '\'' || c == '"') {
        STRATA_ASSIGN_OR_RETURN(p, lex_string(p, out));
      } else {
        static const char* kOps2[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* o : kOps2)
          if (src_.compare(p, 2, o) == 0) op = o;
        if (op.empty()) {
          if (!std::strchr("+-*/%~<>=()[]{},.:|;!", c)) {
            return error(p, fmt::format("unexpected character '{}'", c));
          }
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") {
          if (depth == 0) return error(p, fmt::format("unexpected '{}'", op));
          --depth;
        }
        out.push_back({Tok::kOp, p, op});
        p += op.size();
      }
    }
  }

  Result<size_t> lex_number(size_t p, std::vector<Token>& out) {
    size_t n = src_.size(), s = p;
    auto digits = [&] {
      while (p < n && (is_digit(src_[p]) || (src_[p] == '_' && p + 1 < n && is_digit(src_[p + 1]))))
        ++p;
    };
    digits();
    bool is_float = false;
    if (p + 1 < n && src_[p] == '.' && is_digit(src_[p + 1])) {
      is_float = true;
      ++p;
      digits();
    }
    if (p < n && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      if (q < n && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < n && is_digit(src_[q])) {
        is_float = true;
        p = q;
        digits();
      }
    }
    std::string text;
    for (size_t k = s; k < p; ++k)
      if (src_[k] != '_') text += src_[k];
    Token t{is_float ? Tok::kFloat : Tok::kInt, s, text};
    if (is_float) {
      t.fval = std::strtod(text.c_str(), nullptr);
    } else {
      errno = 0;
      unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
      if (errno == ERANGE || v > static_cast<unsigned long long>(INT64_MAX))
        return error(s, "integer literal too large");
      t.ival = static_cast<int64_t>(v);
    }
    out.push_back(std::move(t));
    return p;
  }

  static void append_utf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // Python's unicode-escape decoding of the literal's body.
  Result<size_t> lex_string(size_t p, std::vector<Token>& out) {
    size_t n = src_.size(), s = p;
    char q = src_[p++];
    std::string v;
    while (true) {
      if (p >= n) return error(s, "unterminated string literal");
      char c = src_[p];
      if (c == q) {
        ++p;
        break;
      }
      if (c != '\\') {
        v += c;
        ++p;
        continue;
      }
      if (p + 1 >= n) return error(s, "unterminated string literal");
      char e = src_[p + 1];
      p += 2;
      auto hex = [&](int count) -> Result<uint32_t> {
        uint32_t x = 0;
        for (int k = 0; k < count; ++k) {
          if (p >= n || !std::isxdigit(static_cast<unsigned char>(src_[p])))
            return error(s, "truncated \\x/\\u escape in string literal");
          char h = src_[p++];
          x = x * 16 + (is_digit(h) ? h - '0' : (std::tolower(h) - 'a' + 10));
        }
        return x;
      };
      switch (e) {
        case '\n':
          break;
        case '\\':
          v += '\\';
          break;
        case '\'':
          v += '\'';
          break;
        case '"':
          v += '"';
          break;
        case 'a':
          v += '\a';
          break;
        case 'b':
          v += '\b';
          break;
        case 'f':
          v += '\f';
          break;
        case 'n':
          v += '\n';
          break;
        case 'r':
          v += '\r';
          break;
        case 't':
          v += '\t';
          break;
        case 'v':
          v += '\v';
          break;
        case 'x':
        case 'u':
        case 'U': {
          STRATA_ASSIGN_OR_RETURN(uint32_t cp, hex(e == 'x' ? 2 : e == 'u' ? 4 : 8));
          if (cp > 0x10FFFF) return error(s, "invalid \\U escape in string literal");
          append_utf8(cp, v);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = e - '0';
            for (int k = 0; k < 2 && p < n && src_[p] >= '0' && src_[p] <= '7'; ++k)
              cp = cp * 8 + (src_[p++] - '0');
            append_utf8(cp, v);
          } else {
            v += '\\';
            v += e;
          }
      }
    }
    out.push_back({Tok::kString, s, std::move(v)});
    return p;
  }

  std::string src_;
  std::vector<size_t> newlines_;
};

const std::set<std::string>& known_filters() {
  static const std::set<std::string> k = {
      "abs",        "capitalize", "count",    "d",       "default", "dictsort", "e",
      "escape",     "first",      "float",    "indent",  "int",     "items",    "join",
      "last",       "length",     "list",     "lower",   "map",     "max",      "min",
      "reject",     "rejectattr", "replace",  "reverse", "round",   "safe",     "select",
      "selectattr", "sort",       "string",   "sum",     "title",   "tojson",   "trim",
      "unique",     "upper",      "wordcount"};
  return k;
}

const std::set<std::string>& known_tests() {
  static const std::set<std::string> k = {
      "boolean",     "callable", "defined",  "divisibleby", "eq",       "equalto", "==",
      "escaped",     "even",     "false",    "float",       "ge",       ">=",      "gt",
      "greaterthan", ">",        "in",       "integer",     "iterable", "le",      "<=",
      "lower",       "lt",       "lessthan", "<",           "mapping",  "ne",      "!=",
      "none",        "number",   "odd",      "sameas",      "sequence", "string",  "true",
      "undefined",   "upper",    "filter",   "test"};
  return k;
}

class Parser {
 public:
  Parser(const Lexer& lexer, std::vector<Token> tokens) : lex_(lexer), t_(std::move(tokens)) {}

  Result<std::unique_ptr<Template>> run() {
    auto tmpl = std::make_unique<Template>();
    std::string found;
    STRATA_ASSIGN_OR_RETURN(tmpl->body, parse_body({}, found));
    return tmpl;
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  int line() const { return lex_.line_of(cur().offset); }
  Status error(const std::string& msg) const { return lex_.error(cur().offset, msg); }
  bool is_op(const char* op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool is_name(const char* name) const { return cur().type == Tok::kName && cur().text == name; }
  std::string describe() const {
    switch (cur().type) {
      case Tok::kEof:
        return "end of template";
      case Tok::kVarEnd:
        return "'}}'";
      case Tok::kBlockEnd:
        return "'%}'";
      case Tok::kText:
        return "template text";
      default:
        return "'" + cur().text + "'";
    }
  }
  Status expect_op(const char* op) {
    if (!is_op(op)) return error(fmt::format("expected '{}', got {}", op, describe()));
    ++i_;
    return ok_status();
  }
  Status expect_block_end() {
    if (cur().type != Tok::kBlockEnd)
      return error(fmt::format("expected '%}}', got {}", describe()));
    ++i_;
    return ok_status();
  }
  Result<std::string> expect_name() {
    if (cur().type != Tok::kName) return error(fmt::format("expected a name, got {}", describe()));
    return t_[i_++].text;
  }
  std::unique_ptr<Expr> node(ExprKind k, int ln) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = ln;
    return e;
  }

  struct DepthGuard {
    int& d;
    explicit DepthGuard(int& x) : d(x) { ++d; }
    ~DepthGuard() { --d; }
  };

  // Parses statements until a block tag whose name is in `stops`; leaves the cursor on that
  // name (after '{%') and stores it in `found`.
  Result<Body> parse_body(const std::vector<const char*>& stops, std::string& found) {
    DepthGuard g(depth_);
    if (depth_ > kMaxParseDepth) return error("template nested too deeply");
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::kEof) {
        if (stops.empty()) return body;
        std::string want;
        for (const char* s : stops) want += (want.empty() ? "'" : " or '") + std::string(s) + "'";
        return error("unexpected end of template, expected " + want);
      }
      if (t.type == Tok::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->line = line();
        s->text = t.text;
        body.push_back(std::move(s));
        ++i_;
        continue;
      }
      if (t.type == Tok::kVarBegin) {
        int ln = line();
        ++i_;
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kOutput;
        s->line = ln;
        STRATA_ASSIGN_OR_RETURN(s->expr, parse_tuple_expr());
        if (cur().type != Tok::kVarEnd)
          return error(fmt::format("expected '}}}}', got {}", describe()));
        ++i_;
        body.push_back(std::move(s));
        continue;
      }
      if (t.type != Tok::kBlockBegin) return error(fmt::format("unexpected {}", describe()));
      ++i_;
      if (cur().type != Tok::kName) return error("expected a statement name after '{%'");
      for (const char* s : stops) {
        if (cur().text == s) {
          found = s;
          ++i_;
          return body;
        }
      }
      STRATA_ASSIGN_OR_RETURN(auto stmt, parse_statement());
      body.push_back(std::move(stmt));
    }
  }

  Result<std::unique_ptr<Stmt>> parse_statement() {
    auto s = std::make_unique<Stmt>();
    s->line = line();
    std::string kw = cur().text;
    ++i_;
    std::string found;
    if (kw == "if") {
      s->kind = StmtKind::kIf;
      while (true) {
        STRATA_ASSIGN_OR_RETURN(auto cond, parse_tuple_expr());
        s->exprs.push_back(std::move(cond));
        STRATA_RETURN_IF_ERROR(expect_block_end());
        STRATA_ASSIGN_OR_RETURN(auto body, parse_body({"elif", "else", "endif"}, found));
        s->bodies.push_back(std::move(body));
        if (found == "elif") continue;
        if (found == "else") {
          STRATA_RETURN_IF_ERROR(expect_block_end());
          STRATA_ASSIGN_OR_RETURN(auto els, parse_body({"endif"}, found));
          s->bodies.push_back(std::move(els));
        }
        break;
      }
      STRATA_RETURN_IF_ERROR(expect_block_end());
    } else if (kw == "for") {
      s->kind = StmtKind::kFor;
      STRATA_ASSIGN_OR_RETURN(s->names, parse_targets());
      if (!is_name("in")) return error(fmt::format("expected 'in', got {}", describe()));
      ++i_;
      STRATA_ASSIGN_OR_RETURN(s->expr, parse_or());
      if (is_name("if")) {
        ++i_;
        STRATA_ASSIGN_OR_RETURN(s->expr2, parse_expr());
      }
      if (is_name("recursive")) return error("recursive for loops are not supported");
      STRATA_RETURN_IF_ERROR(expect_block_end());
      ++loops_;
      STRATA_ASSIGN_OR_RETURN(auto body, parse_body({"endfor", "else"}, found));
      --loops_;
      s->bodies.push_back(std::move(body));
      if (found == "else") {
        STRATA_RETURN_IF_ERROR(expect_block_end());
        STRATA_ASSIGN_OR_RETURN(auto els, parse_body({"endfor"}, found));
        s->bodies.push_back(std::move(els));
      }
      STRATA_RETURN_IF_ERROR(expect_block_end());
    } else if (kw == "set") {
      s->kind = StmtKind::kSet;
      STRATA_ASSIGN_OR_RETURN(std::string first, expect_name());
      if (is_op(".")) {
        ++i_;
        STRATA_ASSIGN_OR_RETURN(s->attr, expect_name());
        s->names.push_back(first);
      } else {
        s->names.push_back(first);
        while (is_op(",")) {
          ++i_;
          STRATA_ASSIGN_OR_RETURN(std::string n, expect_name());
          s->names.push_back(n);
        }
      }
      if (is_op("=")) {
        ++i_;
        STRATA_ASSIGN_OR_RETURN(s->expr, parse_tuple_expr());
        STRATA_RETURN_IF_ERROR(expect_block_end());
      } else {
        if (!s->attr.empty() || s->names.size() != 1) return error("expected '='");
        STRATA_RETURN_IF_ERROR(expect_block_end());
        STRATA_ASSIGN_OR_RETURN(auto body, parse_body({"endset"}, found));
        s->bodies.push_back(std::move(body));
        STRATA_RETURN_IF_ERROR(expect_block_end());
      }
    } else if (kw == "macro") {
      s->kind = StmtKind::kMacro;
      STRATA_ASSIGN_OR_RETURN(s->text, expect_name());
      STRATA_RETURN_IF_ERROR(expect_op("("));
      while (!is_op(")")) {
        STRATA_ASSIGN_OR_RETURN(std::string p, expect_name());
        s->names.push_back(p);
        std::unique_ptr<Expr> def;
        if (is_op("=")) {
          ++i_;
          STRATA_ASSIGN_OR_RETURN(def, parse_expr());
        }
        s->exprs.push_back(std::move(def));
        if (!is_op(",")) break;
        ++i_;
      }
      STRATA_RETURN_IF_ERROR(expect_op(")"));
      STRATA_RETURN_IF_ERROR(expect_block_end());
      int saved = loops_;
      loops_ = 0;
      STRATA_ASSIGN_OR_RETURN(auto body, parse_body({"endmacro"}, found));
      loops_ = saved;
      s->bodies.push_back(std::move(body));
      if (cur().type == Tok::kName && cur().text == s->text) ++i_;
      STRATA_RETURN_IF_ERROR(expect_block_end());
    } else if (kw == "break" || kw == "continue") {
      if (loops_ == 0) return error(fmt::format("'{}' outside of a loop", kw));
      s->kind = kw == "break" ? StmtKind::kBreak : StmtKind::kContinue;
      STRATA_RETURN_IF_ERROR(expect_block_end());
    } else if (kw == "generation") {
      s->kind = StmtKind::kBlock;
      STRATA_RETURN_IF_ERROR(expect_block_end());
      STRATA_ASSIGN_OR_RETURN(auto body, parse_body({"endgeneration"}, found));
      s->bodies.push_back(std::move(body));
      STRATA_RETURN_IF_ERROR(expect_block_end());
    } else {
      --i_;
      return error(fmt::format("unknown tag '{}'", kw));
    }
    return s;
  }

  Result<std::vector<std::string>> parse_targets() {
    std::vector<std::string> names;
    bool paren = is_op("(");
    if (paren) ++i_;
    while (true) {
      STRATA_ASSIGN_OR_RETURN(std::string n, expect_name());
      names.push_back(n);
      if (!is_op(",")) break;
      ++i_;
      if (paren && is_op(")")) break;
    }
    if (paren) STRATA_RETURN_IF_ERROR(expect_op(")"));
    return names;
  }

  // expr or an implicit tuple `a, b`.
  Result<std::unique_ptr<Expr>> parse_tuple_expr() {
    int ln = line();
    STRATA_ASSIGN_OR_RETURN(auto first, parse_expr());
    if (!is_op(",")) return first;
    auto t = node(ExprKind::kList, ln);
    t->value.tuple = true;
    t->kids.push_back(std::move(first));
    while (is_op(",")) {
      ++i_;
      if (cur().type == Tok::kVarEnd || cur().type == Tok::kBlockEnd) break;
      STRATA_ASSIGN_OR_RETURN(auto e, parse_expr());
      t->kids.push_back(std::move(e));
    }
    return t;
  }

  Result<std::unique_ptr<Expr>> parse_expr() {
    DepthGuard g(depth_);
    if (depth_ > kMaxParseDepth) return error("expression nested too deeply");
    STRATA_ASSIGN_OR_RETURN(auto e, parse_or());
    while (is_name("if")) {
      int ln = line();
      ++i_;
      auto c = node(ExprKind::kCond, ln);
      STRATA_ASSIGN_OR_RETURN(auto cond, parse_or());
      c->kids.push_back(std::move(cond));
      c->kids.push_back(std::move(e));
      if (is_name("else")) {
        ++i_;
        STRATA_ASSIGN_OR_RETURN(auto els, parse_expr());
        c->kids.push_back(std::move(els));
      } else {
        c->kids.push_back(nullptr);
      }
      e = std::move(c);
    }
    return e;
  }

  Result<std::unique_ptr<Expr>> binary(ExprKind k, std::string op, std::unique_ptr<Expr> a,
                                       std::unique_ptr<Expr> b, int ln) {
    auto e = node(k, ln);
    e->name = std::move(op);
    e->kids.push_back(std::move(a));
    e->kids.push_back(std::move(b));
    return e;
  }

  Result<std::unique_ptr<Expr>> parse_or() {
    STRATA_ASSIGN_OR_RETURN(auto e, parse_and());
    while (is_name("or")) {
      int ln = line();
      ++i_;
      STRATA_ASSIGN_OR_RETURN(auto r, parse_and());
      STRATA_ASSIGN_OR_RETURN(e, binary(ExprKind::kOr, "or", std::move(e), std::move(r), ln));
    }
    return e;
  }
  Result<std::unique_ptr<Expr>> parse_and() {
    STRATA_ASSIGN_OR_RETURN(auto e, parse_not());
    while (is_name("and")) {
      int ln = line();
      ++i_;
      STRATA_ASSIGN_OR_RETURN(auto r, parse_not());
      STRATA_ASSIGN_OR_RETURN(e, binary(ExprKind::kAnd, "and", std::move(e), std::move(r), ln));
    }
    return e;
  }
  Result<std::unique_ptr<Expr>> parse_not() {
    if (is_name("not")) {
      DepthGuard g(depth_);
      if (depth_ > kMaxParseDepth) return error("expression nested too deeply");
      int ln = line();
      ++i_;
      auto e = node(ExprKind::kNot, ln);
      STRATA_ASSIGN_OR_RETURN(auto x, parse_not());
      e->kids.push_back(std::move(x));
      return e;
    }
    return parse_compare();
  }
  Result<std::unique_ptr<Expr>> parse_compare() {
    int ln = line();
    STRATA_ASSIGN_OR_RETURN(auto first, parse_math1());
    std::unique_ptr<Expr> cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::kOp &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        ++i_;
      } else if (is_name("in")) {
        op = "in";
        ++i_;
      } else if (is_name("not") && peek().type == Tok::kName && peek().text == "in") {
        op = "notin";
        i_ += 2;
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(ExprKind::kCompare, ln);
        cmp->kids.push_back(std::move(first));
      }
      STRATA_ASSIGN_OR_RETURN(auto r, parse_math1());
      cmp->ops.push_back(op);
      cmp->kids.push_back(std::move(r));
    }
    if (cmp) return cmp;
    return first;
  }
  Result<std::unique_ptr<Expr>> parse_math1() {
    STRATA_ASSIGN_OR_RETURN(auto e, parse_concat());
    while (is_op("+") || is_op("-")) {
      int ln = line();
      std::string op = t_[i_++].text;
      STRATA_ASSIGN_OR_RETURN(auto r, parse_concat());
      STRATA_ASSIGN_OR_RETURN(e, binary(ExprKind::kBinary, op, std::move(e), std::move(r), ln));
    }
    return e;
  }
  Result<std::unique_ptr<Expr>> parse_concat() {
    STRATA_ASSIGN_OR_RETURN(auto e, parse_math2());
    while (is_op("~")) {
      int ln = line();
      ++i_;
      STRATA_ASSIGN_OR_RETURN(auto r, parse_math2());
      STRATA_ASSIGN_OR_RETURN(e, binary(ExprKind::kBinary, "~", std::move(e), std::move(r), ln));
    }
    return e;
  }
  Result<std::unique_ptr<Expr>> parse_math2() {
    STRATA_ASSIGN_OR_RETURN(auto e, parse_pow());
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      int ln = line();
      std::string op = t_[i_++].text;
      STRATA_ASSIGN_OR_RETURN(auto r, parse_pow());
      STRATA_ASSIGN_OR_RETURN(e, binary(ExprKind::kBinary, op, std::move(e), std::move(r), ln));
    }
    return e;
  }
  Result<std::unique_ptr<Expr>> parse_pow() {
    STRATA_ASSIGN_OR_RETURN(auto e, parse_unary(true));
    while (is_op("**")) {
      int ln = line();
      ++i_;
      STRATA_ASSIGN_OR_RETURN(auto r, parse_unary(true));
      STRATA_ASSIGN_OR_RETURN(e, binary(ExprKind::kBinary, "**", std::move(e), std::move(r), ln));
    }
    return e;
  }
  Result<std::unique_ptr<Expr>> parse_unary(bool with_filter) {
    DepthGuard g(depth_);
    if (depth_ > kMaxParseDepth) return error("expression nested too deeply");
    int ln = line();
    std::unique_ptr<Expr> e;
    if (is_op("-") || is_op("+")) {
      e = node(is_op("-") ? ExprKind::kNeg : ExprKind::kPos, ln);
      ++i_;
      STRATA_ASSIGN_OR_RETURN(auto x, parse_unary(false));
      e->kids.push_back(std::move(x));
    } else {
      STRATA_ASSIGN_OR_RETURN(e, parse_primary());
    }
    STRATA_ASSIGN_OR_RETURN(e, parse_postfix(std::move(e)));
    if (with_filter) {
      STRATA_ASSIGN_OR_RETURN(e, parse_filters(std::move(e)));
    }
    return e;
  }

  Result<std::unique_ptr<Expr>> parse_primary() {
    int ln = line();
    const Token& t = cur();
    if (t.type == Tok::kName) {
      ++i_;
      auto e = node(ExprKind::kLiteral, ln);
      if (t.text == "true" || t.text == "True")
        e->value = Value::boolean(true);
      else if (t.text == "false" || t.text == "False")
        e->value = Value::boolean(false);
      else if (t.text == "none" || t.text == "None")
        e->value = Value::none();
      else {
        e->kind = ExprKind::kName;
        e->name = t.text;
      }
      return e;
    }
    if (t.type == Tok::kString) {
      std::string s;
      while (cur().type == Tok::kString) s += t_[i_++].text;
      auto e = node(ExprKind::kLiteral, ln);
      e->value = Value::string(std::move(s));
      return e;
    }
    if (t.type == Tok::kInt || t.type == Tok::kFloat) {
      ++i_;
      auto e = node(ExprKind::kLiteral, ln);
      e->value = t.type == Tok::kInt ? Value::integer(t.ival) : Value::real(t.fval);
      return e;
    }
    if (is_op("(")) {
      ++i_;
      if (is_op(")")) {
        ++i_;
        auto e = node(ExprKind::kList, ln);
        e->value.tuple = true;
        return e;
      }
      STRATA_ASSIGN_OR_RETURN(auto first, parse_expr());
      if (is_op(")")) {
        ++i_;
        return first;
      }
      auto e = node(ExprKind::kList, ln);
      e->value.tuple = true;
      e->kids.push_back(std::move(first));
      while (is_op(",")) {
        ++i_;
        if (is_op(")")) break;
        STRATA_ASSIGN_OR_RETURN(auto x, parse_expr());
        e->kids.push_back(std::move(x));
      }
      STRATA_RETURN_IF_ERROR(expect_op(")"));
      return e;
    }
    if (is_op("[")) {
      ++i_;
      auto e = node(ExprKind::kList, ln);
      while (!is_op("]")) {
        STRATA_ASSIGN_OR_RETURN(auto x, parse_expr());
        e->kids.push_back(std::move(x));
        if (!is_op(",")) break;
        ++i_;
      }
      STRATA_RETURN_IF_ERROR(expect_op("]"));
      return e;
    }
    if (is_op("{")) {
      ++i_;
      auto e = node(ExprKind::kDict, ln);
      while (!is_op("}")) {
        STRATA_ASSIGN_OR_RETURN(auto k, parse_expr());
        STRATA_RETURN_IF_ERROR(expect_op(":"));
        STRATA_ASSIGN_OR_RETURN(auto v, parse_expr());
        e->kids.push_back(std::move(k));
        e->kids.push_back(std::move(v));
        if (!is_op(",")) break;
        ++i_;
      }
      STRATA_RETURN_IF_ERROR(expect_op("}"));
      return e;
    }
    return error(fmt::format("unexpected {}", describe()));
  }

  Result<std::unique_ptr<Expr>> parse_postfix(std::unique_ptr<Expr> e) {
    while (true) {
      int ln = line();
      if (is_op(".")) {
        ++i_;
        if (cur().type == Tok::kInt) {
          auto x = node(ExprKind::kIndex, ln);
          auto idx = node(ExprKind::kLiteral, ln);
          idx->value = Value::integer(cur().ival);
          ++i_;
          x->kids.push_back(std::move(e));
          x->kids.push_back(std::move(idx));
          e = std::move(x);
          continue;
        }
        STRATA_ASSIGN_OR_RETURN(std::string n, expect_name());
        auto x = node(ExprKind::kAttr, ln);
        x->name = n;
        x->kids.push_back(std::move(e));
        e = std::move(x);
      } else if (is_op("[")) {
        ++i_;
        std::unique_ptr<Expr> parts[3];
        int nparts = 1;
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!is_op(":") && !is_op("]")) {
            STRATA_ASSIGN_OR_RETURN(parts[k], parse_expr());
          }
          if (k < 2 && is_op(":")) {
            slice = true;
            ++i_;
            ++nparts;
            continue;
          }
          break;
        }
        STRATA_RETURN_IF_ERROR(expect_op("]"));
        auto x = node(slice ? ExprKind::kSlice : ExprKind::kIndex, ln);
        x->kids.push_back(std::move(e));
        if (!slice) {
          if (!parts[0]) return error("empty subscript");
          x->kids.push_back(std::move(parts[0]));
        } else {
          for (int k = 0; k < 3; ++k) x->kids.push_back(std::move(parts[k]));
        }
        (void)nparts;
        e = std::move(x);
      } else if (is_op("(")) {
        auto x = node(ExprKind::kCall, ln);
        x->kids.push_back(std::move(e));
        STRATA_RETURN_IF_ERROR(parse_args(*x));
        e = std::move(x);
      } else {
        return e;
      }
    }
  }

  Status parse_args(Expr& call) {
    STRATA_RETURN_IF_ERROR(expect_op("("));
    while (!is_op(")")) {
      if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
        call.kw_names.push_back(cur().text);
        i_ += 2;
      } else if (!call.kw_names.empty()) {
        return error("positional argument after keyword argument");
      }
      STRATA_ASSIGN_OR_RETURN(auto a, parse_expr());
      call.kids.push_back(std::move(a));
      if (!is_op(",")) break;
      ++i_;
    }
    return expect_op(")");
  }

  Result<std::unique_ptr<Expr>> parse_filters(std::unique_ptr<Expr> e) {
    while (true) {
      int ln = line();
      if (is_op("|")) {
        ++i_;
        STRATA_ASSIGN_OR_RETURN(std::string n, expect_name());
        if (!known_filters().count(n)) {
          --i_;
          return error(fmt::format("unknown filter '{}'", n));
        }
        auto x = node(ExprKind::kFilter, ln);
        x->name = n;
        x->kids.push_back(std::move(e));
        if (is_op("(")) STRATA_RETURN_IF_ERROR(parse_args(*x));
        e = std::move(x);
      } else if (is_name("is")) {
        ++i_;
        auto x = node(ExprKind::kTest, ln);
        if (is_name("not")) {
          x->negate = true;
          ++i_;
        }
        STRATA_ASSIGN_OR_RETURN(std::string n, expect_name());
        if (!known_tests().count(n)) {
          --i_;
          return error(fmt::format("unknown test '{}'", n));
        }
        x->name = n;
        x->kids.push_back(std::move(e));
        if (is_op("(")) {
          STRATA_RETURN_IF_ERROR(parse_args(*x));
        } else if ((cur().type == Tok::kName || cur().type == Tok::kString ||
                    cur().type == Tok::kInt || cur().type == Tok::kFloat || is_op("[") ||
                    is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) return error("cannot chain multiple tests with 'is'");
          STRATA_ASSIGN_OR_RETURN(auto a, parse_primary());
          STRATA_ASSIGN_OR_RETURN(a, parse_postfix(std::move(a)));
          x->kids.push_back(std::move(a));
        }
        e = std::move(x);
      } else if (is_op("(")) {
        auto x = node(ExprKind::kCall, ln);
        x->kids.push_back(std::move(e));
        STRATA_RETURN_IF_ERROR(parse_args(*x));
        e = std::move(x);
      } else {
        return e;
      }
    }
  }

  const Lexer& lex_;
  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
  int loops_ = 0;
};

}  // namespace

Result<std::unique_ptr<Template>> parse_template(const std::string& source) {
  // jinja2: newlines normalized to \n, one trailing newline dropped (keep_trailing_newline off).
  std::string src;
  src.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      src += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      src += source[k];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  Lexer lexer(src);
  std::vector<Token> tokens;
  STRATA_RETURN_IF_ERROR(lexer.run(tokens));
  Parser parser(lexer, std::move(tokens));
  return parser.run();
}

}  // namespace strata::jinja
