// Tokenizer core: added-token extraction, normalization, pre-tokenization, BPE, decoding.
// Behaviour follows Hugging Face `tokenizers` (see tokenizer.h); tests/text/tokenizer_test.cpp
// compares every step's result with ids the HF library produced.
#include "text/tokenizer.h"

#include <algorithm>
#include <array>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "core/status.h"
#include "text/pre_tokenizer.h"
#include "text/unicode.h"

namespace strata {

namespace {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// Words longer than this are not cached; the cache is cleared when it reaches kCacheCapacity.
constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kCacheCapacity = 1 << 16;

// Names of tokens that end a turn in common chat formats.
constexpr std::string_view kEndOfTurnNames[] = {
    "<|im_end|>", "<|eot_id|>",    "<|eom_id|>",      "<end_of_turn>",
    "<|end|>",    "<|endoftext|>", "<|end_of_text|>", "</s>",
    "<|return|>", "<|call|>",      "<EOT>",           "<|END_OF_TURN_TOKEN|>"};

uint64_t pair_key(int32_t a, int32_t b) {
  return static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32 | static_cast<uint32_t>(b);
}

// GPT-2's byte <-> printable character table: bytes that are printable Latin-1 map to
// themselves, the others to U+0100 + n in byte order.
struct ByteLevelTable {
  std::array<std::string, 256> byte_to_utf8;
  std::array<int16_t, 0x144> char_to_byte;  // by code point, -1 when not a byte char

