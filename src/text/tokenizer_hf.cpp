// tokenizer.json (Hugging Face `tokenizers` serialization) -> TokenizerSpec, plus the
// bos/eos/add_bos_token/chat_template facts of tokenizer_config.json beside it.
//
// Supported: model BPE; normalizers Sequence, Prepend, Replace (string pattern), NFC;
// pre-tokenizers Sequence, Split (string or regex), ByteLevel, Metaspace, Digits; post-processors
// TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence; decoders
// Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace. Anything else is a
// kUnimplemented error naming the component.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <limits>

#include "core/mapped_file.h"
#include "core/status.h"
#include "text/pre_tokenizer.h"
#include "text/tokenizer.h"

namespace strata {

namespace {

using json = nlohmann::json;

// Error helpers: every message names the file and the JSON field.
class Parser {
 public:
  explicit Parser(std::string name) : name_(std::move(name)) {}

  Status error(StatusCode code, const std::string& field, const std::string& msg) const {
    return Status(code, name_ + ": " + field + ": " + msg);
  }
  Status invalid(const std::string& field, const std::string& msg) const {
    return error(StatusCode::kInvalidArgument, field, msg);
  }

  Status get_string(const json& obj, const char* key, const std::string& field,
                    std::string* out) const {
    auto it = obj.find(key);
    if (it == obj.end() || !it->is_string()) return invalid(field + "." + key, "expected a string");
    *out = it->get<std::string>();
    return ok_status();
  }
  // Optional bool (absent or null keeps *out).
  Status get_bool(const json& obj, const char* key, const std::string& field, bool* out) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return ok_status();
    if (!it->is_boolean()) return invalid(field + "." + key, "expected true or false");
    *out = it->get<bool>();
    return ok_status();
  }
  Status get_int(const json& obj, const char* key, const std::string& field, int64_t* out) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return ok_status();
    if (!it->is_number_integer()) return invalid(field + "." + key, "expected an integer");
    *out = it->get<int64_t>();
    return ok_status();
  }
  // {"String": s} or {"Regex": r}.
  Status get_pattern(const json& obj, const std::string& field, std::string* out,
                     bool* is_regex) const {
    auto it = obj.find("pattern");
    if (it == obj.end() || !it->is_object())
      return invalid(field + ".pattern", "expected an object");
    if (auto s = it->find("String"); s != it->end() && s->is_string()) {
      *out = s->get<std::string>();
      *is_regex = false;
      return ok_status();
    }
    if (auto r = it->find("Regex"); r != it->end() && r->is_string()) {
      *out = r->get<std::string>();
      *is_regex = true;
      return ok_status();
    }
    return invalid(field + ".pattern", "expected {\"String\": ...} or {\"Regex\": ...}");
  }
  Status type_of(const json& obj, const std::string& field, std::string* type) const {
    if (!obj.is_object()) return invalid(field, "expected an object");
    return get_string(obj, "type", field, type);
  }
  Status unsupported(const std::string& field, const std::string& type) const {
    return error(StatusCode::kUnimplemented, field, "type '" + type + "' is not supported");
  }

  Status parse_normalizer(const json& n, const std::string& field, TokenizerSpec& spec) const;
  Status parse_pre_tokenizer(const json& p, const std::string& field, TokenizerSpec& spec) const;
  Status parse_decoder(const json& d, const std::string& field, TokenizerSpec& spec) const;
  Status parse_post_processor(const json& p, const std::string& field, TokenizerSpec& spec) const;
  Status parse_model(const json& m, TokenizerSpec& spec) const;
  Status parse_added_tokens(const json& a, TokenizerSpec& spec) const;

 private:
  std::string name_;
};

Status parse_prepend_scheme(const Parser& p, const json& obj, const std::string& field,
                            PrependScheme* out) {
  auto it = obj.find("prepend_scheme");
  if (it != obj.end() && !it->is_null()) {
    if (!it->is_string()) return p.invalid(field + ".prepend_scheme", "expected a string");
    const std::string s = it->get<std::string>();
    if (s == "always") {
      *out = PrependScheme::kAlways;
    } else if (s == "first") {
      *out = PrependScheme::kFirst;
    } else if (s == "never") {
      *out = PrependScheme::kNever;
    } else {
      return p.invalid(field + ".prepend_scheme", "unknown value '" + s + "'");
    }
    return ok_status();
  }
  // Older files: add_prefix_space.
  bool add_prefix_space = true;
  STRATA_RETURN_IF_ERROR(p.get_bool(obj, "add_prefix_space", field, &add_prefix_space));
  *out = add_prefix_space ? PrependScheme::kAlways : PrependScheme::kNever;
  return ok_status();
}

