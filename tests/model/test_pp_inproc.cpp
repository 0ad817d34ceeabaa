// Pipeline parallelism with stages as threads of one process (make_in_process_pp_executor), on
// the CPU: 2 and 3 stages (even and uneven splits) against one stage on the fixtures, for the f32
// reference and for the device layout on the bf16 twins. A stage passes its f32 residual stream
// unchanged, so the logits must be bit-identical to one stage's, and so must the swapped KV
// blocks (each stage holds its own layers' K and V). Also: stage bounds, --pp-layers errors, the
// hybrid schedule tables and their bubble, and the Engine path (--pp on the command line).
// Tensor x pipeline parallelism (each stage a group of tensor-parallel threads) against one rank.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/mapped_file.h"
#include "fixture_util.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/model.h"
#include "runtime/executor.h"
#include "runtime/pipeline_schedule.h"
#include "runtime/sequence.h"
#include "strata/engine.h"
#include "strata/serving.h"

namespace strata {
namespace {

struct PpRun {
  std::vector<float> logits;
  std::vector<int32_t> ids;         // argmax of the last row, step by step (greedy)
  std::vector<uint8_t> block_host;  // KV block 0 after the prompt, as swapped out
};

// chunk: prompt tokens per forward call; min_tokens: the smallest prompt micro-batch (the
// default keeps a chunk whole; 2 cuts it into several that flow through the stages).
Result<PpRun> pp_run(const std::string& dir, const std::vector<int64_t>& layers_per_stage,
                     DType act, const std::vector<int32_t>& ids, int64_t chunk = 5,
                     int64_t min_tokens = 256, double* bubble = nullptr, int tp = 1) {
  STRATA_ASSIGN_OR_RETURN(std::string text, read_text_file(dir + "/config.json"));
  STRATA_ASSIGN_OR_RETURN(ModelConfig config, parse_hf_config(text, dir + "/config.json"));
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> ckpt, Checkpoint::open(dir));
  std::shared_ptr<TensorSource> src = ckpt;
  RunnerOptions o;
  o.act_dtype = act;
  o.max_model_len = 64;
  o.num_kv_blocks = 12;
  o.block_size = 4;
  o.max_num_tokens = 64;
  o.max_num_seqs = 4;
  o.pp_min_micro_batch_tokens = min_tokens;
  const int pp = static_cast<int>(layers_per_stage.size());
  STRATA_ASSIGN_OR_RETURN(std::vector<int64_t> bounds,
                          pipeline_bounds(config.n_layers, pp, layers_per_stage));
  auto load = [&](const ParallelConfig& par) { return Model::load(config, par, src); };
  STRATA_ASSIGN_OR_RETURN(auto exec, make_in_process_pp_executor(config, load, bounds, o, tp));
  PpRun out;
  out.logits.resize(ids.size() * static_cast<size_t>(config.vocab));
  SequenceKv seq;
  const ForwardFn fn = [&](const ForwardBatch& b, float* l) { return exec->forward(b, l); };
  STRATA_RETURN_IF_ERROR(forward_sequence(fn, 64, config.vocab, exec->cache(), seq, ids, true,
                                          out.logits.data(), chunk));
  out.block_host.resize(exec->block_bytes());
  STRATA_RETURN_IF_ERROR(exec->copy_block_to_host(seq.block_table[0], out.block_host.data()));
  // Greedy decode through forward_argmax, one token at a time.
  int32_t next = ids.back();
  for (int step = 0; step < 6; ++step) {
    const int32_t pos = static_cast<int32_t>(seq.length);
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
    seq.length = pos + 1;
    out.ids.push_back(next);
  }
  if (bubble != nullptr) *bubble = exec->measured_bubble();
  return out;
}

struct Case {
  const char* model;
  std::vector<int64_t> layers;  // per stage
};

class PpInProcess : public ::testing::TestWithParam<Case> {};

TEST_P(PpInProcess, BitIdenticalToOneStage) {
  const Case& c = GetParam();
  const std::string dir = testing::fixture_model(c.model);
  auto ref = testing::load_reference(dir);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  const std::vector<int32_t>& ids = ref->inputs[1];
  int64_t n_layers = 0;
  for (int64_t l : c.layers) n_layers += l;
  for (DType act : {DType::kF32, DType::kBF16}) {
    auto one = pp_run(dir, {n_layers}, act, ids);
    ASSERT_TRUE(one.ok()) << one.status().to_string();
    auto many = pp_run(dir, c.layers, act, ids);
    ASSERT_TRUE(many.ok()) << many.status().to_string();
    const char* what = act == DType::kF32 ? "f32" : "bf16 twins";
    ASSERT_EQ(many->logits.size(), one->logits.size());
    EXPECT_EQ(std::memcmp(many->logits.data(), one->logits.data(), one->logits.size() * 4), 0)
        << c.model << " " << what << ": " << testing::relative_error(many->logits, one->logits);
    EXPECT_EQ(many->ids, one->ids) << c.model << " " << what;
    ASSERT_EQ(many->block_host.size(), one->block_host.size());
    EXPECT_TRUE(many->block_host == one->block_host) << c.model << " " << what << " KV block";
    if (act == DType::kF32) {
      // And the one-stage run is the model: within the fixture tolerance of transformers.
      EXPECT_LE(testing::relative_error(one->logits, ref->logits[1]), 1e-4) << c.model;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PpInProcess,
                         ::testing::Values(Case{"llama", {2, 1}}, Case{"llama", {1, 1, 1}},
                                           Case{"qwen2", {1, 1}}, Case{"gpt2", {1, 1}},
                                           Case{"neox", {1, 1}}, Case{"gemma3", {1, 1, 1}},
                                           Case{"mistral", {1, 1}}),
                         [](const auto& info) {
                           std::string name = std::string(info.param.model) + "_pp";
                           for (int64_t l : info.param.layers) name += std::to_string(l);
                           return name;
                         });

// Tensor x pipeline parallelism: each stage a tensor-parallel group of 2 ranks (threads), the
// hidden states going from rank i of a stage to rank i of the next. Against one rank: the f32
// logits within 1e-5 relative (the all-reduce sums in another order) and the greedy tokens
// equal; the bf16 twins within the TP tolerance. Prompts are cut into micro-batches of 2+
// tokens that flow through the stages concurrently (PpAsync below runs TP x PP passes in flight).
struct TpPpCase {
  const char* model;
  std::vector<int64_t> layers;  // per stage
  int tp;
};

class TpPpInProcess : public ::testing::TestWithParam<TpPpCase> {};

TEST_P(TpPpInProcess, MatchesOneRank) {
  const TpPpCase& c = GetParam();
  const std::string dir = testing::fixture_model(c.model);
  auto ref = testing::load_reference(dir);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  const std::vector<int32_t>& ids = ref->inputs[1];
  int64_t n_layers = 0;
  for (int64_t l : c.layers) n_layers += l;
  for (DType act : {DType::kF32, DType::kBF16}) {
    auto one = pp_run(dir, {n_layers}, act, ids);
    ASSERT_TRUE(one.ok()) << one.status().to_string();
    for (int64_t min_tokens : {int64_t{2}}) {
      auto many = pp_run(dir, c.layers, act, ids, 5, min_tokens, nullptr, c.tp);
      ASSERT_TRUE(many.ok()) << many.status().to_string();
      const double err = testing::relative_error(many->logits, one->logits);
      const char* what = act == DType::kF32 ? "f32" : "bf16 twins";
      std::printf(
          "[ info ] %s TP=%d x PP=%zu %s, micro-batches of %lld+ tokens: %.2e of "
          "max|logit|\n",
          c.model, c.tp, c.layers.size(), what, static_cast<long long>(min_tokens), err);
      EXPECT_LE(err, act == DType::kF32 ? 1e-5 : 2e-2) << c.model << " " << what;
      if (act == DType::kF32) EXPECT_EQ(many->ids, one->ids) << c.model;
      // A block is every rank's shard of it, stage by stage: as large as one rank's.
      EXPECT_EQ(many->block_host.size(), one->block_host.size()) << c.model;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TpPpInProcess,
                         ::testing::Values(TpPpCase{"llama", {2, 1}, 2},
                                           TpPpCase{"gpt2", {1, 1}, 2},
                                           TpPpCase{"gemma3", {1, 2}, 2}),
                         [](const auto& info) {
                           std::string name = std::string(info.param.model) + "_tp" +
                                              std::to_string(info.param.tp) + "_pp";
                           for (int64_t l : info.param.layers) name += std::to_string(l);
                           return name;
                         });

// A rank that cannot load names its stage and tensor-parallel rank.
TEST(TpPpInProcessErrors, AFailingRankNamesItsPlace) {
  const std::string dir = testing::fixture_model("llama");
  auto text = read_text_file(dir + "/config.json");
  ASSERT_TRUE(text.ok());
  auto config = parse_hf_config(*text, dir + "/config.json");
  ASSERT_TRUE(config.ok());
  auto ckpt = Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.ok());
  std::shared_ptr<TensorSource> src = std::move(*ckpt);
  auto load = [&](const ParallelConfig& par) -> Result<std::unique_ptr<Model>> {
    if (par.pp_rank == 1 && par.tp_rank == 1) return Status(StatusCode::kDataLoss, "bad shard");
    return Model::load(*config, par, src);
  };
  RunnerOptions o;
  o.max_model_len = 64;
  o.num_kv_blocks = 8;
  o.block_size = 4;
  auto exec = make_in_process_pp_executor(*config, load, {0, 2, 3}, o, 2);
  ASSERT_FALSE(exec.ok());
  EXPECT_NE(exec.status().message().find("pipeline stage 1, tensor-parallel rank 1"),
            std::string::npos)
      << exec.status().to_string();
  EXPECT_FALSE(make_in_process_pp_executor(*config, load, {0, 2, 3}, o, 0).ok());
}

// Prompts cut into micro-batches of 2+ tokens that flow through the stages concurrently (stage
// s on micro-batch m while s + 1 runs m - 1): a micro-batch's attention reads the KV its
// predecessors wrote, so the logits equal one stage's up to the kernels' row-count dependence.
TEST(PpMicroBatches, PromptChunksFlowThroughStages) {
  for (const char* model : {"llama", "gemma3", "gpt2"}) {
    const std::string dir = testing::fixture_model(model);
    auto ref = testing::load_reference(dir);
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();
    const std::vector<int32_t>& ids = ref->inputs[1];
    const std::vector<int64_t> stages =
        std::string(model) == "gpt2" ? std::vector<int64_t>{1, 1} : std::vector<int64_t>{1, 1, 1};
    for (DType act : {DType::kF32, DType::kBF16}) {
      auto one = pp_run(dir, {stages.size() == 2 ? 2 : 3}, act, ids, 64);
      ASSERT_TRUE(one.ok()) << one.status().to_string();
      double bubble = -1;
      auto many = pp_run(dir, stages, act, ids, 64, 2, &bubble);
      ASSERT_TRUE(many.ok()) << many.status().to_string();
      const double err = testing::relative_error(many->logits, one->logits);
      std::printf(
          "[ info ] %s %zu stages, prompt micro-batches of 2+ tokens, %s: %.2e of "
          "max|logit|; bubble %.2f\n",
          model, stages.size(), act == DType::kF32 ? "f32" : "bf16 twins", err, bubble);
      EXPECT_LE(err, act == DType::kF32 ? 1e-5 : 2e-2) << model;
      EXPECT_EQ(many->ids, one->ids) << model;
      EXPECT_GE(bubble, 0.0);
      EXPECT_LT(bubble, 1.0);
    }
  }
}

// A decode step of four sequences cut into three groups (one per stage, min 1 token each):
// logits equal one stage's decoding them as one batch, within f32 rounding.
TEST(PpMicroBatches, DecodeGroupsFlowThroughStages) {
  const std::string dir = testing::fixture_model("llama");
  auto text = read_text_file(dir + "/config.json");
  ASSERT_TRUE(text.ok());
  auto config = parse_hf_config(*text, dir + "/config.json");
  ASSERT_TRUE(config.ok());
  auto ckpt = Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.ok());
  std::shared_ptr<TensorSource> src = std::move(*ckpt);
  auto decode_logits = [&](int pp) -> std::vector<float> {
    RunnerOptions o;
    o.max_model_len = 64;
    o.num_kv_blocks = 32;
    o.block_size = 4;
    o.max_num_tokens = 64;
    o.max_num_seqs = 8;
    o.pp_min_micro_batch_tokens = 1;
    auto bounds = pipeline_bounds(config->n_layers, pp, {});
    EXPECT_TRUE(bounds.ok());
    auto load = [&](const ParallelConfig& par) { return Model::load(*config, par, src); };
    auto exec = make_in_process_pp_executor(*config, load, *bounds, o);
    EXPECT_TRUE(exec.ok()) << exec.status().to_string();
    if (!exec.ok()) return {};
    const int64_t V = config->vocab;
    std::vector<SequenceKv> seqs(4);
    std::vector<float> scratch(64 * static_cast<size_t>(V));
    const ForwardFn fn = [&](const ForwardBatch& b, float* l) { return (*exec)->forward(b, l); };
    for (int i = 0; i < 4; ++i) {
      std::vector<int32_t> prompt;
      for (int t = 0; t < 3 + 2 * i; ++t) prompt.push_back(5 + 7 * t + 11 * i);
      EXPECT_TRUE(forward_sequence(fn, 64, V, (*exec)->cache(), seqs[static_cast<size_t>(i)],
                                   prompt, false, scratch.data())
                      .ok());
    }
    // One decode step of all four: token i of sequence i, its block table row i.
    const int64_t width = 4;
    std::vector<int32_t> tables(4 * width, 0), tok, seq_ids, pos, rows;
    for (int i = 0; i < 4; ++i) {
      SequenceKv& s = seqs[static_cast<size_t>(i)];
      EXPECT_TRUE(s.reserve((*exec)->cache(), s.length + 1).ok());
      for (size_t k = 0; k < s.block_table.size(); ++k) tables[i * width + k] = s.block_table[k];
      tok.push_back(40 + i);
      seq_ids.push_back(i);
      pos.push_back(static_cast<int32_t>(s.length));
      rows.push_back(i);
    }
    ForwardBatch b;
    b.tokens = tok;
    b.token_seq = seq_ids;
    b.token_pos = pos;
    b.block_tables = tables.data();
    b.max_blocks_per_seq = width;
    b.n_seqs = 4;
    b.logit_rows = rows;
    std::vector<float> out(4 * static_cast<size_t>(V));
    EXPECT_TRUE((*exec)->forward(b, out.data()).ok());
    return out;
  };
  const std::vector<float> one = decode_logits(1), three = decode_logits(3);
  ASSERT_EQ(one.size(), three.size());
  ASSERT_FALSE(one.empty());
  // Within f32 rounding: the CPU GEMM of one row and of four rows sum in different orders.
  const double err = testing::relative_error(three, one);
  std::printf("[ info ] llama decode of 4 sequences in 3 stage groups: %.2e of max|logit|\n", err);
  EXPECT_LE(err, 1e-5);
}

// The generation schedule across steps (Executor::submit / wait): two micro-batches of different
// sequences in flight through 2 and 3 stages, each submitted again before the other has been
// waited for, equal (within f32 rounding) one synchronous stage running all four sequences.
TEST(PpAsync, PassesInFlightMatchOneStage) {
  const std::string dir = testing::fixture_model("llama");
  auto text = read_text_file(dir + "/config.json");
  ASSERT_TRUE(text.ok());
  auto config = parse_hf_config(*text, dir + "/config.json");
  ASSERT_TRUE(config.ok());
  auto ckpt = Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.ok());
  std::shared_ptr<TensorSource> src = std::move(*ckpt);
  const int64_t V = config->vocab;
  // Logits of two decode steps of four sequences: [step][seq][V].
  auto run = [&](int pp, bool async, int tp) -> std::vector<float> {
    RunnerOptions o;
    o.max_model_len = 64;
    o.num_kv_blocks = 32;
    o.block_size = 4;
    o.max_num_tokens = 64;
    o.max_num_seqs = 8;
    auto bounds = pipeline_bounds(config->n_layers, pp, {});
    EXPECT_TRUE(bounds.ok());
    auto load = [&](const ParallelConfig& par) { return Model::load(*config, par, src); };
    auto exec = make_in_process_pp_executor(*config, load, *bounds, o, tp);
    EXPECT_TRUE(exec.ok()) << exec.status().to_string();
    if (!exec.ok()) return {};
    EXPECT_EQ((*exec)->pipeline_depth(), pp);
    std::vector<SequenceKv> seqs(4);
    std::vector<float> scratch(64 * static_cast<size_t>(V));
    const ForwardFn fn = [&](const ForwardBatch& b, float* l) { return (*exec)->forward(b, l); };
    for (int i = 0; i < 4; ++i) {
      std::vector<int32_t> prompt;
      for (int t = 0; t < 3 + 2 * i; ++t) prompt.push_back(5 + 7 * t + 11 * i);
      EXPECT_TRUE(forward_sequence(fn, 64, V, (*exec)->cache(), seqs[static_cast<size_t>(i)],
                                   prompt, false, scratch.data())
                      .ok());
    }
    const int64_t width = 4;
    struct Pass {
      std::vector<int32_t> tables, tok, seq, pos, rows;
      ForwardBatch b;
    };
    // The decode pass of sequences [first, first + n) at `step`.
    auto make = [&](int first, int n, int step) {
      auto p = std::make_unique<Pass>();
      p->tables.assign(static_cast<size_t>(n * width), 0);
      for (int j = 0; j < n; ++j) {
        SequenceKv& sk = seqs[static_cast<size_t>(first + j)];
        EXPECT_TRUE(sk.reserve((*exec)->cache(), sk.length + 1).ok());
        for (size_t k = 0; k < sk.block_table.size(); ++k)
          p->tables[static_cast<size_t>(j * width) + k] = sk.block_table[k];
        p->tok.push_back(40 + first + j + 10 * step);
        p->seq.push_back(j);
        p->pos.push_back(static_cast<int32_t>(sk.length));
        p->rows.push_back(j);
        sk.length += 1;
      }
      p->b.tokens = p->tok;
      p->b.token_seq = p->seq;
      p->b.token_pos = p->pos;
      p->b.block_tables = p->tables.data();
      p->b.max_blocks_per_seq = width;
      p->b.n_seqs = n;
      p->b.logit_rows = p->rows;
      return p;
    };
    std::vector<float> out(2 * 4 * static_cast<size_t>(V));
    auto at = [&](int step, int seq) { return out.data() + (step * 4 + seq) * V; };
    if (!async) {
      for (int step = 0; step < 2; ++step) {
        auto all = make(0, 4, step);
        EXPECT_TRUE((*exec)->forward(all->b, at(step, 0)).ok());
      }
      return out;
    }
    // A0, B0 in flight; A1 goes in before B0 is waited for.
    auto a0 = make(0, 2, 0), b0 = make(2, 2, 0);
    EXPECT_TRUE((*exec)->submit(a0->b, at(0, 0), nullptr).ok());
    EXPECT_TRUE((*exec)->submit(b0->b, at(0, 2), nullptr).ok());
    EXPECT_TRUE((*exec)->wait().ok());
    auto a1 = make(0, 2, 1);
    EXPECT_TRUE((*exec)->submit(a1->b, at(1, 0), nullptr).ok());
    EXPECT_TRUE((*exec)->wait().ok());
    auto b1 = make(2, 2, 1);
    EXPECT_TRUE((*exec)->submit(b1->b, at(1, 2), nullptr).ok());
    EXPECT_TRUE((*exec)->wait().ok());
    EXPECT_TRUE((*exec)->wait().ok());
    EXPECT_FALSE((*exec)->wait().ok());  // nothing left
    EXPECT_GE((*exec)->measured_bubble(), 0.0);
    return out;
  };
  const std::vector<float> one = run(1, false, 1);
  ASSERT_FALSE(one.empty());
  // (stages, tensor-parallel ranks per stage)
  for (auto [pp, tp] : {std::pair{2, 1}, std::pair{3, 1}, std::pair{2, 2}}) {
    const std::vector<float> got = run(pp, true, tp);
    ASSERT_EQ(got.size(), one.size());
    const double err = testing::relative_error(got, one);
    std::printf("[ info ] llama, %d stages x TP %d, 2 passes in flight: %.2e of max|logit|\n", pp,
                tp, err);
    EXPECT_LE(err, 1e-5) << pp << " stages, TP " << tp;
  }
}

TEST(PipelineBounds, EvenAndExplicitSplits) {
  auto even = pipeline_bounds(32, 3, {});
  ASSERT_TRUE(even.ok());
  EXPECT_EQ(*even, (std::vector<int64_t>{0, 11, 22, 32}));
  auto four = pipeline_bounds(32, 4, {});
  ASSERT_TRUE(four.ok());
  EXPECT_EQ(*four, (std::vector<int64_t>{0, 8, 16, 24, 32}));
  auto given = pipeline_bounds(32, 3, {10, 12, 10});
  ASSERT_TRUE(given.ok());
  EXPECT_EQ(*given, (std::vector<int64_t>{0, 10, 22, 32}));
  auto sum = pipeline_bounds(32, 3, {10, 12, 11});
  ASSERT_FALSE(sum.ok());
  EXPECT_NE(sum.status().message().find("sums to 33"), std::string::npos);
  EXPECT_FALSE(pipeline_bounds(32, 3, {10, 22}).ok());  // two entries for three stages
  EXPECT_FALSE(pipeline_bounds(32, 2, {0, 32}).ok());   // an empty stage
  EXPECT_FALSE(pipeline_bounds(3, 4, {}).ok());         // more stages than layers
  EXPECT_FALSE(pipeline_bounds(32, 0, {}).ok());
}

TEST(PipelineSchedule, PromptFillsAndDrains) {
  const PipelineSchedule s = prompt_schedule(3, 4);
  ASSERT_EQ(s.ticks(), 6);  // M + P - 1
  // Stage s runs micro-batch t - s.
  for (int t = 0; t < s.ticks(); ++t) {
    for (int st = 0; st < 3; ++st) {
      const int m = t - st;
      EXPECT_EQ(s.slot[t][st], m >= 0 && m < 4 ? m : -1) << "t=" << t << " s=" << st;
    }
  }
  EXPECT_DOUBLE_EQ(s.bubble(), 6.0 / 18.0);  // (P - 1) / (M + P - 1)
  EXPECT_EQ(s.to_string().substr(0, s.to_string().find('\n')), "t=0 | s0 m0.0 | s1 - | s2 -");
  // More, smaller micro-batches shrink the bubble.
  EXPECT_LT(prompt_schedule(3, 12).bubble(), s.bubble());
}

TEST(PipelineSchedule, GenerationKeepsEveryStageBusy) {
  // As many micro-batches as stages: after the fill, every stage works at every tick, and a
  // micro-batch's next token enters stage 0 only after its previous one left the last stage.
  const int P = 4, M = 4, N = 5;
  const PipelineSchedule s = generation_schedule(P, M, N);
  ASSERT_EQ(s.ticks(), (N - 1) * P + M + P - 1);
  for (int t = P - 1; t < s.ticks() - (P - 1); ++t) {
    for (int st = 0; st < P; ++st) EXPECT_GE(s.slot[t][st], 0) << "t=" << t << " s=" << st;
  }
  std::vector<int> last_exit(M, -1);
  for (int t = 0; t < s.ticks(); ++t) {
    if (s.slot[t][0] >= 0) {
      EXPECT_GT(t, last_exit[s.slot[t][0]]) << "micro-batch " << s.slot[t][0] << " at t=" << t;
    }
    if (s.slot[t][P - 1] >= 0) last_exit[s.slot[t][P - 1]] = t;
  }
  EXPECT_DOUBLE_EQ(s.bubble(), 1.0 - double(M * N * P) / double(s.ticks() * P));
  // Fewer micro-batches than stages leave stages idle every round.
  EXPECT_GT(generation_schedule(P, 2, N).bubble(), 0.5);
  EXPECT_EQ(prompt_micro_batches(4, 2048, 128), 16);
  EXPECT_EQ(prompt_micro_batches(4, 300, 128), 2);
  EXPECT_NEAR(measured_bubble({0.5, 1.0}, 1.0), 0.25, 1e-12);
}

TEST(PipelineEngine, GenerateMatchesOneStage) {
  GenerateRequest req;
  req.prompt_tokens = {1, 17, 33, 80, 5, 9, 120, 44};
  req.max_tokens = 12;
  req.sampling.temperature = 0.0f;
  req.ignore_eos = true;
  std::vector<std::vector<int32_t>> outs;
  for (int pp : {1, 3}) {
    EngineConfig cfg;
    cfg.model = testing::fixture_model("llama");
    cfg.parallel.pp = pp;
    auto engine = Engine::create(cfg);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    auto r = (*engine)->generate(req, [](std::string_view) { return true; });
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    outs.push_back(r->tokens);
  }
  EXPECT_EQ(outs[0].size(), 12u);
  EXPECT_EQ(outs[1], outs[0]);
  EngineConfig bad;
  bad.model = testing::fixture_model("llama");
  bad.parallel.pp = 2;
  bad.parallel.pp_layers = {1, 1};  // the fixture has 3 layers
  auto e = Engine::create(bad);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--pp-layers"), std::string::npos) << e.status().to_string();
}

// The serving engine's step counters: every token a pass carries is a prompt token or a
// generated one fed back (n_prompt + max_tokens - 1 per request, no prefix cache, no
// preemption); with two stages two passes are in flight and a bubble is measured, with one
// stage one pass at a time and no bubble.
TEST(ServingPipeline, StepCountersAndBubble) {
  for (int pp : {1, 2}) {
    ServingConfig cfg;
    cfg.engine.model = testing::fixture_model("llama");
    cfg.engine.parallel.pp = pp;
    cfg.enable_prefix_caching = false;
    auto serving = ServingEngine::create(cfg);
    ASSERT_TRUE(serving.ok()) << serving.status().to_string();
    constexpr int kRequests = 8;
    constexpr int64_t kPrompt = 9, kGen = 6;
    std::mutex mu;
    std::condition_variable cv;
    int done = 0;
    for (int i = 0; i < kRequests; ++i) {
      CompletionRequest r;
      for (int64_t t = 0; t < kPrompt; ++t) r.prompt_tokens.push_back(3 + (i * 31 + t * 7) % 250);
      r.max_tokens = kGen;
      r.ignore_eos = true;
      r.sampling.temperature = 0.0f;
      ASSERT_TRUE((*serving)
                      ->submit(r,
                               [&](const CompletionEvent& ev) {
                                 if (!ev.finished) return;
                                 std::lock_guard<std::mutex> lk(mu);
                                 ++done;
                                 cv.notify_all();
                               })
                      .ok());
    }
    {
      std::unique_lock<std::mutex> lk(mu);
      ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(60), [&] { return done == kRequests; }));
    }
    ServingMetrics m = (*serving)->metrics();
    for (int i = 0; i < 500 && m.requests_finished_total < kRequests; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      m = (*serving)->metrics();
    }
    EXPECT_EQ(m.step_tokens_total, kRequests * (kPrompt + kGen - 1)) << "pp " << pp;
    EXPECT_GT(m.steps_total, 0);
    if (pp == 1) {
      EXPECT_EQ(m.max_steps_in_flight, 1);
      EXPECT_LT(m.pipeline_bubble, 0.0);
    } else {
      EXPECT_EQ(m.max_steps_in_flight, 2);
      EXPECT_GE(m.pipeline_bubble, 0.0);
      EXPECT_LT(m.pipeline_bubble, 1.0);
    }
  }
}

}  // namespace
}  // namespace strata
