#include "hub/hub_metadata.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <set>

#include "core/status.h"

namespace strata::hub {

namespace {

using Json = nlohmann::json;

constexpr int kMaxJsonDepth = 64;
constexpr const char* kGgufSuffix = ".gguf";

bool ends_with_ci(std::string_view s, std::string_view suffix) {
  if (s.size() < suffix.size()) return false;
  for (size_t i = 0; i < suffix.size(); ++i) {
    const auto a = static_cast<unsigned char>(s[s.size() - suffix.size() + i]);
    const auto b = static_cast<unsigned char>(suffix[i]);
    if (std::tolower(a) != std::tolower(b)) return false;
  }
  return true;
}

bool contains_ci(std::string_view s, std::string_view needle) {
  auto it = std::search(s.begin(), s.end(), needle.begin(), needle.end(), [](char a, char b) {
    return std::tolower(static_cast<unsigned char>(a)) ==
           std::tolower(static_cast<unsigned char>(b));
  });
  return it != s.end();
}

bool valid_repo_part(std::string_view p) {
  if (p.empty() || p.size() > 96) return false;
  for (char c : p) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
      return false;
  }
  if (p.front() == '-' || p.front() == '.' || p.back() == '-' || p.back() == '.') return false;
  return p.find("--") == std::string_view::npos && p.find("..") == std::string_view::npos;
}

bool valid_revision(std::string_view rev) {
  if (rev.empty() || rev.size() > 255) return false;
  for (char c : rev) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f || c == ':' || c == '\\' || c == '@') return false;
  }
  return is_safe_repo_path(rev);
}

// A JSON value parsed without exceptions; the depth is bounded before parsing.
Result<Json> parse_json(std::string_view text, const std::string& source) {
  if (json_too_deep(text, kMaxJsonDepth)) {
    return errorf(StatusCode::kDataLoss, "{}: JSON nested more than {} levels", source,
                  kMaxJsonDepth);
  }
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return errorf(StatusCode::kDataLoss, "{}: not valid JSON", source);
  if (!j.is_object()) return errorf(StatusCode::kDataLoss, "{}: not a JSON object", source);
  return j;
}

std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 80)) {
    const auto u = static_cast<unsigned char>(c);
    out += (u < 0x20 || u == 0x7f) ? '?' : c;
  }
  if (s.size() > 80) out += "...";
  return out;
}

}  // namespace

const std::string& HubId::rev() const {
  static const std::string kMain = "main";
  return revision.empty() ? kMain : revision;
}

std::string HubId::display() const {
  std::string s = repo;
  if (!revision.empty()) s += "@" + revision;
  if (!file.empty()) s += ":" + file;
  return s;
}

bool is_valid_repo_id(std::string_view repo) {
  const size_t slash = repo.find('/');
  if (slash == std::string_view::npos || repo.find('/', slash + 1) != std::string_view::npos)
    return false;
  return valid_repo_part(repo.substr(0, slash)) && valid_repo_part(repo.substr(slash + 1));
}

bool is_hex(std::string_view s, size_t n) {
  if (s.size() != n) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool is_commit_sha(std::string_view s) {
  return is_hex(s, 40);
}

bool is_safe_repo_path(std::string_view path) {
  if (path.empty() || path.size() > 1024 || path.front() == '/') return false;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    const std::string_view part = path.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  for (char c : path) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f || c == '\\') return false;
  }
  return true;
}

std::optional<HubId> parse_hub_id(std::string_view text) {
  HubId id;
  std::string_view rest = text;
  if (const size_t colon = rest.find(':'); colon != std::string_view::npos) {
    id.file = std::string(rest.substr(colon + 1));
    rest = rest.substr(0, colon);
    if (!is_safe_repo_path(id.file) || !ends_with_ci(id.file, kGgufSuffix)) return std::nullopt;
  }
  if (const size_t at = rest.find('@'); at != std::string_view::npos) {
    id.revision = std::string(rest.substr(at + 1));
    rest = rest.substr(0, at);
    if (!valid_revision(id.revision)) return std::nullopt;
  }
  if (!is_valid_repo_id(rest)) return std::nullopt;
  id.repo = std::string(rest);
  return id;
}