Status Parser::parse_normalizer(const json& n, const std::string& field,
                                TokenizerSpec& spec) const {
  if (n.is_null()) return ok_status();
  std::string type;
  STRATA_RETURN_IF_ERROR(type_of(n, field, &type));
  if (type == "Sequence") {
    auto it = n.find("normalizers");
    if (it == n.end() || !it->is_array())
      return invalid(field + ".normalizers", "expected an array");
    for (size_t i = 0; i < it->size(); ++i) {
      STRATA_RETURN_IF_ERROR(
          parse_normalizer((*it)[i], field + ".normalizers[" + std::to_string(i) + "]", spec));
    }
    return ok_status();
  }
  NormalizerStep step;
  if (type == "Prepend") {
    step.kind = NormalizerKind::kPrepend;
    STRATA_RETURN_IF_ERROR(get_string(n, "prepend", field, &step.content));
  } else if (type == "Replace") {
    step.kind = NormalizerKind::kReplace;
    bool is_regex = false;
    STRATA_RETURN_IF_ERROR(get_pattern(n, field, &step.pattern, &is_regex));
    if (is_regex) {
      return error(StatusCode::kUnimplemented, field,
                   "Replace with a regex pattern is not supported");
    }
    if (step.pattern.empty()) return invalid(field + ".pattern", "empty pattern");
    STRATA_RETURN_IF_ERROR(get_string(n, "content", field, &step.content));
  } else if (type == "NFC") {
    step.kind = NormalizerKind::kNfc;
  } else {
    return unsupported(field, type);
  }
  spec.normalizers.push_back(std::move(step));
  return ok_status();
}

Status Parser::parse_pre_tokenizer(const json& p, const std::string& field,
                                   TokenizerSpec& spec) const {
  if (p.is_null()) return ok_status();
  std::string type;
  STRATA_RETURN_IF_ERROR(type_of(p, field, &type));
  if (type == "Sequence") {
    auto it = p.find("pretokenizers");
    if (it == p.end() || !it->is_array()) {
      return invalid(field + ".pretokenizers", "expected an array");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      STRATA_RETURN_IF_ERROR(
          parse_pre_tokenizer((*it)[i], field + ".pretokenizers[" + std::to_string(i) + "]", spec));
    }
    return ok_status();
  }
  PreTokenizerStep step;
  if (type == "Split") {
    bool is_regex = false;
    STRATA_RETURN_IF_ERROR(get_pattern(p, field, &step.pattern, &is_regex));
    std::string behavior;
    STRATA_RETURN_IF_ERROR(get_string(p, "behavior", field, &behavior));
    if (behavior == "Removed") {
      step.behavior = SplitBehavior::kRemoved;
    } else if (behavior == "Isolated") {
      step.behavior = SplitBehavior::kIsolated;
    } else if (behavior == "MergedWithPrevious") {
      step.behavior = SplitBehavior::kMergedWithPrevious;
    } else if (behavior == "MergedWithNext") {
      step.behavior = SplitBehavior::kMergedWithNext;
    } else if (behavior == "Contiguous") {
      step.behavior = SplitBehavior::kContiguous;
    } else {
      return invalid(field + ".behavior", "unknown value '" + behavior + "'");
    }
    STRATA_RETURN_IF_ERROR(get_bool(p, "invert", field, &step.invert));
    if (!is_regex) {
      step.kind = PreTokenizerKind::kLiteral;
    } else if (auto builtin = builtin_regex_for_pattern(step.pattern)) {
      switch (*builtin) {
        case BuiltinRegex::kGpt2:
          step.kind = PreTokenizerKind::kGpt2Regex;
          break;
        case BuiltinRegex::kLlama3:
          step.kind = PreTokenizerKind::kLlama3Regex;
          break;
        case BuiltinRegex::kQwen2:
          step.kind = PreTokenizerKind::kQwen2Regex;
          break;
      }
    } else {
      step.kind = PreTokenizerKind::kRegex;
    }
  } else if (type == "ByteLevel") {
    step.kind = PreTokenizerKind::kByteLevel;
    step.add_prefix_space = true;  // HF's default
    STRATA_RETURN_IF_ERROR(get_bool(p, "add_prefix_space", field, &step.add_prefix_space));
    STRATA_RETURN_IF_ERROR(get_bool(p, "use_regex", field, &step.use_regex));
  } else if (type == "Metaspace") {
    step.kind = PreTokenizerKind::kMetaspace;
    STRATA_RETURN_IF_ERROR(get_string(p, "replacement", field, &step.pattern));
    STRATA_RETURN_IF_ERROR(parse_prepend_scheme(*this, p, field, &step.prepend_scheme));
    STRATA_RETURN_IF_ERROR(get_bool(p, "split", field, &step.split));
  } else if (type == "Digits") {
    step.kind = PreTokenizerKind::kDigits;
    STRATA_RETURN_IF_ERROR(get_bool(p, "individual_digits", field, &step.individual_digits));
  } else {
    return unsupported(field, type);
  }
  spec.pre_tokenizers.push_back(std::move(step));
  return ok_status();
}

