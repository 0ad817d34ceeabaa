// libFuzzer target: encode arbitrary bytes with the fixture tokenizers and check that
//   - byte-level tokenizers reproduce the input exactly (decode of valid UTF-8 input, and the
//     sanitized input otherwise),
//   - every tokenizer's ids are inside its vocabulary,
//   - streaming decode emits only valid UTF-8 and concatenates to decode().
// The first input byte picks the tokenizer and the encode flags; the rest is the text.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer.h"
#include "text/unicode.h"

namespace {

constexpr const char* kNames[] = {"gpt2", "llama3", "qwen2", "spm", "spm_metaspace"};
constexpr int kCount = sizeof(kNames) / sizeof(kNames[0]);

std::vector<std::unique_ptr<strata::Tokenizer>> load_all() {
  std::vector<std::unique_ptr<strata::Tokenizer>> out;
  for (const char* name : kNames) {
    auto tok = strata::Tokenizer::from_hf_json(std::string(STRATA_FIXTURE_DIR) + "/tokenizers/" +
                                               name + "/tokenizer.json");
    if (!tok.ok()) {
      std::fprintf(stderr, "fuzz_tokenizer: %s\n", tok.status().to_string().c_str());
      std::abort();
    }
    out.push_back(std::move(tok).value());
  }
  return out;
}

void check(bool cond, const char* what) {
  if (!cond) {
    std::fprintf(stderr, "fuzz_tokenizer: check failed: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto tokenizers = load_all();
  if (size == 0) return 0;
  const uint8_t selector = data[0];
  const int which = selector % kCount;
  const bool add_special = selector & 0x10;
  const bool parse_special = !(selector & 0x20);
  const bool skip_special = selector & 0x40;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const strata::Tokenizer& tok = *tokenizers[static_cast<size_t>(which)];

  auto ids = tok.encode(text, add_special, parse_special);
  check(ids.ok(), "encode failed");
  for (int32_t id : *ids) check(id >= 0 && id < tok.vocab_size(), "id outside the vocabulary");

  const std::string decoded = tok.decode(*ids, skip_special);
  check(strata::utf8_is_valid(decoded), "decode returned invalid UTF-8");

  strata::StreamingDecoder stream(tok, skip_special);
  std::string streamed;
  for (int32_t id : *ids) {
    const std::string chunk = stream.push(id);
    check(strata::utf8_is_valid(chunk), "streamed chunk is invalid UTF-8");
    streamed += chunk;
  }
  streamed += stream.flush();
  check(streamed == decoded, "streamed text differs from decode()");

  // Byte-level tokenizers without BOS/specials in play round-trip exactly (after the same
  // U+FFFD sanitizing decode applies).
  const bool byte_level = which <= 1;  // gpt2, llama3 (qwen2 normalizes to NFC)
  if (byte_level && !add_special && !parse_special && !skip_special) {
    std::string want;
    strata::utf8_sanitize(text, /*hold_incomplete=*/false, want);
    const std::string plain = tok.decode(*ids, false);
    check(plain == want, "byte-level round trip differs");
  }
  return 0;
}
