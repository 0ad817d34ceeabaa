// Gemma-3-270M (Q4_K_M GGUF) end to end against Hugging Face transformers loading the same
// file (scripts/make_gemma3_reference.py): tokenizer ids of the prompts (SentencePiece-style
// BPE with BOS), logits at every position, and greedy continuations. This exercises qk-norm,
// sandwich norms, GeGLU, sqrt(hidden) embedding scaling, sliding-window layers with their own
// rope theta, and the K-quant kernels. Label `model`; skips when the file is absent
// (scripts/fetch_model.sh gemma3-270m).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backends/cpu/quant.h"
#include "core/env.h"
#include "strata/engine.h"

namespace strata {
namespace {

using nlohmann::json;

std::string gemma_path() {
  return env_config().cache_dir + "/models/gemma-3-270m-q4_k_m.gguf";
}

TEST(Gemma3, MatchesTransformers) {
  struct stat st {};
  if (::stat(gemma_path().c_str(), &st) != 0) GTEST_SKIP() << "no Gemma-3 GGUF at " << gemma_path();
  std::ifstream in(std::string(STRATA_FIXTURE_DIR) + "/gemma3/reference.json");
  const json ref = json::parse(in);
  // f32-level comparison: prefill keeps f32 activations on every CPU (see SmolLM2's tests).
  cpu::set_quant_prefill(QuantPrefill::kF32);
  EngineConfig cfg;
  cfg.model = gemma_path();
  cfg.max_model_len = 256;
  auto engine = Engine::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  Engine& e = **engine;
  const int64_t V = e.info().vocab;
  for (const json& p : ref["prompts"]) {
    const auto ids = p["ids"].get<std::vector<int32_t>>();
    auto mine = e.tokenize(p["text"].get<std::string>(), /*add_special=*/true);
    ASSERT_TRUE(mine.ok()) << mine.status().to_string();
    EXPECT_EQ(*mine, ids) << p["text"];
    auto logits = e.score(ids);
    ASSERT_TRUE(logits.ok()) << logits.status().to_string();
    double max_err = 0.0, max_ref = 0.0;
    for (size_t pos = 0; pos < ids.size(); ++pos) {
      for (const json& pair : p["top"][pos]) {
        const double want = pair[1].get<double>();
        max_err = std::max(max_err, std::fabs((*logits)[pos * V + pair[0].get<int64_t>()] - want));
        max_ref = std::max(max_ref, std::fabs(want));
      }
    }
    EXPECT_LE(max_err / max_ref, 2e-3) << p["text"] << " max abs error " << max_err;
    GenerateRequest req;
    req.prompt_tokens = ids;
    req.max_tokens = static_cast<int64_t>(p["greedy"].size());
    req.sampling.temperature = 0.0f;
    req.ignore_eos = true;
    auto out = e.generate(req, nullptr);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ(out->tokens, p["greedy"].get<std::vector<int32_t>>()) << p["text"];
  }
}

}  // namespace
}  // namespace strata