  ByteLevelTable() {
    char_to_byte.fill(-1);
    uint32_t n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : 256 + n++;
      utf8_append(byte_to_utf8[static_cast<size_t>(b)], cp);
      char_to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelTable& byte_level_table() {
  static const ByteLevelTable table;
  return table;
}

// Start of the character that ends at `pos` (pos > 0); a stray byte counts as one character.
size_t prev_char_start(std::string_view s, size_t pos) {
  size_t p = pos - 1;
  while (p > 0 && pos - p < 4 && (static_cast<uint8_t>(s[p]) & 0xC0) == 0x80) --p;
  size_t len = 0;
  utf8_decode(s, p, &len);
  return p + len == pos ? p : pos - 1;
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out.append(to);
    pos = hit + from.size();
  }
  if (pos == 0) return;
  out.append(s, pos, std::string::npos);
  s = std::move(out);
}

// "<0xAB>" -> 0xAB, else -1.
int parse_byte_token(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = hex(t[3]);
  const int lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// ---- added tokens ------------------------------------------------------------------------------

struct AddedEntry {
  std::string pattern;
  int32_t id = -1;
  bool special = false, lstrip = false, rstrip = false, single_word = false;
};

// Leftmost-longest matching of a small set of literal patterns (HF uses Aho-Corasick with the
// same match kind); candidates are bucketed by first byte, longest first.
class AddedMatcher {
 public:
  void add(AddedEntry e) {
    if (e.pattern.empty()) return;
    entries_.push_back(std::move(e));
  }
  void finish() {
    for (auto& b : by_first_) b.clear();
    for (size_t i = 0; i < entries_.size(); ++i) {
      by_first_[static_cast<uint8_t>(entries_[i].pattern[0])].push_back(static_cast<int>(i));
    }
    for (auto& b : by_first_) {
      std::stable_sort(b.begin(), b.end(), [&](int x, int y) {
        return entries_[static_cast<size_t>(x)].pattern.size() >
               entries_[static_cast<size_t>(y)].pattern.size();
      });
    }
  }
  bool empty() const { return entries_.empty(); }
  const AddedEntry& entry(int i) const { return entries_[static_cast<size_t>(i)]; }

  // Index of the leftmost-longest match at or after `from`, its start in *start; -1 if none.
  int find(std::string_view s, size_t from, size_t* start) const {
    for (size_t pos = from; pos < s.size(); ++pos) {
      for (int i : by_first_[static_cast<uint8_t>(s[pos])]) {
        const std::string& p = entries_[static_cast<size_t>(i)].pattern;
        if (s.size() - pos >= p.size() && s.compare(pos, p.size(), p) == 0) {
          *start = pos;
          return i;
        }
      }
    }
    return -1;
  }

 private:
  std::vector<AddedEntry> entries_;
  std::array<std::vector<int>, 256> by_first_;
};

// A piece of text between added tokens, or an added token.
struct Segment {
  int32_t id = -1;  // >= 0: an added token
  size_t begin = 0, end = 0;
};

bool first_char_is_word(std::string_view s) {
  if (s.empty()) return false;
  size_t len = 0;
  return is_word_char(utf8_decode(s, 0, &len));
}

bool last_char_is_word(std::string_view s) {
  if (s.empty()) return false;
  const size_t p = prev_char_start(s, s.size());
  size_t len = 0;
  return is_word_char(utf8_decode(s, p, &len));
}

// HF AddedVocabulary::find_matches.
void split_added(std::string_view s, const AddedMatcher& m, bool parse_special,
                 std::vector<Segment>& out) {
  if (m.empty() || s.empty()) {
    out.push_back({-1, 0, s.size()});
    return;
  }
  size_t start_offset = 0;
  size_t scan = 0;
  while (true) {
    size_t start = 0;
    const int e = m.find(s, scan, &start);
    if (e < 0) break;
    const AddedEntry& t = m.entry(e);
    size_t stop = start + t.pattern.size();
    scan = stop;
    if (t.special && !parse_special) continue;
    if (t.single_word) {
      const bool start_space = start == 0 || !last_char_is_word(s.substr(0, start));
      const bool stop_space = stop == s.size() || !first_char_is_word(s.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        const size_t p = prev_char_start(s, new_start);
        size_t len = 0;
        if (!is_whitespace(utf8_decode(s, p, &len))) break;
        new_start = p;
      }
      start = std::max(new_start, start_offset);
    }
    if (t.rstrip) {
      while (stop < s.size()) {
        size_t len = 0;
        if (!is_whitespace(utf8_decode(s, stop, &len))) break;
        stop += len;
      }
    }
    if (start_offset < start) out.push_back({-1, start_offset, start});
    out.push_back({t.id, start, stop});
    start_offset = std::max(start_offset, stop);
  }
  if (start_offset < s.size()) out.push_back({-1, start_offset, s.size()});
}

// ---- pre-tokenization ------------------------------------------------------------------------

struct Piece {
  std::string text;
  bool at_start = false;  // begins at offset 0 of the original text (Metaspace kFirst)
};

// (range, is_match) pieces covering a text, as HF Pattern::find_matches returns them.
struct Span {
  size_t begin, end;
  bool match;
};

void spans_from_matches(size_t size, const std::vector<MatchRange>& matches,
                        std::vector<Span>& spans) {
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    if (b > prev) spans.push_back({prev, b, false});
    spans.push_back({b, e, true});
    prev = e;
  }
  if (prev < size) spans.push_back({prev, size, false});
}

// Each character for which pred holds is its own match (HF's char-predicate pattern).
template <class Pred>
void char_matches(std::string_view s, Pred pred, std::vector<MatchRange>& out) {
  for (size_t pos = 0; pos < s.size();) {
    size_t len = 0;
    const uint32_t cp = utf8_decode(s, pos, &len);
    if (pred(cp)) out.emplace_back(pos, pos + len);
    pos += len;
  }
}

void literal_matches(std::string_view s, std::string_view lit, std::vector<MatchRange>& out) {
  if (lit.empty()) return;
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(lit, pos);
    if (hit == std::string_view::npos) break;
    out.emplace_back(hit, hit + lit.size());
    pos = hit + lit.size();
  }
}

// Applies a split behavior (HF NormalizedString::split) and appends the non-empty pieces.
void emit_split(const Piece& piece, std::vector<Span>& spans, SplitBehavior behavior, bool invert,
                std::vector<Piece>& out) {
  if (invert) {
    for (auto& sp : spans) sp.match = !sp.match;
  }
  std::vector<Span> kept;
  kept.reserve(spans.size());
  switch (behavior) {
    case SplitBehavior::kIsolated:
      kept = spans;
      break;
    case SplitBehavior::kRemoved:
      for (const auto& sp : spans) {
        if (!sp.match) kept.push_back(sp);
      }
      break;
    case SplitBehavior::kContiguous: {
      bool prev_match = false;
      for (const auto& sp : spans) {
        if (sp.match == prev_match && !kept.empty()) {
          kept.back().end = sp.end;
        } else {
          kept.push_back(sp);
        }
        prev_match = sp.match;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool prev_match = false;
      for (const auto& sp : spans) {
        if (sp.match && !prev_match && !kept.empty()) {
          kept.back().end = sp.end;
        } else {
          kept.push_back(sp);
        }
        prev_match = sp.match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool prev_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->match && !prev_match && !kept.empty()) {
          kept.back().begin = it->begin;
        } else {
          kept.push_back(*it);
        }
        prev_match = it->match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
  }
  for (const auto& sp : kept) {
    if (sp.end <= sp.begin) continue;
    out.push_back(
        {piece.text.substr(sp.begin, sp.end - sp.begin), piece.at_start && sp.begin == 0});
  }
}

// Decodes one token through the per-token decoder steps (all but a Strip after Fuse, which
// StreamingDecoder applies to the start of the text). `first`: the first decoded token.
std::string decode_with_steps(const std::string& token, const std::vector<DecoderStep>& steps,
                              bool first) {
  const ByteLevelTable& table = byte_level_table();
  std::string t = token;
  bool fused = false;
  for (const auto& d : steps) {
    switch (d.kind) {
      case DecoderKind::kByteLevel: {
        std::string bytes;
        bool ok = true;
        for (size_t pos = 0; pos < t.size() && ok;) {
          size_t len = 0;
          const uint32_t cp = utf8_decode(t, pos, &len);
          if (cp < table.char_to_byte.size() && table.char_to_byte[cp] >= 0) {
            bytes.push_back(static_cast<char>(table.char_to_byte[cp]));
          } else {
            ok = false;
          }
          pos += len;
        }
        if (ok) t = std::move(bytes);
        fused = true;
        break;
      }
      case DecoderKind::kReplace:
        replace_all(t, d.pattern, d.content);
        break;
      case DecoderKind::kByteFallback: {
        const int b = parse_byte_token(t);
        if (b >= 0) t = std::string(1, static_cast<char>(b));
        break;
      }
      case DecoderKind::kFuse:
        fused = true;
        break;
      case DecoderKind::kStrip:
        if (!fused && !d.content.empty()) {
          for (int i = 0; i < d.strip_start && t.compare(0, d.content.size(), d.content) == 0;
               ++i) {
            t.erase(0, d.content.size());
          }
          for (int i = 0; i < d.strip_stop && t.size() >= d.content.size() &&
                          t.compare(t.size() - d.content.size(), d.content.size(), d.content) == 0;
               ++i) {
            t.erase(t.size() - d.content.size());
          }
        }
        break;
      case DecoderKind::kMetaspace:
        // HF drops every replacement char of the first token unless the scheme is kNever.
        replace_all(t, d.pattern, first && d.prepend_scheme != PrependScheme::kNever ? "" : " ");
        break;
    }
  }
  return t;
}

}  // namespace

// ---- Impl ------------------------------------------------------------------------------------

struct CompiledPreStep {
  PreTokenizerStep step;
  std::optional<BuiltinRegex> builtin;
  std::unique_ptr<RegexMatcher> regex;
};

struct MergeValue {
  uint32_t rank;
  int32_t id;
};

struct Tokenizer::Impl {
  // Vocabulary.
  std::vector<std::string> pieces;  // id -> token text (added tokens included)
  std::vector<uint8_t> special;     // id -> special added / control token
  StringIdMap model_vocab;          // the BPE model's vocabulary
  StringIdMap all_vocab;            // added tokens first, then the model's
  // BPE.
  std::unordered_map<uint64_t, MergeValue> merges;
  bool use_scores = false;
  std::vector<float> scores;
  bool byte_fallback = false;
  std::array<int32_t, 256> byte_fallback_ids{};
  bool ignore_merges = false;
  int32_t unk_id = -1;
  bool fuse_unk = false;
  // Pipeline.
  AddedMatcher raw_added, normalized_added;
  std::vector<NormalizerStep> normalizers;
  std::vector<CompiledPreStep> pre_steps;
  bool byte_level = false;  // pieces are mapped to byte-level chars before BPE
  std::vector<DecoderStep> decoders;
  bool join_with_space = false;
  bool metaspace_first = false;  // first token's decoding differs (Metaspace decoder)
  std::string stream_strip_content;
  int stream_strip_start = 0;
  std::vector<std::string> decoded;  // id -> decoded bytes (not the first token)
  // Post-processing and metadata.
  std::vector<int32_t> prefix_ids, suffix_ids;
  int32_t bos = -1, eos = -1;
  std::vector<int32_t> eot;
  std::string chat_template;
  // Word cache.
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache;

  Status encode_text(std::string_view text, bool at_start, bool parse_special,
                     std::vector<int32_t>& ids) const;
  Status pre_tokenize(Piece piece, std::vector<Piece>& out) const;
  void bpe(std::string_view word, std::vector<int32_t>& ids) const;
  void bpe_uncached(std::string_view word, std::vector<int32_t>& ids) const;
  bool find_merge(std::string_view word, uint32_t a_start, int32_t a_id, uint32_t b_start,
                  uint32_t b_end, int32_t b_id, double* key, int32_t* new_id) const;
  std::string normalize(std::string_view s) const;
  std::string decode_token(int32_t id, bool first) const;
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::string Tokenizer::Impl::normalize(std::string_view s) const {
  std::string out(s);
  for (const auto& n : normalizers) {
    switch (n.kind) {
      case NormalizerKind::kPrepend:
        if (!out.empty()) out.insert(0, n.content);
        break;
      case NormalizerKind::kReplace:
        replace_all(out, n.pattern, n.content);
        break;
      case NormalizerKind::kNfc:
        out = nfc_normalize(out);
        break;
    }
  }
  return out;
}

Status Tokenizer::Impl::pre_tokenize(Piece piece, std::vector<Piece>& out) const {
  std::vector<Piece> cur;
  cur.push_back(std::move(piece));
  std::vector<Piece> next;
  std::vector<MatchRange> matches;
  std::vector<Span> spans;
  for (const auto& cs : pre_steps) {
    const PreTokenizerStep& st = cs.step;
    next.clear();
    for (auto& p : cur) {
      matches.clear();
      spans.clear();
      SplitBehavior behavior = st.behavior;
      bool invert = st.invert;
      switch (st.kind) {
        case PreTokenizerKind::kGpt2Regex:
        case PreTokenizerKind::kLlama3Regex:
        case PreTokenizerKind::kQwen2Regex:
        case PreTokenizerKind::kRegex:
          if (cs.builtin) {
            builtin_regex_matches(*cs.builtin, p.text, matches);
          } else {
            STRATA_RETURN_IF_ERROR(cs.regex->matches(p.text, matches));
          }
          break;
        case PreTokenizerKind::kLiteral:
          literal_matches(p.text, st.pattern, matches);
          break;
        case PreTokenizerKind::kDigits:
          char_matches(
              p.text, [](uint32_t cp) { return is_number(cp); }, matches);
          behavior = st.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous;
          invert = false;
          break;
        case PreTokenizerKind::kByteLevel:
          if (st.add_prefix_space && (p.text.empty() || p.text[0] != ' ')) p.text = " " + p.text;
          if (!st.use_regex) {
            next.push_back(std::move(p));
            continue;
          }
          builtin_regex_matches(BuiltinRegex::kGpt2, p.text, matches);
          behavior = SplitBehavior::kIsolated;
          invert = false;
          break;
        case PreTokenizerKind::kMetaspace: {
          replace_all(p.text, " ", st.pattern);
          const bool starts = p.text.compare(0, st.pattern.size(), st.pattern) == 0;
          if (!starts && (st.prepend_scheme == PrependScheme::kAlways ||
                          (st.prepend_scheme == PrependScheme::kFirst && p.at_start))) {
            p.text.insert(0, st.pattern);
          }
          if (!st.split) {
            next.push_back(std::move(p));
            continue;
          }
          literal_matches(p.text, st.pattern, matches);
          behavior = SplitBehavior::kMergedWithNext;
          invert = false;
          break;
        }
      }
      spans_from_matches(p.text.size(), matches, spans);
      emit_split(p, spans, behavior, invert, next);
    }
    std::swap(cur, next);
  }
  for (auto& p : cur) {
    if (!p.text.empty()) out.push_back(std::move(p));
  }
  return ok_status();
}

bool Tokenizer::Impl::find_merge(std::string_view word, uint32_t a_start, int32_t a_id,
                                 uint32_t b_start, uint32_t b_end, int32_t b_id, double* key,
                                 int32_t* new_id) const {
  if (!use_scores) {
    auto it = merges.find(pair_key(a_id, b_id));
    if (it == merges.end()) return false;
    *key = it->second.rank;
    *new_id = it->second.id;
    return true;
  }
  if (b_start < a_start || b_end <= a_start) return false;
  auto it = model_vocab.find(word.substr(a_start, b_end - a_start));
  if (it == model_vocab.end()) return false;
  *key = -static_cast<double>(scores[static_cast<size_t>(it->second)]);
  *new_id = it->second;
  return true;
}

void Tokenizer::Impl::bpe_uncached(std::string_view word, std::vector<int32_t>& ids) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    uint32_t start, end;  // byte span in `word`
    bool alive;
  };
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  auto add = [&](int32_t id, size_t start, size_t end) {
    const auto n = static_cast<int32_t>(sym.size());
    sym.push_back({id, n - 1, -1, static_cast<uint32_t>(start), static_cast<uint32_t>(end), true});
    if (n > 0) sym[static_cast<size_t>(n - 1)].next = n;
  };
  // Initial symbols: one per character, byte fallback or unknown token otherwise.
  int32_t pending_unk_start = -1;
  size_t pending_unk_end = 0;
  auto flush_unk = [&] {
    if (pending_unk_start >= 0)
      add(unk_id, static_cast<size_t>(pending_unk_start), pending_unk_end);
    pending_unk_start = -1;
  };
  for (size_t pos = 0; pos < word.size();) {
    size_t len = 0;
    utf8_decode(word, pos, &len);
    auto it = model_vocab.find(word.substr(pos, len));
    if (it != model_vocab.end()) {
      flush_unk();
      add(it->second, pos, pos + len);
    } else {
      bool done = false;
      if (byte_fallback) {
        bool all = true;
        for (size_t i = 0; i < len; ++i) {
          all = all && byte_fallback_ids[static_cast<uint8_t>(word[pos + i])] >= 0;
        }
        if (all) {
          for (size_t i = 0; i < len; ++i) {
            add(byte_fallback_ids[static_cast<uint8_t>(word[pos + i])], pos + i, pos + i + 1);
          }
          // NOTE: as in HF, a pending unknown token stays open across fallback bytes (it is
          // emitted after them).
          done = true;
        }
      }
      if (!done && unk_id >= 0) {
        if (pending_unk_start >= 0 && fuse_unk) {
          pending_unk_end = pos + len;
        } else {
          flush_unk();
          pending_unk_start = static_cast<int32_t>(pos);
          pending_unk_end = pos + len;
        }
      }
    }
    pos += len;
  }
  flush_unk();

  struct Candidate {
    double key;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const {
      return key > o.key || (key == o.key && pos > o.pos);
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto try_push = [&](int32_t left) {
    if (left < 0) return;
    const Symbol& a = sym[static_cast<size_t>(left)];
    if (a.next < 0) return;
    const Symbol& b = sym[static_cast<size_t>(a.next)];
    double key = 0;
    int32_t new_id = -1;
    if (find_merge(word, a.start, a.id, b.start, b.end, b.id, &key, &new_id)) {
      queue.push({key, left, new_id});
    }
  };
  for (size_t i = 0; i + 1 < sym.size(); ++i) try_push(static_cast<int32_t>(i));
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& a = sym[static_cast<size_t>(top.pos)];
    if (!a.alive || a.next < 0) continue;
    Symbol& b = sym[static_cast<size_t>(a.next)];
    double key = 0;
    int32_t new_id = -1;
    if (!find_merge(word, a.start, a.id, b.start, b.end, b.id, &key, &new_id) ||
        new_id != top.new_id) {
      continue;  // stale entry
    }
    a.id = new_id;
    a.end = b.end;
    b.alive = false;
    a.next = b.next;
    if (a.next >= 0) sym[static_cast<size_t>(a.next)].prev = top.pos;
    try_push(a.prev);
    try_push(top.pos);
  }
  for (const auto& s : sym) {
    if (s.alive) ids.push_back(s.id);
  }
}

void Tokenizer::Impl::bpe(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  if (ignore_merges) {
    auto it = model_vocab.find(word);
    if (it != model_vocab.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex);
    auto it = cache.find(word);
    if (it != cache.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t before = ids.size();
  bpe_uncached(word, ids);
  if (cacheable) {
    std::vector<int32_t> value(ids.begin() + static_cast<std::ptrdiff_t>(before), ids.end());
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (cache.size() >= kCacheCapacity) cache.clear();
    cache.emplace(std::string(word), std::move(value));
  }
}

Status Tokenizer::Impl::encode_text(std::string_view text, bool at_start, bool parse_special,
                                    std::vector<int32_t>& ids) const {
  const std::string normalized = normalize(text);
  std::vector<Segment> segments;
  split_added(normalized, normalized_added, parse_special, segments);
  std::vector<Piece> pieces;
  std::string mapped;
  const ByteLevelTable& table = byte_level_table();
  for (const Segment& seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    if (seg.end == seg.begin) continue;  // HF drops empty splits before pre-tokenizing
    pieces.clear();
    Piece piece{normalized.substr(seg.begin, seg.end - seg.begin), at_start && seg.begin == 0};
    STRATA_RETURN_IF_ERROR(pre_tokenize(std::move(piece), pieces));
    for (const Piece& p : pieces) {
      if (!byte_level) {
        bpe(p.text, ids);
        continue;
      }
      mapped.clear();
      for (char c : p.text) mapped += table.byte_to_utf8[static_cast<uint8_t>(c)];
      bpe(mapped, ids);
    }
  }
  return ok_status();
}

std::string Tokenizer::Impl::decode_token(int32_t id, bool first) const {
  const std::string& token = pieces[static_cast<size_t>(id)];
  if (join_with_space) return first ? token : " " + token;
  if (!first || !metaspace_first) return decoded[static_cast<size_t>(id)];
  return decode_with_steps(token, decoders, /*first=*/true);
}

// ---- construction ------------------------------------------------------------------------------

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_spec(TokenizerSpec spec) {
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  if (spec.tokens.empty()) {
    return errorf(StatusCode::kInvalidArgument, "tokenizer: the vocabulary is empty");
  }
  const size_t n_model = spec.tokens.size();
  if (n_model > (1u << 30)) {
    return errorf(StatusCode::kInvalidArgument, "tokenizer: vocabulary of {} tokens is too large",
                  n_model);
  }
  if (!spec.scores.empty() && spec.scores.size() != n_model) {
    return errorf(StatusCode::kInvalidArgument, "tokenizer: {} scores for {} tokens",
                  spec.scores.size(), n_model);
  }
  if (!spec.token_types.empty() && spec.token_types.size() != n_model) {
    return errorf(StatusCode::kInvalidArgument, "tokenizer: {} token types for {} tokens",
                  spec.token_types.size(), n_model);
  }
  // Added tokens from token types (GGUF) when none are given.
  if (spec.added_tokens.empty() && !spec.token_types.empty()) {
    for (size_t i = 0; i < n_model; ++i) {
      const TokenType t = spec.token_types[i];
      if (t != TokenType::kControl && t != TokenType::kUserDefined) continue;
      if (spec.tokens[i].empty()) continue;
      AddedToken a;
      a.id = static_cast<int32_t>(i);
      a.content = spec.tokens[i];
      a.special = t == TokenType::kControl;
      spec.added_tokens.push_back(std::move(a));
    }
  }
  size_t n_total = n_model;
  const size_t id_limit = n_model + spec.added_tokens.size();  // model ids, then appended ones
  for (const auto& a : spec.added_tokens) {
    if (a.id < 0 || static_cast<size_t>(a.id) >= id_limit) {
      return errorf(StatusCode::kInvalidArgument,
                    "tokenizer: added token '{}' has id {}, beyond the vocabulary ({} model "
                    "tokens + {} added tokens)",
                    a.content, a.id, n_model, spec.added_tokens.size());
    }
    if (a.content.empty()) {
      return errorf(StatusCode::kInvalidArgument, "tokenizer: added token {} has no content", a.id);
    }
    n_total = std::max(n_total, static_cast<size_t>(a.id) + 1);
  }
  m.pieces = std::move(spec.tokens);
  m.pieces.resize(n_total);
  m.special.assign(n_total, 0);
  m.model_vocab.reserve(n_model);
  for (size_t i = 0; i < n_model; ++i) {
    m.model_vocab.emplace(m.pieces[i], static_cast<int32_t>(i));  // first occurrence wins
  }
  if (!spec.token_types.empty()) {
    for (size_t i = 0; i < n_model; ++i) {
      if (spec.token_types[i] == TokenType::kControl) m.special[i] = 1;
    }
  }
  for (const auto& a : spec.added_tokens) {
    const auto id = static_cast<size_t>(a.id);
    m.pieces[id] = a.content;
    m.special[id] = a.special ? 1 : m.special[id];
    m.all_vocab.emplace(a.content, a.id);
    if (!a.normalized)
      m.raw_added.add({a.content, a.id, a.special, a.lstrip, a.rstrip, a.single_word});
  }
  for (const auto& [text, id] : m.model_vocab) m.all_vocab.emplace(text, id);

  // Normalizers.
  for (const auto& n : spec.normalizers) {
    if (n.kind == NormalizerKind::kReplace && n.pattern.empty()) {
      return errorf(StatusCode::kInvalidArgument,
                    "tokenizer: Replace normalizer with empty pattern");
    }
  }
  m.normalizers = std::move(spec.normalizers);
  for (const auto& a : spec.added_tokens) {
    // HF matches a normalized added token by its normalized form, and id_to_token/decode
    // return that form too.
    if (!a.normalized) continue;
    std::string normalized = m.normalize(a.content);
    m.pieces[static_cast<size_t>(a.id)] = normalized;
    m.normalized_added.add(
        {std::move(normalized), a.id, a.special, a.lstrip, a.rstrip, a.single_word});
  }
  m.raw_added.finish();
  m.normalized_added.finish();

  // Pre-tokenizer.
  for (size_t i = 0; i < spec.pre_tokenizers.size(); ++i) {
    CompiledPreStep cs;
    cs.step = spec.pre_tokenizers[i];
    if (m.byte_level) {
      return errorf(StatusCode::kUnimplemented,
                    "tokenizer: pre-tokenizer step {} follows ByteLevel (unsupported)", i);
    }
    switch (cs.step.kind) {
      case PreTokenizerKind::kGpt2Regex:
        cs.builtin = BuiltinRegex::kGpt2;
        break;
      case PreTokenizerKind::kLlama3Regex:
        cs.builtin = BuiltinRegex::kLlama3;
        break;
      case PreTokenizerKind::kQwen2Regex:
        cs.builtin = BuiltinRegex::kQwen2;
        break;
      case PreTokenizerKind::kRegex:
        cs.builtin = builtin_regex_for_pattern(cs.step.pattern);
        if (!cs.builtin) {
          STRATA_ASSIGN_OR_RETURN(cs.regex, RegexMatcher::compile(cs.step.pattern));
        }
        break;
      case PreTokenizerKind::kLiteral:
      case PreTokenizerKind::kDigits:
        break;
      case PreTokenizerKind::kByteLevel:
        m.byte_level = true;
        break;
      case PreTokenizerKind::kMetaspace:
        if (cs.step.pattern.empty()) {
          return errorf(StatusCode::kInvalidArgument, "tokenizer: Metaspace with no replacement");
        }
        break;
    }
    m.pre_steps.push_back(std::move(cs));
  }

  // BPE model.
  m.byte_fallback = spec.byte_fallback;
  m.byte_fallback_ids.fill(-1);
  for (int b = 0; b < 256; ++b) {
    auto it = m.model_vocab.find(fmt::format("<0x{:02X}>", b));
    if (it != m.model_vocab.end()) m.byte_fallback_ids[static_cast<size_t>(b)] = it->second;
  }
  m.ignore_merges = spec.ignore_merges;
  m.fuse_unk = spec.fuse_unk;
  if (!spec.unk_token.empty()) {
    auto it = m.model_vocab.find(spec.unk_token);
    if (it == m.model_vocab.end()) {
      return errorf(StatusCode::kInvalidArgument,
                    "tokenizer: unknown token '{}' is not in the vocabulary", spec.unk_token);
    }
    m.unk_id = it->second;
  }
  if (spec.merges.empty() && !spec.scores.empty()) {
    m.use_scores = true;
    m.scores = std::move(spec.scores);
  } else {
    m.merges.reserve(spec.merges.size());
    for (size_t r = 0; r < spec.merges.size(); ++r) {
      const auto& [a, b] = spec.merges[r];
      auto ia = m.model_vocab.find(a);
      auto ib = m.model_vocab.find(b);
      const std::string joined = a + b;
      auto ij = m.model_vocab.find(joined);
      const std::string* missing = ia == m.model_vocab.end()   ? &a
                                   : ib == m.model_vocab.end() ? &b
                                   : ij == m.model_vocab.end() ? &joined
                                                               : nullptr;
      if (missing != nullptr) {
        return errorf(StatusCode::kInvalidArgument,
                      "tokenizer: merges[{}] ('{}' '{}'): token '{}' is not in the vocabulary", r,
                      a, b, *missing);
      }
      // Later duplicates win, as in HF's merge map.
      m.merges[pair_key(ia->second, ib->second)] = {static_cast<uint32_t>(r), ij->second};
    }
  }

  // Decoder.
  bool fused = false;
  for (size_t i = 0; i < spec.decoders.size(); ++i) {
    const DecoderStep& d = spec.decoders[i];
    switch (d.kind) {
      case DecoderKind::kByteLevel:
      case DecoderKind::kFuse:
        fused = true;
        break;
      case DecoderKind::kStrip:
        if (fused) {
          if (d.strip_stop > 0) {
            return errorf(StatusCode::kUnimplemented,
                          "tokenizer: Strip decoder with stop {} after Fuse (unsupported)",
                          d.strip_stop);
          }
          m.stream_strip_content = d.content;
          m.stream_strip_start = std::max(0, d.strip_start);
        }
        break;
      case DecoderKind::kReplace:
        if (d.pattern.empty()) {
          return errorf(StatusCode::kInvalidArgument,
                        "tokenizer: Replace decoder with empty pattern");
        }
        break;
      case DecoderKind::kMetaspace:
        if (d.pattern.empty()) {
          return errorf(StatusCode::kInvalidArgument,
                        "tokenizer: Metaspace decoder with no replacement");
        }
        if (d.prepend_scheme != PrependScheme::kNever) m.metaspace_first = true;
        break;
      case DecoderKind::kByteFallback:
        break;
    }
  }
  if (m.stream_strip_content.empty()) m.stream_strip_start = 0;
  m.decoders = std::move(spec.decoders);
  m.join_with_space = m.decoders.empty();
  if (!m.join_with_space) {
    m.decoded.resize(n_total);
    for (size_t i = 0; i < n_total; ++i)
      m.decoded[i] = decode_with_steps(m.pieces[i], m.decoders, false);
  }

  // Post-processor and metadata.
  auto check_id = [&](int32_t id, const char* what) -> Status {
    if (id < -1 || id >= static_cast<int32_t>(n_total)) {
      return errorf(StatusCode::kInvalidArgument,
                    "tokenizer: {} id {} is outside the vocabulary ({})", what, id, n_total);
    }
    return ok_status();
  };
  auto check_ids = [&](const std::vector<int32_t>& ids, const char* what) -> Status {
    for (int32_t id : ids) {
      if (id < 0) return errorf(StatusCode::kInvalidArgument, "tokenizer: negative {} id", what);
      STRATA_RETURN_IF_ERROR(check_id(id, what));
    }
    return ok_status();
  };
  STRATA_RETURN_IF_ERROR(check_ids(spec.post_prefix_ids, "post-processor"));
  STRATA_RETURN_IF_ERROR(check_ids(spec.post_suffix_ids, "post-processor"));
  STRATA_RETURN_IF_ERROR(check_id(spec.bos_id, "bos"));
  STRATA_RETURN_IF_ERROR(check_id(spec.eos_id, "eos"));
  STRATA_RETURN_IF_ERROR(check_ids(spec.eot_ids, "end-of-turn"));
  m.prefix_ids = std::move(spec.post_prefix_ids);
  m.suffix_ids = std::move(spec.post_suffix_ids);
  m.bos = spec.bos_id;
  m.eos = spec.eos_id;
  m.eot = std::move(spec.eot_ids);
  if (m.eos >= 0) m.eot.push_back(m.eos);
  for (std::string_view name : kEndOfTurnNames) {
    auto it = m.all_vocab.find(name);
    if (it != m.all_vocab.end() && m.special[static_cast<size_t>(it->second)]) {
      m.eot.push_back(it->second);
    }
  }
  std::sort(m.eot.begin(), m.eot.end());
  m.eot.erase(std::unique(m.eot.begin(), m.eot.end()), m.eot.end());
  m.chat_template = std::move(spec.chat_template);
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_hf_json(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(TokenizerSpec spec, read_hf_tokenizer_spec(path));
  auto tok = from_spec(std::move(spec));
  if (!tok.ok()) return tok.status().with_context(path);
  return tok;
}

// ---- public API ------------------------------------------------------------------------------

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text, bool add_special_tokens,
                                               bool parse_special) const {
  const Impl& m = *impl_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids.insert(ids.end(), m.prefix_ids.begin(), m.prefix_ids.end());
  std::vector<Segment> segments;
  split_added(text, m.raw_added, parse_special, segments);
  for (const Segment& seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    STRATA_RETURN_IF_ERROR(m.encode_text(text.substr(seg.begin, seg.end - seg.begin),
                                         seg.begin == 0, parse_special, ids));
  }
  if (add_special_tokens) ids.insert(ids.end(), m.suffix_ids.begin(), m.suffix_ids.end());
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  StreamingDecoder stream(*this, skip_special_tokens);
  std::string out;
  for (int32_t id : ids) out += stream.push(id);
  out += stream.flush();
  return out;
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->all_vocab.find(token);
  return it == impl_->all_vocab.end() ? -1 : it->second;
}

const std::string& Tokenizer::id_to_token(int32_t id) const {
  static const std::string kEmpty;
  if (id < 0 || id >= vocab_size()) return kEmpty;
  return impl_->pieces[static_cast<size_t>(id)];
}

int32_t Tokenizer::vocab_size() const {
  return static_cast<int32_t>(impl_->pieces.size());
}
int32_t Tokenizer::bos_id() const {
  return impl_->bos;
}
int32_t Tokenizer::eos_id() const {
  return impl_->eos;
}
const std::vector<int32_t>& Tokenizer::eot_ids() const {
  return impl_->eot;
}
bool Tokenizer::is_eot(int32_t id) const {
  return std::binary_search(impl_->eot.begin(), impl_->eot.end(), id);
}
bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special[static_cast<size_t>(id)];
}
bool Tokenizer::add_bos() const {
  return impl_->bos >= 0 && !impl_->prefix_ids.empty() && impl_->prefix_ids[0] == impl_->bos;
}
const std::string& Tokenizer::chat_template() const {
  return impl_->chat_template;
}

// ---- StreamingDecoder ------------------------------------------------------------------------

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_tokens_(skip_special_tokens) {
  reset();
}

void StreamingDecoder::reset() {
  n_tokens_ = 0;
  emitted_ = false;
  strip_left_ = tokenizer_->impl_->stream_strip_start;
  pending_.clear();
}

std::string StreamingDecoder::push(int32_t id) {
  const Tokenizer::Impl& m = *tokenizer_->impl_;
  if (id < 0 || id >= tokenizer_->vocab_size()) return {};
  if (skip_special_tokens_ && m.special[static_cast<size_t>(id)]) return {};
  pending_ += m.decode_token(id, n_tokens_ == 0);
  ++n_tokens_;
  if (strip_left_ > 0 && !emitted_) {
    const std::string& c = m.stream_strip_content;
    while (strip_left_ > 0 && pending_.size() >= c.size() &&
           pending_.compare(0, c.size(), c) == 0) {
      pending_.erase(0, c.size());
      --strip_left_;
    }
    if (pending_.empty()) return {};
    if (strip_left_ > 0 && pending_.size() < c.size() &&
        c.compare(0, pending_.size(), pending_) == 0) {
      return {};  // could still become a strip character
    }
    strip_left_ = 0;
  }
  std::string out;
  const size_t used = utf8_sanitize(pending_, /*hold_incomplete=*/true, out);
  pending_.erase(0, used);
  if (!out.empty()) emitted_ = true;
  return out;
}

std::string StreamingDecoder::flush() {
  std::string out;
  utf8_sanitize(pending_, /*hold_incomplete=*/false, out);
  reset();
  return out;
}

// ---- GGUF pre-tokenizer names ------------------------------------------------------------------

Result<std::vector<PreTokenizerStep>> gguf_pre_tokenizer(std::string_view pre) {
  auto byte_level = [](bool use_regex) {
    PreTokenizerStep s;
    s.kind = PreTokenizerKind::kByteLevel;
    s.use_regex = use_regex;
    return s;
  };
  auto split = [](PreTokenizerKind kind) {
    PreTokenizerStep s;
    s.kind = kind;
    return s;
  };
  if (pre.empty() || pre == "default" || pre == "gpt2" || pre == "gpt-2" || pre == "olmo" ||
      pre == "jais") {
    return std::vector<PreTokenizerStep>{byte_level(true)};
  }
  if (pre == "llama3" || pre == "llama-bpe" || pre == "llama-v3" || pre == "smaug-bpe" ||
      pre == "dbrx" || pre == "falcon3" || pre == "pixtral") {
    return std::vector<PreTokenizerStep>{split(PreTokenizerKind::kLlama3Regex), byte_level(false)};
  }
  if (pre == "qwen2" || pre == "deepseek-r1-qwen" || pre == "qwen35" || pre == "megrez") {
    return std::vector<PreTokenizerStep>{split(PreTokenizerKind::kQwen2Regex), byte_level(false)};
  }
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "codeshell" ||
      pre == "command-r") {
    PreTokenizerStep digits;
    digits.kind = PreTokenizerKind::kDigits;
    digits.individual_digits = true;
    return std::vector<PreTokenizerStep>{digits, byte_level(true)};
  }
  return errorf(StatusCode::kUnimplemented, "tokenizer.ggml.pre '{}' is not supported", pre);
}

}  // namespace strata
