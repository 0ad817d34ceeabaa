// SBI-GeMM's register plumbing: which k each lane loads, and how loaded words become the A (weight)
// and B (token) fragments of mma.m16n8k16.row.col.f32.bf16.bf16.f32. Plain functions of uint32_t
// words, compiled for the device by sbi_gemm.cuh and for the host by tests/ops/
// test_sbi_fragments.cpp, which emulates a warp (loads, conversions, the mma's documented fragment
// layout) and checks the result against a plain dot product. No CUDA types here.
//
// mma.m16n8k16 fragments of lane (g = lane / 4, t = lane % 4) (PTX ISA "Matrix Fragments for
// mma.m16n8k16 with floating point type"; CUTLASS/CuTe SM80_16x8x16 traits say the same):
//   A (16 x 16, row): a[0] = A[g][2t, 2t+1]   a[1] = A[g+8][2t, 2t+1]
//                     a[2] = A[g][2t+8, 2t+9] a[3] = A[g+8][2t+8, 2t+9]
//   B (16 x 8, col):  b[0] = B[2t, 2t+1][g]   b[1] = B[2t+8, 2t+9][g]
//   C/D (16 x 8):     c[0] = D[g][2t]  c[1] = D[g][2t+1]  c[2] = D[g+8][2t]  c[3] = D[g+8][2t+1]
// (two bf16 per 32-bit register, the lower k in the low half).
//
// The k permutation. The mma sums over its 16 k in any order as long as A and B agree, so the
// 16 "positions" of a k-step need not be 16 consecutive k: each lane takes its A words straight
// from coalesced 16-byte loads of a weight row, and loads x at the same k.
//   bf16 weights: a chunk is 64 k. Lane t loads two 16-byte pieces j = 0, 1 of each of its rows,
//     elements [32j + 8t, +8) of the chunk (one warp load = 8 rows x 64 contiguous bytes). k-step
//     s (0..3) uses piece s/2, words 2(s%2) (positions 2t, 2t+1) and 2(s%2)+1 (positions 2t+8,
//     2t+9). x is loaded the same way: token g's elements [32j + 8t, +8) of the chunk.
//   8-bit weights: a chunk is 128 k; piece j is elements [64j + 16t, +16) (16 weights), k-step
//     s (0..7) uses word s%4 of piece s/4 = elements e0..e3 at k 4(s%4) + 0..3 of the piece. The
//     int8/fp8 -> bf16 conversions below yield the pairs {e0, e2} (positions 2t, 2t+1) and
//     {e1, e3} (positions 2t+8, 2t+9), so the x words are shuffled to match with one prmt each.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define STRATA_SBI_HD __host__ __device__ __forceinline__
#else
#define STRATA_SBI_HD inline
#endif

namespace strata::cuda::sbi {

// Weight formats the kernel reads.
enum class WFormat { kBf16, kI8, kFp8 };

// Chunk geometry per weight element size (see the file comment).
template <WFormat F>
struct Geometry {
  static constexpr int kElemBytes = F == WFormat::kBf16 ? 2 : 1;
  static constexpr int kPiece = 16 / kElemBytes;  // weights per 16-byte load
  static constexpr int kChunk = 8 * kPiece;       // k per chunk: 4 lanes x 2 pieces
  static constexpr int kSteps = kChunk / 16;      // mma k-steps per chunk
  static constexpr int kXWords = kPiece / 2;      // 32-bit words of x per piece (bf16 pairs)
};

// First k, within its chunk, of piece j (0 or 1) of lane t (= lane % 4).
template <WFormat F>
STRATA_SBI_HD int piece_k(int j, int t) {
  return j * (Geometry<F>::kChunk / 2) + t * Geometry<F>::kPiece;
}

STRATA_SBI_HD uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, sel);
#else
  const uint64_t v = static_cast<uint64_t>(b) << 32 | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t s = (sel >> (4 * i)) & 7u;
    r |= static_cast<uint32_t>((v >> (8 * s)) & 0xffu) << (8 * i);
  }
  return r;
#endif
}

STRATA_SBI_HD float bits_to_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

STRATA_SBI_HD uint32_t f32_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

// Both bf16 halves of `v` times 2^120, exactly (also for bf16 subnormals: bf16 fma keeps them).
STRATA_SBI_HD uint32_t bf16x2_times_2pow120(uint32_t v) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  // + (-0): x * 2^120 + -0 is x * 2^120, including the sign of zero.
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(v), "r"(0x7b807b80u), "r"(0x80008000u));
  return r;
