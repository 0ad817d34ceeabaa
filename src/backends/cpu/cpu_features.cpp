// Which SIMD variants of the CPU kernels this machine can run, detected once per process.
// __builtin_cpu_supports also checks that the OS saves the wider registers (XCR0).
// STRATA_CPU_ISA (core/env.h) caps what is reported, for A/B runs on one machine.
#include <string>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/quant.h"
#include "core/env.h"
#include "strata/engine.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace strata::cpu {
namespace {

struct CpuFeatures {
  bool avx2 = false;         // avx2 + fma + f16c
  bool avx512 = false;       // avx512f/bw/dq/vl on top of avx2
  bool avx512_vnni = false;  // avx512_vnni on top of avx512
  bool amx_int8 = false;     // amx-tile + amx-int8 on top of avx512_vnni, tile state in XCR0
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
  // CPUID leaf 7 ECX bit 11 (the XCR0 check for the zmm state is part of f.avx512).
  unsigned a7 = 0, b7 = 0, c7 = 0, d7 = 0;
  f.avx512_vnni =
      f.avx512 && __get_cpuid_count(7, 0, &a7, &b7, &c7, &d7) != 0 && ((c7 >> 11) & 1u) != 0;
  // Leaf 7 EDX bits 24 (AMX-TILE) and 25 (AMX-INT8), and the OS's XCR0 bits 17 (XTILECFG) and 18
  // (XTILEDATA). Linux still hands the tile data to a process only on request (the AMX kernel's
  // first use, quant_gemm_i8.cpp).
  if (f.avx512_vnni && ((d7 >> 24) & 3u) == 3u) {
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    f.amx_int8 = ((lo >> 17) & 3u) == 3u;
  }
#endif
  // The cap: each level keeps only what it names and below.
  const std::string& cap = env_config().cpu_isa;
  if (cap == "scalar") f.avx2 = false;
  if (cap == "scalar" || cap == "avx2") f.avx512 = false;
  if (cap == "scalar" || cap == "avx2" || cap == "avx512") f.avx512_vnni = false;
  f.amx_int8 = f.amx_int8 && f.avx512_vnni;
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

bool cpu_has_avx512_vnni() {
  return features().avx512_vnni;
}

bool cpu_has_amx_int8() {
  return features().amx_int8;
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
  s += cpu::cpu_supports(CpuIsa::kAvx512) ? "avx512f/bw/dq/vl; " : "no avx512f/bw/dq/vl; ";
  s += cpu::cpu_has_avx512_vnni() ? "avx512_vnni; " : "no avx512_vnni; ";
  s += "block-quant ";
  s += cpu::quant_isa_name(cpu::quant_best_isa());
  s += "; prefill ";
  s += cpu::quant_prefill_path();
  s += "; decode ";
  s += cpu::quant_decode_path();
  s += ")";
  return s;
}

}  // namespace strata
