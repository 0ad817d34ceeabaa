// The Hugging Face Hub's names and JSON answers, parsed without trusting them: model ids
// (org/name[@revision][:FILE.gguf]), the model API's file list
// (GET /api/models/{repo}/revision/{rev}?blobs=true) and a safetensors index's shard list.
// Every malformed input is an error naming the source and the field, never a crash: these
// parsers are fuzzed (tests/fuzz/fuzz_hub_metadata.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/json_depth.h"
#include "strata/status.h"

namespace strata::hub {

// A model named by its hub id: `org/name`, then optionally `@REVISION` (a branch, tag or commit
// sha; default main), then optionally `:FILE` (a .gguf file of the repository).
struct HubId {
  std::string repo;      // org/name
  std::string revision;  // as given; empty = main
  std::string file;      // a .gguf path inside the repository, or empty
  const std::string& rev() const;
  std::string display() const;  // repo[@revision][:file]
};

// The id when `text` has the hub-id form, nullopt otherwise (a local path, an alias).
std::optional<HubId> parse_hub_id(std::string_view text);

// org/name as the hub accepts it: letters, digits, '-', '_', '.'; no "--" or ".."; '-' and '.'
// neither start nor end a part; at most 96 characters each.
bool is_valid_repo_id(std::string_view repo);
// 40 lowercase hex digits (a git commit or blob id).
bool is_commit_sha(std::string_view s);
bool is_hex(std::string_view s, size_t n);
// A relative path inside a repository: no empty, "." or ".." part, no leading '/', no
// backslash or control character.
bool is_safe_repo_path(std::string_view path);

struct RepoFile {
  std::string name;        // rfilename
  int64_t size = -1;       // bytes; -1 when the answer has none
  std::string blob_id;     // git blob sha1 (40 hex); empty when absent
  std::string lfs_sha256;  // 64 hex for files stored in LFS; empty otherwise
  // The blob's name in the cache, as huggingface_hub names it (the file's ETag): the LFS
  // sha256, else the git blob id; empty when the answer has neither.
  std::string etag() const { return lfs_sha256.empty() ? blob_id : lfs_sha256; }
};

struct RepoInfo {
  std::string sha;  // the commit the revision points at
  std::vector<RepoFile> files;
  const RepoFile* find(std::string_view name) const;
};

// The model API's answer; `source` names it in errors (the URL).
Result<RepoInfo> parse_repo_info(std::string_view json, const std::string& source);

// The shard file names a model.safetensors.index.json's weight_map refers to, sorted, unique.
Result<std::vector<std::string>> parse_index_shards(std::string_view json,
                                                    const std::string& source);

// json_too_deep (the guard before parsing the hub's answers) lives in core/json_depth.h.

// Which files of a repository strata needs (the rule README.md documents):
//  - `:FILE` given: that file;
//  - else config.json + model.safetensors, or config.json + model.safetensors.index.json and
//    the shards it names (`shards` empty: the index is not read yet), plus tokenizer.json,
//    tokenizer_config.json and generation_config.json where the repository has them;
//  - else the repository's .gguf file in its top folder: the only one, or among several the
//    only one whose name contains Q4_K_M (llama.cpp's default); otherwise an error listing them.
struct FileSelection {
  std::vector<std::string> required;  // must exist
  std::vector<std::string> optional;  // used when present (huggingface_hub's .no_exist marks
                                      // the ones the revision does not have)
  std::string entry;         // what strata opens inside the snapshot: "" = the folder, else a file
  bool needs_index = false;  // the shards come from model.safetensors.index.json
};
Result<FileSelection> select_files(const std::vector<std::string>& names, const HubId& id);

}  // namespace strata::hub
