// libFuzzer target for the Hugging Face Hub's answers (src/hub/hub_metadata.h): the model API's
// file list, a safetensors index's shard list, hub ids and the file-selection rule. Any input
// must give a value or a one-line error naming the source, never a crash, hang or UB.
// The first byte picks the parser. Seeds: tests/fuzz/corpus/hub_metadata/.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "hub/hub_metadata.h"

namespace {

void check(const strata::Status& s) {
  const std::string& msg = s.message();
  if (msg.find("fuzz") == std::string::npos || msg.find('\n') != std::string::npos) {
    __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0: {
      auto info = strata::hub::parse_repo_info(text, "fuzz");
      if (!info.ok()) {
        check(info.status());
        return 0;
      }
      std::vector<std::string> names;
      for (const auto& f : info->files) {
        if (!strata::hub::is_safe_repo_path(f.name)) __builtin_trap();
        names.push_back(f.name);
      }
      (void)strata::hub::select_files(names, *strata::hub::parse_hub_id("org/name"));
      return 0;
    }
    case 1: {
      auto shards = strata::hub::parse_index_shards(text, "fuzz");
      if (!shards.ok()) check(shards.status());
      return 0;
    }
    default: {
      auto id = strata::hub::parse_hub_id(text);
      if (id) {
        if (!strata::hub::is_valid_repo_id(id->repo)) __builtin_trap();
        if (!id->file.empty() && !strata::hub::is_safe_repo_path(id->file)) __builtin_trap();
        (void)id->display();
      }
      return 0;
    }
  }
}
