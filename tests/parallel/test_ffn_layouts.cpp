// The FFN layouts of seed 003 (Sec. 3.2) on the CPU under mpirun, one process per rank: with
// --ffn-layout 2d (X x Y = this run's world size, the default grid and, at 8 ranks, X = 4 too)
// and weight-gathered (and the pair of weight-gathered prefill and 1d decode,
// --ffn-gather-min-tokens), the logits of a prompt (prefill in chunks of 5 tokens: step sizes not a
// multiple of the ranks) and of greedy decode steps (one token per step: ranks without tokens)
// must equal one rank's, computed in the same process, within 1e-5 of max |logit|, with the same
// greedy tokens. Models: the llama fixture (f32) and its bf16 twin where the world size divides
// its 4 heads, and the fixture's weights read as 8 heads (wide llama) for every world size.
// Registered with 2 and 4 ranks (mpi_tp2, mpi_tp4) and with 8 (mpi_layouts8: these tests only).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>

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
  int x;               // 2d: the grid's X (0: the default)
  int64_t gather = 0;  // 1d: --ffn-gather-min-tokens
};

std::string layout_name(const Layout& l) {
  std::string s = ffn_layout_name(l.ffn);
  if (l.x > 0) s += " X=" + std::to_string(l.x);
  if (l.gather > 0) s += " --ffn-gather-min-tokens " + std::to_string(l.gather);
  return s;
}

