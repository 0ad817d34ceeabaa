// libFuzzer target for hardware profiles (`strata plan --profile FILE`,
// strata::planner::parse_hardware_profile): any input gives a profile or a one-line error naming
// the file, never a crash, hang or UB; a profile that parses is usable (its fields are finite and
// positive where the cost model divides by them). Seeds: tests/fuzz/corpus/hw_profile/ (the
// shipped profiles).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "planner/planner.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto p = strata::planner::parse_hardware_profile(text, "--profile fuzz.json");
  if (!p.ok()) {
    const std::string& msg = p.status().message();
    if (msg.find("fuzz.json") == std::string::npos || msg.find('\n') != std::string::npos) {
      __builtin_trap();
    }
    return 0;
  }
  const strata::planner::HardwareProfile& h = *p;
  for (double v : {h.hbm_read_Bps, h.peak_bf16()}) {
    if (!std::isfinite(v) || v <= 0) __builtin_trap();
  }
  for (double v : {h.moe_exchange_fixed_s, h.moe_exchange_Bps, h.layer_overhead_s}) {
    if (!std::isfinite(v) || v < 0) __builtin_trap();
  }
  return 0;
}
