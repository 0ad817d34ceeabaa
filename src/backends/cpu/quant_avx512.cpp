// AVX-512 kernels for the quantized dot products: the int8-activation tiles (every block type),
// the activation quantizer, and the int16-activation decode kernels of the 32-value block types.
// The kernels themselves are in quant_avx512_kernels.inc, which this file includes twice:
//   quant_detail::avx512       AVX-512 F/BW/DQ/VL: u8 x i8 products by vpmaddubsw + vpmaddwd
//   quant_detail::avx512_vnni  the same plus AVX512-VNNI: one vpdpbusd per 64 byte pairs
// Each copy's functions carry its own __attribute__((target(...))), so the file builds without
// -mavx512f and quant.cpp calls a copy only after cpu_features.cpp has found the features; the
// copy without VNNI is compiled without it, so no VNNI instruction can reach a CPU that lacks it.
// What each kernel computes (and the summation-order-only difference from the scalar kernels of
// quant.cpp) is described in the .inc file.
#include "backends/cpu/quant_impl.h"

#if defined(STRATA_QUANT_HAVE_AVX512)

// NOTE: GCC 12's avx512fintrin.h initializes its "undefined" vectors from themselves, which
// -Wuninitialized reports at every use; the warning is about the header, not this code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#define STRATA_Q512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl")))
#define STRATA_Q512_VNNI 0
#define STRATA_Q512_NS avx512
#include "backends/cpu/quant_avx512_kernels.inc"
#undef STRATA_Q512
#undef STRATA_Q512_VNNI
#undef STRATA_Q512_NS

#define STRATA_Q512 \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))
#define STRATA_Q512_VNNI 1
#define STRATA_Q512_NS avx512_vnni
#include "backends/cpu/quant_avx512_kernels.inc"
#undef STRATA_Q512
#undef STRATA_Q512_VNNI
#undef STRATA_Q512_NS

#endif  // STRATA_QUANT_HAVE_AVX512
