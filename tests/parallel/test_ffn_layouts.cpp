// The FFN layouts of seed 003 (Sec. 3.2) on the CPU under mpirun, one process per rank: with
// --ffn-layout weight-gathered, the logits of a prompt (prefill in chunks of 5 tokens: step sizes
// not a multiple of the ranks) and of greedy decode steps (one token per step: ranks without
// tokens) must equal one rank's, computed in the same process, within 1e-5 of max |logit|, with the
// same greedy tokens. Models: the llama fixture (f32) and its bf16 twin where the world size
// divides its 4 heads, and the fixture's weights read as 8 heads (wide llama) for every world size.
// Registered with 2 and 4 ranks (mpi_tp2, mpi_tp4) and with 8 (mpi_layouts8: these tests only).
#include <gtest/gtest.h>

#include <unistd.h>

#include "../model/fixture_util.h"
#include "ffn_layout_util.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "parallel/comm.h"

namespace strata {

extern Communicator* g_comm;

namespace {

struct Layout {
  FfnLayout ffn;
};

std::string layout_name(const Layout& l) {
  return ffn_layout_name(l.ffn);
}

Result<testing::LayoutRun> run(const std::string& dir, const ParallelConfig& par,
                               Communicator& comm) {
  STRATA_ASSIGN_OR_RETURN(std::string text, read_text_file(dir + "/config.json"));
  STRATA_ASSIGN_OR_RETURN(ModelConfig config, parse_hf_config(text, dir + "/config.json"));
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> ckpt, Checkpoint::open(dir));
  STRATA_ASSIGN_OR_RETURN(auto model, Model::load(config, par, ckpt));
  // The shards the layout asks for: W_in[F / N, E].
  const ops::LinearWeight& w_in = model->weights().layers[0].gate_up;
  EXPECT_EQ(w_in.cols(), config.hidden);
  EXPECT_EQ(w_in.rows(), 2 * config.ffn_dim / par.tp_size);
  STRATA_ASSIGN_OR_RETURN(auto exec, make_layout_runner(config, par, std::move(model), comm,
                                                        testing::layout_runner_options()));
  return testing::run_layout(*exec, testing::layout_prompt(), 4);
}

// The wide llama in a folder every rank names alike (rank 0 writes it).
std::string wide_llama() {
  std::string name = (std::filesystem::temp_directory_path() /
                      ("strata_wide_llama_" + std::to_string(static_cast<long>(::getpid()))))
                         .string();
  name.resize(512, '\0');
  EXPECT_TRUE(g_comm->broadcast(name.data(), static_cast<int64_t>(name.size()), 0).ok());
  const std::string dir = name.c_str();
  if (g_comm->rank() == 0) {
    Status s = testing::write_wide_llama(testing::fixture_model("llama"), dir);
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
  EXPECT_TRUE(g_comm->barrier().ok());
  return dir;
}

void expect_layouts_match_one_rank(const std::string& dir, const std::string& what) {
  const int n = g_comm->size();
  auto single = make_single_rank_communicator();
  auto one = run(dir, ParallelConfig{}, *single);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  std::vector<Layout> layouts = {{FfnLayout::kWeightGathered}};
  for (const Layout& l : layouts) {
    ParallelConfig par;
    par.tp_size = n;
    par.tp_rank = g_comm->rank();
    par.ffn_layout = l.ffn;
    auto many = run(dir, par, *g_comm);
    ASSERT_TRUE(many.ok()) << many.status().to_string();
    const double err = testing::relative_error(many->logits, one->logits);
    if (g_comm->rank() == 0) {
      std::printf("[ info ] %s --ffn-layout %s, %d ranks: %.2e of max|logit| from one rank\n",
                  what.c_str(), layout_name(l).c_str(), n, err);
    }
    EXPECT_LE(err, 1e-5) << what << " " << layout_name(l) << " rank " << par.tp_rank;
    EXPECT_EQ(many->ids, one->ids) << what << " " << layout_name(l) << " rank " << par.tp_rank;
  }
}

TEST(FfnLayoutMpi, LlamaMatchesOneRank) {
  if (4 % g_comm->size() != 0) GTEST_SKIP() << "4 heads over " << g_comm->size() << " ranks";
  expect_layouts_match_one_rank(testing::fixture_model("llama"), "llama");
}

TEST(FfnLayoutMpi, LlamaBf16MatchesOneRank) {
  if (4 % g_comm->size() != 0) GTEST_SKIP() << "4 heads over " << g_comm->size() << " ranks";
  expect_layouts_match_one_rank(testing::fixture_model("llama_bf16"), "llama_bf16");
}

TEST(FfnLayoutMpi, WideLlamaMatchesOneRank) {
  const std::string dir = wide_llama();
  expect_layouts_match_one_rank(dir, "wide llama (8 heads)");
  EXPECT_TRUE(g_comm->barrier().ok());
  if (g_comm->rank() == 0) std::filesystem::remove_all(dir);
}

// Unsupported combinations fail on every rank alike, before any collective, naming the flag.
TEST(FfnLayoutMpi, Errors) {
  const int n = g_comm->size();
  const std::string dir = testing::fixture_model("gpt2");
  auto text = read_text_file(dir + "/config.json");
  ASSERT_TRUE(text.ok());
  auto config = parse_hf_config(*text, dir + "/config.json");
  ASSERT_TRUE(config.ok());
  auto ckpt = Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.ok());
  ParallelConfig par;
  par.tp_size = n;
  par.tp_rank = g_comm->rank();
  par.ffn_layout = FfnLayout::kWeightGathered;
  auto m = Model::load(*config, par, std::shared_ptr<TensorSource>(std::move(*ckpt)));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("--ffn-layout weight-gathered is built for the Llama family"),
            std::string::npos)
      << m.status().to_string();
}

}  // namespace
}  // namespace strata
