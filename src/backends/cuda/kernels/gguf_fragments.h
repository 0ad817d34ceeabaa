// GGUF block formats on the GPU: the device row layout, the values the kernels compute from it,
// and each lane's share of a 256-value chunk as mma.m16n8k16 A fragments. Plain functions of
// uint32_t words (no CUDA types), compiled for the device by gguf_gemv.cuh and for the host by
// tests/ops/test_gguf_fragments.cpp, which emulates a warp against the scalar twin
// (cpu::gguf_row_to_bf16).
//
// Device row layout (the same bytes per row as the GGUF file, dtype_bytes(dt, k); rows stay
// independent, so row blocks of one format concatenate as bytes):
//   Q4_K, Q5_K  the GGUF blocks unchanged (144 / 176 bytes: 16-byte aligned whenever the row is).
//   Q8_0        [qs: k int8][d: k/32 f16]: the 34-byte blocks split into their quants and scales
//   Q4_0        [qs: k/2 bytes, block b's 16 at 16 b][d: k/32 f16] (18-byte blocks split)
//   Q6_K        [ql 128 | qh 64 per super-block][scales: 16 int8 per super-block][d: f16 per
//               super-block] (210-byte blocks split)
// (the 34-, 18- and 210-byte blocks are not 16-byte aligned, which the weight-streaming kernel
// needs; gguf_pack_row in backends/cpu/gguf_device.cpp moves their bytes, losslessly).
//
// Values: weight e of a row is w = bf16_rn(q * S - M) with one rounding (fma.rn.bf16x2), where q
// is the integer quant (exact in bf16) and S, M are the group scale and min rounded once to bf16:
//   Q8_0  q = qs (int8)      S = bf16(d)              M = 0     (group 32)
//   Q4_0  q = nibble - 8     S = bf16(d)              M = 0     (group 32)
//   Q4_K  q = nibble         S = bf16(d * sc_j)       M = bf16(dmin * m_j)   (group 32)
//   Q5_K  q = nibble | b<<4  S = bf16(d * sc_j)       M = bf16(dmin * m_j)   (group 32)
//   Q6_K  q = v - 32         S = bf16(d * sc[e/16])   M = 0     (group 16)
// (d * sc is exact in f32: an f16 times a 6- or 8-bit integer). The decode kernel, the prefill
// dequantizer and the CPU twin all produce exactly these bf16 weights; the dot products then
// accumulate in f32 as for bf16 weights. Against the f32 dequantization the weights move by at
// most ~2^-8 relative (scale rounding + weight rounding), like the old dequantize-to-bf16 path.
//
// Lane share of chunk c (256 values of a row): lane (g, t) loads kLoads 16-byte words of rows g
// and g + 8 and covers 4 runs of 16 consecutive k (run_k), 64 values; k-step s (0..15) of the
// chunk uses run s / 4, elements 4 (s % 4) + 0..3 = e0..e3, as the A pairs lo = {e0, e2}
// (positions 2t, 2t+1) and hi = {e1, e3} (positions 2t+8, 2t+9); the x words are shuffled the
// same way (b_pair). The mma sums its 16 positions in any order, and the scales are inside the
// weights, so which k a lane takes is free as long as A and B agree.
#pragma once

#include <cstdint>

#include "backends/cuda/kernels/sbi_fragments.h"
#include "strata/types.h"

#include <cmath>

#include "core/half.h"
#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

namespace strata::cuda::gguf {

using sbi::bits_to_f32;
using sbi::f32_to_bits;
using sbi::prmt;

constexpr int kChunk = 256;  // values per chunk (a K-quant super-block, 8 Q8_0 / Q4_0 blocks)
constexpr int kSteps = 16;   // mma k-steps per chunk
constexpr int kRuns = 4;     // runs of 16 consecutive k per lane and chunk

// The formats with a device kernel.
STRATA_SBI_HD constexpr bool gpu_format(DType dt) {
  return dt == DType::kQ8_0 || dt == DType::kQ4_0 || dt == DType::kQ4_K || dt == DType::kQ5_K ||
         dt == DType::kQ6_K;
}

STRATA_SBI_HD float f16_bits_to_f32(uint32_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h & 0xffffu)));
#else
  return f16_to_f32(static_cast<uint16_t>(h & 0xffffu));
