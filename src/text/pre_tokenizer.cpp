// Hand-written matchers for the GPT-2, Llama-3 and Qwen2 pre-tokenizer regexes, and the PCRE2
// wrapper for other regexes. See pre_tokenizer.h for the patterns.
#include "text/pre_tokenizer.h"

#include "core/status.h"
#include "text/unicode.h"

#ifdef STRATA_HAS_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif

namespace strata {

namespace {

constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr uint8_t ascii_flags(int b) {
  if (b == ' ' || (b >= 0x09 && b <= 0x0D)) return kCatWhitespace;
  if ((b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z')) return kCatLetter | kCatWord;
  if (b >= '0' && b <= '9') return kCatNumber | kCatWord;
  if (b == '_') return kCatWord;
  return 0;
}

struct AsciiTable {
  uint8_t flags[128];
};

constexpr AsciiTable make_ascii_table() {
  AsciiTable t{};
  for (int i = 0; i < 128; ++i) t.flags[i] = ascii_flags(i);
  return t;
}

constexpr AsciiTable kAscii = make_ascii_table();

// One decoded character of the text being split.
struct Char {
  uint32_t cp = kInvalidCodePoint;
  size_t len = 0;  // 0 past the end
  uint8_t flags = 0;

  bool letter() const { return flags & kCatLetter; }
  bool number() const { return flags & kCatNumber; }
  bool space() const { return flags & kCatWhitespace; }
  // [^\s\p{L}\p{N}]
  bool other() const { return len > 0 && !(flags & (kCatLetter | kCatNumber | kCatWhitespace)); }
  bool newline() const { return cp == '\r' || cp == '\n'; }
};

class Scanner {
 public:
  explicit Scanner(std::string_view s) : s_(s) {}

  Char at(size_t pos) const {
    Char c;
    if (pos >= s_.size()) return c;
    const auto b = static_cast<uint8_t>(s_[pos]);
    if (b < 0x80) {  // ASCII fast path
      c.cp = b;
      c.len = 1;
      c.flags = kAscii.flags[b];
      return c;
    }
    c.cp = utf8_decode(s_, pos, &c.len);
    c.flags = unicode_flags(c.cp);
    return c;
  }
  size_t size() const { return s_.size(); }
  char byte(size_t pos) const { return pos < s_.size() ? s_[pos] : '\0'; }

  // End of the run of characters starting at pos that satisfy pred.
  template <class Pred>
  size_t run(size_t pos, Pred pred) const {
    while (pos < s_.size()) {
      const Char c = at(pos);
      if (!pred(c)) break;
      pos += c.len;
    }
    return pos;
  }

 private:
  std::string_view s_;
};

char ascii_lower(char c) {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

// Length of a contraction ('s 't 're 've 'm 'll 'd) at pos, or 0.
size_t contraction_at(const Scanner& sc, size_t pos, bool ignore_case) {
  if (sc.byte(pos) != '\'') return 0;
  auto fold = [&](char c) { return ignore_case ? ascii_lower(c) : c; };
  const char a = fold(sc.byte(pos + 1));
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  const char b = fold(sc.byte(pos + 2));
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// \s+(?!\S) followed by the \s+ fallback, for a whitespace character at pos.
size_t whitespace_tail(const Scanner& sc, size_t pos) {
  size_t last_start = pos;
  size_t end = pos;
  while (end < sc.size()) {
    const Char c = sc.at(end);
    if (!c.space()) break;
    last_start = end;
    end += c.len;
  }
  if (end == sc.size()) return end;         // the run reaches the end: (?!\S) holds
  if (last_start > pos) return last_start;  // give back the last space before the \S
  return end;                               // one space before \S: plain \s+
}

size_t gpt2_match(const Scanner& sc, size_t pos) {
  if (size_t n = contraction_at(sc, pos, false)) return pos + n;
  const Char c0 = sc.at(pos);
  size_t start = pos;  // where the class run starts (after an optional leading space)
  Char first = c0;
  if (c0.cp == ' ') {
    const Char c1 = sc.at(pos + 1);
    if (c1.letter() || c1.number() || c1.other()) {
      start = pos + 1;
      first = c1;
    }
  }
  if (first.letter()) return sc.run(start, [](const Char& c) { return c.letter(); });
  if (first.number()) return sc.run(start, [](const Char& c) { return c.number(); });
  if (first.other()) return sc.run(start, [](const Char& c) { return c.other(); });
  return whitespace_tail(sc, pos);
}

size_t llama3_match(const Scanner& sc, size_t pos, int max_digits) {
  if (size_t n = contraction_at(sc, pos, true)) return pos + n;
  const Char c0 = sc.at(pos);
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (!c0.newline() && !c0.letter() && !c0.number()) {
    const Char c1 = sc.at(pos + c0.len);
    if (c1.letter()) return sc.run(pos + c0.len, [](const Char& c) { return c.letter(); });
  }
  if (c0.letter()) return sc.run(pos, [](const Char& c) { return c.letter(); });
  // \p{N}{1,max_digits}
  if (c0.number()) {
    size_t end = pos;
    for (int i = 0; i < max_digits; ++i) {
      const Char c = sc.at(end);
      if (!c.number()) break;
      end += c.len;
    }
    return end;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  size_t start = c0.other() ? pos : std::string_view::npos;
  if (c0.cp == ' ' && sc.at(pos + 1).other()) start = pos + 1;
  if (start != std::string_view::npos) {
    const size_t end = sc.run(start, [](const Char& c) { return c.other(); });
    return sc.run(end, [](const Char& c) { return c.newline(); });
  }
  // c0 is whitespace. \s*[\r\n]+ : up to and including the last newline of the run.
  size_t end = pos;
  size_t after_newline = 0;
  while (end < sc.size()) {
    const Char c = sc.at(end);
    if (!c.space()) break;
    end += c.len;
    if (c.newline()) after_newline = end;
  }
  if (after_newline != 0) return after_newline;
  return whitespace_tail(sc, pos);
}

}  // namespace

std::string_view builtin_regex_pattern(BuiltinRegex which) {
  switch (which) {
    case BuiltinRegex::kGpt2:
      return kGpt2Pattern;
    case BuiltinRegex::kLlama3:
      return kLlama3Pattern;
    case BuiltinRegex::kQwen2:
      return kQwen2Pattern;
  }
  return {};
}

std::optional<BuiltinRegex> builtin_regex_for_pattern(std::string_view pattern) {
  if (pattern == kGpt2Pattern) return BuiltinRegex::kGpt2;
  if (pattern == kLlama3Pattern) return BuiltinRegex::kLlama3;
  if (pattern == kQwen2Pattern) return BuiltinRegex::kQwen2;
  return std::nullopt;
}

void builtin_regex_matches(BuiltinRegex which, std::string_view s, std::vector<MatchRange>& out) {
  const Scanner sc(s);
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = pos;
    switch (which) {
      case BuiltinRegex::kGpt2:
        end = gpt2_match(sc, pos);
        break;
      case BuiltinRegex::kLlama3:
        end = llama3_match(sc, pos, 3);
        break;
      case BuiltinRegex::kQwen2:
        end = llama3_match(sc, pos, 1);
        break;
    }
    if (end <= pos) end = pos + 1;  // cannot happen: every character starts a match
    out.emplace_back(pos, end);
    pos = end;
  }
}

// ---- PCRE2 ---------------------------------------------------------------------------------

#ifdef STRATA_HAS_PCRE2

Result<std::unique_ptr<RegexMatcher>> RegexMatcher::compile(const std::string& pattern) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error_code,
                                   &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return errorf(StatusCode::kInvalidArgument, "regex '{}': {} at offset {}", pattern,
                  reinterpret_cast<const char*>(message), error_offset);
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort: interpreted matching otherwise
  std::unique_ptr<RegexMatcher> m(new RegexMatcher());
  m->pattern_ = pattern;
  m->code_ = code;
  return m;
}

RegexMatcher::~RegexMatcher() {
  if (code_ != nullptr) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

Status RegexMatcher::matches(std::string_view s, std::vector<MatchRange>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  if (md == nullptr) return errorf(StatusCode::kOutOfMemory, "regex '{}': no match data", pattern_);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t offset = 0;
  Status status;
  while (offset <= s.size()) {
    const int rc = pcre2_match(code, subject, s.size(), offset, 0, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      status = errorf(StatusCode::kInternal, "regex '{}': {}", pattern_,
                      reinterpret_cast<const char*>(message));
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t start = ov[0];
    const size_t end = ov[1];
    if (end > start) {
      out.emplace_back(start, end);
      offset = end;
    } else {
      // Empty match: step over one character and search again.
      if (start >= s.size()) break;
      size_t len = 1;
      utf8_decode(s, start, &len);
      offset = start + len;
    }
  }
  pcre2_match_data_free(md);
  return status;
}

#else  // !STRATA_HAS_PCRE2

Result<std::unique_ptr<RegexMatcher>> RegexMatcher::compile(const std::string& pattern) {
  return errorf(StatusCode::kUnimplemented,
                "pre-tokenizer regex '{}' is not one of the built-in GPT-2/Llama-3/Qwen2 "
                "patterns and strata was built without PCRE2",
                pattern);
}

RegexMatcher::~RegexMatcher() = default;

Status RegexMatcher::matches(std::string_view, std::vector<MatchRange>&) const {
  return errorf(StatusCode::kUnimplemented, "regex '{}': built without PCRE2", pattern_);
}

#endif

}  // namespace strata
