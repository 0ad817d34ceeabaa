// Pipeline (x tensor) parallelism on the CPU under mpirun (make_pipeline_rank): one process per
// rank, world rank = pp_rank * tp + tp_rank. With 2 ranks: PP = 2; with 4: PP = 4 and TP = 2 x
// PP = 2. Rank 0's logits must equal the single-rank logits, computed in the same process,
// within 1e-5 relative, and greedy decoding through forward_argmax (the last stage's ids sent to
// rank 0) must give the single rank's tokens. PP = 4 needs four layers: the fixtures have two or
// three, so rank 0 writes a five-layer llama (the fixture's layers repeated) to a temp folder.
// And the real SmolLM2-135M when it has been downloaded (PP = 2 and 4; its 9 heads rule out
// TP = 2).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <unistd.h>

#include "../model/fixture_util.h"
#include "core/env.h"
#include "core/mapped_file.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/model.h"
#include "parallel/comm.h"
#include "runtime/executor.h"
#include "runtime/model_loader.h"
#include "runtime/pipeline_schedule.h"
#include "runtime/sequence.h"

namespace strata {

extern Communicator* g_comm;

namespace {

struct Run {
  std::vector<float> logits;  // every prompt position's (rank 0's with several ranks)
  std::vector<int32_t> ids;   // the greedy continuation (rank 0's choices, on every rank)
};

// tp x pp ranks of g_comm, or one rank in this process alone (tp = pp = 1, one = true).
Result<Run> run_model(const std::string& dir, int tp, int pp, bool one,
                      const std::vector<int32_t>& prompt) {
  STRATA_ASSIGN_OR_RETURN(ModelFiles files, open_model(dir, /*with_weights=*/true));
  const ModelConfig config = files.config;
  std::shared_ptr<TensorSource> src = files.weights;
  RunnerOptions ro;  // the CPU reference: f32 activations, the weights as stored
  ro.block_size = 4;
  ro.num_kv_blocks = 8;
  ro.max_model_len = 64;
  ro.max_num_tokens = 64;
  ro.max_num_seqs = 4;
  auto load = [&](const ParallelConfig& par) { return Model::load(config, par, src); };
  std::unique_ptr<Communicator> single = make_single_rank_communicator();
  std::unique_ptr<Executor> exec;
  if (one) {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, load(ParallelConfig{}));
    STRATA_ASSIGN_OR_RETURN(exec, make_runner(config, ParallelConfig{}, std::move(m), *single, ro));
  } else {
    STRATA_ASSIGN_OR_RETURN(std::vector<int64_t> bounds, pipeline_bounds(config.n_layers, pp, {}));
    STRATA_ASSIGN_OR_RETURN(exec, make_pipeline_rank(config, bounds, tp, *g_comm, load, ro));
  }
  Run out;
  out.logits.resize(prompt.size() * static_cast<size_t>(config.vocab));
  SequenceKv seq;
  // Chunks of 5: prefill over several forward calls and KV blocks.
  const ForwardFn fn = [&](const ForwardBatch& b, float* l) { return exec->forward(b, l); };
  STRATA_RETURN_IF_ERROR(forward_sequence(fn, 64, config.vocab, exec->cache(), seq, prompt, true,
                                          out.logits.data(), 5));
  int32_t next = prompt.back();
  for (int step = 0; step < 6; ++step) {
    const auto pos = static_cast<int32_t>(seq.length);
    STRATA_RETURN_IF_ERROR(seq.reserve(exec->cache(), pos + 1));
    const int32_t tok[1] = {next}, seq_id[1] = {0}, tpos[1] = {pos}, row[1] = {0};
    ForwardBatch b;
    b.tokens = tok;
    b.token_seq = seq_id;
    b.token_pos = tpos;
    b.block_tables = seq.block_table.data();
    b.max_blocks_per_seq = static_cast<int64_t>(seq.block_table.size());
    b.n_seqs = 1;
    b.logit_rows = row;
    STRATA_RETURN_IF_ERROR(exec->forward_argmax(b, &next));
    // Only rank 0 holds the result: every rank feeds rank 0's token back, as the engines do.
    if (!one) STRATA_RETURN_IF_ERROR(g_comm->broadcast(&next, sizeof(next), 0));
    seq.length = pos + 1;
    out.ids.push_back(next);
  }
  return out;
}

// A copy of the llama fixture with n_layers layers (layer l is the fixture's layer l % 3).
std::string deep_llama(int n_layers) {
  const std::string src = testing::fixture_model("llama");
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("strata_pp_llama" + std::to_string(n_layers) + "_" +
                            std::to_string(static_cast<long>(::getpid()))))
                              .string();
  if (g_comm->rank() == 0) {
    std::filesystem::create_directories(dir);
    auto text = read_text_file(src + "/config.json");
    EXPECT_TRUE(text.ok());
    std::string cfg = text.ok() ? *text : std::string();
    const std::string key = "\"num_hidden_layers\": 3";
    const size_t at = cfg.find(key);
    EXPECT_NE(at, std::string::npos);
    if (at != std::string::npos) {
      cfg.replace(at, key.size(), "\"num_hidden_layers\": " + std::to_string(n_layers));
    }
    std::ofstream(dir + "/config.json") << cfg;
    auto file = SafetensorsFile::open(src + "/model.safetensors");
    EXPECT_TRUE(file.ok());
    if (file.ok()) {
      std::vector<std::pair<std::string, Tensor>> tensors;
      for (const std::string& name : (*file)->names()) {
        auto t = (*file)->tensor(name);
        EXPECT_TRUE(t.ok());
        const std::string prefix = "model.layers.";
        if (name.rfind(prefix, 0) != 0) {
          tensors.emplace_back(name, *t);
          continue;
        }
        const size_t dot = name.find('.', prefix.size());
        const int layer = std::stoi(name.substr(prefix.size(), dot - prefix.size()));
        for (int l = layer; l < n_layers; l += 3) {
          tensors.emplace_back(prefix + std::to_string(l) + name.substr(dot), *t);
        }
      }
      EXPECT_TRUE(write_safetensors(dir + "/model.safetensors", tensors).ok());
    }
  }
  // Every rank's folder name is rank 0's (the pid differs): broadcast it.
  std::string name = dir;
  name.resize(512, '\0');
  EXPECT_TRUE(g_comm->broadcast(name.data(), static_cast<int64_t>(name.size()), 0).ok());
  return name.c_str();
}