const RepoFile* RepoInfo::find(std::string_view name) const {
  for (const RepoFile& f : files) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

Result<RepoInfo> parse_repo_info(std::string_view text, const std::string& source) {
  STRATA_ASSIGN_OR_RETURN(Json j, parse_json(text, source));
  RepoInfo info;
  const auto sha = j.find("sha");
  if (sha == j.end() || !sha->is_string() || !is_commit_sha(sha->get_ref<const std::string&>())) {
    return errorf(StatusCode::kDataLoss, "{}: 'sha' is missing or not a 40-digit commit id",
                  source);
  }
  info.sha = sha->get<std::string>();
  const auto siblings = j.find("siblings");
  if (siblings == j.end() || !siblings->is_array()) {
    return errorf(StatusCode::kDataLoss, "{}: 'siblings' is missing or not an array", source);
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < siblings->size(); ++i) {
    const Json& s = (*siblings)[i];
    const auto bad = [&](const char* field, const char* why) {
      return errorf(StatusCode::kDataLoss, "{}: siblings[{}].{} {}", source, i, field, why);
    };
    if (!s.is_object()) {
      return errorf(StatusCode::kDataLoss, "{}: siblings[{}] is not an object", source, i);
    }
    RepoFile f;
    const auto name = s.find("rfilename");
    if (name == s.end() || !name->is_string())
      return bad("rfilename", "is missing or not a string");
    f.name = name->get<std::string>();
    if (!is_safe_repo_path(f.name)) {
      return errorf(StatusCode::kDataLoss, "{}: siblings[{}].rfilename '{}' is not a safe path",
                    source, i, printable(f.name));
    }
    if (!seen.insert(f.name).second) {
      return errorf(StatusCode::kDataLoss, "{}: siblings[{}].rfilename '{}' is listed twice",
                    source, i, printable(f.name));
    }
    if (const auto size = s.find("size"); size != s.end() && !size->is_null()) {
      if (!size->is_number_unsigned()) return bad("size", "is not a non-negative integer");
      const uint64_t v = size->get<uint64_t>();
      if (v > (uint64_t{1} << 50)) return bad("size", "is implausibly large");
      f.size = static_cast<int64_t>(v);
    }
    if (const auto blob = s.find("blobId"); blob != s.end() && !blob->is_null()) {
      if (!blob->is_string() || !is_hex(blob->get_ref<const std::string&>(), 40))
        return bad("blobId", "is not 40 hex digits");
      f.blob_id = blob->get<std::string>();
    }
    if (const auto lfs = s.find("lfs"); lfs != s.end() && !lfs->is_null()) {
      if (!lfs->is_object()) return bad("lfs", "is not an object");
      const auto h = lfs->find("sha256");
      if (h == lfs->end() || !h->is_string() || !is_hex(h->get_ref<const std::string&>(), 64))
        return bad("lfs.sha256", "is missing or not 64 hex digits");
      f.lfs_sha256 = h->get<std::string>();
      if (const auto size = lfs->find("size"); size != lfs->end() && !size->is_null()) {
        if (!size->is_number_unsigned()) return bad("lfs.size", "is not a non-negative integer");
        const uint64_t v = size->get<uint64_t>();
        if (v > (uint64_t{1} << 50)) return bad("lfs.size", "is implausibly large");
        if (f.size >= 0 && static_cast<uint64_t>(f.size) != v)
          return bad("lfs.size", "differs from size");
        f.size = static_cast<int64_t>(v);
      }
    }
    info.files.push_back(std::move(f));
  }
  return info;
}

Result<std::vector<std::string>> parse_index_shards(std::string_view text,
                                                    const std::string& source) {
  STRATA_ASSIGN_OR_RETURN(Json j, parse_json(text, source));
  const auto wm = j.find("weight_map");
  if (wm == j.end() || !wm->is_object() || wm->empty()) {
    return errorf(StatusCode::kDataLoss, "{}: 'weight_map' is missing, empty or not an object",
                  source);
  }
  std::set<std::string> shards;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it->is_string()) {
      return errorf(StatusCode::kDataLoss, "{}: weight_map['{}'] is not a string", source,
                    printable(it.key()));
    }
    const std::string& shard = it->get_ref<const std::string&>();
    if (!is_safe_repo_path(shard) || shard.find('/') != std::string::npos ||
        !ends_with_ci(shard, ".safetensors")) {
      return errorf(StatusCode::kDataLoss,
                    "{}: weight_map['{}'] = '{}' is not a .safetensors file of this folder", source,
                    printable(it.key()), printable(shard));
    }
    shards.insert(shard);
  }
  return std::vector<std::string>(shards.begin(), shards.end());
}

Result<FileSelection> select_files(const std::vector<std::string>& names, const HubId& id) {
  FileSelection sel;
  const auto has = [&](std::string_view n) {
    return std::find(names.begin(), names.end(), n) != names.end();
  };
  if (!id.file.empty()) {
    sel.required = {id.file};
    sel.entry = id.file;
    return sel;
  }
  if (has("config.json") && (has("model.safetensors") || has("model.safetensors.index.json"))) {
    sel.required = {"config.json"};
    if (has("model.safetensors")) {
      sel.required.push_back("model.safetensors");
    } else {
      sel.required.push_back("model.safetensors.index.json");
      sel.needs_index = true;
    }
    sel.optional = {"tokenizer.json", "tokenizer_config.json", "generation_config.json"};
    return sel;
  }
  std::vector<std::string> ggufs;
  for (const std::string& n : names) {
    if (n.find('/') == std::string::npos && ends_with_ci(n, kGgufSuffix)) ggufs.push_back(n);
  }
  std::sort(ggufs.begin(), ggufs.end());
  std::string pick;
  if (ggufs.size() == 1) {
    pick = ggufs[0];
  } else if (ggufs.size() > 1) {
    std::vector<std::string> q4;
    for (const std::string& g : ggufs) {
      if (contains_ci(g, "Q4_K_M")) q4.push_back(g);
    }
    if (q4.size() == 1) {
      pick = q4[0];
    } else {
      std::string list;
      for (size_t i = 0; i < ggufs.size() && i < 12; ++i) list += (i ? ", " : "") + ggufs[i];
      if (ggufs.size() > 12) list += ", ...";
      return errorf(StatusCode::kInvalidArgument,
                    "{}@{} has {} .gguf files ({}): pick one with -m {}:FILE.gguf", id.repo,
                    id.rev(), ggufs.size(), list, id.repo);
    }
  }
  if (pick.empty()) {
    return errorf(StatusCode::kNotFound,
                  "{}@{} has neither config.json with model.safetensors (or "
                  "model.safetensors.index.json) nor a .gguf file in its top folder",
                  id.repo, id.rev());
  }
  sel.required = {pick};
  sel.entry = pick;
  return sel;
}

}  // namespace strata::hub
