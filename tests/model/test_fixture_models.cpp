// Golden tests: strata's CPU logits and greedy continuations against Hugging Face
// transformers on tiny random checkpoints of every supported family.
#include <gtest/gtest.h>

#include "fixture_util.h"
#include "strata/engine.h"

namespace strata {
namespace {

struct Case {
  const char* name;
  double tolerance;  // max abs error / max |ref|
};

class FixtureModel : public ::testing::TestWithParam<Case> {};

TEST_P(FixtureModel, LogitsAndGreedyMatchTransformers) {
  const Case& c = GetParam();
  const std::string dir = testing::fixture_model(c.name);
  auto ref = testing::load_reference(dir);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  EngineConfig cfg;
  cfg.model = dir;
  auto engine = Engine::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  for (size_t i = 0; i < ref->inputs.size(); ++i) {
    auto logits = (*engine)->score(ref->inputs[i]);
    ASSERT_TRUE(logits.ok()) << logits.status().to_string();
    const double err = testing::relative_error(*logits, ref->logits[i]);
    EXPECT_LE(err, c.tolerance) << c.name << " sequence " << i;
  }
  GenerateRequest req;
  req.prompt_tokens = ref->greedy_prompt;
  req.max_tokens = static_cast<int64_t>(ref->greedy_tokens.size());
  req.sampling.temperature = 0.0f;
  req.ignore_eos = true;
  auto out = (*engine)->generate(req, nullptr);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->tokens, ref->greedy_tokens) << c.name;
}

// The f16/bf16 references are computed in f32 from the rounded weights, exactly what strata
// does (f32 accumulation over upcast weights), so they meet the f32 bound too; the issue's
// bound for half-precision checkpoints is 2e-2.
INSTANTIATE_TEST_SUITE_P(All, FixtureModel,
                         ::testing::Values(Case{"llama", 1e-4}, Case{"llama_bf16", 1e-4},
                                           Case{"llama_sharded", 1e-4}, Case{"mistral", 1e-4},
                                           Case{"qwen2", 1e-4}, Case{"gpt2", 1e-4},
                                           Case{"neox", 1e-4}, Case{"neox_seq", 1e-4},
                                           Case{"gemma3", 1e-4}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace strata
