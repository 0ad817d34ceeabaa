// Block-quantized CPU kernels against gguf-py: dequantize_row must reproduce
// gguf.quants.dequantize bit for bit; the int8-activation dot products and quant_linear must
// match (a) a double-precision reference that quantizes the activation the same way, tightly,
// and (b) the plain f32 product, within the activation-quantization error bound.
//
// Tolerances:
//  tight: the kernels regroup sum_i (d_w q_i + c_w) d_a qa_i as d_w d_a sum(q qa) + c_w s_a and
//    accumulate in f32: every term carries a few f32 roundings (relative 2^-24 each) and the
//    sum of <= 16 block terms adds <= 16 more. Both regrouped terms of a 32-value block are at
//    most T_blk = (range(w_blk) + max|w_blk|) * sum|a_blk| in magnitude, so the error is far
//    below 1e-5 * sum T_blk; that is the bound checked (about 100x headroom).
//  loose: rounding x to d_a * q moves each element by <= d_a / 2 (d_a = max|x_blk| / 127), so
//    |q8 result - f32 result| <= sum_blk d_a / 2 * sum|w_blk| (+ the tight error).
#include "backends/cpu/quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/quant_impl.h"
#include "core/half.h"
#include "io/gguf.h"
#include "quant_test_util.h"

namespace strata::cpu {
namespace {

using namespace quant_test;  // NOLINT(google-build-using-namespace)

const std::string kDir = std::string(STRATA_FIXTURE_DIR) + "/gguf/";

std::vector<float> read_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> v(raw.size() / 4);
  std::memcpy(v.data(), raw.data(), v.size() * 4);
  return v;
}

class QuantFixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto r = GgufFile::open(kDir + "all_types.gguf");
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    file_ = new GgufFile(std::move(r).value());
  }
  static void TearDownTestSuite() {
    delete file_;
    file_ = nullptr;
  }
  static Tensor tensor(const std::string& name) {
    auto t = file_->tensor(name);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return t.ok() ? t.value() : Tensor{};
  }
  static GgufFile* file_;
};
GgufFile* QuantFixture::file_ = nullptr;

struct Refs {
  double q8 = 0;     // sum w_i * d_a q_i in double
  double f32 = 0;    // sum w_i * x_i in double
  double tight = 0;  // 1e-5 * sum T_blk
  double loose = 0;  // sum d_a / 2 * sum|w_blk|
  double i16 = 0;    // sum max|x_blk| / 65534 * sum|w_blk|: the int16-activation rounding bound
};
Refs reference(const float* w, const float* x, const Q8Row& q, int64_t k) {
  Refs r;
  for (int64_t b = 0; b < k / 32; ++b) {
    double wmax = -1e300, wmin = 1e300, wabs = 0, aabs = 0, wsum_abs = 0, xabs = 0;
    for (int64_t i = 32 * b; i < 32 * b + 32; ++i) {
      const double a =
          static_cast<double>(q.d[static_cast<size_t>(b)]) * q.qs[static_cast<size_t>(i)];
      r.q8 += static_cast<double>(w[i]) * a;
      r.f32 += static_cast<double>(w[i]) * x[i];
      wmax = std::max<double>(wmax, w[i]);
      wmin = std::min<double>(wmin, w[i]);
      wabs = std::max(wabs, std::fabs(static_cast<double>(w[i])));
      aabs += std::fabs(a);
      wsum_abs += std::fabs(static_cast<double>(w[i]));
      xabs = std::max(xabs, std::fabs(static_cast<double>(x[i])));
    }
    r.i16 += xabs / 65534.0 * wsum_abs;
    r.tight += 1e-5 * ((wmax - wmin) + wabs) * aabs;
    r.loose += q.d[static_cast<size_t>(b)] / 2.0 * wsum_abs;
  }
  r.tight += 1e-30;
  return r;
}

TEST_F(QuantFixture, DequantizeRowMatchesGgufPyBitExactly) {
  std::vector<TypeCase> all(std::begin(kQuantTypes), std::end(kQuantTypes));
  all.push_back({"f32", DType::kF32});
  all.push_back({"f16", DType::kF16});
  all.push_back({"bf16", DType::kBF16});
  for (const TypeCase& tc : all) {
    for (const char* tag : {"a", "b"}) {
      const std::string name = std::string(tc.name) + "." + tag;
      const Tensor t = tensor(name);
      ASSERT_EQ(t.dtype, tc.dtype);
      const std::vector<float> ref = read_f32(kDir + name + ".f32");
      ASSERT_EQ(static_cast<int64_t>(ref.size()), t.numel()) << name;
      const int64_t k = t.cols();
      std::vector<float> row(static_cast<size_t>(k));
      for (int64_t r = 0; r < t.rows(); ++r) {
        const auto* src = static_cast<const uint8_t*>(t.data) + dtype_bytes(t.dtype, r * k);
        ASSERT_TRUE(dequantize_row(t.dtype, src, row.data(), k).ok());
        for (int64_t i = 0; i < k; ++i) {
          const float want = ref[static_cast<size_t>(r * k + i)];
          ASSERT_EQ(std::memcmp(&row[static_cast<size_t>(i)], &want, 4), 0)
              << name << " row " << r << " col " << i << ": " << row[static_cast<size_t>(i)]
              << " vs " << want;
        }
      }
    }
  }
}

TEST(Quant, DequantizeRejectsPartialBlocksAndPlainInts) {
  std::vector<uint8_t> buf(64);
  std::vector<float> out(64);
  Status st = dequantize_row(DType::kQ4_0, buf.data(), out.data(), 48);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("48 values of q4_0"), std::string::npos) << st.message();
  EXPECT_FALSE(dequantize_row(DType::kI32, buf.data(), out.data(), 4).ok());
}

class QuantSimd : public ::testing::TestWithParam<QuantIsa> {};
INSTANTIATE_TEST_SUITE_P(Isa, QuantSimd, ::testing::ValuesIn(kSimdIsas), isa_test_name);