struct Layout {
  int tp, pp;
};

// The layouts this world size runs: tp x pp = world.
std::vector<Layout> layouts() {
  const int w = g_comm->size();
  std::vector<Layout> out{{1, w}};
  if (w == 4) out.push_back({2, 2});
  return out;
}

void expect_matches_one_rank(const std::string& dir, const std::string& what) {
  const std::vector<int32_t> prompt = {1, 17, 33, 80, 5, 9, 120, 44, 3, 61, 7};
  auto files = open_model(dir, /*with_weights=*/false);
  ASSERT_TRUE(files.ok()) << files.status().to_string();
  const ModelConfig* config = &files->config;
  // The reference on rank 0 only (the others' results are not compared, and their cores are
  // shared).
  Result<Run> one = Run{};
  if (g_comm->rank() == 0) one = run_model(dir, 1, 1, true, prompt);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  for (const Layout& l : layouts()) {
    // Every rank decides alike: stages need layers, tensor-parallel ranks whole heads.
    if (l.pp > config->n_layers || config->n_heads % l.tp != 0) continue;
    auto many = run_model(dir, l.tp, l.pp, false, prompt);
    ASSERT_TRUE(many.ok()) << many.status().to_string();
    if (g_comm->rank() != 0) continue;  // the results are rank 0's
    const double err = testing::relative_error(many->logits, one->logits);
    std::printf("[ info ] %s TP=%d x PP=%d under mpirun: %.2e of max|logit|\n", what.c_str(), l.tp,
                l.pp, err);
    EXPECT_LE(err, 1e-5) << what << " TP " << l.tp << " PP " << l.pp;
    EXPECT_EQ(many->ids, one->ids) << what << " TP " << l.tp << " PP " << l.pp;
  }
}

class PipelineMpi : public ::testing::TestWithParam<const char*> {};

// Fixtures of two and three layers: PP = 2, and TP = 2 x PP = 2 (PP = 4 needs more layers).
TEST_P(PipelineMpi, MatchesOneRank) {
  expect_matches_one_rank(testing::fixture_model(GetParam()), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PipelineMpi,
                         ::testing::Values("llama", "gpt2", "neox", "gemma3"));

// PP = world size over a model deep enough for it (PP = 4 with 4 ranks).
TEST(PipelineMpiDeep, FiveLayerLlamaMatchesOneRank) {
  const std::string dir = deep_llama(5);
  expect_matches_one_rank(dir, "llama x5 layers");
  EXPECT_TRUE(g_comm->barrier().ok());
  if (g_comm->rank() == 0) std::filesystem::remove_all(dir);
}

// The real SmolLM2-135M (GGUF, 30 layers; 9 heads, so no TP = 2): PP = 2, PP = 4. Skips when
// scripts/fetch_model.sh smollm2 has not been run (as the `model` tests do).
TEST(PipelineMpiSmolLM2, MatchesOneRank) {
  const char* env = std::getenv("STRATA_SMOLLM2_GGUF");
  const std::string path =
      env != nullptr ? env : env_config().cache_dir + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is absent";
  expect_matches_one_rank(path, "SmolLM2-135M");
}

TEST(PipelineMpiErrors, WorldSizeMustBeTpTimesPp) {
  const std::string dir = testing::fixture_model("llama");
  auto text = read_text_file(dir + "/config.json");
  ASSERT_TRUE(text.ok());
  auto config = parse_hf_config(*text, dir + "/config.json");
  ASSERT_TRUE(config.ok());
  RunnerOptions ro;
  auto e = make_pipeline_rank(*config, {0, 1, 3}, g_comm->size(), *g_comm, nullptr, ro);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("needs " + std::to_string(2 * g_comm->size()) + " ranks"),
            std::string::npos)
      << e.status().to_string();
}

}  // namespace
}  // namespace strata