#endif
}

// f32 -> bf16 bits, round to nearest even (scales are finite).
STRATA_SBI_HD uint32_t bf16_rn(float f) {
  uint32_t u = f32_to_bits(f);
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}

STRATA_SBI_HD uint32_t bf16x2_splat(uint32_t h) {
  return h | (h << 16);
}

#if !defined(__CUDA_ARCH__)
// The bf16 nearest (ties to even) to a double: RNE to a multiple of the bf16 ulp of v's binade
// (the magic-number add), then exact in f32.
inline uint32_t bf16_from_double(double v) {
  if (v == 0.0) return std::signbit(v) ? 0x8000u : 0u;
  int e = std::ilogb(v);
  if (e < -126) e = -126;                        // bf16 subnormals: ulp 2^-133
  const double magic = std::ldexp(1.5, e + 45);  // 1.5 * 2^52 * ulp, ulp = 2^(e - 7)
  volatile double y = v + magic;
  y = y - magic;
  return bf16_rn(static_cast<float>(y));  // exact: at most 8 significant bits
}
#endif

// fma.rn.bf16x2: a * b + c per half, rounded once.
STRATA_SBI_HD uint32_t fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
#else
  uint32_t r = 0;
  for (int h = 0; h < 2; ++h) {
    const auto half = [h](uint32_t v) {
      return static_cast<double>(bits_to_f32(((v >> (16 * h)) & 0xffffu) << 16));
    };
    r |= bf16_from_double(half(a) * half(b) + half(c)) << (16 * h);
  }
  return r;
#endif
}

constexpr uint32_t kOne2 = 0x3f803f80u;      // {1, 1}
constexpr uint32_t kNegZero2 = 0x80008000u;  // {-0, -0}

// {128 + v0, 128 + v2}, {128 + v1, 128 + v3} from bytes v0..v3 < 128 of `v` (exact bf16: 0x43
// is 128 with 7 mantissa bits for v), then minus `off` (bf16x2 {-off, -off}, exact).
STRATA_SBI_HD void small_to_bf16(uint32_t v, uint32_t neg_off, uint32_t& lo, uint32_t& hi) {
  lo = fma_bf16x2((v & 0x00ff00ffu) | 0x43004300u, kOne2, neg_off);
  hi = fma_bf16x2(((v >> 8) & 0x00ff00ffu) | 0x43004300u, kOne2, neg_off);
}

// Byte b (runtime) of a 32-bit word.
STRATA_SBI_HD uint32_t byte_of(uint32_t w, int b) {
  return (w >> (8 * b)) & 0xffu;
}

// Q4_K / Q5_K 6-bit scale and min of sub-block j (0..7) from the 12 scale bytes in words s0..s2.
STRATA_SBI_HD void k_scale_min(uint32_t s0, uint32_t s1, uint32_t s2, int j, uint32_t& sc,
                               uint32_t& m) {
  if (j < 4) {
    sc = byte_of(s0, j) & 63u;
    m = byte_of(s1, j) & 63u;
  } else {
    sc = (byte_of(s2, j - 4) & 0x0fu) | ((byte_of(s0, j - 4) >> 6) << 4);
    m = (byte_of(s2, j - 4) >> 4) | ((byte_of(s1, j - 4) >> 6) << 4);
  }
}

// S and {-M, -M} of a group as bf16x2.
STRATA_SBI_HD void scale_min(float s, float m, uint32_t& S, uint32_t& M) {
  S = bf16x2_splat(bf16_rn(s));
  M = bf16x2_splat(bf16_rn(m)) ^ 0x80008000u;
}

template <DType F>
struct Lane;

