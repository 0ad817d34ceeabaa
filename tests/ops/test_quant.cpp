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

#include "core/half.h"
#include "io/gguf.h"

namespace strata::cpu {
namespace {

const std::string kDir = std::string(STRATA_FIXTURE_DIR) + "/gguf/";

struct TypeCase {
  const char* name;
  DType dtype;
};
const TypeCase kQuantTypes[] = {
    {"q8_0", DType::kQ8_0}, {"q4_0", DType::kQ4_0}, {"q4_1", DType::kQ4_1}, {"q5_0", DType::kQ5_0},
    {"q5_1", DType::kQ5_1}, {"q4_k", DType::kQ4_K}, {"q5_k", DType::kQ5_K}, {"q6_k", DType::kQ6_K}};

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

std::vector<float> random_rows(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * k));
  for (float& v : x) v = nd(rng);
  // A spike and an all-zero block to exercise extreme scales.
  if (k >= 64) {
    x[3] = 25.0f;
    for (int i = 32; i < 64; ++i) x[static_cast<size_t>(i)] = 0.0f;
  }
  return x;
}

struct Q8Row {
  std::vector<int8_t> qs;
  std::vector<float> d;
  std::vector<float> s;
  Q8Act act() const { return {qs.data(), d.data(), s.data()}; }
};
Q8Row quantize(const float* x, int64_t k, QuantIsa isa) {
  Q8Row q;
  q.qs.resize(static_cast<size_t>(k));
  q.d.resize(static_cast<size_t>(k / 32));
  q.s.resize(static_cast<size_t>(k / 32));
  quantize_row_q8(x, k, q.qs.data(), q.d.data(), q.s.data(), isa);
  return q;
}