// Every variant's activation quantizer reproduces the scalar one bit for bit.
TEST_P(QuantSimd, ActivationQuantizationMatchesScalarBitExactly) {
  if (const std::string why = cannot_run(GetParam()); !why.empty()) GTEST_SKIP() << why;
  const int64_t k = 4096;
  std::vector<float> x = random_rows(1, k, 7);
  x[100] = 0.5f * (127.0f / 25.0f);  // lands near a .5 rounding boundary for some blocks
  const Q8Row a = quantize(x.data(), k, QuantIsa::kScalar);
  const Q8Row b = quantize(x.data(), k, GetParam());
  EXPECT_EQ(a.qs, b.qs);
  EXPECT_EQ(std::memcmp(a.d.data(), b.d.data(), a.d.size() * 4), 0);
  EXPECT_EQ(std::memcmp(a.s.data(), b.s.data(), a.s.size() * 4), 0);
  for (int64_t j = 0; j < k / 32; ++j) {
    float amax = 0;
    int32_t sum = 0;
    for (int64_t i = 32 * j; i < 32 * j + 32; ++i) {
      amax = std::max(amax, std::fabs(x[static_cast<size_t>(i)]));
      sum += a.qs[static_cast<size_t>(i)];
      const float err = std::fabs(x[static_cast<size_t>(i)] -
                                  a.d[static_cast<size_t>(j)] * a.qs[static_cast<size_t>(i)]);
      EXPECT_LE(err, a.d[static_cast<size_t>(j)] * 0.5f * 1.0001f + 1e-30f);
    }
    EXPECT_EQ(a.d[static_cast<size_t>(j)], amax / 127.0f);
    EXPECT_EQ(a.s[static_cast<size_t>(j)], a.d[static_cast<size_t>(j)] * static_cast<float>(sum));
  }
}

// QuantFixture once per kernel variant (scalar and the SIMD ones).
class QuantIsaFixture : public QuantFixture, public ::testing::WithParamInterface<QuantIsa> {};
const QuantIsa kAllIsas[] = {QuantIsa::kScalar, QuantIsa::kAvx2, QuantIsa::kAvx512,
                             QuantIsa::kAvx512Vnni};
INSTANTIATE_TEST_SUITE_P(Isa, QuantIsaFixture, ::testing::ValuesIn(kAllIsas), isa_test_name);

TEST_P(QuantIsaFixture, DotMatchesReferences) {
  if (const std::string why = cannot_run(GetParam()); !why.empty()) GTEST_SKIP() << why;
  std::printf("quant kernels: best ISA here is %s\n", quant_isa_name(quant_best_isa()));
  for (const TypeCase& tc : kQuantTypes) {
    for (const char* tag : {"a", "b"}) {
      const std::string name = std::string(tc.name) + "." + tag;
      const Tensor t = tensor(name);
      const std::vector<float> wref = read_f32(kDir + name + ".f32");
      const int64_t k = t.cols();
      const std::vector<float> x = random_rows(1, k, 11);
      for (QuantIsa isa : {QuantIsa::kScalar, GetParam()}) {
        const Q8Row q = quantize(x.data(), k, isa);
        for (int64_t r = 0; r < t.rows(); ++r) {
          const auto* w = static_cast<const uint8_t*>(t.data) + dtype_bytes(t.dtype, r * k);
          const float got = vec_dot_q8(t.dtype, w, q.act(), k, isa);
          const Refs ref = reference(wref.data() + r * k, x.data(), q, k);
          EXPECT_NEAR(got, ref.q8, ref.tight)
              << name << " row " << r << " isa " << quant_isa_name(isa);
          EXPECT_NEAR(got, ref.f32, ref.loose + ref.tight)
              << name << " row " << r << " isa " << quant_isa_name(isa);
        }
      }
    }
  }
}

// quant_linear over all rows for 1..9 tokens (tiles of 4 plus remainders), with bias and
// strided x / out, forced scalar and the parameter's ISA, with and without caller scratch.
TEST_P(QuantIsaFixture, LinearMatchesReferences) {
  if (const std::string why = cannot_run(GetParam()); !why.empty()) GTEST_SKIP() << why;
  for (const TypeCase& tc : kQuantTypes) {
    for (const char* tag : {"a", "b"}) {
      const std::string name = std::string(tc.name) + "." + tag;
      const Tensor t = tensor(name);
      const std::vector<float> wref = read_f32(kDir + name + ".f32");
      const int64_t k = t.cols();
      const int64_t m = t.rows();
      for (int64_t n : {1, 2, 3, 4, 5, 9}) {
        const int64_t x_stride = k + 32;
        const int64_t out_stride = m + 3;
        std::vector<float> x = random_rows(n, x_stride, static_cast<uint32_t>(100 + n));
        std::vector<float> bias(static_cast<size_t>(m));
        for (int64_t r = 0; r < m; ++r)
          bias[static_cast<size_t>(r)] = 0.25f * static_cast<float>(r);
        for (int variant = 0; variant < 4; ++variant) {
          const bool scalar = variant & 1, f32_act = variant & 2;
          std::vector<float> out(static_cast<size_t>(n * out_stride), -7.0f);
          std::vector<uint8_t> scratch(quant_linear_scratch_bytes(n, k));
          QuantLinearParams p;
          p.x = x.data();
          p.weight = t.data;
          p.weight_dtype = t.dtype;
          p.bias = bias.data();
          p.out = out.data();
          p.n_tokens = n;
          p.in_features = k;
          p.out_features = m;
          p.x_stride = x_stride;
          p.out_stride = out_stride;
          p.force_scalar = scalar;
          p.isa = GetParam();
          p.f32_activations = f32_act;
          if (n % 2 == 0) {
            p.scratch = scratch.data();
            p.scratch_bytes = scratch.size();
          }
          ASSERT_TRUE(quant_linear(p).ok());
          for (int64_t tok = 0; tok < n; ++tok) {
            const float* xt = x.data() + tok * x_stride;
            const Q8Row q = quantize(xt, k, QuantIsa::kScalar);
            for (int64_t r = 0; r < m; ++r) {
              const Refs ref = reference(wref.data() + r * k, xt, q, k);
              const float got = out[static_cast<size_t>(tok * out_stride + r)];
              const double b = bias[static_cast<size_t>(r)];
              if (f32_act) {
                // f32 activations: the dequantized weights exactly, f32 summation order only
                // (plus the int16 rounding of x in the decode kernels of 32-value types).
                double mag = 0;
                for (int64_t i = 0; i < k; ++i) mag += std::fabs(wref[r * k + i] * xt[i]);
                EXPECT_NEAR(got, ref.f32 + b, 1e-5 * mag + ref.i16 + 1e-6 * std::fabs(b))
                    << name << " n " << n << " tok " << tok << " row " << r << " scalar " << scalar;
                continue;
              }
              EXPECT_NEAR(got, ref.q8 + b, ref.tight + 1e-6 * std::fabs(b))
                  << name << " n " << n << " tok " << tok << " row " << r << " scalar " << scalar;
              EXPECT_NEAR(got, ref.f32 + b, ref.loose + ref.tight + 1e-6 * std::fabs(b));
            }
            // Padding between output rows is untouched.
            for (int64_t r = m; r < out_stride; ++r) {
              EXPECT_EQ(out[static_cast<size_t>(tok * out_stride + r)], -7.0f);
            }
          }
        }
      }
    }
  }
}

