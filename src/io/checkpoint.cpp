#include "io/checkpoint.h"

#include <filesystem>
#include <set>
#include <system_error>

#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "core/status.h"

namespace strata {

namespace {

namespace fs = std::filesystem;

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// A shard name from weight_map must stay inside the model directory.
bool is_safe_shard_name(const std::string& name) {
  if (name.empty() || name.find('\0') != std::string::npos) return false;
  const fs::path p(name);
  if (p.is_absolute() || p.has_root_path()) return false;
  for (const fs::path& part : p) {
    if (part == "..") return false;
  }
  return true;
}

std::string parent_dir(const std::string& file) {
  const fs::path parent = fs::path(file).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// The weight_map of an index file: tensor name -> shard file name.
Result<std::map<std::string, std::string>> read_weight_map(const std::string& index_path) {
  STRATA_ASSIGN_OR_RETURN(std::string text, read_text_file(index_path));
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    return errorf(StatusCode::kDataLoss, "{}: not valid JSON: {}", index_path,
                  printable_for_message(e.what(), 300));
  }
  if (!index.is_object()) {
    return errorf(StatusCode::kDataLoss, "{}: not a JSON object", index_path);
  }
  const auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object()) {
    return errorf(StatusCode::kDataLoss, "{}: no 'weight_map' object", index_path);
  }
  if (wm->empty()) return errorf(StatusCode::kDataLoss, "{}: 'weight_map' is empty", index_path);
  std::map<std::string, std::string> out;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it->is_string()) {
      return errorf(StatusCode::kDataLoss, "{}: weight_map entry for tensor '{}' is not a string",
                    index_path, printable_for_message(it.key()));
    }
    const auto& shard = it->get_ref<const std::string&>();
    if (!is_safe_shard_name(shard)) {
      return errorf(
          StatusCode::kDataLoss,
          "{}: weight_map puts tensor '{}' in '{}', which is not a file in the model directory",
          index_path, printable_for_message(it.key()), printable_for_message(shard));
    }
    out.emplace(it.key(), shard);
  }
  return out;
}

}  // namespace

Status Checkpoint::not_found(const std::string& name) const {
  return errorf(StatusCode::kNotFound, "{}: tensor '{}' not found in checkpoint", source_,
                printable_for_message(name));
}

Status Checkpoint::add_shard(std::shared_ptr<SafetensorsFile> shard) {
  const size_t index = shards_.size();
  for (const std::string& name : shard->names()) {
    const auto [it, inserted] = where_.emplace(name, index);
    if (!inserted) {
      return errorf(StatusCode::kDataLoss, "{}: tensor '{}' is in two shards: {} and {}", source_,
                    printable_for_message(name), shards_[it->second]->path(), shard->path());
    }
  }
  total_bytes_ += shard->tensor_bytes();
  shards_.push_back(std::move(shard));
  return ok_status();
}

Result<std::unique_ptr<Checkpoint>> Checkpoint::open(const std::string& path) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->source_ = path;

  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    return errorf(StatusCode::kNotFound, "{}: no such file or directory", path);
  }

  std::string index_path;
  if (fs::is_directory(st)) {
    ckpt->dir_ = path;
    const std::string single = (fs::path(path) / kSafetensorsSingleName).string();
    const std::string index = (fs::path(path) / kSafetensorsIndexName).string();
    if (fs::exists(single, ec)) {
      STRATA_ASSIGN_OR_RETURN(auto shard, SafetensorsFile::open(single));
      STRATA_RETURN_IF_ERROR(ckpt->add_shard(std::move(shard)));
    } else if (fs::exists(index, ec)) {
      index_path = index;
    } else {
      return errorf(StatusCode::kNotFound, "{}: no {} or {} in this directory", path,
                    kSafetensorsSingleName, kSafetensorsIndexName);
    }
  } else if (ends_with(path, ".index.json")) {
    ckpt->dir_ = parent_dir(path);
    index_path = path;
  } else {
    ckpt->dir_ = parent_dir(path);
    STRATA_ASSIGN_OR_RETURN(auto shard, SafetensorsFile::open(path));
    STRATA_RETURN_IF_ERROR(ckpt->add_shard(std::move(shard)));
  }

  if (!index_path.empty()) {
    STRATA_ASSIGN_OR_RETURN(auto weight_map, read_weight_map(index_path));
    // Open each shard once, in name order; the first tensor mapped to it names it in errors.
    std::map<std::string, std::string> shard_first_tensor;
    for (const auto& [tensor, shard] : weight_map) shard_first_tensor.emplace(shard, tensor);
    std::map<std::string, size_t> shard_index;
    for (const auto& [shard, tensor] : shard_first_tensor) {
      const std::string shard_path = (fs::path(ckpt->dir_) / shard).string();
      if (!fs::is_regular_file(shard_path, ec)) {
        return errorf(StatusCode::kNotFound,
                      "{}: shard '{}' (holding tensor '{}') not found: no file {}", index_path,
                      printable_for_message(shard), printable_for_message(tensor),
                      printable_for_message(shard_path, 400));
      }
      STRATA_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(shard_path));
      shard_index.emplace(shard, ckpt->shards_.size());
      STRATA_RETURN_IF_ERROR(ckpt->add_shard(std::move(file)));
    }
    for (const auto& [tensor, shard] : weight_map) {
      const SafetensorsFile& file = *ckpt->shards_[shard_index.at(shard)];
      if (!file.has(tensor)) {
        return errorf(StatusCode::kDataLoss,
                      "{}: weight_map puts tensor '{}' in '{}', but that shard has no such tensor",
                      index_path, printable_for_message(tensor), printable_for_message(shard));
      }
    }
    // NOTE: tensors a shard holds beyond its weight_map entries are kept (they are in the
    // files); transformers loads them too and reports them as unexpected keys.
  }

  ckpt->names_.reserve(ckpt->where_.size());
  for (const auto& [name, shard] : ckpt->where_) ckpt->names_.push_back(name);
  return ckpt;
}

const SafetensorsFile* Checkpoint::shard_of(const std::string& name) const {
  const auto it = where_.find(name);
  return it == where_.end() ? nullptr : shards_[it->second].get();
}

const SafetensorsEntry* Checkpoint::find(const std::string& name) const {
  const SafetensorsFile* shard = shard_of(name);
  return shard ? shard->find(name) : nullptr;
}

Result<const SafetensorsEntry*> Checkpoint::info(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  if (!e) {
    return not_found(name);
  }
  return e;
}

Result<Tensor> Checkpoint::tensor(const std::string& name) const {
  const SafetensorsFile* shard = shard_of(name);
  if (!shard) {
    return not_found(name);
  }
  return shard->tensor(name);
}

Result<Buffer> Checkpoint::buffer(const std::string& name) const {
  const SafetensorsFile* shard = shard_of(name);
  if (!shard) {
    return not_found(name);
  }
  return shard->buffer(name);
}

void Checkpoint::prefault(
    const std::function<void(uint64_t done, uint64_t total)>& progress) const {
  constexpr uint64_t kPage = 4096;
  uint64_t done = 0;
  for (const auto& shard : shards_) {
    for (const std::string& name : shard->names()) {
      Result<Buffer> buf = shard->buffer(name);
      if (!buf.ok()) continue;
      const auto* p = static_cast<const volatile uint8_t*>(buf->data());
      uint8_t sink = 0;
      for (uint64_t off = 0; off < buf->bytes(); off += kPage) sink ^= p[off];
      (void)sink;
      done += buf->bytes();
      if (progress) progress(done, total_bytes_);
    }
  }
}

}  // namespace strata