Result<testing::LayoutRun> run(const std::string& dir, const ParallelConfig& par,
                               Communicator& comm) {
  STRATA_ASSIGN_OR_RETURN(std::string text, read_text_file(dir + "/config.json"));
  STRATA_ASSIGN_OR_RETURN(ModelConfig config, parse_hf_config(text, dir + "/config.json"));
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> ckpt, Checkpoint::open(dir));
  STRATA_ASSIGN_OR_RETURN(auto model, Model::load(config, par, ckpt));
  // The shards the layout asks for: 2d holds W_in[F / Y, E / X], the others [F / N, E].
  const ops::LinearWeight& w_in = model->weights().layers[0].gate_up;
  const bool grid = par.ffn_layout == FfnLayout::k2D;
  EXPECT_EQ(w_in.cols(), grid ? config.hidden / par.grid_x() : config.hidden);
  EXPECT_EQ(w_in.rows(), 2 * config.ffn_dim / (grid ? par.grid_y() : par.tp_size));
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
  // 1d with weight-gathered prefill from 4 tokens: the prompt's 5-token chunks gather, its
  // 3-token tail and the decode steps run 1d.
  std::vector<Layout> layouts = {{FfnLayout::kWeightGathered, 0}, {FfnLayout::k1D, 0, 4}};
  if (default_grid_x(n) > 0) layouts.push_back({FfnLayout::k2D, 0});
  if (n == 8) layouts.push_back({FfnLayout::k2D, 4});
  for (const Layout& l : layouts) {
    ParallelConfig par;
    par.tp_size = n;
    par.tp_rank = g_comm->rank();
    par.ffn_layout = l.ffn;
    par.ws2d_x = l.x;
    par.ffn_gather_min_tokens = l.gather;
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

// The 2d grid's groups: X = the ranks of one grid column j (ordered by i), Y = those of one row
// i (ordered by j); a sum within each names its members.
TEST(FfnLayoutMpi, GridGroups) {
  const int n = g_comm->size();
  if (default_grid_x(n) == 0) GTEST_SKIP() << n << " ranks have no 2D grid";
  for (int x : {default_grid_x(n), n / default_grid_x(n)}) {
    ParallelConfig par;
    par.tp_size = n;
    par.tp_rank = g_comm->rank();
    par.ffn_layout = FfnLayout::k2D;
    par.ws2d_x = x;
    auto g = split_ffn_groups(*g_comm, par);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    EXPECT_EQ(g->x->size(), x);
    EXPECT_EQ(g->x->rank(), par.grid_i());
    EXPECT_EQ(g->y->size(), n / x);
    EXPECT_EQ(g->y->rank(), par.grid_j());
    // Sum of 2^rank over each group: the set of world ranks in it.
    float xs = static_cast<float>(1 << par.tp_rank), ys = xs;
    ASSERT_TRUE(g->x->all_reduce_sum(&xs, 1).ok());
    ASSERT_TRUE(g->y->all_reduce_sum(&ys, 1).ok());
    float want_x = 0, want_y = 0;
    for (int i = 0; i < x; ++i) want_x += static_cast<float>(1 << (par.grid_j() * x + i));
    for (int j = 0; j < n / x; ++j) want_y += static_cast<float>(1 << (j * x + par.grid_i()));
    EXPECT_EQ(xs, want_x);
    EXPECT_EQ(ys, want_y);
  }
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
  if (default_grid_x(n) == 0) {
    const std::string llama = testing::fixture_model("llama");
    auto lt = read_text_file(llama + "/config.json");
    ASSERT_TRUE(lt.ok());
    auto lc = parse_hf_config(*lt, llama + "/config.json");
    ASSERT_TRUE(lc.ok());
    auto lk = Checkpoint::open(llama);
    ASSERT_TRUE(lk.ok());
    par.ffn_layout = FfnLayout::k2D;
    auto m2 = Model::load(*lc, par, std::shared_ptr<TensorSource>(std::move(*lk)));
    ASSERT_FALSE(m2.ok());
    EXPECT_NE(m2.status().message().find("--ffn-layout 2d needs a tensor-parallel size that "
                                         "factors as X x Y"),
              std::string::npos)
        << m2.status().to_string();
  }
}

// ---- attention layouts (seed 003 Sec. 3.3) -----------------------------------------------------
// --attn-layout batch-sharded (alone and with the FFN layouts) against one rank on batches of
// sequences of different lengths (a prefill step of all of them, then greedy decode steps):
// 2 sequences (fewer than the ranks at 4 and 8) and 7 (not a multiple of any world size). The
// KV heads (2 of the llama's 4, 4 of the wide llama's 8) are fewer than the ranks at 4 and 8:
// head-sharded attention would replicate them. Each rank's pool must hold every KV head, and
// only its own sequences' K/V: a sequence's first block is written on its owner only.

Result<testing::LayoutRun> run_batch(const std::string& dir, const ParallelConfig& par,
                                     Communicator& comm, int n_seqs, int swap_step = -1) {
  STRATA_ASSIGN_OR_RETURN(std::string text, read_text_file(dir + "/config.json"));
  STRATA_ASSIGN_OR_RETURN(ModelConfig config, parse_hf_config(text, dir + "/config.json"));
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> ckpt, Checkpoint::open(dir));
  STRATA_ASSIGN_OR_RETURN(auto model, Model::load(config, par, ckpt));
  STRATA_ASSIGN_OR_RETURN(auto exec, make_layout_runner(config, par, std::move(model), comm,
                                                        testing::batch_runner_options()));
  const bool sharded = par.attn_layout == AttnLayout::kBatchSharded;
  KvPool& pool = exec->cache();
  EXPECT_EQ(pool.config().n_heads_kv,
            sharded ? config.n_heads_kv : std::max<int64_t>(1, config.n_heads_kv / par.tp_size));
  auto inspect = [&](const std::vector<SequenceKv>& seqs) {
    if (!sharded || swap_step >= 0) return;
    const ops::KvLayer& kv = pool.layers()[0];
    const int64_t per_block = pool.config().block_size * pool.config().n_heads_kv * config.head_dim;
    // The rank holds its own blocks only, block b at b / N: the ids b % N == rank's K/V are
    // written, every other local block stays zero.
    const int64_t local = pool.config().n_blocks / par.tp_size;
    EXPECT_EQ(kv.k.dim(0), local + 1);
    std::vector<bool> used(static_cast<size_t>(local + 1), false);
    for (const SequenceKv& q : seqs) {
      const int o = par.attn_owner(q.block_table[0]);
      for (int32_t b : q.block_table) EXPECT_EQ(par.attn_owner(b), o) << "block " << b;
      if (o != par.tp_rank) continue;
      const int32_t b = q.block_table[0] / par.tp_size;
      used[static_cast<size_t>(b)] = true;
      const float* k = static_cast<const float*>(kv.k.data) + b * per_block;
      double sum = 0;
      for (int64_t i = 0; i < per_block; ++i) sum += std::fabs(k[i]);
      EXPECT_GT(sum, 0) << "block " << q.block_table[0] << " on rank " << par.tp_rank;
    }
    for (int64_t b = 0; b <= local; ++b) {
      if (used[static_cast<size_t>(b)]) continue;
      bool any = false;
      for (const SequenceKv& q : seqs) {
        for (int32_t g : q.block_table)
          any = any || (g % par.tp_size == par.tp_rank && g / par.tp_size == b);
      }
      if (any) continue;
      const float* k = static_cast<const float*>(kv.k.data) + b * per_block;
      double sum = 0;
      for (int64_t i = 0; i < per_block; ++i) sum += std::fabs(k[i]);
      EXPECT_EQ(sum, 0) << "local block " << b << " on rank " << par.tp_rank;
    }
  };
  return testing::run_batch_layout(*exec, testing::batch_prompts(n_seqs), 4, inspect, swap_step);
}