// A column slice of the weight: the first half of each row's blocks, rows a full row apart.
TEST_F(QuantFixture, LinearOnColumnSliceWithRowStride) {
  for (const TypeCase& tc : kQuantTypes) {
    const std::string name = std::string(tc.name) + ".b";  // [3, 512]
    const Tensor t = tensor(name);
    const std::vector<float> wref = read_f32(kDir + name + ".f32");
    const DTypeInfo& info = dtype_info(t.dtype);
    const int64_t k = 256;
    const int64_t m = t.rows();
    const std::vector<float> x = random_rows(2, k, 5);
    std::vector<float> out(static_cast<size_t>(2 * m));
    QuantLinearParams p;
    p.x = x.data();
    p.weight = t.data;
    p.weight_dtype = t.dtype;
    p.out = out.data();
    p.n_tokens = 2;
    p.in_features = k;
    p.out_features = m;
    p.weight_row_blocks = 512 / info.block_size;
    for (bool f32_act : {false, true}) {
      p.f32_activations = f32_act;
      ASSERT_TRUE(quant_linear(p).ok());
      for (int64_t tok = 0; tok < 2; ++tok) {
        const float* xt = x.data() + tok * k;
        const Q8Row q = quantize(xt, k, QuantIsa::kScalar);
        for (int64_t r = 0; r < m; ++r) {
          const Refs ref = reference(wref.data() + r * 512, xt, q, k);
          if (f32_act) {
            double mag = 0;
            for (int64_t i = 0; i < k; ++i) mag += std::fabs(wref[r * 512 + i] * xt[i]);
            EXPECT_NEAR(out[static_cast<size_t>(tok * m + r)], ref.f32, 1e-5 * mag + ref.i16)
                << name;
          } else {
            EXPECT_NEAR(out[static_cast<size_t>(tok * m + r)], ref.q8, ref.tight) << name;
          }
        }
      }
    }
  }
}

// Each SIMD variant's f32-activation kernels (the fused decode kernels for n_tokens < 16, with
// int16 activations the AVX-512 ones where the variant has them; the dequantizing GEMM above)
// against the scalar f32 path (force_scalar: dequantize_row + scalar dot) for every
// block type: n_tokens 1..7, 9, 15 (token groups), 16, 23, 40 (GEMM: partial 6-token panels),
// row counts that are not multiples of the 4-row tile or the 16-row panel, k past one 256-value
// k-block, rows with a block count that leaves a tail after
// groups of 8, weight rows farther apart than their length (weight_row_blocks), strided x and
// out, and a bias. Both compute the f32 product over the dequantized weights, so they may
// differ only by f32 summation order: within 1e-5 of sum |w_i x_i| + |bias|; with int16_decode
// the 32-value types' decode kernels also round x to int16, which adds at most
// sum_blk max|x_blk| / 65534 * sum|w_blk|.
TEST_P(QuantSimd, F32ActivationMatchesScalar) {
  if (const std::string why = cannot_run(GetParam()); !why.empty()) GTEST_SKIP() << why;
  for (const TypeCase& tc : kQuantTypes) {
    const DTypeInfo& info = dtype_info(tc.dtype);
    const bool kq = info.block_size == 256;
    // 32-value types: 1 block, 9 (a group of 8 + 1), 19 (2 groups + 3); K-quants: 1 and 3
    // super-blocks.
    const std::vector<int64_t> ks =
        kq ? std::vector<int64_t>{256, 768} : std::vector<int64_t>{32, 288, 608};
    for (const int64_t k : ks) {
      for (const int64_t m : {1, 6, 13, 37}) {
        for (const int64_t pad_blocks : {0, 3}) {
          const int64_t row_blocks = k / info.block_size + pad_blocks;
          const std::vector<uint8_t> w = random_quant_rows(
              tc.dtype, m, row_blocks, static_cast<uint32_t>(k * 31 + m * 7 + pad_blocks));
          std::vector<float> wf(static_cast<size_t>(m * k));
          for (int64_t r = 0; r < m; ++r) {
            ASSERT_TRUE(dequantize_row(tc.dtype, w.data() + r * row_blocks * info.block_bytes,
                                       wf.data() + r * k, k)
                            .ok());
          }
          std::vector<float> bias(static_cast<size_t>(m));
          for (int64_t r = 0; r < m; ++r)
            bias[static_cast<size_t>(r)] = 0.1f * static_cast<float>(r % 5) - 0.2f;
          for (const int64_t n : {1, 2, 3, 4, 5, 6, 7, 9, 15, 16, 23, 40}) {
            const int64_t x_stride = k + 8;
            const int64_t out_stride = m + 2;
            const std::vector<float> x =
                random_rows(n, x_stride, static_cast<uint32_t>(1000 + n + k + m));
            std::vector<float> got(static_cast<size_t>(n * out_stride), -7.0f);
            std::vector<float> want(got.size(), -7.0f);
            QuantLinearParams p;
            p.x = x.data();
            p.weight = w.data();
            p.weight_dtype = tc.dtype;
            p.bias = bias.data();
            p.n_tokens = n;
            p.in_features = k;
            p.out_features = m;
            p.x_stride = x_stride;
            p.out_stride = out_stride;
            p.weight_row_blocks = pad_blocks != 0 ? row_blocks : 0;
            p.f32_activations = true;
            p.prefill = QuantPrefill::kF32;  // 16 tokens and more: the f32 GEMM, not the int8 one
            p.force_scalar = true;
            p.out = want.data();
            ASSERT_TRUE(quant_linear(p).ok());
            for (const bool i16 : {false, true}) {
              p.force_scalar = false;
              p.isa = GetParam();
              p.int16_decode = i16;
              p.out = got.data();
              ASSERT_TRUE(quant_linear(p).ok());
              for (int64_t t = 0; t < n; ++t) {
                const float* xt = x.data() + t * x_stride;
                for (int64_t r = 0; r < m; ++r) {
                  double mag = std::fabs(bias[static_cast<size_t>(r)]);
                  double i16_bound = 0;  // sum max|x_blk| / 65534 * sum|w_blk|
                  for (int64_t b = 0; b < k / 32; ++b) {
                    double xmax = 0, wsum = 0;
                    for (int64_t i = 32 * b; i < 32 * b + 32; ++i) {
                      const double wi = wf[static_cast<size_t>(r * k + i)];
                      mag += std::fabs(wi * xt[i]);
                      xmax = std::max(xmax, std::fabs(static_cast<double>(xt[i])));
                      wsum += std::fabs(wi);
                    }
                    i16_bound += xmax / 65534.0 * wsum;
                  }
                  const size_t o = static_cast<size_t>(t * out_stride + r);
                  EXPECT_NEAR(got[o], want[o], 1e-5 * mag + (i16 ? i16_bound : 0.0))
                      << tc.name << " k " << k << " m " << m << " pad " << pad_blocks << " n " << n
                      << " tok " << t << " row " << r << " int16 " << i16;
                }
                for (int64_t r = m; r < out_stride; ++r) {
                  EXPECT_EQ(got[static_cast<size_t>(t * out_stride + r)], -7.0f);
                }
              }
            }
          }
        }
      }
    }
  }
}

