// libFuzzer target: parse arbitrary bytes as a chat template and render it with a small fixed
// context. Any input must give a Status or a string: no crash, hang or unbounded allocation
// (the caps in ChatTemplateOptions are lowered so a slow input is reported as an error fast).
//   ./build-fuzz/tests/fuzz/fuzz_chat_template tests/fuzz/corpus/chat_template -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <string>

#include "chat/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;
  std::string source(reinterpret_cast<const char*>(data), size);
  auto tmpl = strata::ChatTemplate::parse(source);
  if (!tmpl.ok()) return 0;
  static const nlohmann::ordered_json kContext = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi {{ x }} \u00e9 \ud83d\ude00"},
      {"role": "assistant", "content": "<think>t</think>ok", "reasoning_content": "r",
       "tool_calls": [{"id": "call12345", "function": {"name": "f", "arguments": {"a": 1.5}}}]},
      {"role": "tool", "content": "42"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"
  })");
  strata::ChatTemplateOptions options;
  options.now = [] { return std::tm{}; };
  options.max_output_bytes = 1 << 16;
  options.max_work = 1 << 16;
  options.max_depth = 128;
  auto out = tmpl->render(kContext, options);
  (void)out;
  return 0;
}
