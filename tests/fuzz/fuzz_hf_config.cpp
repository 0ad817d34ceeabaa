// libFuzzer target for parse_hf_config (Hugging Face config.json): any input must give a
// ModelConfig or a one-line error naming the source, never a crash, hang or UB.
// Seeds: tests/fuzz/corpus/hf_config/ (real configs of each supported family, a few broken).
#include <cstddef>
#include <cstdint>
#include <string>

#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = strata::parse_hf_config(text, "fuzz");
  if (!config.ok()) {
    const std::string& msg = config.status().message();
    if (msg.find("fuzz") == std::string::npos || msg.find('\n') != std::string::npos) {
      __builtin_trap();
    }
    return 0;
  }
  (void)config->parameter_count();  // `strata info` prints it for any config that parses
  return 0;
}