// The AVX2 dequantizers (the GEMM's weight packing) reproduce dequantize_row bit for bit.
TEST(Quant, DequantAvx2MatchesScalarBitExactly) {
  if (!cpu_supports(CpuIsa::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  for (const TypeCase& tc : kQuantTypes) {
    const DTypeInfo& info = dtype_info(tc.dtype);
    const int64_t blocks = 5;
    const int64_t n = blocks * info.block_size;
    const std::vector<uint8_t> w = random_quant_rows(tc.dtype, 1, blocks, 77);
    std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n), -1.0f);
    ASSERT_TRUE(dequantize_row(tc.dtype, w.data(), want.data(), n).ok());
    quant_detail::DequantFn fn = quant_detail::dequant_avx2(tc.dtype);
    ASSERT_NE(fn, nullptr) << tc.name;
    fn(w.data(), got.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::memcmp(&got[static_cast<size_t>(i)], &want[static_cast<size_t>(i)], 4), 0)
          << tc.name << " value " << i << ": " << got[static_cast<size_t>(i)] << " vs "
          << want[static_cast<size_t>(i)];
    }
  }
}

// The int16 activation quantizer's quad layout (Q16Act::qq, the AVX-512 4-row decode kernel's
// activations for Q4_0 / Q4_1) holds qs permuted as its comment says, whole groups of 4 blocks
// only, and the quantizer's other outputs do not change with it.
TEST(Quant, Q16QuadLayoutPermutesTheValues) {
  if (!cpu_supports(CpuIsa::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  for (const int64_t n : {128, 576, 640, 1536}) {
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::normal_distribution<float> dist(0.0f, 2.0f);
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = dist(rng);
    const int64_t nb = n / 32, whole = n / 128 * 128;
    std::vector<int16_t> qs(n), qs2(n), qq(n + 8, int16_t{0x5a5a});
    std::vector<float> d(nb), s(nb), d2(nb), s2(nb);
    quant_detail::quantize_row_q16_avx2(x.data(), n, qs.data(), d.data(), s.data(), qq.data());
    quant_detail::quantize_row_q16_avx2(x.data(), n, qs2.data(), d2.data(), s2.data());
    ASSERT_EQ(qs, qs2) << n;
    ASSERT_EQ(0, std::memcmp(d.data(), d2.data(), sizeof(float) * nb)) << n;
    ASSERT_EQ(0, std::memcmp(s.data(), s2.data(), sizeof(float) * nb)) << n;
    const int offset[4] = {0, 16, 1, 17};
    for (int64_t g = 0; g < whole / 128; ++g) {
      for (int k = 0; k < 4; ++k) {
        for (int b = 0; b < 4; ++b) {
          for (int i = 0; i < 8; ++i) {
            ASSERT_EQ(qq[128 * g + 32 * k + 8 * b + i], qs[32 * (4 * g + b) + offset[k] + 2 * i])
                << "n " << n << " group " << g << " k " << k << " block " << b << " i " << i;
          }
        }
      }
    }
    for (int64_t i = whole; i < n + 8; ++i) {
      ASSERT_EQ(qq[i], int16_t{0x5a5a}) << "n " << n << ": wrote past the whole groups at " << i;
    }
  }
}

// Striped one-token tiles (rows4_striped, what decode runs): tile j of rows [r0, r0 + 4q) takes
// rows r0 + j + {0, q, 2q, 3q}; every row's result is the bits the same kernel gives it in
// consecutive tiles (rows do not mix), lands at its own row, and no prefetch distance (none, a
// few rows on, 16 rows on) changes a result.
TEST(Quant, StripedTilesGiveEachRowItsConsecutiveTileBits) {
  if (!cpu_supports(CpuIsa::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  const QuantIsa isa = quant_detail::resolve_quant_isa(QuantIsa::kBest);
  for (const DType dt : {DType::kQ4_0, DType::kQ4_1, DType::kQ8_0, DType::kQ5_1}) {
    const quant_detail::RowsI16Fn rows4 = quant_detail::rows4_i16_for(dt, isa);
    ASSERT_NE(rows4, nullptr);
    for (const int64_t k : {int64_t{576}, int64_t{1536}}) {
      const int64_t q = 7, r0 = 4, rows = r0 + 4 * q + 3;  // rows before and after the range
      const int64_t row_bytes = k / 32 * static_cast<int64_t>(dtype_info(dt).block_bytes);
      const std::vector<uint8_t> w = random_quant_rows(dt, rows, k / 32, 11);
      const std::vector<float> x = random_rows(1, k, 12);
      std::vector<int16_t> qs(k), qq(k);
      std::vector<float> d(k / 32), s(k / 32);
      const bool quad = quant_detail::rows4_reads_quad(isa);
      quant_detail::quantize_row_q16_avx2(x.data(), k, qs.data(), d.data(), s.data(),
                                          quad ? qq.data() : nullptr);
      const quant_detail::Q16Act a{qs.data(), d.data(), s.data(), quad ? qq.data() : nullptr};
      std::vector<float> want(rows, NAN);
      for (int64_t t = r0; t + 4 <= r0 + 4 * q; t += 4) {
        rows4(w.data() + t * row_bytes, row_bytes, k, a, want.data() + t, 16 * row_bytes);
      }
      for (const int64_t pf : {int64_t{-1}, 2 * row_bytes, 16 * row_bytes}) {
        std::vector<float> got(rows, NAN);
        std::vector<int> hits(rows, 0);
        for (int64_t j = 0; j < q; ++j) {
          float res[4];
          rows4(w.data() + (r0 + j) * row_bytes, q * row_bytes, k, a, res, pf);
          for (int i = 0; i < 4; ++i) got[r0 + i * q + j] = res[i];
        }
        quant_detail::rows4_striped(rows4, w.data(), row_bytes, r0, q, k, a,
                                    [&](int64_t r, float v) {
                                      ASSERT_EQ(0, std::memcmp(&v, &got[r], sizeof v)) << r;
                                      ++hits[r];
                                    });
        for (int64_t r = 0; r < rows; ++r) {
          const bool in = r >= r0 && r < r0 + 4 * q;
          EXPECT_EQ(hits[r], in ? 1 : 0) << dtype_info(dt).name << " row " << r;
          if (in) {
            EXPECT_EQ(0, std::memcmp(&got[r], &want[r], sizeof(float)))
                << dtype_info(dt).name << " k " << k << " pf " << pf << " row " << r << ": "
                << got[r] << " vs " << want[r];
          }
        }
      }
    }
  }
}

// The int8-activation kernels of each SIMD variant against the scalar ones, through
// quant_linear (f32_activations = false) on random blocks: one token (tiles of 1..4 rows), 2..5
// and 9 tokens (one row, tiles of 1..4 tokens), row counts that leave partial tiles, block
// counts that leave a tail after groups of 8 (and an odd one, so a 512-bit pair is split), padded
// weight rows, strided x and out. Both sides quantize x identically (the quantizers agree bit
// for bit, above) and every block's integer dot is exact, so they differ only by f32 summation
// order: within 1e-5 of sum |w_i d_a q_i| (+ |bias|).
TEST_P(QuantSimd, Int8KernelsMatchScalar) {
  if (const std::string why = cannot_run(GetParam()); !why.empty()) GTEST_SKIP() << why;
  for (const TypeCase& tc : kQuantTypes) {
    const DTypeInfo& info = dtype_info(tc.dtype);
    const bool kq = info.block_size == 256;
    const std::vector<int64_t> ks =
        kq ? std::vector<int64_t>{256, 768} : std::vector<int64_t>{32, 96, 288, 608, 1024};
    for (const int64_t k : ks) {
      for (const int64_t m : {1, 6, 13}) {
        const int64_t row_blocks = k / info.block_size + 1;
        const std::vector<uint8_t> w =
            random_quant_rows(tc.dtype, m, row_blocks, static_cast<uint32_t>(k * 17 + m));
        std::vector<float> wf(static_cast<size_t>(m * k));
        for (int64_t r = 0; r < m; ++r) {
          ASSERT_TRUE(dequantize_row(tc.dtype, w.data() + r * row_blocks * info.block_bytes,
                                     wf.data() + r * k, k)
                          .ok());
        }
        std::vector<float> bias(static_cast<size_t>(m));
        for (int64_t r = 0; r < m; ++r)
          bias[static_cast<size_t>(r)] = 0.1f * static_cast<float>(r % 3) - 0.1f;
        for (const int64_t n : {1, 2, 3, 4, 5, 9}) {
          const int64_t x_stride = k + 8;
          const int64_t out_stride = m + 2;
          const std::vector<float> x =
              random_rows(n, x_stride, static_cast<uint32_t>(77 + n + k + m));
          std::vector<float> got(static_cast<size_t>(n * out_stride), -7.0f);
          std::vector<float> want(got.size(), -7.0f);
          QuantLinearParams p =
              linear_params(tc.dtype, w, bias, x, n, k, m, x_stride, out_stride, row_blocks);
          p.out = want.data();
          ASSERT_TRUE(quant_linear(p).ok());
          p.isa = GetParam();
          p.out = got.data();
          ASSERT_TRUE(quant_linear(p).ok());
          for (int64_t t = 0; t < n; ++t) {
            const Q8Row q = quantize(x.data() + t * x_stride, k, QuantIsa::kScalar);
            for (int64_t r = 0; r < m; ++r) {
              double mag = std::fabs(bias[static_cast<size_t>(r)]);
              for (int64_t i = 0; i < k; ++i) {
                mag += std::fabs(static_cast<double>(wf[static_cast<size_t>(r * k + i)]) *
                                 q.d[static_cast<size_t>(i / 32)] * q.qs[static_cast<size_t>(i)]);
              }
              const size_t o = static_cast<size_t>(t * out_stride + r);
              EXPECT_NEAR(got[o], want[o], 1e-5 * mag + 1e-30)
                  << tc.name << " k " << k << " m " << m << " n " << n << " tok " << t << " row "
                  << r << " isa " << quant_isa_name(GetParam());
            }
            for (int64_t r = m; r < out_stride; ++r) {
              EXPECT_EQ(got[static_cast<size_t>(t * out_stride + r)], -7.0f);
            }
          }
        }
      }
    }
  }
}

// linear_quant_gemm on every SIMD variant this CPU runs (AVX2, AVX-512) against the scalar
// reference (dequantize_row + double dot), for a 32-value and a K-quant type, with a bias,
// strides and shapes that leave partial panels; the scalar variant is refused.
// The decode choice (set_quant_decode, STRATA_CPU_DECODE): with kInt8, decode-sized calls with
// f32_activations run exactly the int8 kernels that f32_activations = false runs; with kInt16
// they run the int16 / f32 kernels; calls of 16 tokens or more are not affected.
TEST(Quant, DecodeChoiceSelectsTheKernels) {
  const int64_t k = 256, m = 13;
  for (const TypeCase& tc : kQuantTypes) {
    const DTypeInfo& info = dtype_info(tc.dtype);
    const int64_t row_blocks = k / info.block_size;
    const std::vector<uint8_t> w = random_quant_rows(tc.dtype, m, row_blocks, 5);
    const std::vector<float> bias(static_cast<size_t>(m), 0.25f);
    for (const int64_t n : {1, 3, 16}) {
      const std::vector<float> x = random_rows(n, k, static_cast<uint32_t>(n + 11));
      QuantLinearParams p = linear_params(tc.dtype, w, bias, x, n, k, m, k, m, row_blocks);
      p.isa = QuantIsa::kBest;
      const auto run = [&](bool f32_act, QuantDecode mode) {
        std::vector<float> out(static_cast<size_t>(n * m), -7.0f);
        set_quant_decode(mode);
        p.f32_activations = f32_act;
        p.out = out.data();
        const Status st = quant_linear(p);
        set_quant_decode(QuantDecode::kAuto);
        EXPECT_TRUE(st.ok()) << st.to_string();
        return out;
      };
      const std::vector<float> int8 = run(false, QuantDecode::kInt16);
      const std::vector<float> f32_act = run(true, QuantDecode::kInt16);
      const std::vector<float> chosen = run(true, QuantDecode::kInt8);
      if (n < 16) {
        EXPECT_EQ(chosen, int8) << tc.name << " n " << n;
        EXPECT_NE(chosen, f32_act) << tc.name << " n " << n << ": the choice changed nothing";
      } else {
        EXPECT_EQ(chosen, f32_act) << tc.name << " n " << n;
      }
    }
  }
}

TEST(Quant, QuantGemmEveryIsaMatchesReference) {
  for (const DType dt : {DType::kQ4_1, DType::kQ6_K}) {
    const DTypeInfo& info = dtype_info(dt);
    const int64_t k = 3 * 256, m = 45, n = 19, row_blocks = k / info.block_size + 1;
    const std::vector<uint8_t> w = random_quant_rows(dt, m, row_blocks, 5);
    std::vector<float> wf(static_cast<size_t>(m * k));
    for (int64_t r = 0; r < m; ++r) {
      ASSERT_TRUE(
          dequantize_row(dt, w.data() + r * row_blocks * info.block_bytes, wf.data() + r * k, k)
              .ok());
    }
    const std::vector<float> x = random_rows(n, k + 4, 9);
    std::vector<float> bias(static_cast<size_t>(m));
    for (int64_t r = 0; r < m; ++r) bias[static_cast<size_t>(r)] = 0.01f * static_cast<float>(r);
    for (const CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
      std::vector<float> out(static_cast<size_t>(n * (m + 1)), -7.0f);
      const LinearParams p{.x = x.data(),
                           .x_stride = k + 4,
                           .w = w.data(),
                           .w_dtype = dt,
                           .w_stride = row_blocks * info.block_size,
                           .bias = bias.data(),
                           .out = out.data(),
                           .out_stride = m + 1,
                           .n_tokens = n,
                           .in_features = k,
                           .out_features = m};
      const Status st = linear_quant_gemm(p, isa);
      if (isa == CpuIsa::kScalar || !cpu_supports(isa)) {
        EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << cpu_isa_name(isa);
        continue;
      }
      ASSERT_TRUE(st.ok()) << st.to_string();
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t r = 0; r < m; ++r) {
          double want = bias[static_cast<size_t>(r)], mag = std::fabs(want);
          for (int64_t i = 0; i < k; ++i) {
            const double v = static_cast<double>(wf[static_cast<size_t>(r * k + i)]) *
                             x[static_cast<size_t>(t * (k + 4) + i)];
            want += v;
            mag += std::fabs(v);
          }
          EXPECT_NEAR(out[static_cast<size_t>(t * (m + 1) + r)], want, 1e-5 * mag)
              << info.name << " " << cpu_isa_name(isa) << " tok " << t << " row " << r;
        }
        EXPECT_EQ(out[static_cast<size_t>(t * (m + 1) + m)], -7.0f);
      }
    }
  }
}

TEST(Quant, LinearRejectsBadArguments) {
  std::vector<float> x(64), out(4);
  std::vector<uint8_t> w(1024);
  QuantLinearParams p;
  p.x = x.data();
  p.weight = w.data();
  p.out = out.data();
  p.n_tokens = 1;
  p.out_features = 1;
  p.weight_dtype = DType::kQ4_K;
  p.in_features = 64;  // not a multiple of 256
  Status st = quant_linear(p);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("q4_k"), std::string::npos) << st.message();
  p.weight_dtype = DType::kF16;
  st = quant_linear(p);
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  p.weight_dtype = DType::kQ8_0;
  p.x_stride = 32;  // shorter than a row
  EXPECT_FALSE(quant_linear(p).ok());
}

// quant_decode_parts (one token through q/k/v or gate/up in one OpenMP region) against
// quant_linear on each part alone: bit-identical, for mixed 32-value block types, row counts that
// are not multiples of the 4-row tile, weight rows farther apart than their length, f32 and
// bf16 biases, and with accumulate (out += result, as the residual add does), with int16 and
// with int8 decode activations. K-quant parts are refused (false) with int16, out untouched,
// and so is a CPU without AVX2.
TEST(Quant, DecodePartsMatchLinearPerPartBitExactly) {
  if (quant_detail::resolve_quant_isa(QuantIsa::kBest) == QuantIsa::kScalar) {
    GTEST_SKIP() << "no AVX2 on this CPU: quant_decode_parts serves nothing";
  }
  const int64_t k = 320;  // 10 blocks of 32
  const std::vector<float> x = random_rows(1, k, 11);
  struct Spec {
    DType dt;
    int64_t rows, row_blocks;  // row_blocks > k / 32: rows farther apart than their length
    DType bias;                // kI32: no bias
  };
  const std::vector<std::vector<Spec>> cases = {
      {{DType::kQ4_1, 9, 10, DType::kI32},
       {DType::kQ8_0, 3, 10, DType::kF32},
       {DType::kQ5_0, 3, 12, DType::kBF16}},
      {{DType::kQ4_0, 16, 10, DType::kF32}, {DType::kQ5_1, 7, 11, DType::kI32}},
      {{DType::kQ8_0, 1, 10, DType::kI32}},
  };
  for (const QuantDecode mode : {QuantDecode::kInt16, QuantDecode::kInt8}) {
    set_quant_decode(mode);
    uint32_t seed = 100;
    for (const auto& spec : cases) {
      std::vector<std::vector<uint8_t>> weights;
      std::vector<std::vector<float>> bias_f32;
      std::vector<std::vector<uint16_t>> bias_bf16;
      std::vector<DecodePart> parts;
      int64_t total = 0;
      for (const Spec& s : spec) total += s.rows;
      for (bool accumulate : {false, true}) {
        std::vector<float> got(static_cast<size_t>(total)), want(static_cast<size_t>(total));
        for (size_t i = 0; i < got.size(); ++i)
          got[i] = want[i] = 0.25f * static_cast<float>(i) - 1;
        weights.clear();
        bias_f32.clear();
        bias_bf16.clear();
        parts.clear();
        int64_t r0 = 0;
        for (const Spec& s : spec) {
          weights.push_back(random_quant_rows(s.dt, s.rows, s.row_blocks, seed++));
          DecodePart d;
          d.weight = weights.back().data();
          d.weight_dtype = s.dt;
          d.row_bytes = s.row_blocks * dtype_info(s.dt).block_bytes;
          d.rows = s.rows;
          std::vector<float> b = random_rows(1, s.rows, seed++);
          bias_f32.push_back(b);
          std::vector<uint16_t> bb(b.size());
          for (size_t i = 0; i < b.size(); ++i) bb[i] = f32_to_bf16(b[i]);
          bias_bf16.push_back(bb);
          if (s.bias == DType::kF32) d.bias = bias_f32.back().data();
          if (s.bias == DType::kBF16) d.bias = bias_bf16.back().data();
          d.bias_dtype = s.bias == DType::kBF16 ? DType::kBF16 : DType::kF32;
          d.out = got.data() + r0;
          parts.push_back(d);
          // The per-part reference: quant_linear (f32 bias only; a bf16 one added after, as
          // cpu::linear does), then the residual add.
          std::vector<float> res(static_cast<size_t>(s.rows));
          QuantLinearParams p;
          p.x = x.data();
          p.weight = d.weight;
          p.weight_dtype = s.dt;
          p.bias = s.bias == DType::kF32 ? bias_f32.back().data() : nullptr;
          p.out = res.data();
          p.n_tokens = 1;
          p.in_features = k;
          p.out_features = s.rows;
          p.weight_row_blocks = s.row_blocks;
          ASSERT_TRUE(quant_linear(p).ok());
          for (int64_t r = 0; r < s.rows; ++r) {
            float v = res[static_cast<size_t>(r)];
            if (s.bias == DType::kBF16) v += bf16_to_f32(bias_bf16.back()[static_cast<size_t>(r)]);
            float& w = want[static_cast<size_t>(r0 + r)];
            w = accumulate ? w + v : v;
          }
          r0 += s.rows;
        }
        const bool served = quant_decode_parts(x.data(), k, parts.data(),
                                               static_cast<int>(parts.size()), accumulate);
        set_quant_decode(QuantDecode::kAuto);
        ASSERT_TRUE(served);
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_EQ(got[i], want[i]) << "row " << i << " accumulate " << accumulate << " int8 "
                                     << (mode == QuantDecode::kInt8);
        }
        set_quant_decode(mode);
      }
    }
  }
  set_quant_decode(QuantDecode::kAuto);
  // A K-quant part: refused, nothing written.
  std::vector<uint8_t> wk = random_quant_rows(DType::kQ4_K, 4, 2, 7);
  std::vector<float> out(4, 3.0f);
  const std::vector<float> x256 = random_rows(1, 512, 12);
  DecodePart d;
  d.weight = wk.data();
  d.weight_dtype = DType::kQ4_K;
  d.row_bytes = 2 * dtype_info(DType::kQ4_K).block_bytes;
  d.rows = 4;
  d.out = out.data();
  EXPECT_FALSE(quant_decode_parts(x256.data(), 512, &d, 1, false));
  for (float v : out) EXPECT_EQ(v, 3.0f);
}

}  // namespace
}  // namespace strata::cpu

