// SBI-GeMM's fragment plumbing (src/backends/cuda/kernels/sbi_fragments.h) emulated on the host:
// one warp computes a 16-row x 8-token tile over all of k exactly as the kernel does (the same
// piece offsets, tail rule, A/B fragment assembly and int8/fp8 -> bf16 conversions), with the
// mma.m16n8k16 fragment layout of the PTX ISA, and the result must equal a plain dot product.
// All values are chosen so every product and sum is exact in double: any mismatch is a mapping
// or conversion bug, not rounding. Runs without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cuda/kernels/sbi_fragments.h"
#include "core/half.h"

namespace strata::cuda::sbi {
namespace {

constexpr int kRows = 16;
constexpr int kTokens = 8;

double bf16_bits(uint32_t h) {
  return bf16_to_f32(static_cast<uint16_t>(h & 0xffffu));
}

// Weight value of element (row, k) of the stored bytes.
template <WFormat F>
double weight_value(const std::vector<uint8_t>& w, int k_total, int row, int k) {
  const size_t i = static_cast<size_t>(row) * k_total + k;
  if constexpr (F == WFormat::kBf16) {
    uint16_t h;
    std::memcpy(&h, w.data() + 2 * i, 2);
    return bf16_to_f32(h);
  } else if constexpr (F == WFormat::kI8) {
    return static_cast<int8_t>(w[i]);
  } else {
    return fp8e4m3_to_f32(w[i]);
  }
}

// 16 bytes of a weight row starting at element k0, as the kernel loads them: whole pieces, a
// half piece of 8-bit weights when only 8 elements remain, zeros past k.
template <WFormat F>
void load_piece(const std::vector<uint8_t>& w, int k_total, int row, int k0, uint32_t (&out)[4]) {
  using G = Geometry<F>;
  uint8_t bytes[16] = {};
  int valid = 0;
  if (k0 + G::kPiece <= k_total) {
    valid = G::kPiece;
  } else if (G::kElemBytes == 1 && k0 + 8 <= k_total) {
    valid = 8;
  }
  std::memcpy(bytes, w.data() + (static_cast<size_t>(row) * k_total + k0) * G::kElemBytes,
              static_cast<size_t>(valid * G::kElemBytes));
  std::memcpy(out, bytes, 16);
}

// x elements [k0, k0 + kPiece) of one token as 32-bit words, zeros past k (x rows are whole
// multiples of 8 elements, so 16-byte loads are all or nothing).
template <WFormat F>
void load_x(const std::vector<uint16_t>& x, int k_total, int token, int k0,
            uint32_t (&out)[Geometry<F>::kXWords]) {
  uint16_t vals[Geometry<F>::kPiece] = {};
  for (int i = 0; i < Geometry<F>::kPiece; i += 8) {
    if (k0 + i + 8 <= k_total) {
      std::memcpy(vals + i, x.data() + static_cast<size_t>(token) * k_total + k0 + i, 16);
    }
  }
  std::memcpy(out, vals, sizeof(vals));
}

template <WFormat F>
void emulate_warp(const std::vector<uint8_t>& w, const std::vector<uint16_t>& x, int k_total,
                  double (&d)[kRows][kTokens]) {
  using G = Geometry<F>;
  std::memset(d, 0, sizeof(d));
  const int n_chunks = (k_total + G::kChunk - 1) / G::kChunk;
  for (int c = 0; c < n_chunks; ++c) {
    uint32_t piece[32][2][2][4];               // lane, row half (g, g+8), piece j, word
    uint32_t xw[32][2][Geometry<F>::kXWords];  // lane, piece j, word
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4;
      const int t = lane % 4;
      for (int j = 0; j < 2; ++j) {
        const int k0 = c * G::kChunk + piece_k<F>(j, t);
        load_piece<F>(w, k_total, g, k0, piece[lane][0][j]);
        load_piece<F>(w, k_total, g + 8, k0, piece[lane][1][j]);
        load_x<F>(x, k_total, g, k0, xw[lane][j]);
      }
    }
    for (int s = 0; s < G::kSteps; ++s) {
      double a[16][16];
      double b[16][8];
      int a_set[16][16] = {};
      int b_set[16][8] = {};
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4;
        const int t = lane % 4;
        uint32_t reg[4];
        a_pair<F>(piece[lane][0], s, reg[0], reg[2]);  // row g: positions 2t.. and 2t+8..
        a_pair<F>(piece[lane][1], s, reg[1], reg[3]);  // row g+8
        uint32_t breg[2];
        b_pair<F>(xw[lane], s, breg[0], breg[1]);
        // The documented fragment layout (see sbi_fragments.h).
        for (int r = 0; r < 4; ++r) {
          const int row = g + 8 * (r % 2);
          const int col = 2 * t + 8 * (r / 2);
          for (int h = 0; h < 2; ++h) {
            a[row][col + h] = bf16_bits(reg[r] >> (16 * h));
            ++a_set[row][col + h];
          }
        }
        for (int r = 0; r < 2; ++r) {
          for (int h = 0; h < 2; ++h) {
            b[2 * t + 8 * r + h][g] = bf16_bits(breg[r] >> (16 * h));
            ++b_set[2 * t + 8 * r + h][g];
          }
        }
      }
      for (int i = 0; i < 16; ++i) {
        for (int j = 0; j < 16; ++j) ASSERT_EQ(a_set[i][j], 1);
        for (int j = 0; j < 8; ++j) ASSERT_EQ(b_set[i][j], 1);
      }
      for (int m = 0; m < kRows; ++m) {
        for (int n = 0; n < kTokens; ++n) {
          for (int p = 0; p < 16; ++p) d[m][n] += a[m][p] * b[p][n];
        }
      }
    }
  }
}

