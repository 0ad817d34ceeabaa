// Lexer and parser of the chat-template Jinja subset: source text to the statement tree that
// chat_template.cpp interprets. Whitespace control follows jinja2 with trim_blocks and
// lstrip_blocks on, newlines normalized to \n and one trailing newline dropped.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chat/jinja_value.h"
#include "strata/status.h"

namespace strata::jinja {

enum class ExprKind : uint8_t {
  kLiteral,
  kName,
  kList,    // kids: items (tuple flag in `value.tuple`)
  kDict,    // kids: key, value, key, value ...
  kAttr,    // kids[0].name
  kIndex,   // kids[0][kids[1]]
  kSlice,   // kids[0][kids[1]:kids[2]:kids[3]] (null kids are omitted bounds)
  kCall,    // kids[0](kids[1..]); the last kw_names.size() args are keyword args
  kFilter,  // kids[0] | name(kids[1..])
  kTest,    // kids[0] is [not] name(kids[1..])
  kNeg,
  kPos,
  kNot,
  kAnd,
  kOr,
  kBinary,   // kids[0] <name> kids[1]: + - * / // % ** ~
  kCompare,  // kids[0] ops[0] kids[1] ops[1] kids[2] ...: == != < <= > >= in notin
  kCond,     // kids[1] if kids[0] else kids[2] (kids[2] may be null)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  bool negate = false;
  Value value;
  std::string name;
  std::vector<std::unique_ptr<Expr>> kids;
  std::vector<std::string> kw_names;
  std::vector<std::string> ops;
};

enum class StmtKind : uint8_t {
  kText,
  kOutput,
  kIf,     // exprs: conditions; bodies: one per condition, plus the else body when present
  kFor,    // names: targets; expr: iterable; expr2: filter; bodies[0] body, bodies[1] else
  kSet,    // names: targets (or names[0] + attr); expr: value, or bodies[0] for block set
  kMacro,  // text: name; names: params; exprs: defaults (null when none); bodies[0]
  kBreak,
  kContinue,
  kBlock,  // generation: bodies[0]
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;
  std::string attr;
  std::vector<std::string> names;
  std::unique_ptr<Expr> expr, expr2;
  std::vector<std::unique_ptr<Expr>> exprs;
  std::vector<Body> bodies;
};

struct Template {
  Body body;
};

// Errors read "line N: <what>".
Result<std::unique_ptr<Template>> parse_template(const std::string& source);

}  // namespace strata::jinja
