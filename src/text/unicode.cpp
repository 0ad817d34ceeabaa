// UTF-8 decoding, category lookup and NFC normalization over the generated tables.
#include "text/unicode.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace strata {

namespace {

// Valid range of the byte after a lead byte (Unicode Table 3-7); later bytes are 80..BF.
struct LeadInfo {
  int length;  // 0: the byte cannot start a character
  uint8_t lo, hi;
};

LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// How many bytes of a well-formed sequence start at s[pos]: returns the full length when the
// character is complete, or -k when only k bytes (k >= 1) form a valid prefix (ill-formed or
// truncated at the end of s; *truncated tells which).
int scan_sequence(std::string_view s, size_t pos, bool* truncated) {
  *truncated = false;
  const auto b0 = static_cast<uint8_t>(s[pos]);
  const LeadInfo info = lead_info(b0);
  if (info.length == 1) return 1;
  if (info.length == 0) return -1;
  int k = 1;
  while (k < info.length) {
    if (pos + static_cast<size_t>(k) >= s.size()) {
      *truncated = true;
      return -k;
    }
    const auto b = static_cast<uint8_t>(s[pos + static_cast<size_t>(k)]);
    const uint8_t lo = k == 1 ? info.lo : 0x80;
    const uint8_t hi = k == 1 ? info.hi : 0xBF;
    if (b < lo || b > hi) return -k;
    ++k;
  }
  return k;
}

}  // namespace

uint32_t utf8_decode(std::string_view s, size_t pos, size_t* len) {
  bool truncated = false;
  const int n = scan_sequence(s, pos, &truncated);
  if (n <= 0) {
    *len = 1;
    return kInvalidCodePoint;
  }
  *len = static_cast<size_t>(n);
  const auto* p = reinterpret_cast<const uint8_t*>(s.data() + pos);
  switch (n) {
    case 1:
      return p[0];
    case 2:
      return (p[0] & 0x1Fu) << 6 | (p[1] & 0x3Fu);
    case 3:
      return (p[0] & 0x0Fu) << 12 | (p[1] & 0x3Fu) << 6 | (p[2] & 0x3Fu);
    default:
      return (p[0] & 0x07u) << 18 | (p[1] & 0x3Fu) << 12 | (p[2] & 0x3Fu) << 6 | (p[3] & 0x3Fu);
  }
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool utf8_is_valid(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    bool truncated = false;
    const int n = scan_sequence(s, pos, &truncated);
    if (n <= 0) return false;
    pos += static_cast<size_t>(n);
  }
  return true;
}

size_t utf8_sanitize(std::string_view in, bool hold_incomplete, std::string& out) {
  size_t pos = 0;
  while (pos < in.size()) {
    // Copy the ASCII run in one go.
    size_t run = pos;
    while (run < in.size() && static_cast<uint8_t>(in[run]) < 0x80) ++run;
    if (run > pos) {
      out.append(in.substr(pos, run - pos));
      pos = run;
      continue;
    }
    bool truncated = false;
    const int n = scan_sequence(in, pos, &truncated);
    if (n > 0) {
      out.append(in.substr(pos, static_cast<size_t>(n)));
      pos += static_cast<size_t>(n);
    } else if (truncated && hold_incomplete) {
      return pos;
    } else {
      out.append("\xEF\xBF\xBD");
      pos += static_cast<size_t>(-n);
    }
  }
  return pos;
}

