// Which SIMD variants of the CPU kernels this machine can run, detected once per process.
// __builtin_cpu_supports also checks that the OS saves the wider registers (XCR0).
#include <string>

#include "backends/cpu/cpu_kernels.h"
#include "strata/engine.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace strata::cpu {
namespace {

struct CpuFeatures {
  bool avx2 = false;    // avx2 + fma + f16c
  bool avx512 = false;  // avx512f/bw/dq/vl on top of avx2
};

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // NOTE: clang's __builtin_cpu_supports does not know "f16c"; cpuid leaf 1 ECX says it.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  f.avx512 = f.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#endif
  return f;
}

const CpuFeatures& features() {
  static const CpuFeatures kFeatures = detect();
  return kFeatures;
}

}  // namespace

bool cpu_supports(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return true;
    case CpuIsa::kAvx2:
      return features().avx2;
    case CpuIsa::kAvx512:
      return features().avx512;
  }
  return false;
}

CpuIsa best_cpu_isa() {
  if (cpu_supports(CpuIsa::kAvx512)) return CpuIsa::kAvx512;
  if (cpu_supports(CpuIsa::kAvx2)) return CpuIsa::kAvx2;
  return CpuIsa::kScalar;
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

}  // namespace strata::cpu

namespace strata {

std::string cpu_kernel_path() {
  using cpu::CpuIsa;
  std::string s = cpu::cpu_isa_name(cpu::best_cpu_isa());
  s += cpu::cpu_supports(CpuIsa::kAvx2) ? " (avx2 fma f16c; " : " (no avx2/fma/f16c; ";
  s += cpu::cpu_supports(CpuIsa::kAvx512) ? "avx512f/bw/dq/vl)" : "no avx512f/bw/dq/vl)";
  return s;
}

}  // namespace strata