// Q4_K: header (d, dmin, scales[12]) at 0, qs[128] at 16. Lane t takes pieces p = t, t + 4 (16
// qs bytes each: pair i = p / 2, half h = p % 2); run r = piece r / 2, low (r even) or high
// nibbles, sub-block j = 2 i + r % 2, k = 64 i + 32 (r % 2) + 16 h + byte.
template <>
struct Lane<DType::kQ4_K> {
  static constexpr int kLoads = 3;
  static constexpr bool kD16 = false;
  static constexpr int kBlockBytes = 144;
  STRATA_SBI_HD static int64_t load_offset(int64_t /*k*/, int64_t c, int t, int l) {
    return c * kBlockBytes + (l == 0 ? 0 : 16 + 16 * (t + 4 * (l - 1)));
  }
  STRATA_SBI_HD static int64_t d16_offset(int64_t, int64_t) { return 0; }
  STRATA_SBI_HD static int piece(int t, int r) { return t + 4 * (r / 2); }
  STRATA_SBI_HD static int run_k(int t, int r) {
    const int p = piece(t, r);
    return 64 * (p / 2) + 32 * (r % 2) + 16 * (p % 2);
  }
  STRATA_SBI_HD static void scales(const uint32_t (&w)[kLoads][4], uint32_t, int t, int r,
                                   uint32_t& S, uint32_t& M) {
    const int j = 2 * (piece(t, r) / 2) + r % 2;
    uint32_t sc, m;
    k_scale_min(w[0][1], w[0][2], w[0][3], j, sc, m);
    scale_min(f16_bits_to_f32(w[0][0]) * static_cast<float>(sc),
              f16_bits_to_f32(w[0][0] >> 16) * static_cast<float>(m), S, M);
  }
  STRATA_SBI_HD static void a_pair(const uint32_t (&w)[kLoads][4], uint32_t S, uint32_t M, int s,
                                   uint32_t& lo, uint32_t& hi) {
    const int r = s / 4;
    const uint32_t v = (w[1 + r / 2][s % 4] >> (4 * (r % 2))) & 0x0f0f0f0fu;
    small_to_bf16(v, 0xc300c300u, lo, hi);  // q exactly
    lo = fma_bf16x2(lo, S, M);
    hi = fma_bf16x2(hi, S, M);
  }
};

// Q5_K: header at 0, qh[32] at 16, qs[128] at 48; as Q4_K plus the fifth bit of value l of
// sub-block j: bit j of qh[l] (l = 16 h + byte for the lane's pieces, both of half h = t % 2).
template <>
struct Lane<DType::kQ5_K> {
  static constexpr int kLoads = 4;
  static constexpr bool kD16 = false;
  static constexpr int kBlockBytes = 176;
  STRATA_SBI_HD static int64_t load_offset(int64_t /*k*/, int64_t c, int t, int l) {
    const int64_t b = c * kBlockBytes;
    return l == 0 ? b : l == 1 ? b + 16 + 16 * (t % 2) : b + 48 + 16 * (t + 4 * (l - 2));
  }
  STRATA_SBI_HD static int64_t d16_offset(int64_t, int64_t) { return 0; }
  STRATA_SBI_HD static int run_k(int t, int r) { return Lane<DType::kQ4_K>::run_k(t, r); }
  STRATA_SBI_HD static void scales(const uint32_t (&w)[kLoads][4], uint32_t, int t, int r,
                                   uint32_t& S, uint32_t& M) {
    const int j = 2 * (Lane<DType::kQ4_K>::piece(t, r) / 2) + r % 2;
    uint32_t sc, m;
    k_scale_min(w[0][1], w[0][2], w[0][3], j, sc, m);
    scale_min(f16_bits_to_f32(w[0][0]) * static_cast<float>(sc),
              f16_bits_to_f32(w[0][0] >> 16) * static_cast<float>(m), S, M);
  }
  // The sub-block j of run r depends on t: its qh bit comes in through `j`.
  STRATA_SBI_HD static void a_pair_j(const uint32_t (&w)[kLoads][4], uint32_t S, uint32_t M, int s,
                                     int j, uint32_t& lo, uint32_t& hi) {
    const int r = s / 4;
    const uint32_t nib = (w[2 + r / 2][s % 4] >> (4 * (r % 2))) & 0x0f0f0f0fu;
    const uint32_t hb = ((w[1][s % 4] >> j) & 0x01010101u) << 4;
    small_to_bf16(nib | hb, 0xc300c300u, lo, hi);
    lo = fma_bf16x2(lo, S, M);
    hi = fma_bf16x2(hi, S, M);
  }
};