namespace strata::cpu {
namespace {

// quant_ffn_decode (norm, gate/up, activation and down with the residual in one OpenMP region)
// against the composition it replaces: rms_norm, quant_decode_parts on [gate; up], gated_act,
// quant_decode_parts on down with accumulate. Bit-identical x, h and act, for mixed 32-value
// block types, biases, SiLU and GELU; a K-quant part is refused (false, nothing written).
TEST(Quant, FfnDecodeMatchesCompositionBitExactly) {
  if (quant_detail::resolve_quant_isa(QuantIsa::kBest) == QuantIsa::kScalar) {
    GTEST_SKIP() << "no AVX2 on this CPU: quant_ffn_decode serves nothing";
  }
  set_quant_decode(QuantDecode::kInt16);
  const int64_t k = 160, F = 96;  // hidden: 5 blocks of 32; ffn: 3 blocks
  struct Case {
    DType gate, up, down;
    Activation act;
    bool bias;
  };
  const std::vector<Case> cases = {
      {DType::kQ4_1, DType::kQ4_1, DType::kQ4_1, Activation::kSilu, false},
      {DType::kQ8_0, DType::kQ4_0, DType::kQ8_0, Activation::kSilu, true},
      {DType::kQ5_1, DType::kQ4_1, DType::kQ5_0, Activation::kGeluTanh, true},
  };
  uint32_t seed = 300;
  for (const Case& c : cases) {
    const auto wg = random_quant_rows(c.gate, F, k / 32, seed++);
    const auto wu = random_quant_rows(c.up, F, k / 32, seed++);
    const auto wd = random_quant_rows(c.down, k, F / 32, seed++);
    const std::vector<float> bg = random_rows(1, F, seed++), bu = random_rows(1, F, seed++),
                             bd = random_rows(1, k, seed++), nw = random_rows(1, k, seed++);
    const std::vector<float> x0 = random_rows(1, k, seed++);
    const auto part = [&](const std::vector<uint8_t>& w, DType dt, int64_t rows, int64_t in,
                          const std::vector<float>& b) {
      DecodePart d;
      d.weight = w.data();
      d.weight_dtype = dt;
      d.row_bytes = in / 32 * dtype_info(dt).block_bytes;
      d.rows = rows;
      if (c.bias) d.bias = b.data();
      return d;
    };
    RmsNormParams norm;
    norm.weight = nw.data();
    norm.weight_dtype = DType::kF32;
    norm.eps = 1e-5f;
    norm.weight_offset = 0.0f;

    // The composition.
    std::vector<float> xw = x0, hw(k), gu(2 * F), aw(F);
    RmsNormParams np = norm;
    np.x = xw.data();
    np.out = hw.data();
    np.n_tokens = 1;
    np.hidden = k;
    np.x_stride = np.out_stride = k;
    ASSERT_TRUE(rms_norm(np).ok());
    DecodePart in[2] = {part(wg, c.gate, F, k, bg), part(wu, c.up, F, k, bu)};
    in[0].out = gu.data();
    in[1].out = gu.data() + F;
    ASSERT_TRUE(quant_decode_parts(hw.data(), k, in, 2, false));
    GatedActParams ga;
    ga.gate = gu.data();
    ga.up = gu.data() + F;
    ga.out = aw.data();
    ga.gate_stride = ga.up_stride = ga.out_stride = 2 * F;
    ga.n_tokens = 1;
    ga.ffn_dim = F;
    ga.act = c.act;
    ASSERT_TRUE(gated_act(ga).ok());
    DecodePart dn = part(wd, c.down, k, F, bd);
    dn.out = xw.data();
    ASSERT_TRUE(quant_decode_parts(aw.data(), F, &dn, 1, true));

    // The fused kernel.
    std::vector<float> xf = x0, hf(k, -1.0f), af(F, -1.0f);
    FfnDecodeArgs f;
    f.x = xf.data();
    f.hidden = k;
    f.norm = norm;
    f.h = hf.data();
    f.gate = part(wg, c.gate, F, k, bg);
    f.up = part(wu, c.up, F, k, bu);
    f.down = part(wd, c.down, k, F, bd);
    f.act = c.act;
    f.act_out = af.data();
    f.ffn_dim = F;
    ASSERT_TRUE(quant_ffn_decode(f)) << dtype_info(c.gate).name;
    EXPECT_EQ(std::memcmp(xf.data(), xw.data(), sizeof(float) * k), 0) << dtype_info(c.gate).name;
    EXPECT_EQ(std::memcmp(hf.data(), hw.data(), sizeof(float) * k), 0);
    EXPECT_EQ(std::memcmp(af.data(), aw.data(), sizeof(float) * F), 0);
    EXPECT_NE(xf, x0);  // the residual moved
  }
  // A K-quant down projection: refused, nothing written.
  const auto wq = random_quant_rows(DType::kQ4_1, 256, 8, 7);
  const auto wk = random_quant_rows(DType::kQ4_K, 256, 1, 8);
  std::vector<float> x = random_rows(1, 256, 9), x_before = x, h(256, -1.0f), a(256, -1.0f),
                     nw(256, 1.0f);
  FfnDecodeArgs f;
  f.x = x.data();
  f.hidden = 256;
  f.norm.weight = nw.data();
  f.h = h.data();
  f.gate = {wq.data(), DType::kQ4_1, 8 * dtype_info(DType::kQ4_1).block_bytes, 256};
  f.up = f.gate;
  f.down = {wk.data(), DType::kQ4_K, dtype_info(DType::kQ4_K).block_bytes, 256};
  f.act_out = a.data();
  f.ffn_dim = 256;
  EXPECT_FALSE(quant_ffn_decode(f));
  EXPECT_EQ(x, x_before);
  EXPECT_EQ(h, std::vector<float>(256, -1.0f));
  set_quant_decode(QuantDecode::kAuto);
}

}  // namespace
}  // namespace strata::cpu
