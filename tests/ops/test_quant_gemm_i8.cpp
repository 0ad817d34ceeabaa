// The int8-activation GEMM (quant_gemm_i8.cpp): its portable weight packer against
// dequantize_row, each SIMD variant's micro-kernel against the scalar one (integer sums bit for
// bit, scaled sums tightly), and quant_linear's prefill through the GEMM against the scalar
// int8 tile kernels (the reference of the int8 path), with the switch that picks it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/quant.h"
#include "backends/cpu/quant_impl.h"
#include "quant_test_util.h"

namespace strata::cpu {
namespace {

using namespace quant_test;  // NOLINT(google-build-using-namespace)
using quant_detail::GemmI8MicroFn;
using quant_detail::kGemmRows;
using quant_detail::kGemmTokens;

// The types the GEMM takes (Q6_K has 16-value scales and keeps the f32 GEMM).
bool gemm_type(DType dt) {
  return quant_detail::gemm_i8_max_u(dt) > 0;
}

// Every packed value u satisfies dw * u + cw == the dequantized weight (up to the regrouping's
// f32 rounding), u <= max_u, and rows past nr pack as zeros; k-blocks past the first start at
// their group.
TEST(QuantGemmI8, PackMatchesDequantize) {
  for (const TypeCase& tc : kQuantTypes) {
    if (!gemm_type(tc.dtype)) {
      EXPECT_EQ(tc.dtype, DType::kQ6_K);
      continue;
    }
    const DTypeInfo& info = dtype_info(tc.dtype);
    const int64_t k = 2 * 256, row_blocks = k / info.block_size + 1, nr = 13;
    const int64_t row_bytes = row_blocks * info.block_bytes;
    const std::vector<uint8_t> w = random_quant_rows(tc.dtype, nr, row_blocks, 3);
    const int64_t k0 = 256, kc = 256, ng = kc / 32;
    std::vector<uint8_t> q(static_cast<size_t>(kGemmRows * kc), 0xAA);
    std::vector<float> dw(static_cast<size_t>(kGemmRows * ng)), cw(dw.size());
    quant_detail::gemm_i8_pack(tc.dtype, w.data(), row_bytes, nr, k0, kc, q.data(), dw.data(),
                               cw.data());
    const int max_u = quant_detail::gemm_i8_max_u(tc.dtype);
    std::vector<float> deq(static_cast<size_t>(k));
    for (int64_t r = 0; r < kGemmRows; ++r) {
      if (r < nr)
        ASSERT_TRUE(dequantize_row(tc.dtype, w.data() + r * row_bytes, deq.data(), k).ok());
      for (int64_t i = 0; i < kc; ++i) {
        const int u = q[static_cast<size_t>(((i / 4) * kGemmRows + r) * 4 + i % 4)];
        const size_t gi = static_cast<size_t>((i / 32) * kGemmRows + r);
        if (r >= nr) {
          ASSERT_EQ(u, 0);
          ASSERT_EQ(dw[gi], 0.0f);
          ASSERT_EQ(cw[gi], 0.0f);
          continue;
        }
        ASSERT_LE(u, max_u) << tc.name;
        const float want = deq[static_cast<size_t>(k0 + i)];
        const float got = dw[gi] * static_cast<float>(u) + cw[gi];
        ASSERT_NEAR(got, want, 1e-6f * (std::fabs(dw[gi]) * max_u + std::fabs(cw[gi])))
            << tc.name << " row " << r << " value " << i;
      }
    }
  }
}

// A random packed panel of ng groups (u <= max_u, the extremes included) and 8 tokens' int8
// activations (+-127 included).
struct Panel {
  int64_t ng;
  std::vector<uint8_t> q;
  std::vector<float> dw, cw;
  std::vector<int8_t> aq;  // 8 tokens, a_stride = 32 ng + 32
  std::vector<float> ad, as;
  int64_t a_stride() const { return 32 * ng + 32; }
  int64_t ad_stride() const { return ng + 1; }
};
Panel random_panel(int64_t ng, int max_u, bool unit_scales, uint32_t seed) {
  std::mt19937 rng(seed);
  Panel p{.ng = ng};
  p.q.resize(static_cast<size_t>(kGemmRows * 32 * ng));
  for (uint8_t& v : p.q) v = static_cast<uint8_t>(rng() % (max_u + 1));
  p.q[0] = static_cast<uint8_t>(max_u);
  p.dw.resize(static_cast<size_t>(kGemmRows * ng));
  p.cw.resize(p.dw.size());
  std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
  for (size_t i = 0; i < p.dw.size(); ++i) {
    p.dw[i] = unit_scales ? 1.0f : 0.01f + 0.04f * std::fabs(ud(rng));
    p.cw[i] = unit_scales ? 0.0f : 0.3f * ud(rng);
  }
  p.aq.resize(static_cast<size_t>(kGemmTokens * p.a_stride()));
  for (int8_t& v : p.aq) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
  p.aq[0] = 127;
  p.aq[1] = -127;
  p.ad.resize(static_cast<size_t>(kGemmTokens * p.ad_stride()));
  p.as.resize(p.ad.size());
  for (size_t i = 0; i < p.ad.size(); ++i) {
    p.ad[i] = unit_scales ? 1.0f : 0.001f + 0.02f * std::fabs(ud(rng));
    p.as[i] = unit_scales ? 0.0f : 30.0f * ud(rng);
  }
  return p;
}
std::vector<float> run_micro(GemmI8MicroFn fn, const Panel& p) {
  std::vector<float> c(static_cast<size_t>(kGemmTokens * kGemmRows), -1.0f);
  fn(p.ng, p.q.data(), p.dw.data(), p.cw.data(), p.aq.data(), p.a_stride(), p.ad.data(),
     p.as.data(), p.ad_stride(), c.data());
  return c;
}

class QuantGemmI8Simd : public ::testing::TestWithParam<QuantIsa> {};
INSTANTIATE_TEST_SUITE_P(Isa, QuantGemmI8Simd, ::testing::ValuesIn(kSimdIsas), isa_test_name);

// Each variant's micro-kernel against the scalar one for every u range it takes: with unit
// scales (dw = d_a = 1, cw = s_a = 0) the outputs are the integer sums themselves (exact in f32
// below 2^24), so they must agree bit for bit; with real scales within 1e-5 of the magnitude.
TEST_P(QuantGemmI8Simd, MicroKernelMatchesScalar) {
  if (const std::string why = cannot_run(GetParam()); !why.empty()) GTEST_SKIP() << why;
  const GemmI8MicroFn ref = quant_detail::gemm_i8_micro_scalar();
  for (const DType dt : {DType::kQ4_0, DType::kQ5_1, DType::kQ8_0}) {
    const GemmI8MicroFn fn = quant_detail::gemm_i8_micro(dt, GetParam());
    if (fn == nullptr) {
      // The vpmaddubsw variants cannot take Q8_0's u up to 255 (pair sums would saturate).
      EXPECT_TRUE(dt == DType::kQ8_0 && GetParam() != QuantIsa::kAvx512Vnni);
      continue;
    }
    const int max_u = quant_detail::gemm_i8_max_u(dt);
    for (const int64_t ng : {1, 3, 8}) {
      const Panel exact = random_panel(ng, max_u, true, static_cast<uint32_t>(ng + max_u));
      const std::vector<float> want = run_micro(ref, exact), got = run_micro(fn, exact);
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(got[i], want[i]) << dtype_name(dt) << " ng " << ng << " out " << i;
      }
      const Panel real = random_panel(ng, max_u, false, static_cast<uint32_t>(7 * ng + max_u));
      const std::vector<float> rw = run_micro(ref, real), rg = run_micro(fn, real);
      for (int64_t t = 0; t < kGemmTokens; ++t) {
        for (int64_t r = 0; r < kGemmRows; ++r) {
          double mag = 0;
          for (int64_t g = 0; g < ng; ++g) {
            const size_t wi = static_cast<size_t>(g * kGemmRows + r);
            const size_t ai = static_cast<size_t>(t * real.ad_stride() + g);
            mag += std::fabs(static_cast<double>(real.cw[wi]) * real.as[ai]) +
                   static_cast<double>(real.dw[wi]) * real.ad[ai] * 255 * 127 * 32;
          }
          const size_t o = static_cast<size_t>(t * kGemmRows + r);
          EXPECT_NEAR(rg[o], rw[o], 1e-6 * mag) << dtype_name(dt) << " ng " << ng;
        }
      }
    }
  }
}

// The AMX micro-kernel (CPUs with AMX-INT8, where Linux grants the tile state) against the
// AVX512-VNNI one: the same integer sums scaled by the same operations, so the same bits, with
// real scales too; odd group counts take its one-group tail.
TEST(QuantGemmI8Amx, MatchesVnniBitExactly) {
#if defined(STRATA_QUANT_HAVE_AMX)
  if (quant_detail::resolve_quant_isa(QuantIsa::kBest) != QuantIsa::kAvx512Vnni ||
      !cpu_has_amx_int8() || !quant_detail::amx::request_tile_data()) {
    GTEST_SKIP() << "no AMX-INT8 here";
  }
  const GemmI8MicroFn amx = quant_detail::amx::gemm_i8_micro();
  const GemmI8MicroFn vnni = quant_detail::avx512_vnni::gemm_i8_micro(255);
  ASSERT_NE(vnni, nullptr);
  for (const int max_u : {15, 31, 255}) {
    for (const int64_t ng : {1, 2, 3, 8, 9}) {
      for (const bool unit : {true, false}) {
        const Panel p = random_panel(ng, max_u, unit, static_cast<uint32_t>(13 * ng + max_u));
        const std::vector<float> want = run_micro(vnni, p), got = run_micro(amx, p);
        ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
            << "u <= " << max_u << " ng " << ng << (unit ? " unit scales" : " real scales");
      }
    }
  }
#else
  GTEST_SKIP() << "built without the AMX kernel";
#endif
}

// quant_linear's prefill through the GEMM (f32_activations = false, and prefill = kInt8 with
// f32 activations) against the scalar int8 tile kernels: token counts that leave a partial
// 8-token tile, row counts that leave a partial 16-row panel, k over two k-blocks, padded
// weight rows, strided x and out. Both quantize x identically and every group's integer sum is
// exact, so they differ by f32 summation order only (the bound of Int8KernelsMatchScalar).
TEST_P(QuantGemmI8Simd, PrefillMatchesScalarTiles) {
  if (const std::string why = cannot_run(GetParam()); !why.empty()) GTEST_SKIP() << why;
  for (const TypeCase& tc : kQuantTypes) {
    const DTypeInfo& info = dtype_info(tc.dtype);
    const int64_t k = info.block_size == 256 ? 1280 : 1088;  // two k-blocks
    const int64_t m = 21, row_blocks = k / info.block_size + 1;
    const std::vector<uint8_t> w = random_quant_rows(tc.dtype, m, row_blocks, 11);
    std::vector<float> bias(static_cast<size_t>(m));
    for (int64_t r = 0; r < m; ++r)
      bias[static_cast<size_t>(r)] = 0.05f * static_cast<float>(r % 4);
    for (const int64_t n : {16, 27}) {
      const int64_t x_stride = k + 8, out_stride = m + 3;
      const std::vector<float> x = random_rows(n, x_stride, static_cast<uint32_t>(5 + n));
      std::vector<float> want(static_cast<size_t>(n * out_stride), -7.0f), got(want.size(), -7.0f),
          got2(want.size(), -7.0f);
      QuantLinearParams p =
          linear_params(tc.dtype, w, bias, x, n, k, m, x_stride, out_stride, row_blocks);
      p.out = want.data();
      ASSERT_TRUE(quant_linear(p).ok());
      p.isa = GetParam();
      p.out = got.data();
      ASSERT_TRUE(quant_linear(p).ok());
      p.f32_activations = true;
      p.prefill = QuantPrefill::kInt8;
      p.out = got2.data();
      ASSERT_TRUE(quant_linear(p).ok());
      std::vector<float> wf(static_cast<size_t>(k));
      for (int64_t r = 0; r < m; ++r) {
        ASSERT_TRUE(
            dequantize_row(tc.dtype, w.data() + r * row_blocks * info.block_bytes, wf.data(), k)
                .ok());
        for (int64_t t = 0; t < n; ++t) {
          const Q8Row q = quantize(x.data() + t * x_stride, k, QuantIsa::kScalar);
          double mag = std::fabs(bias[static_cast<size_t>(r)]);
          for (int64_t i = 0; i < k; ++i) {
            mag += std::fabs(static_cast<double>(wf[static_cast<size_t>(i)]) *
                             q.d[static_cast<size_t>(i / 32)] * q.qs[static_cast<size_t>(i)]);
          }
          const size_t o = static_cast<size_t>(t * out_stride + r);
          EXPECT_NEAR(got[o], want[o], 1e-5 * mag) << tc.name << " n " << n << " t " << t;
          // Q6_K (and Q8_0 without VNNI) have no GEMM: prefill = kInt8 leaves them on the f32
          // GEMM, whose result differs by the activation rounding; the others match bit for bit.
          if (quant_detail::gemm_i8_micro(tc.dtype, GetParam()) != nullptr) {
            EXPECT_EQ(got2[o], got[o]) << tc.name << " n " << n << " t " << t;
          }
        }
      }
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t r = m; r < out_stride; ++r) {
          EXPECT_EQ(got[static_cast<size_t>(t * out_stride + r)], -7.0f);
        }
      }
    }
  }
}

}  // namespace
}  // namespace strata::cpu
