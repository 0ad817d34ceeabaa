// The int8 GEMM micro-kernel for AVX-512 CPUs (quant_gemm_i8_avx512.inc), two copies as in
// quant_avx512.cpp: quant_detail::avx512 (F/BW/DQ/VL: vpmaddubsw + vpmaddwd, 4- and 5-bit
// types) and quant_detail::avx512_vnni (vpdpbusd, Q8_0 too). Each copy carries its own target
// attribute, so the file builds without -mavx512f and runs only where cpu_features.cpp found
// the features.
#include <cstring>

#include "backends/cpu/quant_impl.h"

#if defined(STRATA_QUANT_HAVE_AVX512)

// NOTE: see quant_avx512.cpp (GCC 12's avx512fintrin.h and -Wuninitialized).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#define STRATA_Q512_PRAGMA_(x) _Pragma(#x)
#define STRATA_Q512_UNROLL STRATA_Q512_PRAGMA_(GCC unroll 8)

#define STRATA_Q512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl")))
#define STRATA_Q512_VNNI 0
#define STRATA_Q512_NS avx512
#include "backends/cpu/quant_gemm_i8_avx512.inc"
#undef STRATA_Q512
#undef STRATA_Q512_VNNI
#undef STRATA_Q512_NS

#define STRATA_Q512 \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))
#define STRATA_Q512_VNNI 1
#define STRATA_Q512_NS avx512_vnni
#include "backends/cpu/quant_gemm_i8_avx512.inc"
#undef STRATA_Q512
#undef STRATA_Q512_VNNI
#undef STRATA_Q512_NS

#endif  // STRATA_QUANT_HAVE_AVX512
