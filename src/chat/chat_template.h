// Chat templates: a Jinja subset rendered the way transformers renders `chat_template`.
//
// transformers compiles templates in an ImmutableSandboxedEnvironment with trim_blocks=True,
// lstrip_blocks=True and the loopcontrols extension, adds the globals raise_exception,
// strftime_now, namespace and dict, and replaces the tojson filter with json.dumps(ensure_ascii=
// False). ChatTemplate reproduces that byte for byte for the features chat templates use:
//
//   text, {{ }}, {% %}, {# #}, whitespace control ({%- -%} {{- -}} {%+), trim/lstrip blocks;
//   if/elif/else, for (loop.*, for-else, `for x in xs if c`, tuple targets, break/continue),
//   set (names, tuples, `ns.attr`, block set), macro (defaults, keyword args), generation;
//   literals, attribute/subscript access, slices, arithmetic, comparison, and/or/not, in,
//   ~, ternaries, filters, tests, str/dict methods, range/namespace/dict/raise_exception/
//   strftime_now.
//
// Undefined values follow jinja2's default Undefined: printing one prints nothing, testing
// it is false, iterating it is empty, but taking an attribute of it, calling it or doing
// arithmetic with it is an error. As in the sandbox, mutating methods (list.append, dict.update)
// are refused. Every failure is a Status ("chat template: line 3: unknown filter 'foo'"); work,
// output size and recursion are capped so a hostile template cannot hang or crash the engine.
#pragma once

#include <cstdint>
#include <ctime>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "strata/status.h"

namespace strata {

namespace jinja {
struct Template;  // the parsed program (chat_template.cpp)
}  // namespace jinja

struct ChatTemplateOptions {
  // Wall clock for strftime_now(); local time by default. Tests inject a fixed time.
  std::function<std::tm()> now;
  // Caps: bytes of output (and of any single string/list built), units of work (nodes
  // evaluated, loop iterations, bytes copied) and call depth (macros, nesting).
  size_t max_output_bytes = size_t{16} << 20;
  int64_t max_work = int64_t{16} << 20;
  int max_depth = 256;
};

class ChatTemplate {
 public:
  // Parses `source`; syntax errors carry the line number.
  static Result<ChatTemplate> parse(const std::string& source);

  // Renders with `context` (an object) as the template's variables.
  Result<std::string> render(const nlohmann::ordered_json& context) const;
  Result<std::string> render(const nlohmann::ordered_json& context,
                             const ChatTemplateOptions& options) const;

 private:
  explicit ChatTemplate(std::shared_ptr<const jinja::Template> program)
      : program_(std::move(program)) {}
  std::shared_ptr<const jinja::Template> program_;
};

// Builds the context transformers' apply_chat_template builds (messages, add_generation_prompt,
// bos_token, eos_token, tools when not null, then every key of `extra`, e.g. enable_thinking)
// and renders `tmpl` with it.
Result<std::string> apply_chat_template(const std::string& tmpl,
                                        const nlohmann::ordered_json& messages,
                                        bool add_generation_prompt, const std::string& bos_token,
                                        const std::string& eos_token,
                                        const nlohmann::ordered_json& tools = nullptr,
                                        const nlohmann::ordered_json& extra = {},
                                        const ChatTemplateOptions& options = {});

// What a model without a chat template is sent instead (issue 16 item 14): bos_token, then
// each message's text content (system, user and assistant alike), separated by blank lines.
std::string plain_chat_prompt(const nlohmann::ordered_json& messages, const std::string& bos_token);

}  // namespace strata