// Q8_0 (split rows): qs at 0, d at k. Lane t takes the 16-byte pieces t + 4 u (u = run r) of the
// chunk's 256 qs bytes (block (t + 4 r) / 2) and the chunk's 8 scales (one 16-byte load).
template <>
struct Lane<DType::kQ8_0> {
  static constexpr int kLoads = 5;
  static constexpr bool kD16 = false;
  STRATA_SBI_HD static int64_t load_offset(int64_t k, int64_t c, int t, int l) {
    return l < 4 ? 256 * c + 16 * (t + 4 * l) : k + 16 * c;
  }
  STRATA_SBI_HD static int64_t d16_offset(int64_t, int64_t) { return 0; }
  STRATA_SBI_HD static int run_k(int t, int r) { return 16 * (t + 4 * r); }
  STRATA_SBI_HD static void scales(const uint32_t (&w)[kLoads][4], uint32_t, int t, int r,
                                   uint32_t& S, uint32_t& M) {
    // block 2 r + t / 2 of the chunk: word r, half t / 2
    S = bf16x2_splat(bf16_rn(f16_bits_to_f32(w[4][r] >> (16 * (t / 2)))));
    M = kNegZero2;
  }
  STRATA_SBI_HD static void a_pair(const uint32_t (&w)[kLoads][4], uint32_t S, uint32_t M, int s,
                                   uint32_t& lo, uint32_t& hi) {
    sbi::i8x4_to_bf16(w[s / 4][s % 4], lo, hi);
    lo = fma_bf16x2(lo, S, M);
    hi = fma_bf16x2(hi, S, M);
  }
};

// Q4_0 (split rows): qs at 0 (block b's 16 bytes at 16 b: value l < 16 the low nibble of byte l,
// value 16 + l the high one), d at k / 2. Lane t takes blocks t and t + 4 of the chunk's 8; run r
// = block t + 4 (r / 2), low (r even) or high nibbles: k = 32 b + 16 (r % 2) + byte.
template <>
struct Lane<DType::kQ4_0> {
  static constexpr int kLoads = 3;
  static constexpr bool kD16 = false;
  STRATA_SBI_HD static int64_t load_offset(int64_t k, int64_t c, int t, int l) {
    return l < 2 ? 128 * c + 16 * (t + 4 * l) : k / 2 + 16 * c;
  }
  STRATA_SBI_HD static int64_t d16_offset(int64_t, int64_t) { return 0; }
  STRATA_SBI_HD static int run_k(int t, int r) { return 32 * (t + 4 * (r / 2)) + 16 * (r % 2); }
  STRATA_SBI_HD static void scales(const uint32_t (&w)[kLoads][4], uint32_t, int t, int r,
                                   uint32_t& S, uint32_t& M) {
    // block b = t + 4 (r / 2): word b / 2 = 2 (r / 2) + t / 2, half b % 2 = t % 2
    const uint32_t word = t / 2 ? w[2][2 * (r / 2) + 1] : w[2][2 * (r / 2)];
    S = bf16x2_splat(bf16_rn(f16_bits_to_f32(word >> (16 * (t % 2)))));
    M = kNegZero2;
  }
  STRATA_SBI_HD static void a_pair(const uint32_t (&w)[kLoads][4], uint32_t S, uint32_t M, int s,
                                   uint32_t& lo, uint32_t& hi) {
    const int r = s / 4;
    const uint32_t v = (w[r / 2][s % 4] >> (4 * (r % 2))) & 0x0f0f0f0fu;
    small_to_bf16(v, 0xc308c308u, lo, hi);  // 128 + v - 136 = v - 8
    lo = fma_bf16x2(lo, S, M);
    hi = fma_bf16x2(hi, S, M);
  }
};