Status Parser::parse_decoder(const json& d, const std::string& field, TokenizerSpec& spec) const {
  if (d.is_null()) return ok_status();
  std::string type;
  STRATA_RETURN_IF_ERROR(type_of(d, field, &type));
  if (type == "Sequence") {
    auto it = d.find("decoders");
    if (it == d.end() || !it->is_array()) return invalid(field + ".decoders", "expected an array");
    for (size_t i = 0; i < it->size(); ++i) {
      STRATA_RETURN_IF_ERROR(
          parse_decoder((*it)[i], field + ".decoders[" + std::to_string(i) + "]", spec));
    }
    return ok_status();
  }
  DecoderStep step;
  if (type == "ByteLevel") {
    step.kind = DecoderKind::kByteLevel;
  } else if (type == "Replace") {
    step.kind = DecoderKind::kReplace;
    bool is_regex = false;
    STRATA_RETURN_IF_ERROR(get_pattern(d, field, &step.pattern, &is_regex));
    if (is_regex) {
      return error(StatusCode::kUnimplemented, field,
                   "Replace with a regex pattern is not supported");
    }
    if (step.pattern.empty()) return invalid(field + ".pattern", "empty pattern");
    STRATA_RETURN_IF_ERROR(get_string(d, "content", field, &step.content));
  } else if (type == "ByteFallback") {
    step.kind = DecoderKind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecoderKind::kFuse;
  } else if (type == "Strip") {
    step.kind = DecoderKind::kStrip;
    STRATA_RETURN_IF_ERROR(get_string(d, "content", field, &step.content));
    int64_t start = 0;
    int64_t stop = 0;
    STRATA_RETURN_IF_ERROR(get_int(d, "start", field, &start));
    STRATA_RETURN_IF_ERROR(get_int(d, "stop", field, &stop));
    if (start < 0 || stop < 0 || start > 1024 || stop > 1024) {
      return invalid(field, "Strip start/stop out of range");
    }
    step.strip_start = static_cast<int>(start);
    step.strip_stop = static_cast<int>(stop);
  } else if (type == "Metaspace") {
    step.kind = DecoderKind::kMetaspace;
    STRATA_RETURN_IF_ERROR(get_string(d, "replacement", field, &step.pattern));
    STRATA_RETURN_IF_ERROR(parse_prepend_scheme(*this, d, field, &step.prepend_scheme));
  } else {
    return unsupported(field, type);
  }
  spec.decoders.push_back(std::move(step));
  return ok_status();
}

