// libFuzzer target: GgufFile::parse on arbitrary bytes, then touch every key and tensor the
// way a loader would (typed getters, array conversions, tensor views, reading each tensor's
// first and last byte). Any crash, sanitizer report or hang is a bug in the reader.
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc \
//     tests/fuzz/fuzz_gguf.cpp src/io/gguf.cpp src/core/*.cpp -lfmt -o fuzz_gguf
//   ./fuzz_gguf tests/fuzz/corpus/gguf -max_total_time=60
#include <cstddef>
#include <cstdint>

#include "io/gguf.h"

namespace {

volatile uint64_t g_sink;

void touch_value(const strata::GgufValue& v) {
  g_sink = g_sink + v.to_string(4).size() + v.raw_items().size() + v.as_strings().size();
  const size_t n = v.array_size();
  if (n > 0) g_sink = g_sink + v.item(0).to_string().size() + v.item(n - 1).to_string().size();
  for (const strata::GgufValue& e : v.as_array()) touch_value(e);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = strata::GgufFile::parse(data, size, "fuzz.gguf");
  if (!r.ok()) {
    g_sink = g_sink + r.status().message().size();
    return 0;
  }
  const strata::GgufFile& f = r.value();
  for (const strata::GgufKv& kv : f.metadata()) {
    touch_value(kv.value);
    g_sink = g_sink + f.get_u32(kv.key).ok() + f.get_int(kv.key).ok() + f.get_float(kv.key).ok() +
             f.get_string(kv.key).ok() + f.get_bool(kv.key).ok();
    if (auto s = f.get_string_array(kv.key); s.ok()) g_sink = g_sink + s->size();
    if (auto a = f.get_int_array(kv.key); a.ok()) g_sink = g_sink + a->size();
    if (auto a = f.get_f32_array(kv.key); a.ok()) g_sink = g_sink + a->size();
    if (auto a = f.get_i32_array(kv.key); a.ok()) g_sink = g_sink + a->size();
  }
  for (const strata::GgufTensorInfo& info : f.tensor_infos()) {
    if (info.bytes > 0) {
      const uint8_t* p = f.tensor_data(info);
      g_sink = g_sink + p[0] + p[info.bytes - 1];
    }
    auto t = f.tensor(info.name);
    if (t.ok()) {
      g_sink = g_sink + static_cast<uint64_t>(t->nbytes()) + t->shape_string().size();
      if (static_cast<uint64_t>(t->nbytes()) != info.bytes) __builtin_trap();
    }
  }
  return 0;
}
