// libFuzzer target for the safetensors header parser: any input must give either a validated
// file whose every tensor can be requested and read within the input, or a one-line error that
// starts with the file name. Seeds: tests/fuzz/corpus/safetensors/; dictionary:
// tests/fuzz/safetensors.dict. Run: fuzz_safetensors CORPUS_COPY tests/fuzz/corpus/safetensors
//   -dict=tests/fuzz/safetensors.dict -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <string>

#include "io/safetensors.h"

namespace {

void require(bool cond) {
  if (!cond) __builtin_trap();
}

void check_error(const strata::Status& s) {
  require(!s.ok());
  require(s.message().rfind("fuzz: ", 0) == 0);
  require(s.message().find('\n') == std::string::npos);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = strata::SafetensorsFile::parse(data, size, "fuzz");
  if (!file.ok()) {
    check_error(file.status());
    return 0;
  }
  const strata::SafetensorsFile& f = **file;
  require(f.data_offset() + f.data_bytes() == size);
  volatile uint8_t sink = 0;
  for (const std::string& name : f.names()) {
    const strata::SafetensorsEntry* e = f.find(name);
    require(e != nullptr && e->begin <= e->end && e->end <= f.data_bytes());
    auto buf = f.buffer(name);
    require(buf.ok() && buf->bytes() == e->bytes());
    if (buf->bytes() > 0) {  // ASan flags these reads if the range left the input
      sink = sink ^ buf->as<uint8_t>()[0] ^ buf->as<uint8_t>()[buf->bytes() - 1];
    }
    auto t = f.tensor(name);
    if (!t.ok()) {
      check_error(t.status());
      continue;
    }
    require(t->nbytes() == static_cast<int64_t>(e->bytes()) && t->is_contiguous());
    if (t->nbytes() > 0) {
      const auto* p = static_cast<const uint8_t*>(t->data);
      sink = sink ^ p[0] ^ p[t->nbytes() - 1];
    }
  }
  check_error(f.tensor("\x01 no such tensor").status());
  return 0;
}