Status Parser::parse_post_processor(const json& p, const std::string& field,
                                    TokenizerSpec& spec) const {
  if (p.is_null()) return ok_status();
  std::string type;
  STRATA_RETURN_IF_ERROR(type_of(p, field, &type));
  if (type == "Sequence") {
    auto it = p.find("processors");
    if (it == p.end() || !it->is_array())
      return invalid(field + ".processors", "expected an array");
    for (size_t i = 0; i < it->size(); ++i) {
      STRATA_RETURN_IF_ERROR(
          parse_post_processor((*it)[i], field + ".processors[" + std::to_string(i) + "]", spec));
    }
    return ok_status();
  }
  if (type == "ByteLevel") return ok_status();  // offsets only
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    auto cls = p.find("cls");
    auto sep = p.find("sep");
    if (cls == p.end() || !cls->is_array() || cls->size() != 2 || !(*cls)[1].is_number_integer() ||
        sep == p.end() || !sep->is_array() || sep->size() != 2 || !(*sep)[1].is_number_integer()) {
      return invalid(field, "expected cls and sep as [token, id]");
    }
    spec.post_prefix_ids.push_back((*cls)[1].get<int32_t>());
    spec.post_suffix_ids.push_back((*sep)[1].get<int32_t>());
    return ok_status();
  }
  if (type != "TemplateProcessing") return unsupported(field, type);
  auto single = p.find("single");
  if (single == p.end() || !single->is_array())
    return invalid(field + ".single", "expected an array");
  auto specials = p.find("special_tokens");
  bool seen_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const json& item = (*single)[i];
    const std::string item_field = field + ".single[" + std::to_string(i) + "]";
    if (!item.is_object()) return invalid(item_field, "expected an object");
    if (item.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    auto st = item.find("SpecialToken");
    if (st == item.end() || !st->is_object()) {
      return invalid(item_field, "expected Sequence or SpecialToken");
    }
    std::string name;
    STRATA_RETURN_IF_ERROR(get_string(*st, "id", item_field + ".SpecialToken", &name));
    if (specials == p.end() || !specials->is_object() || !specials->contains(name)) {
      return invalid(field + ".special_tokens", "no entry for '" + name + "'");
    }
    const json& entry = (*specials)[name];
    auto ids = entry.find("ids");
    if (ids == entry.end() || !ids->is_array()) {
      return invalid(field + ".special_tokens." + name + ".ids", "expected an array");
    }
    for (const json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return invalid(field + ".special_tokens." + name + ".ids", "expected non-negative ids");
      }
      (seen_sequence ? spec.post_suffix_ids : spec.post_prefix_ids).push_back(id.get<int32_t>());
    }
  }
  return ok_status();
}

Status Parser::parse_model(const json& m, TokenizerSpec& spec) const {
  if (!m.is_object()) return invalid("model", "expected an object");
  std::string type = "BPE";
  if (m.contains("type")) STRATA_RETURN_IF_ERROR(get_string(m, "type", "model", &type));
  if (type != "BPE") {
    return error(StatusCode::kUnimplemented, "model.type",
                 "model type '" + type + "' is not supported (only BPE)");
  }
  auto vocab = m.find("vocab");
  if (vocab == m.end() || !vocab->is_object()) return invalid("model.vocab", "expected an object");
  int64_t max_id = -1;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer()) {
      return invalid("model.vocab." + it.key(), "expected an integer id");
    }
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= (int64_t{1} << 30)) {
      return invalid("model.vocab." + it.key(), "id " + std::to_string(id) + " out of range");
    }
    max_id = std::max(max_id, id);
  }
  if (max_id < 0) return invalid("model.vocab", "empty vocabulary");
  if (max_id >= static_cast<int64_t>(vocab->size()) * 2 + 1024) {
    return invalid("model.vocab", "ids are sparse (max id " + std::to_string(max_id) + ")");
  }
  spec.tokens.assign(static_cast<size_t>(max_id) + 1, std::string());
  std::vector<bool> used(static_cast<size_t>(max_id) + 1, false);
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const auto id = static_cast<size_t>(it.value().get<int64_t>());
    if (used[id]) {
      return invalid("model.vocab." + it.key(), "id " + std::to_string(id) + " used twice");
    }
    used[id] = true;
    spec.tokens[id] = it.key();
  }
  auto merges = m.find("merges");
  if (merges != m.end() && !merges->is_null()) {
    if (!merges->is_array()) return invalid("model.merges", "expected an array");
    spec.merges.reserve(merges->size());
    for (size_t i = 0; i < merges->size(); ++i) {
      const json& e = (*merges)[i];
      const std::string field = "model.merges[" + std::to_string(i) + "]";
      if (e.is_string()) {
        const std::string s = e.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
          return invalid(field, "expected \"a b\" with exactly one space, got '" + s + "'");
        }
        spec.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        spec.merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
      } else {
        return invalid(field, "expected \"a b\" or [\"a\", \"b\"]");
      }
    }
  }
  STRATA_RETURN_IF_ERROR(get_bool(m, "byte_fallback", "model", &spec.byte_fallback));
  STRATA_RETURN_IF_ERROR(get_bool(m, "ignore_merges", "model", &spec.ignore_merges));
  STRATA_RETURN_IF_ERROR(get_bool(m, "fuse_unk", "model", &spec.fuse_unk));
  if (auto unk = m.find("unk_token"); unk != m.end() && !unk->is_null()) {
    if (!unk->is_string()) return invalid("model.unk_token", "expected a string");
    spec.unk_token = unk->get<std::string>();
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = m.find(key);
    if (it != m.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty())) {
      return error(StatusCode::kUnimplemented, std::string("model.") + key, "not supported");
    }
  }
  if (auto dropout = m.find("dropout"); dropout != m.end() && !dropout->is_null()) {
    if (!dropout->is_number() || dropout->get<double>() > 0.0) {
      return error(StatusCode::kUnimplemented, "model.dropout", "BPE dropout is not supported");
    }
  }
  return ok_status();
}

