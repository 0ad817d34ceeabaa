// libFuzzer target for plan files (`--plan FILE`, strata::plan_from_json) and the engine's layout
// choice over whatever they hold: any input gives a choice or a one-line error naming the file,
// never a crash, hang or UB. Seeds: tests/fuzz/corpus/plan_json/ (`strata plan ... --json`).
#include <cstddef>
#include <cstdint>
#include <string>

#include "strata/plan.h"

namespace {

void check(const strata::Status& s, bool names_file) {
  const std::string& msg = s.message();
  if ((names_file && msg.find("fuzz.json") == std::string::npos) ||
      msg.find('\n') != std::string::npos) {
    __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto rep = strata::plan_from_json(text, "--plan fuzz.json");
  if (!rep.ok()) {
    check(rep.status(), true);
    return 0;
  }
  for (int world : {0, 1, 2, 8}) {
    auto c = strata::choose_engine_layout(*rep, world);
    if (!c.ok()) {
      check(c.status(), false);
    } else if (c->decode.tp != c->prefill.tp || c->decode.pp != c->prefill.pp ||
               (world > 0 && c->decode.tp * c->decode.pp != world)) {
      __builtin_trap();
    }
  }
  return 0;
}
