// The GGUF block-format kernels' lane plumbing (src/backends/cuda/kernels/gguf_fragments.h)
// emulated on the host, against the independent scalar twin cpu::gguf_row_to_bf16:
//   - every lane share of every chunk, turned into bf16 weights as the dequantizer does, gives
//     the twin's bits for every element, each element exactly once;
//   - a warp computing a 16-row x 8-token tile as the decode kernel does (its loads, scales,
//     A / B fragments, the mma.m16n8k16 layout of the PTX ISA) gives the dot products of the
//     twin's weights (bf16 x bf16 products are exact in double; only the summation order of
//     doubles differs).
// Also: the device row layout holds the GGUF blocks' values (pack vs cpu::dequantize_row), and
// the host bf16 fma emulation rounds once. Runs without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/quant.h"
#include "backends/cuda/kernels/gguf_fragments.h"
#include "core/half.h"

namespace strata::cuda::gguf {
namespace {

constexpr int kRows = 16;
constexpr int kTokens = 8;

double bf(uint32_t h) {
  return bf16_to_f32(static_cast<uint16_t>(h & 0xffffu));
}

struct Rows {
  DType dt;
  int64_t k;
  int64_t row_bytes;
  std::vector<uint8_t> bytes;
  const uint8_t* row(int r) const { return bytes.data() + r * row_bytes; }
};

Rows random_rows(DType dt, int64_t k, int n, uint64_t seed) {
  Rows r{dt, k, dtype_bytes(dt, k), {}};
  r.bytes.resize(static_cast<size_t>(r.row_bytes * n));
  for (int i = 0; i < n; ++i) {
    cpu::gguf_fill_random_row(dt, seed, i, 0.5f, k, r.bytes.data() + i * r.row_bytes);
  }
  return r;
}

template <DType F>
void lane_load(const Rows& rows, int row, int64_t c, int t, uint32_t (&w)[Lane<F>::kLoads][4],
               uint32_t& d16) {
  for (int l = 0; l < Lane<F>::kLoads; ++l) {
    std::memcpy(w[l], rows.row(row) + Lane<F>::load_offset(rows.k, c, t, l), 16);
  }
  d16 = 0;
  if constexpr (Lane<F>::kD16) {
    uint16_t h;
    std::memcpy(&h, rows.row(row) + Lane<F>::d16_offset(rows.k, c), 2);
    d16 = h;
  }
}

template <DType F>
void check_dequant(int64_t k, uint64_t seed) {
  const Rows rows = random_rows(F, k, 3, seed);
  for (int row = 0; row < 3; ++row) {
    std::vector<uint16_t> want(static_cast<size_t>(k));
    cpu::gguf_row_to_bf16(F, rows.row(row), k, want.data());
    std::vector<int> seen(static_cast<size_t>(k), 0);
    for (int64_t c = 0; c < k / kChunk; ++c) {
      for (int t = 0; t < 4; ++t) {
        uint32_t w[Lane<F>::kLoads][4];
        uint32_t d16;
        lane_load<F>(rows, row, c, t, w, d16);
        for (int r = 0; r < kRuns; ++r) {
          uint32_t S, M;
          Lane<F>::scales(w, d16, t, r, S, M);
          for (int s4 = 0; s4 < 4; ++s4) {
            uint32_t lo, hi;
            lane_a_pair<F>(w, S, M, 4 * r + s4, t, lo, hi);
            const uint32_t e[4] = {lo & 0xffffu, hi & 0xffffu, lo >> 16, hi >> 16};
            for (int i = 0; i < 4; ++i) {
              const int64_t at = c * kChunk + Lane<F>::run_k(t, r) + 4 * s4 + i;
              ASSERT_LT(at, k);
              ++seen[static_cast<size_t>(at)];
              ASSERT_EQ(e[i], want[static_cast<size_t>(at)])
                  << dtype_name(F) << " row " << row << " element " << at << " lane t " << t;
            }
          }
        }
      }
    }
    for (int64_t i = 0; i < k; ++i) ASSERT_EQ(seen[static_cast<size_t>(i)], 1) << "element " << i;
  }
}

template <DType F>
void check_warp(int64_t k, uint64_t seed) {
  const Rows rows = random_rows(F, k, kRows, seed);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> xd(-1.0f, 1.0f);
  std::vector<uint16_t> x(static_cast<size_t>(kTokens * k));
  for (uint16_t& v : x) v = f32_to_bf16(xd(rng));

  double d[kRows][kTokens] = {};
  for (int64_t c = 0; c < k / kChunk; ++c) {
    uint32_t w[32][2][Lane<F>::kLoads][4];
    uint32_t S[32][2][kRuns], M[32][2][kRuns];
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, t = lane % 4;
      for (int h = 0; h < 2; ++h) {
        uint32_t d16;
        lane_load<F>(rows, g + 8 * h, c, t, w[lane][h], d16);
        for (int r = 0; r < kRuns; ++r) {
          Lane<F>::scales(w[lane][h], d16, t, r, S[lane][h][r], M[lane][h][r]);
        }
      }
    }
    for (int s = 0; s < kSteps; ++s) {
      const int r = s / 4;
      double a[16][16], b[16][8];
      int a_set[16][16] = {}, b_set[16][8] = {};
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        uint32_t reg[4];
        lane_a_pair<F>(w[lane][0], S[lane][0][r], M[lane][0][r], s, t, reg[0], reg[2]);
        lane_a_pair<F>(w[lane][1], S[lane][1][r], M[lane][1][r], s, t, reg[1], reg[3]);
        uint32_t xw[8];
        std::memcpy(xw, x.data() + g * k + c * kChunk + Lane<F>::run_k(t, r), 32);
        uint32_t breg[2];
        x_pair(xw, s, breg[0], breg[1]);
        for (int q = 0; q < 4; ++q) {
          const int row = g + 8 * (q % 2);
          const int col = 2 * t + 8 * (q / 2);
          for (int h = 0; h < 2; ++h) {
            a[row][col + h] = bf(reg[q] >> (16 * h));
            ++a_set[row][col + h];
          }
        }
        for (int q = 0; q < 2; ++q) {
          for (int h = 0; h < 2; ++h) {
            b[2 * t + 8 * q + h][g] = bf(breg[q] >> (16 * h));
            ++b_set[2 * t + 8 * q + h][g];
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
  std::vector<uint16_t> wr(static_cast<size_t>(k));
  for (int m = 0; m < kRows; ++m) {
    cpu::gguf_row_to_bf16(F, rows.row(m), k, wr.data());
    for (int n = 0; n < kTokens; ++n) {
      double want = 0.0, mag = 0.0;
      for (int64_t i = 0; i < k; ++i) {
        const double p = bf16_to_f32(wr[static_cast<size_t>(i)]) *
                         static_cast<double>(bf16_to_f32(x[static_cast<size_t>(n * k + i)]));
        want += p;
        mag += std::fabs(p);
      }
      ASSERT_NEAR(d[m][n], want, 1e-12 * mag) << dtype_name(F) << " row " << m << " token " << n;
    }
  }
}

// The device rows hold the GGUF values: the twin's weights are the f32 dequantization
// (cpu::dequantize_row) within the two bf16 roundings (scale and weight, 2^-8 relative each)
// plus, for the min term of Q4_K / Q5_K, the rounding of dmin * m.
template <DType F>
void check_values(int64_t k, uint64_t seed) {
  const Rows rows = random_rows(F, k, 1, seed);
  // The GGUF row behind the device row (the layout's inverse, written out), which must pack
  // back to the same bytes.
  std::vector<uint8_t> raw(static_cast<size_t>(rows.row_bytes));
  const int64_t nb = k / 32, nsb = k / 256;
  const uint8_t* dev = rows.row(0);
  switch (F) {
    case DType::kQ8_0:
      for (int64_t b = 0; b < nb; ++b) {
        std::memcpy(raw.data() + 34 * b, dev + k + 2 * b, 2);
        std::memcpy(raw.data() + 34 * b + 2, dev + 32 * b, 32);
      }
      break;
    case DType::kQ4_0:
      for (int64_t b = 0; b < nb; ++b) {
        std::memcpy(raw.data() + 18 * b, dev + k / 2 + 2 * b, 2);
        std::memcpy(raw.data() + 18 * b + 2, dev + 16 * b, 16);
      }
      break;
    case DType::kQ6_K:
      for (int64_t c = 0; c < nsb; ++c) {
        std::memcpy(raw.data() + 210 * c, dev + 192 * c, 192);
        std::memcpy(raw.data() + 210 * c + 192, dev + 192 * nsb + 16 * c, 16);
        std::memcpy(raw.data() + 210 * c + 208, dev + 208 * nsb + 2 * c, 2);
      }
      break;
    default:
      std::memcpy(raw.data(), dev, raw.size());
      break;
  }
  std::vector<uint8_t> repacked(raw.size());
  cpu::gguf_pack_row(F, raw.data(), repacked.data(), k);
  ASSERT_EQ(repacked, std::vector<uint8_t>(dev, dev + rows.row_bytes));
  std::vector<float> ref(static_cast<size_t>(k));
  ASSERT_TRUE(cpu::dequantize_row(F, raw.data(), ref.data(), k).ok());
  std::vector<uint16_t> got(static_cast<size_t>(k));
  cpu::gguf_row_to_bf16(F, dev, k, got.data());
  float amax = 0.0f;
  for (float v : ref) amax = std::fmax(amax, std::fabs(v));
  for (int64_t i = 0; i < k; ++i) {
    const float r = ref[static_cast<size_t>(i)];
    const float g = bf16_to_f32(got[static_cast<size_t>(i)]);
    ASSERT_NEAR(g, r, std::fabs(r) * 0x1p-7f + amax * 0x1p-8f) << dtype_name(F) << " " << i;
  }
}

template <DType F>
void check_all() {
  for (int64_t k : {256, 512, 2048}) {
    check_dequant<F>(k, 11 + static_cast<uint64_t>(k));
    check_warp<F>(k, 12 + static_cast<uint64_t>(k));
    check_values<F>(k, 13 + static_cast<uint64_t>(k));
  }
}

TEST(GgufFragments, Q8_0) {
  check_all<DType::kQ8_0>();
}
TEST(GgufFragments, Q4_0) {
  check_all<DType::kQ4_0>();
}
TEST(GgufFragments, Q4_K) {
  check_all<DType::kQ4_K>();
}
TEST(GgufFragments, Q5_K) {
  check_all<DType::kQ5_K>();
}
TEST(GgufFragments, Q6_K) {
  check_all<DType::kQ6_K>();
}

TEST(GgufFragments, Bf16FmaRoundsOnce) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits(0, 0xffffu);
  for (int i = 0; i < 100000; ++i) {
    // q a small integer, S and M any finite bf16: the double result is exact, so rounding it to
    // bf16 must equal rounding the exact value (checked against a long-double computation).
    const uint32_t q = f32_to_bf16(static_cast<float>(static_cast<int>(bits(rng) % 64) - 32));
    uint32_t S = bits(rng) & 0x7fffu, M = bits(rng);
    if ((S & 0x7f80u) == 0x7f80u || (M & 0x7f80u) == 0x7f80u) continue;  // inf / NaN
    S = (S & 0x0fffu) | 0x3800u;  // moderate exponents: every value exact in double
    M = (M & 0x8fffu) | 0x3800u;
    const uint32_t r = fma_bf16x2(q | q << 16, S | S << 16, M | M << 16);
    const double exact = bf(q) * bf(S) + bf(M);
    // Neighbouring bf16 values around the result: r must be the nearest.
    const double got = bf(r);
    const double up = bf16_to_f32(static_cast<uint16_t>((r & 0xffffu) + 1));
    const double down = bf16_to_f32(static_cast<uint16_t>((r & 0xffffu) - 1));
    if (exact != 0.0 && got != 0.0) {
      ASSERT_LE(std::fabs(got - exact), std::fabs(up - exact));
      ASSERT_LE(std::fabs(got - exact), std::fabs(down - exact));
    }
    ASSERT_EQ(r >> 16, r & 0xffffu);
  }
}

}  // namespace
}  // namespace strata::cuda::gguf