Status Parser::parse_added_tokens(const json& a, TokenizerSpec& spec) const {
  if (a.is_null()) return ok_status();
  if (!a.is_array()) return invalid("added_tokens", "expected an array");
  for (size_t i = 0; i < a.size(); ++i) {
    const json& t = a[i];
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    if (!t.is_object()) return invalid(field, "expected an object");
    AddedToken tok;
    int64_t id = -1;
    STRATA_RETURN_IF_ERROR(get_int(t, "id", field, &id));
    // Added tokens either reuse a model id or extend the vocabulary after it, so an id past
    // (model tokens + added tokens) cannot be right; accepting one would size the id tables to it.
    const auto limit = static_cast<int64_t>(spec.tokens.size() + a.size());
    if (id < 0) return invalid(field + ".id", "missing or negative");
    if (id >= limit) {
      return invalid(field + ".id", std::to_string(id) + " is beyond the vocabulary (" +
                                        std::to_string(spec.tokens.size()) + " model tokens + " +
                                        std::to_string(a.size()) + " added tokens)");
    }
    tok.id = static_cast<int32_t>(id);
    STRATA_RETURN_IF_ERROR(get_string(t, "content", field, &tok.content));
    if (tok.content.empty()) return invalid(field + ".content", "empty");
    STRATA_RETURN_IF_ERROR(get_bool(t, "special", field, &tok.special));
    tok.normalized = !tok.special;  // HF's default
    STRATA_RETURN_IF_ERROR(get_bool(t, "lstrip", field, &tok.lstrip));
    STRATA_RETURN_IF_ERROR(get_bool(t, "rstrip", field, &tok.rstrip));
    STRATA_RETURN_IF_ERROR(get_bool(t, "normalized", field, &tok.normalized));
    STRATA_RETURN_IF_ERROR(get_bool(t, "single_word", field, &tok.single_word));
    spec.added_tokens.push_back(std::move(tok));
  }
  return ok_status();
}

// A token given in tokenizer_config.json: "text", {"content": "text", ...} or null.
std::string config_token(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object()) {
    auto it = v.find("content");
    if (it != v.end() && it->is_string()) return it->get<std::string>();
  }
  return {};
}

int32_t find_token(const TokenizerSpec& spec, const std::string& text) {
  if (text.empty()) return -1;
  for (const auto& a : spec.added_tokens) {
    if (a.content == text) return a.id;
  }
  for (size_t i = 0; i < spec.tokens.size(); ++i) {
    if (spec.tokens[i] == text) return static_cast<int32_t>(i);
  }
  return -1;
}

// Applies tokenizer_config.json to the spec.
Status apply_tokenizer_config(const std::string& path, TokenizerSpec& spec) {
  STRATA_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  json cfg = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (cfg.is_discarded() || !cfg.is_object()) {
    return errorf(StatusCode::kInvalidArgument, "{}: malformed JSON", path);
  }
  if (auto it = cfg.find("bos_token"); it != cfg.end()) {
    const int32_t id = find_token(spec, config_token(*it));
    if (id >= 0) spec.bos_id = id;
  }
  if (auto it = cfg.find("eos_token"); it != cfg.end()) {
    const int32_t id = find_token(spec, config_token(*it));
    if (id >= 0) spec.eos_id = id;
  }
  auto apply_flag = [&](const char* key, int32_t id, std::vector<int32_t>& ids, bool front) {
    auto it = cfg.find(key);
    if (it == cfg.end() || !it->is_boolean() || id < 0) return;
    const bool has = !ids.empty() && (front ? ids.front() : ids.back()) == id;
    if (it->get<bool>() && !has) {
      ids.insert(front ? ids.begin() : ids.end(), id);
    } else if (!it->get<bool>() && has) {
      ids.erase(front ? ids.begin() : ids.end() - 1);
    }
  };
  apply_flag("add_bos_token", spec.bos_id, spec.post_prefix_ids, true);
  apply_flag("add_eos_token", spec.eos_id, spec.post_suffix_ids, false);
  if (auto it = cfg.find("chat_template"); it != cfg.end()) {
    if (it->is_string()) {
      spec.chat_template = it->get<std::string>();
    } else if (it->is_array()) {
      // [{"name": ..., "template": ...}]: the "default" one, else the first.
      for (const json& t : *it) {
        if (!t.is_object() || !t.contains("template") || !t["template"].is_string()) continue;
        const bool is_default = t.contains("name") && t["name"] == "default";
        if (spec.chat_template.empty() || is_default) spec.chat_template = t["template"];
        if (is_default) break;
      }
    }
  }
  return ok_status();
}

}  // namespace