void expect_attn_layouts_match_one_rank(const std::string& dir, const std::string& what) {
  const int n = g_comm->size();
  auto single = make_single_rank_communicator();
  std::vector<FfnLayout> ffns = {FfnLayout::k1D, FfnLayout::kWeightGathered};
  if (default_grid_x(n) > 0) ffns.push_back(FfnLayout::k2D);
  for (int n_seqs : {2, 7}) {
    auto one = run_batch(dir, ParallelConfig{}, *single, n_seqs);
    ASSERT_TRUE(one.ok()) << one.status().to_string();
    for (FfnLayout ffn : ffns) {
      ParallelConfig par;
      par.tp_size = n;
      par.tp_rank = g_comm->rank();
      par.ffn_layout = ffn;
      par.attn_layout = AttnLayout::kBatchSharded;
      auto many = run_batch(dir, par, *g_comm, n_seqs);
      ASSERT_TRUE(many.ok()) << many.status().to_string();
      const double err = testing::relative_error(many->logits, one->logits);
      if (g_comm->rank() == 0) {
        std::printf(
            "[ info ] %s, %d sequences, --attn-layout batch-sharded --ffn-layout %s, %d ranks: "
            "%.2e of max|logit| from one rank\n",
            what.c_str(), n_seqs, ffn_layout_name(ffn), n, err);
      }
      EXPECT_LE(err, 1e-5) << what << " " << ffn_layout_name(ffn) << " rank " << par.tp_rank;
      EXPECT_EQ(many->ids, one->ids) << what << " " << ffn_layout_name(ffn);
    }
  }
  // Every sequence swapped out and back in under new blocks before decode step 2: its K/V
  // stays on (and comes back to) the rank that holds it.
  auto one = run_batch(dir, ParallelConfig{}, *single, 7, 2);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  ParallelConfig par;
  par.tp_size = n;
  par.tp_rank = g_comm->rank();
  par.attn_layout = AttnLayout::kBatchSharded;
  auto many = run_batch(dir, par, *g_comm, 7, 2);
  ASSERT_TRUE(many.ok()) << many.status().to_string();
  const double err = testing::relative_error(many->logits, one->logits);
  if (g_comm->rank() == 0) {
    std::printf(
        "[ info ] %s, 7 sequences swapped, --attn-layout batch-sharded, %d ranks: %.2e of "
        "max|logit| from one rank\n",
        what.c_str(), n, err);
  }
  EXPECT_LE(err, 1e-5) << what << " swapped, rank " << par.tp_rank;
  EXPECT_EQ(many->ids, one->ids) << what << " swapped";
}

TEST(AttnLayoutMpi, LlamaMatchesOneRank) {
  if (4 % g_comm->size() != 0) GTEST_SKIP() << "4 heads over " << g_comm->size() << " ranks";
  expect_attn_layouts_match_one_rank(testing::fixture_model("llama"), "llama");
}

TEST(AttnLayoutMpi, WideLlamaMatchesOneRank) {
  const std::string dir = wide_llama();
  expect_attn_layouts_match_one_rank(dir, "wide llama (8 heads, 4 KV heads)");
  EXPECT_TRUE(g_comm->barrier().ok());
  if (g_comm->rank() == 0) std::filesystem::remove_all(dir);
}

// Families it is not built for fail on every rank alike, naming the flag.
TEST(AttnLayoutMpi, Errors) {
  const std::string dir = testing::fixture_model("gpt2");
  auto text = read_text_file(dir + "/config.json");
  ASSERT_TRUE(text.ok());
  auto config = parse_hf_config(*text, dir + "/config.json");
  ASSERT_TRUE(config.ok());
  auto ckpt = Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.ok());
  ParallelConfig par;
  par.tp_size = g_comm->size();
  par.tp_rank = g_comm->rank();
  par.attn_layout = AttnLayout::kBatchSharded;
  auto m = Model::load(*config, par, std::shared_ptr<TensorSource>(std::move(*ckpt)));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("--attn-layout batch-sharded is built for the dense Llama "
                                      "family"),
            std::string::npos)
      << m.status().to_string();
}

}  // namespace
}  // namespace strata
