// SmolLM2-135M-Instruct (Q4_1 GGUF) end to end against Hugging Face transformers loading the
// same file (scripts/make_smollm2_reference.py): tokenizer ids on the whole tokenizer corpus,
// logits at every position of four prompts, greedy continuations, and the chat template.
// Label `model`: needs scripts/fetch_model.sh smollm2; skips when the file is absent.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backends/cpu/quant.h"
#include "core/env.h"
#include "strata/engine.h"

namespace strata {
namespace {

using nlohmann::json;

std::string model_path() {
  if (const char* p = std::getenv("STRATA_SMOLLM2_GGUF")) return p;
  return env_config().cache_dir + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::string fixture(const std::string& rel) {
  return std::string(STRATA_FIXTURE_DIR) + "/" + rel;
}

class SmolLM2 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // The transformers comparisons hold prefill to f32 activations (CPUs whose default is the
    // int8 GEMM would move logits by ~1; Int8PrefillNearF32 checks that path).
    cpu::set_quant_prefill(QuantPrefill::kF32);
    struct stat st {};
    if (::stat(model_path().c_str(), &st) != 0) return;
    EngineConfig cfg;
    cfg.model = model_path();
    cfg.max_model_len = 512;
    auto e = Engine::create(cfg);
    if (e.ok()) engine_ = std::move(e).value().release();
    std::ifstream in(fixture("smollm2/reference.json"));
    ref_ = new json(json::parse(in));
  }
  static void TearDownTestSuite() {
    cpu::set_quant_prefill(QuantPrefill::kAuto);
    delete engine_;
    delete ref_;
    engine_ = nullptr;
    ref_ = nullptr;
  }
  void SetUp() override {
    struct stat st {};
    if (::stat(model_path().c_str(), &st) != 0)
      GTEST_SKIP() << "no SmolLM2 GGUF at " << model_path();
    ASSERT_NE(engine_, nullptr);
  }
  static Engine* engine_;
  static json* ref_;
};
Engine* SmolLM2::engine_ = nullptr;
json* SmolLM2::ref_ = nullptr;

TEST_F(SmolLM2, TokenizerMatchesTransformersOnCorpus) {
  std::ifstream corpus(fixture("tokenizers/corpus.jsonl"));
  std::ifstream expected(fixture("smollm2/tokenizer_expected.txt"));
  std::string line, want;
  int lines = 0, mismatches = 0;
  while (std::getline(corpus, line) && std::getline(expected, want)) {
    const std::string text = json::parse(line).get<std::string>();
    auto ids = engine_->tokenize(text, /*add_special=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status().to_string();
    std::ostringstream got;
    for (size_t i = 0; i < ids->size(); ++i) got << (i ? " " : "") << (*ids)[i];
    if (got.str() != want && ++mismatches <= 5) {
      ADD_FAILURE() << "line " << lines << ": " << line << "\n got: " << got.str()
                    << "\nwant: " << want;
    }
    ++lines;
  }
  EXPECT_GE(lines, 2000);
  EXPECT_EQ(mismatches, 0);
}

TEST_F(SmolLM2, LogitsMatchTransformers) {
  for (const json& p : (*ref_)["prompts"]) {
    std::vector<int32_t> ids = p["ids"].get<std::vector<int32_t>>();
    auto mine = engine_->tokenize(p["text"].get<std::string>(), false);
    ASSERT_TRUE(mine.ok());
    EXPECT_EQ(*mine, ids) << p["text"];
    auto logits = engine_->score(ids);
    ASSERT_TRUE(logits.ok()) << logits.status().to_string();
    const int64_t V = engine_->info().vocab;
    double max_err = 0.0, max_ref = 0.0;
    for (size_t pos = 0; pos < ids.size(); ++pos) {
      for (const json& pair : p["top"][pos]) {
        const int64_t id = pair[0].get<int64_t>();
        const double want = pair[1].get<double>();
        max_err = std::max(max_err, std::fabs((*logits)[pos * V + id] - want));
        max_ref = std::max(max_ref, std::fabs(want));
      }
    }
    // bf16-level: the weights are identical (dequantized the same way); activations stay f32.
    EXPECT_LE(max_err / max_ref, 2e-3) << p["text"] << " max abs error " << max_err;
  }
}

TEST_F(SmolLM2, GreedyMatchesTransformers) {
  for (const json& p : (*ref_)["prompts"]) {
    GenerateRequest req;
    req.prompt_tokens = p["ids"].get<std::vector<int32_t>>();
    req.max_tokens = 64;
    req.sampling.temperature = 0.0f;
    req.ignore_eos = true;
    auto out = engine_->generate(req, nullptr);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    const auto want = p["greedy"].get<std::vector<int32_t>>();
    // Identical until the first position where the reference's top two logits are within
    // the numeric noise of two different f32 summation orders.
    size_t same = 0;
    while (same < want.size() && same < out->tokens.size() && out->tokens[same] == want[same])
      ++same;
    EXPECT_GE(same, 16u) << p["text"] << ": diverged at token " << same;
  }
}

// How far one run's logits are from another's over `positions` rows of V logits.
struct LogitGap {
  double max_err = 0.0, max_ref = 0.0;  // max |a - b|, max |a|
  size_t same_top = 0, positions = 0;   // rows whose argmax agrees, rows compared
  std::vector<double> row_err;          // max |a - b| of each row
  void add(const float* a, const float* b, size_t positions_in, int64_t V) {
    for (size_t pos = 0; pos < positions_in; ++pos, ++positions) {
      const float* ra = a + pos * V;
      const float* rb = b + pos * V;
      double row = 0.0;
      for (int64_t v = 0; v < V; ++v) {
        row = std::max(row, static_cast<double>(std::fabs(ra[v] - rb[v])));
        max_ref = std::max(max_ref, static_cast<double>(std::fabs(ra[v])));
      }
      row_err.push_back(row);
      max_err = std::max(max_err, row);
      same_top += std::max_element(ra, ra + V) - ra == std::max_element(rb, rb + V) - rb ? 1 : 0;
    }
  }
  // The bounds both int8 tests hold: the int8 path ran, logits within 0.1 of the largest, the
  // top token kept at 80% of the positions.
  void expect_near(const char* what) const {
    std::printf(
        "[ info ] %s, %zu positions: max |logit error| %.3f (%.2e of max |logit|), same top "
        "token at %zu\n",
        what, positions, max_err, max_err / max_ref, same_top);
    EXPECT_GT(max_err, 0.0);  // the int8 path ran
    EXPECT_LE(max_err / max_ref, 0.1) << "max abs error " << max_err;
    EXPECT_GE(same_top * 10, positions * 8) << same_top << " of " << positions;
  }
  // For int8 decode: the same bounds on 90% of the positions. A few rows go far off: one
  // position (the third prompt's 9th token) moved by up to 2.95 with one build and 10.09 with
  // the next, whose norm, rope and softmax round differently in f32, while int16 moved by
  // 2e-3 there; that row measures one position's sensitivity to int8 rounding (docs/
  // performance.md, "int8 decode").
  void expect_near_most(const char* what) const {
    size_t near = 0;
    for (double e : row_err) near += e <= 0.1 * max_ref ? 1 : 0;
    std::printf(
        "[ info ] %s, %zu positions: %zu within 0.1 of max |logit| (%.3f), max |logit error| "
        "%.3f, same top token at %zu\n",
        what, positions, near, max_ref, max_err, same_top);
    EXPECT_GT(max_err, 0.0);  // the int8 path ran
    EXPECT_GE(near * 10, positions * 9) << near << " of " << positions;
    EXPECT_GE(same_top * 10, positions * 8) << same_top << " of " << positions;
  }
};

// Prefill through the int8-activation GEMM (the default on AVX2 and AVX512-VNNI CPUs) against
// the f32 path on the four prompts run as one 77-token prompt: on the AVX2 machine measured,
// activations rounded to int8 per 32 values moved the logits by up to 1.28 (3.4e-2 of
// max|logit|) and kept the top token at 74 of 77 positions (docs/performance.md); the bounds
// leave room for other ISAs' summation orders.
TEST_F(SmolLM2, Int8PrefillNearF32) {
  std::vector<int32_t> ids;
  for (const json& p : (*ref_)["prompts"]) {
    for (const int32_t id : p["ids"].get<std::vector<int32_t>>()) ids.push_back(id);
  }
  auto f32 = engine_->score(ids);
  cpu::set_quant_prefill(QuantPrefill::kInt8);
  auto i8 = engine_->score(ids);
  cpu::set_quant_prefill(QuantPrefill::kF32);
  ASSERT_TRUE(f32.ok() && i8.ok());
  LogitGap gap;
  gap.add(f32->data(), i8->data(), ids.size(), engine_->info().vocab);
  gap.expect_near("int8 prefill vs f32");
}

// Decode with int8 activations (STRATA_CPU_DECODE=int8, llama.cpp's scheme) against the default
// int16 ones: every prompt scored alone, each cut to 15 tokens, so every linear layer runs the
// decode kernels. The int8 prefill's bounds on 90% of the positions (measured on the AVX2
// machine: max 2.95, 8.3e-2 of max|logit|, 46 of 50 top tokens; a later build 10.09 at one
// position, LogitGap::expect_near_most).
TEST_F(SmolLM2, Int8DecodeNearInt16) {
  LogitGap gap;
  for (const json& pr : (*ref_)["prompts"]) {
    std::vector<int32_t> ids = pr["ids"].get<std::vector<int32_t>>();
    if (ids.size() > 15) ids.resize(15);
    cpu::set_quant_decode(cpu::QuantDecode::kInt16);
    auto i16 = engine_->score(ids);
    cpu::set_quant_decode(cpu::QuantDecode::kInt8);
    auto i8 = engine_->score(ids);
    cpu::set_quant_decode(cpu::QuantDecode::kAuto);
    ASSERT_TRUE(i16.ok() && i8.ok());
    gap.add(i16->data(), i8->data(), ids.size(), engine_->info().vocab);
  }
  gap.expect_near_most("int8 decode vs int16");
}

TEST_F(SmolLM2, CapitalOfFranceIsParis) {
  GenerateRequest req;
  req.prompt = "The capital of France is";
  req.max_tokens = 8;
  req.sampling.temperature = 0.0f;
  auto out = engine_->generate(req, nullptr);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_NE(out->text.find("Paris"), std::string::npos) << out->text;
}

TEST_F(SmolLM2, ChatTemplateMatchesTransformers) {
  const json& chat = (*ref_)["chat"];
  GenerateRequest req;
  req.chat = true;
  req.prompt = chat["messages"][0]["content"].get<std::string>();
  req.max_tokens = 16;
  req.sampling.temperature = 0.0f;
  auto out = engine_->generate(req, nullptr);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->prompt_tokens, chat["ids"].get<std::vector<int32_t>>());
  EXPECT_NE(out->text.find("Paris"), std::string::npos) << out->text;
}

}  // namespace
}  // namespace strata