// Q6_K (split rows): [ql 128 | qh 64] per super-block at 192 c, scales at 192 nsb + 16 c, d at
// 208 nsb + 2 c. Element e = 128 h + 32 q + l takes its low 4 bits from ql[64 h + 32 (q & 1) + l]
// (nibble q >> 1) and its high 2 from bits 2q, 2q+1 of qh[32 h + l]; scale sc[e / 16]. Lane t
// takes h = t / 2, l in [16 (t % 2), +16): loads qlA = ql[64 h + 16 (t % 2), +16), qlB = the
// same + 32, qh[16 t, +16) and the scales; run r = q.
template <>
struct Lane<DType::kQ6_K> {
  static constexpr int kLoads = 4;
  static constexpr bool kD16 = true;
  STRATA_SBI_HD static int64_t load_offset(int64_t k, int64_t c, int t, int l) {
    const int64_t b = 192 * c;
    const int h = t / 2;
    switch (l) {
      case 0:
        return b + 64 * h + 16 * (t % 2);
      case 1:
        return b + 64 * h + 32 + 16 * (t % 2);
      case 2:
        return b + 128 + 16 * t;
      default:
        return 192 * (k / 256) + 16 * c;
    }
  }
  STRATA_SBI_HD static int64_t d16_offset(int64_t k, int64_t c) { return 208 * (k / 256) + 2 * c; }
  STRATA_SBI_HD static int run_k(int t, int r) { return 128 * (t / 2) + 32 * r + 16 * (t % 2); }
  STRATA_SBI_HD static void scales(const uint32_t (&w)[kLoads][4], uint32_t d16, int t, int r,
                                   uint32_t& S, uint32_t& M) {
    // sc[8 h + 2 r + t % 2]: word 2 h + r / 2, byte 2 (r % 2) + t % 2
    const uint32_t word = t / 2 ? w[3][2 + r / 2] : w[3][r / 2];
    const auto sc = static_cast<int8_t>(byte_of(word, 2 * (r % 2) + t % 2));
    S = bf16x2_splat(bf16_rn(f16_bits_to_f32(d16) * static_cast<float>(sc)));
    M = kNegZero2;
  }
  STRATA_SBI_HD static void a_pair(const uint32_t (&w)[kLoads][4], uint32_t S, uint32_t M, int s,
                                   uint32_t& lo, uint32_t& hi) {
    const int r = s / 4;
    const uint32_t nib = (w[r % 2][s % 4] >> (4 * (r / 2))) & 0x0f0f0f0fu;
    const uint32_t hb = ((w[2][s % 4] >> (2 * r)) & 0x03030303u) << 4;
    small_to_bf16(nib | hb, 0xc320c320u, lo, hi);  // 128 + v - 160 = v - 32
    lo = fma_bf16x2(lo, S, M);
    hi = fma_bf16x2(hi, S, M);
  }
};

// The A pair of k-step s for every format (Q5_K needs the run's sub-block for its qh bit).
template <DType F>
STRATA_SBI_HD void lane_a_pair(const uint32_t (&w)[Lane<F>::kLoads][4], uint32_t S, uint32_t M,
                               int s, int t, uint32_t& lo, uint32_t& hi) {
  if constexpr (F == DType::kQ5_K) {
    const int r = s / 4;
    const int j = 2 * (Lane<DType::kQ4_K>::piece(t, r) / 2) + r % 2;
    Lane<F>::a_pair_j(w, S, M, s, j, lo, hi);
  } else {
    Lane<F>::a_pair(w, S, M, s, lo, hi);
  }
}

// B fragment of k-step s from the run's 8 x words (16 bf16): elements 4 (s % 4) + 0..3 as
// b0 = {x0, x2}, b1 = {x1, x3}, matching lane_a_pair's lo / hi.
STRATA_SBI_HD void x_pair(const uint32_t (&xw)[8], int s, uint32_t& b0, uint32_t& b1) {
  const uint32_t x01 = xw[2 * (s % 4)];
  const uint32_t x23 = xw[2 * (s % 4) + 1];
  b0 = prmt(x01, x23, 0x5410);
  b1 = prmt(x01, x23, 0x7632);
}

}  // namespace strata::cuda::gguf