#else
  uint32_t r = 0;
  for (int h = 0; h < 2; ++h) {
    const float x = bits_to_f32(((v >> (16 * h)) & 0xffffu) << 16) * 0x1p120f;
    r |= (f32_to_bits(x) >> 16) << (16 * h);  // exact: at most 4 significant bits
  }
  return r;
#endif
}

// Four int8 weights (e0 in the low byte) -> bf16 pairs lo = {e0, e2}, hi = {e1, e3}, exactly:
// (q + 128) goes into the mantissa of 2^23 (a prmt), minus 2^23 + 128 leaves q as an f32 whose
// low 16 bits are zero, so its high half is the bf16 value.
STRATA_SBI_HD void i8x4_to_bf16(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t u = w ^ 0x80808080u;  // q + 128 in every byte
  constexpr uint32_t kTwo23 = 0x4b000000u;
  constexpr float kMagic = 8388736.0f;  // 2^23 + 128
  const float f0 = bits_to_f32(prmt(u, kTwo23, 0x7650)) - kMagic;
  const float f1 = bits_to_f32(prmt(u, kTwo23, 0x7651)) - kMagic;
  const float f2 = bits_to_f32(prmt(u, kTwo23, 0x7652)) - kMagic;
  const float f3 = bits_to_f32(prmt(u, kTwo23, 0x7653)) - kMagic;
  lo = prmt(f32_to_bits(f0), f32_to_bits(f2), 0x7632);
  hi = prmt(f32_to_bits(f1), f32_to_bits(f3), 0x7632);
}

// Four fp8 e4m3 weights -> bf16 pairs lo = {e0, e2}, hi = {e1, e3}, exactly. The e4m3 bits
// s.eeee.mmm of bytes 1 and 3 land in bf16 halves as s.0000eeee.mmm0000 (one and, one shift,
// one or): the bf16 exponent field holds e biased by 127 instead of 7, so the value is the e4m3
// value * 2^-120, subnormals included; the fma by 2^120 restores it. NaN (0x7f) becomes 480, a
// finite value: quantized weights never hold NaN.
STRATA_SBI_HD void fp8x4_to_bf16(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t w8 = w << 8;  // bytes 0, 2 move to 1, 3
  hi = (w & 0x80008000u) | ((w & 0x7f007f00u) >> 4);
  lo = (w8 & 0x80008000u) | ((w8 & 0x7f007f00u) >> 4);
  lo = bf16x2_times_2pow120(lo);
  hi = bf16x2_times_2pow120(hi);
}

// A fragment half for k-step s from one row's two pieces (4 words each for bf16, 4 words = 16
// bytes of 8-bit weights): lo = positions (2t, 2t+1), hi = positions (2t+8, 2t+9).
template <WFormat F>
STRATA_SBI_HD void a_pair(const uint32_t (&piece)[2][4], int s, uint32_t& lo, uint32_t& hi) {
  if constexpr (F == WFormat::kBf16) {
    lo = piece[s / 2][2 * (s % 2)];
    hi = piece[s / 2][2 * (s % 2) + 1];
  } else if constexpr (F == WFormat::kI8) {
    i8x4_to_bf16(piece[s / 4][s % 4], lo, hi);
  } else {
    fp8x4_to_bf16(piece[s / 4][s % 4], lo, hi);
  }
}

// B fragment for k-step s from one token's two x pieces (kXWords words each): b[0] (positions
// 2t, 2t+1) and b[1] (positions 2t+8, 2t+9), in the order a_pair produced.
template <WFormat F>
STRATA_SBI_HD void b_pair(const uint32_t (&x)[2][Geometry<F>::kXWords], int s, uint32_t& b0,
                          uint32_t& b1) {
  if constexpr (F == WFormat::kBf16) {
    b0 = x[s / 2][2 * (s % 2)];
    b1 = x[s / 2][2 * (s % 2) + 1];
  } else {
    const uint32_t x01 = x[s / 4][2 * (s % 4)];      // {x0, x1}
    const uint32_t x23 = x[s / 4][2 * (s % 4) + 1];  // {x2, x3}
    b0 = prmt(x01, x23, 0x5410);                     // {x0, x2}
    b1 = prmt(x01, x23, 0x7632);                     // {x1, x3}
  }
}

}  // namespace strata::cuda::sbi
