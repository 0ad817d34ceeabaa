// The int8 GEMM micro-kernel on AMX tiles (Intel Sapphire Rapids and later: AMX-TILE, AMX-INT8),
// same contract and same result bits as the AVX512-VNNI one (quant_gemm_i8_avx512.inc).
//
// The packed panel of a 32-group is already AMX's B layout: 8 rows (the group's quads) of 64
// bytes, 16 output rows x 4 consecutive values each (quant_impl.h), and the 8 tokens' 32
// activation bytes of the group are an A tile of 8 rows (stride: the activation row). One
// tdpbsud (signed activation bytes x unsigned weight bytes, i32 sums) gives the group's 8 x 16
// integer dots; they are stored and scaled in 512-bit registers exactly as the VNNI kernel does
// (f += f32(isum) * (dw * d_a), then f += cw * s_a), so only the integer products moved: the
// output bits are the VNNI kernel's. Two groups per pass (tiles 0-1 C, 2-3 A, 4-5 B).
// Opt-in (STRATA_CPU_AMX=1): on the one Xeon measured its GEMM sections were ~20% slower than the
// VNNI kernel's. An 8 x 16 x 32 product per tdpbsud uses a fraction of a tile, and each group's
// sums go through memory (tilestored, then 512-bit loads) to be scaled; bigger tiles (16 tokens,
// several 16-row panels per pass) are the next step.
//
// Linux hands out the tile data state only on request (arch_prctl ARCH_REQ_XCOMP_PERM, once per
// process: request_tile_data, on the kernel's first pick; cpu_features.cpp finds the hardware);
// each thread loads the tile configuration once before its first use.
#include "backends/cpu/quant_impl.h"

#if defined(STRATA_QUANT_HAVE_AVX512) && defined(__linux__)

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define STRATA_AMX                                                                 \
  __attribute__((                                                                  \
      target("amx-tile,amx-int8,avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl," \
             "avx512vnni")))

namespace strata::cpu::quant_detail::amx {
namespace {

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

STRATA_AMX void configure_tiles() {
  thread_local bool configured = false;
  if (configured) return;
  TileConfig cfg{};
  cfg.palette_id = 1;
  for (int i = 0; i < 2; ++i) {
    cfg.rows[i] = kGemmTokens;  // C: tokens x 16 rows of i32
    cfg.colsb[i] = kGemmRows * 4;
    cfg.rows[2 + i] = kGemmTokens;  // A: tokens x 32 activation bytes
    cfg.colsb[2 + i] = 32;
    cfg.rows[4 + i] = 8;  // B: 8 quads x (16 rows x 4 bytes)
    cfg.colsb[4 + i] = kGemmRows * 4;
  }
  _tile_loadconfig(&cfg);
  configured = true;
}

// f[t] += f32(s[t]) * (dw * d_a[t]) + cw * s_a[t] for group g: the VNNI kernel's operations.
STRATA_AMX inline void scale_group(const int32_t (*s)[kGemmRows], int64_t g, const float* wd,
                                   const float* wc, const float* ad, const float* as,
                                   int64_t ad_stride, __m512* f) {
  const __m512 dw = _mm512_loadu_ps(wd + g * kGemmRows);
  const __m512 cw = _mm512_loadu_ps(wc + g * kGemmRows);
  for (int t = 0; t < kGemmTokens; ++t) {
    const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(ad[t * ad_stride + g]));
    const __m512 isum = _mm512_cvtepi32_ps(_mm512_load_si512(s[t]));
    f[t] = _mm512_fmadd_ps(isum, scale, f[t]);
    f[t] = _mm512_fmadd_ps(cw, _mm512_set1_ps(as[t * ad_stride + g]), f[t]);
  }
}

STRATA_AMX void gemm_micro_amx(int64_t ng, const uint8_t* wq, const float* wd, const float* wc,
                               const int8_t* aq, int64_t a_stride, const float* ad, const float* as,
                               int64_t ad_stride, float* c) {
  configure_tiles();
  constexpr int64_t kGroupBytes = 8 * kGemmRows * 4;  // one group's packed weights
  __m512 f[kGemmTokens];
  for (int t = 0; t < kGemmTokens; ++t) f[t] = _mm512_setzero_ps();
  alignas(64) int32_t s0[kGemmTokens][kGemmRows];
  alignas(64) int32_t s1[kGemmTokens][kGemmRows];
  int64_t g = 0;
  for (; g + 2 <= ng; g += 2) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_loadd(2, aq + 32 * g, a_stride);
    _tile_loadd(3, aq + 32 * (g + 1), a_stride);
    _tile_loadd(4, wq + g * kGroupBytes, kGemmRows * 4);
    _tile_loadd(5, wq + (g + 1) * kGroupBytes, kGemmRows * 4);
    _tile_dpbsud(0, 2, 4);
    _tile_dpbsud(1, 3, 5);
    _tile_stored(0, s0, kGemmRows * 4);
    _tile_stored(1, s1, kGemmRows * 4);
    scale_group(s0, g, wd, wc, ad, as, ad_stride, f);
    scale_group(s1, g + 1, wd, wc, ad, as, ad_stride, f);
  }
  if (g < ng) {
    _tile_zero(0);
    _tile_loadd(2, aq + 32 * g, a_stride);
    _tile_loadd(4, wq + g * kGroupBytes, kGemmRows * 4);
    _tile_dpbsud(0, 2, 4);
    _tile_stored(0, s0, kGemmRows * 4);
    scale_group(s0, g, wd, wc, ad, as, ad_stride, f);
  }
  for (int t = 0; t < kGemmTokens; ++t) _mm512_storeu_ps(c + t * kGemmRows, f[t]);
}

}  // namespace

bool request_tile_data() {
  // ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18).
  return ::syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

GemmI8MicroFn gemm_i8_micro() {
  return gemm_micro_amx;
}

}  // namespace strata::cpu::quant_detail::amx

#endif  // STRATA_QUANT_HAVE_AVX512 && __linux__
