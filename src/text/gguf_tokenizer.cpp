#include "text/gguf_tokenizer.h"

#include "core/status.h"

namespace strata {

namespace {

Result<int32_t> optional_id(const GgufFile& f, const char* key, int64_t vocab) {
  if (!f.has(key)) return -1;
  STRATA_ASSIGN_OR_RETURN(int64_t id, f.get_int(key));
  if (id < 0 || id >= vocab) {
    return errorf(StatusCode::kInvalidArgument, "{}: {} = {} is outside the vocabulary of {}",
                  f.name(), key, id, vocab);
  }
  return static_cast<int32_t>(id);
}

}  // namespace

Result<TokenizerSpec> tokenizer_spec_from_gguf(const GgufFile& f) {
  TokenizerSpec spec;
  STRATA_ASSIGN_OR_RETURN(std::string model, f.get_string("tokenizer.ggml.model"));
  STRATA_ASSIGN_OR_RETURN(spec.tokens, f.get_string_array("tokenizer.ggml.tokens"));
  const int64_t vocab = static_cast<int64_t>(spec.tokens.size());
  if (vocab == 0) {
    return errorf(StatusCode::kInvalidArgument, "{}: tokenizer.ggml.tokens is empty", f.name());
  }
  if (f.has("tokenizer.ggml.token_type")) {
    STRATA_ASSIGN_OR_RETURN(std::vector<int64_t> types,
                            f.get_int_array("tokenizer.ggml.token_type"));
    if (static_cast<int64_t>(types.size()) != vocab) {
      return errorf(StatusCode::kInvalidArgument,
                    "{}: tokenizer.ggml.token_type has {} entries for {} tokens", f.name(),
                    types.size(), vocab);
    }
    spec.token_types.reserve(types.size());
    for (int64_t t : types) {
      spec.token_types.push_back(t >= 0 && t <= 6 ? static_cast<TokenType>(t)
                                                  : TokenType::kUndefined);
    }
  }
  if (model == "gpt2") {
    if (f.has("tokenizer.ggml.merges")) {
      STRATA_ASSIGN_OR_RETURN(std::vector<std::string> merges,
                              f.get_string_array("tokenizer.ggml.merges"));
      spec.merges.reserve(merges.size());
      for (size_t i = 0; i < merges.size(); ++i) {
        const std::string& m = merges[i];
        const size_t sp = m.find(' ', 1);
        if (sp == std::string::npos) {
          return errorf(StatusCode::kInvalidArgument,
                        "{}: tokenizer.ggml.merges[{}] '{}' has no space", f.name(), i, m);
        }
        spec.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
      }
    }
    std::string pre = "default";
    if (f.has("tokenizer.ggml.pre")) {
      STRATA_ASSIGN_OR_RETURN(pre, f.get_string("tokenizer.ggml.pre"));
    }
    auto steps = gguf_pre_tokenizer(pre);
    if (!steps.ok()) return steps.status().with_context(f.name());
    spec.pre_tokenizers = std::move(steps).value();
    DecoderStep d;
    d.kind = DecoderKind::kByteLevel;
    spec.decoders.push_back(d);
  } else if (model == "llama") {
    STRATA_ASSIGN_OR_RETURN(spec.scores, f.get_f32_array("tokenizer.ggml.scores"));
    if (static_cast<int64_t>(spec.scores.size()) != vocab) {
      return errorf(StatusCode::kInvalidArgument,
                    "{}: tokenizer.ggml.scores has {} entries for {} tokens", f.name(),
                    spec.scores.size(), vocab);
    }
    spec.byte_fallback = true;
    bool add_space_prefix = true;
    if (f.has("tokenizer.ggml.add_space_prefix")) {
      STRATA_ASSIGN_OR_RETURN(add_space_prefix, f.get_bool("tokenizer.ggml.add_space_prefix"));
    }
    const std::string kSpace = "\xe2\x96\x81";  // U+2581
    if (add_space_prefix) spec.normalizers.push_back({NormalizerKind::kPrepend, "", kSpace});
    spec.normalizers.push_back({NormalizerKind::kReplace, " ", kSpace});
    spec.decoders.push_back({DecoderKind::kReplace, kSpace, " "});
    spec.decoders.push_back({DecoderKind::kByteFallback, "", ""});
    spec.decoders.push_back({DecoderKind::kFuse, "", ""});
    if (add_space_prefix) {
      DecoderStep strip;
      strip.kind = DecoderKind::kStrip;
      strip.content = " ";
      strip.strip_start = 1;
      spec.decoders.push_back(strip);
    }
    STRATA_ASSIGN_OR_RETURN(int32_t unk, optional_id(f, "tokenizer.ggml.unknown_token_id", vocab));
    if (unk >= 0) spec.unk_token = spec.tokens[static_cast<size_t>(unk)];
  } else {
    return errorf(StatusCode::kUnimplemented, "{}: tokenizer.ggml.model '{}' is not supported",
                  f.name(), model);
  }
  STRATA_ASSIGN_OR_RETURN(spec.bos_id, optional_id(f, "tokenizer.ggml.bos_token_id", vocab));
  STRATA_ASSIGN_OR_RETURN(spec.eos_id, optional_id(f, "tokenizer.ggml.eos_token_id", vocab));
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    STRATA_ASSIGN_OR_RETURN(int32_t id, optional_id(f, key, vocab));
    if (id >= 0) spec.eot_ids.push_back(id);
  }
  bool add_bos = model == "llama";  // SentencePiece models add BOS unless told otherwise
  if (f.has("tokenizer.ggml.add_bos_token")) {
    STRATA_ASSIGN_OR_RETURN(add_bos, f.get_bool("tokenizer.ggml.add_bos_token"));
  }
  if (add_bos && spec.bos_id >= 0) spec.post_prefix_ids.push_back(spec.bos_id);
  if (f.has("tokenizer.chat_template")) {
    STRATA_ASSIGN_OR_RETURN(spec.chat_template, f.get_string("tokenizer.chat_template"));
  }
  return spec;
}

}  // namespace strata
