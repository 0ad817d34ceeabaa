// The AVX-512 block-quant kernels (src/backends/cpu/quant_avx512_kernels.inc) run on any x86-64
// with AVX2 through SIMDe's portable AVX-512 (SIMDE_ENABLE_NATIVE_ALIASES maps each _mm512_*
// intrinsic to its emulation), checked against the scalar kernels (int8 tiles: 1..4 rows x 1..4
// tokens, and the activation quantizer, bit for bit) and the AVX2 int16 decode kernels, for all
// eight block types and block counts that leave tails. Both copies (with and without VNNI) are
// built. A development check for machines without AVX-512; run_check.sh builds and runs it.
// The emulation follows Intel's definitions, so it checks lane layouts, masks, tails and
// operand orders, not speed.
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/quant_impl.h"
#include "core/half.h"

// Intrinsics SIMDe 0.8.2 lacks (or does not alias), built from ones it has.
static inline simde__m512i emu_cvtepu8_epi16(simde__m256i a) {
  alignas(64) uint8_t in[32];
  alignas(64) uint16_t out[32];
  simde_mm256_storeu_si256(reinterpret_cast<simde__m256i*>(in), a);
  for (int i = 0; i < 32; ++i) out[i] = in[i];
  return simde_mm512_loadu_si512(out);
}
static inline float emu_reduce_add_ps(simde__m512 a) {
  alignas(64) float v[16];
  simde_mm512_storeu_ps(v, a);
  float s = 0;
  for (float x : v) s += x;
  return s;
}
static inline int emu_reduce_add_epi32(simde__m512i a) {
  alignas(64) int32_t v[16];
  simde_mm512_storeu_si512(v, a);
  int s = 0;
  for (int x : v) s += x;
  return s;
}
static inline simde__m128i emu_cvtepi32_epi16(simde__m256i a) {
  alignas(32) int32_t in[8];
  alignas(16) int16_t out[8];
  simde_mm256_storeu_si256(reinterpret_cast<simde__m256i*>(in), a);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<int16_t>(in[i]);  // truncation, as vpmovdw
  return simde_mm_loadu_si128(out);
}
#define _mm512_cvtepu8_epi16(a) emu_cvtepu8_epi16(a)
#define _mm256_cvtepi32_epi16(a) emu_cvtepi32_epi16(a)
#define _mm512_mask_srli_epi16(src, k, a, imm) \
  simde_mm512_mask_mov_epi16(src, k, simde_mm512_srli_epi16(a, imm))
#define _mm512_reduce_add_ps(a) emu_reduce_add_ps(a)
#define _mm512_reduce_add_epi32(a) emu_reduce_add_epi32(a)

#define STRATA_Q512
#define STRATA_Q512_VNNI 0
#define STRATA_Q512_NS emu512
#include "backends/cpu/quant_avx512_kernels.inc"
#include "backends/cpu/quant_gemm_i8_avx512.inc"
#undef STRATA_Q512_VNNI
#undef STRATA_Q512_NS
#define STRATA_Q512_VNNI 1
#define STRATA_Q512_NS emu512_vnni
#include "backends/cpu/quant_avx512_kernels.inc"
#include "backends/cpu/quant_gemm_i8_avx512.inc"

using namespace strata;
using namespace strata::cpu;
using namespace strata::cpu::quant_detail;