Result<TokenizerSpec> parse_hf_tokenizer_json(std::string_view json_text, const std::string& name) {
  const Parser p(name);
  TokenizerSpec spec;
  try {
    json root = json::parse(json_text.begin(), json_text.end(), nullptr,
                            /*allow_exceptions=*/false);
    if (root.is_discarded()) {
      return errorf(StatusCode::kInvalidArgument, "{}: malformed JSON", name);
    }
    if (!root.is_object()) return p.invalid("(root)", "expected an object");
    auto model = root.find("model");
    if (model == root.end()) return p.invalid("model", "missing");
    STRATA_RETURN_IF_ERROR(p.parse_model(*model, spec));
    const json null_value;
    auto field = [&](const char* key) -> const json& {
      auto it = root.find(key);
      return it == root.end() ? null_value : *it;
    };
    STRATA_RETURN_IF_ERROR(p.parse_added_tokens(field("added_tokens"), spec));
    STRATA_RETURN_IF_ERROR(p.parse_normalizer(field("normalizer"), "normalizer", spec));
    STRATA_RETURN_IF_ERROR(p.parse_pre_tokenizer(field("pre_tokenizer"), "pre_tokenizer", spec));
    STRATA_RETURN_IF_ERROR(p.parse_post_processor(field("post_processor"), "post_processor", spec));
    STRATA_RETURN_IF_ERROR(p.parse_decoder(field("decoder"), "decoder", spec));
  } catch (const std::exception& e) {
    return errorf(StatusCode::kInvalidArgument, "{}: {}", name, e.what());
  }
  // Token types: what HF knows about each id.
  spec.token_types.assign(spec.tokens.size(), TokenType::kNormal);
  for (size_t i = 0; i < spec.tokens.size(); ++i) {
    const std::string& t = spec.tokens[i];
    if (spec.byte_fallback && t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
      spec.token_types[i] = TokenType::kByte;
    } else if (!spec.unk_token.empty() && t == spec.unk_token) {
      spec.token_types[i] = TokenType::kUnknown;
    }
  }
  for (const auto& a : spec.added_tokens) {
    if (static_cast<size_t>(a.id) < spec.token_types.size()) {
      spec.token_types[static_cast<size_t>(a.id)] =
          a.special ? TokenType::kControl : TokenType::kUserDefined;
    }
  }
  // bos/eos guesses; tokenizer_config.json overrides them.
  if (!spec.post_prefix_ids.empty()) {
    const int32_t first = spec.post_prefix_ids.front();
    for (const auto& a : spec.added_tokens) {
      if (a.id == first && a.special) spec.bos_id = first;
    }
  }
  if (spec.bos_id < 0) {
    for (const char* name_guess : {"<|begin_of_text|>", "<s>", "<bos>"}) {
      if (const int32_t id = find_token(spec, name_guess); id >= 0) {
        spec.bos_id = id;
        break;
      }
    }
  }
  for (const char* name_guess : {"<|end_of_text|>", "</s>", "<eos>", "<|endoftext|>"}) {
    if (const int32_t id = find_token(spec, name_guess); id >= 0) {
      spec.eos_id = id;
      break;
    }
  }
  return spec;
}

Result<TokenizerSpec> read_hf_tokenizer_spec(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  STRATA_ASSIGN_OR_RETURN(TokenizerSpec spec, parse_hf_tokenizer_json(text, path));
  std::error_code ec;
  const std::filesystem::path config =
      std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config, ec)) {
    try {
      STRATA_RETURN_IF_ERROR(apply_tokenizer_config(config.string(), spec));
    } catch (const std::exception& e) {
      return errorf(StatusCode::kInvalidArgument, "{}: {}", config.string(), e.what());
    }
  }
  return spec;
}

}  // namespace strata
