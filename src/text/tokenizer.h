// Tokenizer: BPE text <-> token ids, as Hugging Face `tokenizers` does it, built from a
// format-neutral TokenizerSpec that both tokenizer.json and GGUF metadata can fill.
//
// Pipeline of encode(), in HF order:
//   1. added tokens whose `normalized` is false are cut out of the raw text (leftmost-longest,
//      honouring special/lstrip/rstrip/single_word);
//   2. each remaining piece is normalized (Prepend, Replace, NFC), then added tokens whose
//      `normalized` is true are cut out of it;
//   3. pre-tokenizer steps split the pieces (regex splitters, Digits, ByteLevel, Metaspace);
//   4. each piece goes through BPE: merges by rank (tokenizer.json, GGUF `gpt2`) or by token
//      score (GGUF `llama` / SentencePiece vocabularies without merges), byte fallback to
//      <0xXX> tokens, optional unknown token;
//   5. the post-processor's prefix/suffix ids (e.g. BOS) are added when add_special_tokens.
// decode() runs the decoder steps per token (ByteLevel, Replace, ByteFallback, Fuse, Strip,
// Metaspace) and returns valid UTF-8; StreamingDecoder gives the same text one id at a time.
//
// Input that is not valid UTF-8 is accepted: each invalid byte is a one-byte character with no
// Unicode category, so byte-level tokenizers still round-trip arbitrary bytes exactly.
// A Tokenizer is immutable after construction; encode/decode are safe to call concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "strata/status.h"

namespace strata {

// GGUF `tokenizer.ggml.token_type` values.
enum class TokenType : uint8_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

enum class NormalizerKind : uint8_t {
  kPrepend,  // `content` before non-empty text
  kReplace,  // every occurrence of `pattern` becomes `content`
  kNfc,      // Unicode NFC
};

struct NormalizerStep {
  NormalizerKind kind = NormalizerKind::kNfc;
  std::string pattern;
  std::string content;
};

// How a split step keeps the delimiters it found (HF SplitDelimiterBehavior).
enum class SplitBehavior : uint8_t {
  kRemoved,
  kIsolated,
  kMergedWithPrevious,
  kMergedWithNext,
  kContiguous,
};

enum class PrependScheme : uint8_t { kAlways, kFirst, kNever };

enum class PreTokenizerKind : uint8_t {
  kGpt2Regex,  // hand-written splitters for the three known regexes
  kLlama3Regex,
  kQwen2Regex,
  kRegex,      // any other regex in `pattern` (needs PCRE2)
  kLiteral,    // split on the literal string `pattern`
  kDigits,     // HF Digits: numeric characters, one by one when individual_digits
  kByteLevel,  // HF ByteLevel: optional prefix space, optional GPT-2 split, bytes -> chars
  kMetaspace,  // HF Metaspace: ' ' -> `pattern` (the replacement), prefix, optional split
};

struct PreTokenizerStep {
  PreTokenizerKind kind = PreTokenizerKind::kGpt2Regex;
  std::string pattern;
  SplitBehavior behavior = SplitBehavior::kIsolated;      // split kinds
  bool invert = false;                                    // kRegex, kLiteral
  bool individual_digits = false;                         // kDigits
  bool add_prefix_space = false;                          // kByteLevel
  bool use_regex = true;                                  // kByteLevel
  PrependScheme prepend_scheme = PrependScheme::kAlways;  // kMetaspace
  bool split = true;                                      // kMetaspace
};

enum class DecoderKind : uint8_t {
  kByteLevel,     // printable byte-level chars back to bytes
  kReplace,       // `pattern` -> `content` in each token
  kByteFallback,  // "<0xXX>" tokens -> the byte XX
  kFuse,          // join the tokens (later Strip steps then act on the whole text)
  kStrip,         // remove up to strip_start leading / strip_stop trailing `content` chars
  kMetaspace,     // `pattern` (the replacement) -> ' '; dropped in the first token unless kNever
};

struct DecoderStep {
  DecoderKind kind = DecoderKind::kByteLevel;
  std::string pattern;
  std::string content;
  int strip_start = 0;
  int strip_stop = 0;
  PrependScheme prepend_scheme = PrependScheme::kAlways;
};

// A token matched in the text before pre-tokenization (HF AddedToken).
struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;      // skipped by decode(skip_special_tokens); see parse_special
  bool lstrip = false;       // also swallows the whitespace on its left
  bool rstrip = false;       // ... and on its right
  bool normalized = false;   // matched in the normalized text instead of the raw text
  bool single_word = false;  // only matches when not inside a word
};