namespace {

void put16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

struct Kernels {
  const char* name;
  TileDotFn (*tile_dot)(DType);
  void (*quantize)(const float*, int64_t, int8_t*, float*, float*);
  RowDotI16Fn (*row_dot_i16)(DType);
  RowsI16Fn (*rows4_i16)(DType);
  GemmI8MicroFn (*gemm_i8_micro)(int);
};

bool near(double got, double want, double tol) {
  return std::fabs(got - want) <= tol;
}

// The int8 GEMM micro-kernel over a packed panel of the first 13 weight rows (the rest of the
// 16-row panel zero) and 8 tokens (x holds 4 rows of n; tokens 4..7 reuse them negated) against
// the scalar tile kernels, then with unit scales against the scalar micro-kernel bit for bit.
// Returns the number of checks.
int check_gemm(const char* name, DType dt, GemmI8MicroFn micro, const uint8_t* w, int64_t row_bytes,
               int64_t n, const std::vector<float>& x, std::mt19937& rng, int* fails) {
  constexpr int64_t kNr = 13;
  const int64_t nb = n / 32;
  std::vector<float> x8(static_cast<size_t>(kGemmTokens * n));
  for (size_t i = 0; i < x8.size(); ++i) {
    x8[i] = i < x.size() ? x[i] : -x[i - x.size()];
  }
  std::vector<int8_t> qs(x8.size());
  std::vector<float> d(static_cast<size_t>(kGemmTokens * nb)), s(d.size());
  for (int64_t t = 0; t < kGemmTokens; ++t) {
    quantize_row_q8_scalar(x8.data() + t * n, n, qs.data() + t * n, d.data() + t * nb,
                           s.data() + t * nb);
  }
  std::vector<uint8_t> q(static_cast<size_t>(kGemmRows * n));
  std::vector<float> dw(static_cast<size_t>(kGemmRows * nb)), cw(dw.size());
  gemm_i8_pack(dt, w, row_bytes, kNr, 0, n, q.data(), dw.data(), cw.data());
  float c[kGemmTokens * kGemmRows];
  micro(nb, q.data(), dw.data(), cw.data(), qs.data(), n, d.data(), s.data(), nb, c);
  int checks = 0;
  const TileDotFn ref = tile_dot_scalar(dt);
  std::vector<float> row(static_cast<size_t>(n));
  for (int64_t r = 0; r < kGemmRows; ++r) {
    if (r < kNr) (void)dequantize_row(dt, w + r * row_bytes, row.data(), n);
    for (int64_t t = 0; t < kGemmTokens; ++t) {
      const float got = c[t * kGemmRows + r];
      float want = 0.0f;
      double mag = 0;
      if (r < kNr) {
        const Q8Act a{qs.data() + t * n, d.data() + t * nb, s.data() + t * nb};
        ref(w + r * row_bytes, row_bytes, 1, n, a, 1, &want);
        for (int64_t e = 0; e < n; ++e) {
          mag += std::fabs(row[static_cast<size_t>(e)] * d[t * nb + e / 32] *
                           qs[static_cast<size_t>(t * n + e)]);
        }
      }
      ++checks;
      if (!near(got, want, 1e-5 * mag + 1e-30)) {
        std::printf("%s int8 gemm %s n %lld row %lld token %lld: %g, scalar %g\n", name,
                    std::string(dtype_name(dt)).c_str(), static_cast<long long>(n),
                    static_cast<long long>(r), static_cast<long long>(t), got, want);
        ++*fails;
      }
    }
  }
  // Unit scales: the outputs are the integer sums, random u up to max_u and q_a up to +-127.
  const int max_u = gemm_i8_max_u(dt);
  for (auto& v : q) v = static_cast<uint8_t>(rng() % (max_u + 1));
  for (auto& v : qs) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
  std::fill(dw.begin(), dw.end(), 1.0f);
  std::fill(cw.begin(), cw.end(), 0.0f);
  std::fill(d.begin(), d.end(), 1.0f);
  std::fill(s.begin(), s.end(), 0.0f);
  float c2[kGemmTokens * kGemmRows];
  micro(nb, q.data(), dw.data(), cw.data(), qs.data(), n, d.data(), s.data(), nb, c);
  gemm_i8_micro_scalar()(nb, q.data(), dw.data(), cw.data(), qs.data(), n, d.data(), s.data(), nb,
                         c2);
  ++checks;
  if (std::memcmp(c, c2, sizeof(c)) != 0) {
    std::printf("%s int8 gemm %s n %lld: integer sums differ from scalar\n", name,
                std::string(dtype_name(dt)).c_str(), static_cast<long long>(n));
    ++*fails;
  }
  return checks;
}

}  // namespace

