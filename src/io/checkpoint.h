// Checkpoint: the safetensors weights of a Hugging Face model directory, memory-mapped.
//
// open() accepts a directory holding `model.safetensors` (preferred, as transformers does) or a
// sharded `model.safetensors.index.json` whose `weight_map` names each tensor's shard, or the
// path of one `.safetensors` file (or of an index file). Every shard is validated
// (SafetensorsFile), every tensor of the weight_map must be in the shard it names, and a tensor
// found in two shards is an error. All shards stay mapped for the Checkpoint's lifetime;
// tensors are read-only views into the maps. A Checkpoint is the TensorSource the model
// loader reads from.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/buffer.h"
#include "core/tensor.h"
#include "io/safetensors.h"
#include "io/tensor_source.h"
#include "strata/status.h"

namespace strata {

inline constexpr std::string_view kSafetensorsSingleName = "model.safetensors";
inline constexpr std::string_view kSafetensorsIndexName = "model.safetensors.index.json";

class Checkpoint final : public TensorSource {
 public:
  static Result<std::unique_ptr<Checkpoint>> open(const std::string& path);

  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  // The model directory (for a file path: the directory it is in), where config.json lives.
  const std::string& dir() const { return dir_; }
  // The path given to open(); starts this class's messages.
  const std::string& source() const { return source_; }

  const std::vector<std::string>& names() const { return names_; }  // sorted
  bool has(const std::string& name) const override { return where_.find(name) != where_.end(); }
  // kNotFound: "DIR: tensor 'NAME' not found in checkpoint".
  Result<Tensor> tensor(const std::string& name) const override;
  std::string describe() const override { return source_; }
  std::vector<MappedRegion> mapped_regions() const override {
    std::vector<MappedRegion> out;
    for (const auto& s : shards_) {
      if (s->mapping())
        out.push_back({s->mapping()->path(), s->mapping()->data(), s->mapping()->size()});
    }
    return out;
  }

  // The entry, or nullptr when no shard has `name`.
  const SafetensorsEntry* find(const std::string& name) const;
  Result<const SafetensorsEntry*> info(const std::string& name) const;
  // The tensor's bytes as a Buffer that keeps its shard mapped.
  Result<Buffer> buffer(const std::string& name) const;
  // The shard holding `name`, or nullptr.
  const SafetensorsFile* shard_of(const std::string& name) const;

  uint64_t total_bytes() const { return total_bytes_; }  // sum of every tensor's bytes
  const std::vector<std::shared_ptr<SafetensorsFile>>& shards() const { return shards_; }

  // Read one byte of every page of tensor data, so later reads do not fault; progress(done,
  // total) in bytes after each tensor. Optional: everything works without it.
  void prefault(const std::function<void(uint64_t done, uint64_t total)>& progress = {}) const;

 private:
  Checkpoint() = default;
  Status add_shard(std::shared_ptr<SafetensorsFile> shard);
  Status not_found(const std::string& name) const;

  std::string source_;
  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> shards_;
  std::map<std::string, size_t, std::less<>> where_;  // tensor name -> index into shards_
  std::vector<std::string> names_;
  uint64_t total_bytes_ = 0;
};

}  // namespace strata