// Everything a Tokenizer is built from. tokenizer.json fills it through read_hf_tokenizer_spec;
// a GGUF loader fills it from `tokenizer.ggml.*`:
//   gpt2:  tokens, merges ("a b" split at the first space), token_types, pre_tokenizers from
//          gguf_pre_tokenizer(`tokenizer.ggml.pre`), decoders {kByteLevel};
//   llama: tokens, scores, token_types (merges empty: merge priority by score), byte_fallback,
//          normalizers {Prepend "▁" if add_space_prefix, Replace " " -> "▁"},
//          decoders {Replace "▁"->" ", ByteFallback, Fuse, Strip " " 1 0};
//   both:  bos/eos ids, add_bos -> post_prefix_ids {bos}, chat_template. When added_tokens is
//          empty, control tokens become special added tokens and user-defined tokens plain ones.
struct TokenizerSpec {
  std::vector<std::string> tokens;                          // the model vocabulary, by id
  std::vector<std::pair<std::string, std::string>> merges;  // rank = index
  std::vector<float> scores;           // by id; used for merging when merges is empty
  std::vector<TokenType> token_types;  // by id; optional
  // May reuse ids of `tokens` or extend past them (the id table grows to cover them).
  std::vector<AddedToken> added_tokens;
  std::vector<NormalizerStep> normalizers;
  std::vector<PreTokenizerStep> pre_tokenizers;
  std::vector<DecoderStep> decoders;  // empty: tokens are joined with spaces (as HF does)
  bool byte_fallback = false;
  bool ignore_merges = false;  // a piece that is itself a token is not merged further
  std::string unk_token;       // empty: characters with no token are dropped
  bool fuse_unk = false;
  std::vector<int32_t> post_prefix_ids;  // added before the ids when add_special_tokens
  std::vector<int32_t> post_suffix_ids;  // ... and after
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  std::vector<int32_t> eot_ids;  // extra end-of-turn ids (eos and well-known names are added)
  std::string chat_template;
};

// Pre-tokenizer steps for a GGUF `tokenizer.ggml.pre` name of a `gpt2` vocabulary
// ("default"/"gpt2", "llama3"/"llama-bpe", "qwen2", "smollm"/"starcoder", ...).
Result<std::vector<PreTokenizerStep>> gguf_pre_tokenizer(std::string_view pre);

// Parses a tokenizer.json document; `name` (usually the path) prefixes error messages.
Result<TokenizerSpec> parse_hf_tokenizer_json(std::string_view json_text, const std::string& name);
// Reads tokenizer.json at `path`, plus tokenizer_config.json beside it when present (bos/eos
// tokens, add_bos_token/add_eos_token, chat_template).
Result<TokenizerSpec> read_hf_tokenizer_spec(const std::string& path);

class Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> from_spec(TokenizerSpec spec);
  static Result<std::unique_ptr<Tokenizer>> from_hf_json(const std::string& path);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`. add_special_tokens adds the post-processor's ids (BOS); parse_special
  // = false treats special added tokens in the text as plain text (HF encode_special_tokens).
  // Fails only when a PCRE2 pre-tokenizer regex reports an error.
  Result<std::vector<int32_t>> encode(std::string_view text, bool add_special_tokens = true,
                                      bool parse_special = true) const;
  // Text of `ids` as valid UTF-8 (ill-formed byte sequences become U+FFFD). Ids outside the
  // vocabulary are skipped, as HF does.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = true) const;

  int32_t token_to_id(std::string_view token) const;  // -1 when absent
  const std::string& id_to_token(int32_t id) const;   // "" when out of range
  int32_t vocab_size() const;
  int32_t bos_id() const;  // -1 when none
  int32_t eos_id() const;  // -1 when none
  // Ids that end a turn: eos plus <|im_end|>, <|eot_id|>, <end_of_turn>, ... when present.
  const std::vector<int32_t>& eot_ids() const;
  bool is_eot(int32_t id) const;
  bool is_special(int32_t id) const;  // a special added token (or control token)
  bool add_bos() const;               // the post-processor starts with bos
  const std::string& chat_template() const;

 private:
  friend class StreamingDecoder;
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Decodes ids one at a time, returning only complete UTF-8 and holding back a partial
// character until the bytes that finish it arrive. The concatenation of every push() and the
// final flush() equals Tokenizer::decode of the same ids.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = true);
  std::string push(int32_t id);
  // Whatever is held back, with an incomplete character replaced by U+FFFD; then reset().
  std::string flush();
  void reset();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  int64_t n_tokens_ = 0;  // tokens decoded so far (skipped ones excluded)
  bool emitted_ = false;  // any text produced yet (leading Strip applies before that)
  int strip_left_ = 0;    // leading strip characters still to remove
  std::string pending_;   // bytes not yet returned
};

}  // namespace strata
