// Pre-tokenizer splitters: the three regexes real BPE tokenizers use, written by hand over the
// Unicode category tables, and a PCRE2 fallback for any other regex.
//
// The hand-written matchers reproduce the leftmost-first (backtracking) semantics of
//   GPT-2:  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   Llama-3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   Qwen2:  Llama-3 with \p{N} (one digit per match)
// Every character starts a match of these regexes, so their matches tile the text. Bytes that
// are not well-formed UTF-8 count as characters outside every class (like punctuation).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/status.h"

namespace strata {

enum class BuiltinRegex : uint8_t { kGpt2, kLlama3, kQwen2 };

// Byte range [first, second) of one match.
using MatchRange = std::pair<size_t, size_t>;

// The regex source text of a built-in splitter (as it appears in tokenizer.json).
std::string_view builtin_regex_pattern(BuiltinRegex which);
// Which built-in splitter implements `pattern`, if any (exact string comparison).
std::optional<BuiltinRegex> builtin_regex_for_pattern(std::string_view pattern);

// Appends the matches of a built-in regex in `s`, in order.
void builtin_regex_matches(BuiltinRegex which, std::string_view s, std::vector<MatchRange>& out);

// A compiled arbitrary regex (PCRE2 with UTF, UCP and JIT when strata is built with it).
class RegexMatcher {
 public:
  // kUnimplemented when strata was built without PCRE2; kInvalidArgument on a bad pattern.
  static Result<std::unique_ptr<RegexMatcher>> compile(const std::string& pattern);
  ~RegexMatcher();
  RegexMatcher(const RegexMatcher&) = delete;
  RegexMatcher& operator=(const RegexMatcher&) = delete;

  // Appends the non-empty matches in `s`, in order. Fails only when PCRE2 reports an error
  // (for example its match limit).
  Status matches(std::string_view s, std::vector<MatchRange>& out) const;
  const std::string& pattern() const { return pattern_; }

 private:
  RegexMatcher() = default;
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
};

}  // namespace strata