uint8_t unicode_flags(uint32_t cp) {
  using unicode_data::kCategoryRangeCount;
  using unicode_data::kCategoryRanges;
  if (cp == kInvalidCodePoint) return 0;
  // Binary search for the last range whose first <= cp.
  int lo = 0;
  int hi = kCategoryRangeCount - 1;
  int found = -1;
  while (lo <= hi) {
    const int mid = (lo + hi) / 2;
    if (kCategoryRanges[mid].first <= cp) {
      found = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  if (found < 0 || cp > kCategoryRanges[found].last) return 0;
  return kCategoryRanges[found].flags;
}

// ---- NFC ---------------------------------------------------------------------------------------

namespace {

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr uint32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;
// Marks an invalid input byte inside the code point buffer; it is a starter that never composes.
constexpr uint32_t kRawByteTag = 0x80000000u;

struct NfcData {
  std::unordered_map<uint32_t, std::pair<uint32_t, uint32_t>> decomposition;
  std::unordered_map<uint64_t, uint32_t> composition;
  // Code points whose presence means a string may not be in NFC already.
  std::unordered_set<uint32_t> unstable;
};

const NfcData& nfc_data() {
  static const NfcData data = [] {
    NfcData d;
    using unicode_data::kDecompositionCount;
    using unicode_data::kDecompositions;
    for (int i = 0; i < kDecompositionCount; ++i) {
      const auto& e = kDecompositions[i];
      d.decomposition[e.cp] = {e.first, e.second};
      if (e.composes) {
        d.composition[static_cast<uint64_t>(e.first) << 32 | e.second] = e.cp;
        d.unstable.insert(e.second);
      } else {
        d.unstable.insert(e.cp);
      }
    }
    return d;
  }();
  return data;
}

uint8_t ccc_of(uint32_t cp) {
  using unicode_data::kCccRangeCount;
  using unicode_data::kCccRanges;
  if (cp < 0x300 || (cp & kRawByteTag)) return 0;
  int lo = 0;
  int hi = kCccRangeCount - 1;
  while (lo <= hi) {
    const int mid = (lo + hi) / 2;
    if (cp < kCccRanges[mid].first) {
      hi = mid - 1;
    } else if (cp > kCccRanges[mid].last) {
      lo = mid + 1;
    } else {
      return kCccRanges[mid].ccc;
    }
  }
  return 0;
}

void decompose(const NfcData& d, uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  auto it = d.decomposition.find(cp);
  if (it == d.decomposition.end()) {
    out.push_back(cp);
    return;
  }
  decompose(d, it->second.first, out);
  if (it->second.second != 0) decompose(d, it->second.second, out);
}

// Composite of (a, b) or 0.
uint32_t compose(const NfcData& d, uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  if ((a | b) & kRawByteTag) return 0;
  auto it = d.composition.find(static_cast<uint64_t>(a) << 32 | b);
  return it == d.composition.end() ? 0 : it->second;
}

bool may_change_under_nfc(const NfcData& d, uint32_t cp) {
  if (cp < 0x300) return false;
  if (ccc_of(cp) != 0) return true;
  if (cp >= kVBase && cp < kVBase + kVCount) return true;
  if (cp > kTBase && cp < kTBase + kTCount) return true;
  return d.unstable.count(cp) != 0;
}

}  // namespace

std::string nfc_normalize(std::string_view s) {
  const NfcData& d = nfc_data();
  bool needs_work = false;
  for (size_t pos = 0; pos < s.size();) {
    if (static_cast<uint8_t>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    size_t len = 0;
    const uint32_t cp = utf8_decode(s, pos, &len);
    pos += len;
    if (cp != kInvalidCodePoint && may_change_under_nfc(d, cp)) {
      needs_work = true;
      break;
    }
  }
  if (!needs_work) return std::string(s);

  std::vector<uint32_t> buf;
  buf.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    size_t len = 0;
    const uint32_t cp = utf8_decode(s, pos, &len);
    if (cp == kInvalidCodePoint) {
      buf.push_back(kRawByteTag | static_cast<uint8_t>(s[pos]));
    } else {
      decompose(d, cp, buf);
    }
    pos += len;
  }
  // Canonical ordering: stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < buf.size();) {
    if (ccc_of(buf[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < buf.size() && ccc_of(buf[j]) != 0) ++j;
    std::stable_sort(buf.begin() + static_cast<std::ptrdiff_t>(i),
                     buf.begin() + static_cast<std::ptrdiff_t>(j),
                     [](uint32_t a, uint32_t b) { return ccc_of(a) < ccc_of(b); });
    i = j;
  }
  // Canonical composition.
  if (!buf.empty()) {
    size_t starter = 0;
    int last_class = ccc_of(buf[0]) == 0 ? 0 : 256;
    size_t out = 1;
    for (size_t i = 1; i < buf.size(); ++i) {
      const uint32_t ch = buf[i];
      const int cls = ccc_of(ch);
      const uint32_t composite = last_class == 256 ? 0 : compose(d, buf[starter], ch);
      if (composite != 0 && (last_class < cls || last_class == 0)) {
        buf[starter] = composite;
        continue;
      }
      if (cls == 0) starter = out;
      last_class = cls;
      buf[out++] = ch;
    }
    buf.resize(out);
  }
  std::string result;
  result.reserve(s.size());
  for (uint32_t cp : buf) {
    if (cp & kRawByteTag) {
      result.push_back(static_cast<char>(cp & 0xFF));
    } else {
      utf8_append(result, cp);
    }
  }
  return result;
}

}  // namespace strata