template <WFormat F>
void check_tile(int k_total, uint32_t seed) {
  using G = Geometry<F>;
  std::mt19937 rng(seed);
  std::vector<uint8_t> w(static_cast<size_t>(kRows) * k_total * G::kElemBytes);
  if constexpr (F == WFormat::kBf16) {
    // Small multiples of 1/8: exact products and sums.
    std::uniform_int_distribution<int> dist(-64, 64);
    for (size_t i = 0; i < w.size() / 2; ++i) {
      const uint16_t h = f32_to_bf16(static_cast<float>(dist(rng)) / 8.0f);
      std::memcpy(w.data() + 2 * i, &h, 2);
    }
  } else {
    std::uniform_int_distribution<int> dist(0, 255);
    for (uint8_t& b : w) {
      b = static_cast<uint8_t>(dist(rng));
      if (F == WFormat::kFp8 && (b & 0x7f) == 0x7f) b = 0x01;  // no NaN; a subnormal instead
    }
  }
  std::vector<uint16_t> x(static_cast<size_t>(kTokens) * k_total);
  std::uniform_int_distribution<int> xd(-32, 32);
  for (uint16_t& v : x) v = f32_to_bf16(static_cast<float>(xd(rng)) / 4.0f);

  double d[kRows][kTokens];
  emulate_warp<F>(w, x, k_total, d);
  for (int m = 0; m < kRows; ++m) {
    for (int n = 0; n < kTokens; ++n) {
      double want = 0.0;
      for (int k = 0; k < k_total; ++k) {
        want += weight_value<F>(w, k_total, m, k) *
                bf16_to_f32(x[static_cast<size_t>(n) * k_total + k]);
      }
      ASSERT_EQ(d[m][n], want) << "row " << m << " token " << n << " k " << k_total;
    }
  }
}

TEST(SbiFragments, Bf16WarpTileEqualsDotProduct) {
  for (int k : {8, 16, 64, 72, 200, 256, 1032}) check_tile<WFormat::kBf16>(k, 1u + k);
}

TEST(SbiFragments, Int8WarpTileEqualsDotProduct) {
  for (int k : {8, 16, 24, 128, 136, 200, 1032}) check_tile<WFormat::kI8>(k, 2u + k);
}

TEST(SbiFragments, Fp8WarpTileEqualsDotProduct) {
  for (int k : {8, 16, 24, 128, 136, 200, 1032}) check_tile<WFormat::kFp8>(k, 3u + k);
}

TEST(SbiFragments, ConversionsAreExactForEveryByte) {
  for (uint32_t b = 0; b < 256; ++b) {
    // The byte in each position of the word, the others distinct, to catch cross-talk.
    for (int pos = 0; pos < 4; ++pos) {
      uint32_t w = 0x35a7c311u;
      w = (w & ~(0xffu << (8 * pos))) | b << (8 * pos);
      uint32_t lo;
      uint32_t hi;
      i8x4_to_bf16(w, lo, hi);
      const uint32_t halves[4] = {lo, hi, lo >> 16, hi >> 16};  // e0, e1, e2, e3
      for (int e = 0; e < 4; ++e) {
        const int8_t q = static_cast<int8_t>((w >> (8 * e)) & 0xffu);
        ASSERT_EQ(bf16_bits(halves[e]), static_cast<double>(q)) << "int8 byte " << e;
      }
      fp8x4_to_bf16(w, lo, hi);
      const uint32_t fh[4] = {lo, hi, lo >> 16, hi >> 16};
      for (int e = 0; e < 4; ++e) {
        const uint8_t v = static_cast<uint8_t>((w >> (8 * e)) & 0xffu);
        if ((v & 0x7f) == 0x7f) continue;  // NaN: documented to come out finite
        ASSERT_EQ(bf16_bits(fh[e]), static_cast<double>(fp8e4m3_to_f32(v))) << "fp8 byte " << e;
        if (v == 0x80) {
          ASSERT_EQ((fh[e] & 0xffffu), 0x8000u) << "-0 keeps its sign";
        }
      }
    }
  }
}

}  // namespace
}  // namespace strata::cuda::sbi