int main() {
  const Kernels copies[] = {
      {"avx512", emu512::tile_dot, emu512::quantize_row_q8, emu512::row_dot_i16, emu512::rows4_i16,
       emu512::gemm_i8_micro},
      {"avx512-vnni", emu512_vnni::tile_dot, emu512_vnni::quantize_row_q8, emu512_vnni::row_dot_i16,
       emu512_vnni::rows4_i16, emu512_vnni::gemm_i8_micro}};
  const DType types[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                         DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  int fails = 0, checks = 0;
  for (const Kernels& kc : copies) {
    for (DType dt : types) {
      const DTypeInfo& info = dtype_info(dt);
      for (int64_t nblk : {1, 3, 9, 18, 19, 32}) {
        const int64_t n = nblk * info.block_size;
        const int64_t row_blocks = nblk + 1;  // padded rows
        const int64_t row_bytes = row_blocks * info.block_bytes;
        constexpr int kRows = 4 + 16;  // rows4 is asked to prefetch 16 rows on
        constexpr int kToks = 4;
        std::vector<uint8_t> w(static_cast<size_t>(kRows * row_bytes));
        for (auto& b : w) b = static_cast<uint8_t>(rng());
        for (int64_t j = 0; j < kRows * row_blocks; ++j) {
          uint8_t* b = w.data() + j * info.block_bytes;
          if (info.block_size == 32) {
            put16(b, 0.01f + 0.02f * u(rng));
            if (dt == DType::kQ4_1 || dt == DType::kQ5_1) put16(b + 2, u(rng));
          } else if (dt == DType::kQ6_K) {
            put16(b + 208, 0.01f * u(rng));
          } else {
            put16(b, 0.01f * u(rng));
            put16(b + 2, 0.01f * u(rng));
          }
        }
        std::vector<float> x(static_cast<size_t>(kToks * n));
        for (auto& v : x) v = 3.0f * u(rng);
        const size_t nb = static_cast<size_t>(kToks * n / 32);
        std::vector<int8_t> qs(x.size()), qs2(x.size());
        std::vector<float> d(nb), s(nb), d2(nb), s2(nb);
        for (int t = 0; t < kToks; ++t) {
          quantize_row_q8_scalar(x.data() + t * n, n, qs.data() + t * n, d.data() + t * n / 32,
                                 s.data() + t * n / 32);
          kc.quantize(x.data() + t * n, n, qs2.data() + t * n, d2.data() + t * n / 32,
                      s2.data() + t * n / 32);
        }
        ++checks;
        if (qs != qs2 || std::memcmp(d.data(), d2.data(), nb * 4) != 0 ||
            std::memcmp(s.data(), s2.data(), nb * 4) != 0) {
          std::printf("%s quantize_row_q8 differs from scalar (n %lld)\n", kc.name,
                      static_cast<long long>(n));
          ++fails;
        }
        const Q8Act a{qs.data(), d.data(), s.data()};
        const TileDotFn ref = tile_dot_scalar(dt), got = kc.tile_dot(dt);
        for (int nr = 1; nr <= 4; ++nr) {
          for (int nt = 1; nt <= 4; ++nt) {
            float o1[16], o2[16];
            ref(w.data(), row_bytes, nr, n, a, nt, o1);
            got(w.data(), row_bytes, nr, n, a, nt, o2);
            for (int i = 0; i < nr * nt; ++i) {
              // Integer dots are exact; f32 summation order only.
              double mag = 0;
              std::vector<float> row(static_cast<size_t>(n));
              (void)dequantize_row(dt, w.data() + (i / nt) * row_bytes, row.data(), n);
              for (int64_t e = 0; e < n; ++e) {
                mag += std::fabs(row[static_cast<size_t>(e)] * d[(i % nt) * n / 32 + e / 32] *
                                 qs[static_cast<size_t>((i % nt) * n + e)]);
              }
              ++checks;
              if (!near(o2[i], o1[i], 1e-5 * mag + 1e-30)) {
                std::printf("%s int8 %.*s blocks %lld rows %d tokens %d out %d: %g, scalar %g\n",
                            kc.name, static_cast<int>(info.name.size()), info.name.data(),
                            static_cast<long long>(nblk), nr, nt, i, o2[i], o1[i]);
                ++fails;
              }
            }
          }
        }
        if (GemmI8MicroFn micro = kc.gemm_i8_micro(gemm_i8_max_u(dt))) {
          checks += check_gemm(kc.name, dt, micro, w.data(), row_bytes, n, x, rng, &fails);
        } else if (gemm_i8_max_u(dt) > 0 &&
                   (std::strcmp(kc.name, "avx512") != 0 || dt != DType::kQ8_0)) {
          std::printf("%s has no int8 GEMM micro-kernel for %.*s\n", kc.name,
                      static_cast<int>(info.name.size()), info.name.data());
          ++fails;
        }
        if (info.block_size != 32) continue;
        std::vector<int16_t> q16(x.size()), qq(n);
        std::vector<float> d16(nb), s16(nb);
        for (int t = 0; t < kToks; ++t) {
          quantize_row_q16_avx2(x.data() + t * n, n, q16.data() + t * n, d16.data() + t * n / 32,
                                s16.data() + t * n / 32, t == 0 ? qq.data() : nullptr);
        }
        const Q16Act a16{q16.data(), d16.data(), s16.data()};
        for (int nt = 1; nt <= 4; ++nt) {
          float o1[4], o2[4];
          row_dot_i16_avx2(dt)(w.data(), n, a16, nt, o1);
          kc.row_dot_i16(dt)(w.data(), n, a16, nt, o2);
          for (int i = 0; i < nt; ++i) {
            ++checks;
            if (!near(o2[i], o1[i], 1e-5 * (std::fabs(o1[i]) + 1))) {
              std::printf("%s int16 row %.*s blocks %lld tokens %d: %g, avx2 %g\n", kc.name,
                          static_cast<int>(info.name.size()), info.name.data(),
                          static_cast<long long>(nblk), nt, o2[i], o1[i]);
              ++fails;
            }
          }
        }
        // Without and with the quad layout (the 4-bit types' quad kernel takes it).
        const Q16Act a16q{q16.data(), d16.data(), s16.data(), qq.data()};
        float o1[4];
        rows4_i16_avx2(dt)(w.data(), row_bytes, n, a16, o1, 16 * row_bytes);
        for (const Q16Act* a : {&a16, &a16q}) {
          float o2[4];
          kc.rows4_i16(dt)(w.data(), row_bytes, n, *a, o2, 16 * row_bytes);
          for (int i = 0; i < 4; ++i) {
            ++checks;
            if (!near(o2[i], o1[i], 1e-5 * (std::fabs(o1[i]) + 1))) {
              std::printf("%s int16 rows4%s %.*s blocks %lld row %d: %g, avx2 %g\n", kc.name,
                          a->qq != nullptr ? " quad" : "", static_cast<int>(info.name.size()),
                          info.name.data(), static_cast<long long>(nblk), i, o2[i], o1[i]);
              ++fails;
            }
          }
        }
      }
    }
  }
  std::printf("emulated AVX-512 block-quant kernels: %d checks, %d failures\n", checks, fails);
  return fails == 0 ? 0 : 1;
}