struct Refs {
  double q8 = 0;     // sum w_i * d_a q_i in double
  double f32 = 0;    // sum w_i * x_i in double
  double tight = 0;  // 1e-5 * sum T_blk
  double loose = 0;  // sum d_a / 2 * sum|w_blk|
};
Refs reference(const float* w, const float* x, const Q8Row& q, int64_t k) {
  Refs r;
  for (int64_t b = 0; b < k / 32; ++b) {
    double wmax = -1e300, wmin = 1e300, wabs = 0, aabs = 0, wsum_abs = 0;
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
    }
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

TEST(Quant, ActivationQuantizationScalarAndAvx2Agree) {
  const int64_t k = 4096;
  std::vector<float> x = random_rows(1, k, 7);
  x[100] = 0.5f * (127.0f / 25.0f);  // lands near a .5 rounding boundary for some blocks
  const Q8Row a = quantize(x.data(), k, QuantIsa::kScalar);
  const Q8Row b = quantize(x.data(), k, QuantIsa::kBest);
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

TEST_F(QuantFixture, DotMatchesReferences) {
  std::printf("quant kernels: best ISA here is %s\n", quant_isa_name(quant_best_isa()));
  for (const TypeCase& tc : kQuantTypes) {
    for (const char* tag : {"a", "b"}) {
      const std::string name = std::string(tc.name) + "." + tag;
      const Tensor t = tensor(name);
      const std::vector<float> wref = read_f32(kDir + name + ".f32");
      const int64_t k = t.cols();
      const std::vector<float> x = random_rows(1, k, 11);
      for (QuantIsa isa : {QuantIsa::kScalar, QuantIsa::kBest}) {
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
// strided x / out, scalar and best ISA, with and without caller scratch.
TEST_F(QuantFixture, LinearMatchesReferences) {
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
        for (bool scalar : {true, false}) {
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
          p.f32_activations = false;
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
    p.f32_activations = false;
    ASSERT_TRUE(quant_linear(p).ok());
    for (int64_t tok = 0; tok < 2; ++tok) {
      const Q8Row q = quantize(x.data() + tok * k, k, QuantIsa::kScalar);
      for (int64_t r = 0; r < m; ++r) {
        const Refs ref = reference(wref.data() + r * 512, x.data() + tok * k, q, k);
        EXPECT_NEAR(out[static_cast<size_t>(tok * m + r)], ref.q8, ref.tight) << name;
      }
    }
  }
}

// ---- f32-activation path -----------------------------------------------------------------------
// Against sum w_i x_i in double over the dequantize_row'd weights: the kernels only round in
// f32 (block products, per-block scaling, the sum(x) terms, accumulation), so the error is a
// small multiple of 2^-24 * sum|w||x|; 1e-5 relative to that scale is the bound checked.

struct F32Ref {
  double dot = 0;
  double tol = 0;
};
F32Ref f32_reference(const float* w, const float* x, int64_t k) {
  F32Ref r;
  double scale = 0;
  for (int64_t i = 0; i < k; ++i) {
    r.dot += static_cast<double>(w[i]) * x[i];
    scale += std::fabs(static_cast<double>(w[i]) * x[i]);
  }
  r.tol = 1e-5 * scale + 1e-30;
  return r;
}

TEST_F(QuantFixture, DotF32MatchesDequantizedReference) {
  for (const TypeCase& tc : kQuantTypes) {
    for (const char* tag : {"a", "b"}) {
      const std::string name = std::string(tc.name) + "." + tag;
      const Tensor t = tensor(name);
      const int64_t k = t.cols();
      std::vector<float> wrow(static_cast<size_t>(k));
      const std::vector<float> x = random_rows(1, k, 12);
      for (int64_t r = 0; r < t.rows(); ++r) {
        const auto* w = static_cast<const uint8_t*>(t.data) + dtype_bytes(t.dtype, r * k);
        ASSERT_TRUE(dequantize_row(t.dtype, w, wrow.data(), k).ok());
        const F32Ref ref = f32_reference(wrow.data(), x.data(), k);
        for (QuantIsa isa : {QuantIsa::kScalar, QuantIsa::kBest}) {
          EXPECT_NEAR(vec_dot_f32(t.dtype, w, x.data(), k, isa), ref.dot, ref.tol)
              << name << " row " << r << " isa " << quant_isa_name(isa);
        }
      }
    }
  }
}

// Random blocks of any type with f16 scales of moderate size (so values stay finite).
std::vector<uint8_t> random_quant_rows(DType dt, int64_t rows, int64_t k, uint32_t seed) {
  const DTypeInfo& info = dtype_info(dt);
  const int64_t nb = rows * k / info.block_size;
  std::vector<uint8_t> w(static_cast<size_t>(nb * info.block_bytes));
  std::mt19937 rng(seed);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> ud(0.001f, 0.05f);
  for (int64_t j = 0; j < nb; ++j) {
    uint8_t* b = w.data() + j * info.block_bytes;
    const uint16_t d = f32_to_f16(ud(rng));
    const uint16_t m = f32_to_f16(-ud(rng));
    std::memcpy(b + (dt == DType::kQ6_K ? 208 : 0), &d, 2);
    if (dt == DType::kQ4_1 || dt == DType::kQ5_1 || dt == DType::kQ4_K || dt == DType::kQ5_K) {
      std::memcpy(b + 2, &m, 2);
    }
  }
  return w;
}

// quant_linear, f32 path, for every type: 1..9 tokens (4-row tiles with remainders for one
// token, 4-token tiles with remainders for more), strided x / out, bias, a column slice of a
// wider weight (weight_row_blocks), scalar and best ISA, with and without caller scratch.
TEST(Quant, LinearF32MatchesDequantizedReference) {
  for (const TypeCase& tc : kQuantTypes) {
    const DTypeInfo& info = dtype_info(tc.dtype);
    const int64_t k = info.block_size == 32 ? 320 : 512;  // 10 blocks (8 + tail) / 2 super-blocks
    const int64_t k_full = k + 2 * info.block_size;       // the weight is a column slice
    const int64_t m = 11;
    const std::vector<uint8_t> w = random_quant_rows(tc.dtype, m, k_full, 7);
    std::vector<float> wref(static_cast<size_t>(m * k_full));
    ASSERT_TRUE(dequantize_row(tc.dtype, w.data(), wref.data(), m * k_full).ok());
    std::vector<float> bias(static_cast<size_t>(m));
    for (int64_t r = 0; r < m; ++r)
      bias[static_cast<size_t>(r)] = 0.5f - 0.1f * static_cast<float>(r);
    for (int64_t n = 1; n <= 9; ++n) {
      const int64_t x_stride = k + 40;
      const int64_t out_stride = m + 5;
      const std::vector<float> x = random_rows(n, x_stride, static_cast<uint32_t>(200 + n));
      for (bool scalar : {true, false}) {
        std::vector<float> out(static_cast<size_t>(n * out_stride), -7.0f);
        std::vector<uint8_t> scratch(quant_linear_scratch_bytes(n, k));
        QuantLinearParams p;
        p.x = x.data();
        p.weight = w.data();
        p.weight_dtype = tc.dtype;
        p.bias = bias.data();
        p.out = out.data();
        p.n_tokens = n;
        p.in_features = k;
        p.out_features = m;
        p.x_stride = x_stride;
        p.out_stride = out_stride;
        p.weight_row_blocks = k_full / info.block_size;
        p.force_scalar = scalar;
        if (n % 2 == 1) {
          p.scratch = scratch.data();
          p.scratch_bytes = scratch.size();
        }
        ASSERT_TRUE(p.f32_activations);  // the default
        ASSERT_TRUE(quant_linear(p).ok());
        for (int64_t tok = 0; tok < n; ++tok) {
          const float* xt = x.data() + tok * x_stride;
          for (int64_t r = 0; r < m; ++r) {
            const F32Ref ref = f32_reference(wref.data() + r * k_full, xt, k);
            const double b = bias[static_cast<size_t>(r)];
            EXPECT_NEAR(out[static_cast<size_t>(tok * out_stride + r)], ref.dot + b,
                        ref.tol + 1e-6 * std::fabs(b))
                << tc.name << " n " << n << " tok " << tok << " row " << r << " scalar " << scalar;
          }
          for (int64_t r = m; r < out_stride; ++r) {
            EXPECT_EQ(out[static_cast<size_t>(tok * out_stride + r)], -7.0f);
          }
        }
      }
    }
  }
}

// The gguf-py fixture tensors through the f32 path (both ISAs), 1 and 5 tokens.
TEST_F(QuantFixture, LinearF32OnFixtureTensors) {
  for (const TypeCase& tc : kQuantTypes) {
    for (const char* tag : {"a", "b"}) {
      const std::string name = std::string(tc.name) + "." + tag;
      const Tensor t = tensor(name);
      const std::vector<float> wref = read_f32(kDir + name + ".f32");
      const int64_t k = t.cols();
      const int64_t m = t.rows();
      for (int64_t n : {1, 5}) {
        const std::vector<float> x = random_rows(n, k, static_cast<uint32_t>(300 + n));
        for (bool scalar : {true, false}) {
          std::vector<float> out(static_cast<size_t>(n * m));
          QuantLinearParams p;
          p.x = x.data();
          p.weight = t.data;
          p.weight_dtype = t.dtype;
          p.out = out.data();
          p.n_tokens = n;
          p.in_features = k;
          p.out_features = m;
          p.force_scalar = scalar;
          ASSERT_TRUE(quant_linear(p).ok());
          for (int64_t tok = 0; tok < n; ++tok) {
            for (int64_t r = 0; r < m; ++r) {
              const F32Ref ref = f32_reference(wref.data() + r * k, x.data() + tok * k, k);
              EXPECT_NEAR(out[static_cast<size_t>(tok * m + r)], ref.dot, ref.tol)
                  << name << " n " << n << " tok " << tok << " row " << r;
            }
          }
        }
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

}  // namespace
}  // namespace strata::cpu
