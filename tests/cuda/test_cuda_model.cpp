// The model program on the CUDA backend (Engine --device cuda, or a ModelRunner on a GPU) against
// three references: the CPU backend (the executable specification, f32 throughout), the same
// device layout run on the CPU through the bf16 twins of the CUDA kernels, and Hugging Face
// transformers' logits stored with each fixture. The GPU holds bf16 weights and bf16 GEMM inputs
// and KV, so the tolerances are bf16-sized: on these fixtures (hidden 64-72, max|logit| ~6-8)
// transformers itself run in bf16 lands 3.2e-2 (qwen2), 3.6e-2 (mistral), 5.1e-2 (llama_bf16)
// and 8.4e-2 (llama, f32 weights) from its f32 logits (max abs error / max |logit|, 37 random
// tokens, torch_dtype=bfloat16 vs float32); strata keeps the residual stream in f32 and measured
// 1.4e-2 .. 3.1e-2 on the H100. Every comparison also checks that the outputs are finite.
//
// Also: a mixed batch (a prefill, a chunk continuing a cached sequence and decode steps in one
// forward) against the CPU reference and the CPU bf16 twins with the same block tables; CUDA-graph
// replays against eager launches; int8 / fp8 weights; clear errors for impossible sizes; and
// SmolLM2's 64 greedy tokens against the CPU's (when the model is in the cache).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../model/fixture_util.h"
#include "backends/cuda/cuda_device.h"
#include "model/model.h"
#include "parallel/comm.h"
#include "runtime/executor.h"
#include "runtime/model_loader.h"
#include "strata/engine.h"

namespace strata {
namespace {

bool have_gpu() {
  return cuda::cuda_device_count() > 0;
}

#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "needs a CUDA device"

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

int64_t argmax(const float* row, int64_t n) {
  return std::max_element(row, row + n) - row;
}

EngineConfig cuda_config(const std::string& model) {
  EngineConfig cfg;
  cfg.model = model;
  cfg.device = DeviceSpec::cuda(0);
  cfg.max_model_len = 256;
  cfg.max_num_seqs = 8;
  cfg.gpu_memory_utilization = 0.5;
  cfg.show_progress = false;
  return cfg;
}

struct FixtureCase {
  const char* name;
  double tol;  // max |cuda - ref| / max |ref|, against both the CPU and transformers
};

class CudaFixture : public ::testing::TestWithParam<FixtureCase> {};

TEST_P(CudaFixture, LogitsMatchCpuAndTransformers) {
  REQUIRE_GPU();
  const FixtureCase& c = GetParam();
  const std::string dir = testing::fixture_model(c.name);
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " not present";
  auto ref = testing::load_reference(dir);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  EngineConfig cpu_cfg;
  cpu_cfg.model = dir;
  auto cpu = Engine::create(cpu_cfg);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  auto gpu = Engine::create(cuda_config(dir));
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  EXPECT_EQ((*gpu)->info().backend, "CUDA");
  for (size_t i = 0; i < ref->inputs.size(); ++i) {
    auto g = (*gpu)->score(ref->inputs[i]);
    auto p = (*cpu)->score(ref->inputs[i]);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    ASSERT_TRUE(all_finite(*g)) << c.name;
    const double vs_cpu = testing::relative_error(*g, *p);
    const double vs_hf = testing::relative_error(*g, ref->logits[i]);
    EXPECT_LE(vs_cpu, c.tol) << c.name << " sequence " << i << " vs CPU";
    EXPECT_LE(vs_hf, c.tol) << c.name << " sequence " << i << " vs transformers";
    std::printf("[ info ] %s seq %zu: max err vs CPU %.2e, vs transformers %.2e (of max|logit|)\n",
                c.name, i, vs_cpu, vs_hf);
  }
  // Greedy decode (CUDA graphs) against transformers' continuation. Fixture logits are small
  // random numbers where bf16 can flip near-ties, so require the first tokens and most of the rest.
  GenerateRequest req;
  req.prompt_tokens = ref->greedy_prompt;
  req.max_tokens = static_cast<int64_t>(ref->greedy_tokens.size());
  req.sampling.temperature = 0.0f;
  req.ignore_eos = true;
  auto out = (*gpu)->generate(req, nullptr);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->tokens.size(), ref->greedy_tokens.size());
  size_t same_prefix = 0;
  while (same_prefix < out->tokens.size() &&
         out->tokens[same_prefix] == ref->greedy_tokens[same_prefix]) {
    ++same_prefix;
  }
  std::printf("[ info ] %s greedy: first %zu of %zu tokens equal transformers'\n", c.name,
              same_prefix, out->tokens.size());
  EXPECT_GE(same_prefix, 4u) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaFixture,
                         ::testing::Values(FixtureCase{"llama", 4e-2},
                                           FixtureCase{"llama_bf16", 4e-2},
                                           FixtureCase{"llama_sharded", 4e-2},
                                           FixtureCase{"mistral", 4e-2}, FixtureCase{"qwen2", 4e-2},
                                           FixtureCase{"gpt2", 4e-2}, FixtureCase{"neox", 4e-2},
                                           FixtureCase{"neox_seq", 4e-2},
                                           FixtureCase{"gemma3", 4e-2}),
                         [](const auto& info) { return std::string(info.param.name); });

// Runners over the same checkpoint: the CPU reference (f32), the device layout on the CPU (bf16
// twins of the CUDA kernels) and on the GPU.
struct Runners {
  std::unique_ptr<Communicator> comm = make_single_rank_communicator();
  std::unique_ptr<Executor> cpu, twin, gpu;
};

Result<Runners> make_runners(const std::string& dir) {
  Runners r;
  RunnerOptions o;
  o.max_model_len = 128;
  o.num_kv_blocks = 40;
  o.max_num_tokens = 64;
  o.max_num_seqs = 8;
  for (int which = 0; which < 3; ++which) {
    STRATA_ASSIGN_OR_RETURN(ModelFiles files, open_model(dir, true));
    STRATA_ASSIGN_OR_RETURN(auto model, Model::load(files.config, ParallelConfig{}, files.weights));
    RunnerOptions w = o;
    w.act_dtype = which == 0 ? DType::kF32 : DType::kBF16;
    w.device = which == 2 ? Device::cuda(0) : Device::cpu();
    STRATA_ASSIGN_OR_RETURN(
        auto e, make_runner(files.config, ParallelConfig{}, std::move(model), *r.comm, w));
    (which == 0 ? r.cpu : which == 1 ? r.twin : r.gpu) = std::move(e);
  }
  return r;
}

// One forward mixing a 9-token prefill, a 5-token chunk continuing a 7-token sequence, and two
// decode steps, on shuffled block ids, against the CPU reference and the CPU bf16 twins with the
// same block tables; then decode steps through the graph path.
TEST(CudaModel, MixedBatchMatchesCpu) {
  REQUIRE_GPU();
  auto rs = make_runners(testing::fixture_model("llama_bf16"));
  ASSERT_TRUE(rs.ok()) << rs.status().to_string();
  Executor& cpu = *rs->cpu;
  Executor& twin = *rs->twin;
  Executor& gpu = *rs->gpu;
  const int64_t V = cpu.config().vocab;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(V - 1));
  // Block tables (width 8): shuffled ids, no sharing.
  std::vector<int32_t> ids(40);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const int64_t W = 8;
  std::vector<int32_t> tables(static_cast<size_t>(4 * W));
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = ids[i];
  double worst_twin = 0;
  auto check = [&](const ForwardBatch& b, const char* what) {
    const size_t n = b.logit_rows.size() * static_cast<size_t>(V);
    std::vector<float> lc(n), lt(n), lg(n);
    ASSERT_TRUE(cpu.forward(b, lc.data()).ok());
    ASSERT_TRUE(twin.forward(b, lt.data()).ok());
    ASSERT_TRUE(gpu.forward(b, lg.data()).ok());
    ASSERT_TRUE(all_finite(lg)) << what;
    EXPECT_LE(testing::relative_error(lg, lc), 4e-2) << what;
    const double vs_twin = testing::relative_error(lg, lt);
    worst_twin = std::max(worst_twin, vs_twin);
    EXPECT_LE(vs_twin, 1e-2) << what << ": GPU vs its CPU twins";
  };
  // Step 1: history for sequences 1 (7 tokens), 2 (20 tokens) and 3 (33 tokens).
  std::vector<int32_t> t1, s1, p1;
  const int64_t hist[4] = {0, 7, 20, 33};
  for (int32_t s = 1; s < 4; ++s) {
    for (int32_t p = 0; p < hist[s]; ++p) {
      t1.push_back(tok(rng));
      s1.push_back(s);
      p1.push_back(p);
    }
  }
  std::vector<int32_t> r1 = {6, 26, 59};  // last token of each
  ForwardBatch b1;
  b1.tokens = t1;
  b1.token_seq = s1;
  b1.token_pos = p1;
  b1.block_tables = tables.data();
  b1.max_blocks_per_seq = W;
  b1.n_seqs = 4;
  b1.logit_rows = r1;
  check(b1, "history");
  // Step 2: seq 0 prefill 9, seq 1 chunk of 5 at 7..11, seqs 2 and 3 one decode step each.
  std::vector<int32_t> t2, s2, p2;
  for (int32_t p = 0; p < 9; ++p) t2.push_back(tok(rng)), s2.push_back(0), p2.push_back(p);
  for (int32_t p = 7; p < 12; ++p) t2.push_back(tok(rng)), s2.push_back(1), p2.push_back(p);
  t2.push_back(tok(rng)), s2.push_back(2), p2.push_back(20);
  t2.push_back(tok(rng)), s2.push_back(3), p2.push_back(33);
  std::vector<int32_t> r2(t2.size());
  std::iota(r2.begin(), r2.end(), 0);
  ForwardBatch b2 = b1;
  b2.tokens = t2;
  b2.token_seq = s2;
  b2.token_pos = p2;
  b2.logit_rows = r2;
  check(b2, "mixed step");
  // Step 3: decode steps of all four through the graph path.
  for (int step = 0; step < 6; ++step) {
    std::vector<int32_t> t3, s3, p3, r3;
    const int32_t pos[4] = {9 + step, 12 + step, 21 + step, 34 + step};
    for (int32_t s = 0; s < 4; ++s) {
      t3.push_back(tok(rng));
      s3.push_back(s);
      p3.push_back(pos[s]);
      r3.push_back(s);
    }
    ForwardBatch b3 = b1;
    b3.tokens = t3;
    b3.token_seq = s3;
    b3.token_pos = p3;
    b3.logit_rows = r3;
    check(b3, "decode step");
    std::vector<float> lg(4 * V);
    ASSERT_TRUE(gpu.forward(b3, lg.data()).ok());
    std::vector<int32_t> greedy(4);
    // forward_argmax rewrites the same positions' KV with the same values: idempotent.
    ASSERT_TRUE(gpu.forward_argmax(b3, greedy.data()).ok());
    for (int s = 0; s < 4; ++s) {
      EXPECT_EQ(greedy[static_cast<size_t>(s)], argmax(lg.data() + s * V, V))
          << "device argmax vs host argmax";
    }
  }
  std::printf("[ info ] mixed batch: GPU vs CPU bf16 twins worst %.2e of max|logit|\n", worst_twin);
  EXPECT_GE(gpu.graph_captures(), 1);
  EXPECT_GE(gpu.graph_replays(), 6);
}

TEST(CudaModel, GraphReplayEqualsEagerLaunches) {
  REQUIRE_GPU();
  const std::string dir = testing::fixture_model("llama_bf16");
  EngineConfig a = cuda_config(dir), b = cuda_config(dir);
  b.cuda_graphs = false;
  // Two engines in one process: the second one's share is counted over what the first holds.
  a.gpu_memory_utilization = 0.1;
  b.gpu_memory_utilization = 0.3;
  auto ea = Engine::create(a);
  ASSERT_TRUE(ea.ok()) << ea.status().to_string();
  auto eb = Engine::create(b);
  ASSERT_TRUE(eb.ok()) << eb.status().to_string();
  GenerateRequest req;
  req.prompt_tokens = {1, 5, 9, 200, 17, 3};
  req.max_tokens = 24;
  req.sampling.temperature = 0.0f;
  req.ignore_eos = true;
  auto ga = (*ea)->generate(req, nullptr), gb = (*eb)->generate(req, nullptr);
  ASSERT_TRUE(ga.ok() && gb.ok());
  EXPECT_EQ(ga->tokens, gb->tokens);
}

TEST(CudaModel, QuantizedWeightsStayClose) {
  REQUIRE_GPU();
  const std::string dir = testing::fixture_model("llama");
  auto ref = testing::load_reference(dir);
  ASSERT_TRUE(ref.ok());
  for (const char* q : {"int8", "fp8"}) {
    EngineConfig cfg = cuda_config(dir);
    cfg.quantization = std::string(q) == "int8" ? Quantization::kInt8 : Quantization::kFp8;
    auto e = Engine::create(cfg);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    EXPECT_EQ((*e)->info().weight_format,
              std::string(q == std::string("int8") ? "i8" : "fp8_e4m3"));
    auto g = (*e)->score(ref->inputs[0]);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    ASSERT_TRUE(all_finite(*g));
    const double err = testing::relative_error(*g, ref->logits[0]);
    std::printf("[ info ] %s weights: max err vs transformers %.2e\n", q, err);
    // Per-row int8 keeps ~2 significant digits per weight, e4m3 ~1; errors average over k.
    // bf16 alone costs 2.5e-2 on this fixture (f32 weights); int8 measured 6.1e-2, fp8 1.4e-1.
    EXPECT_LE(err, std::string(q) == "int8" ? 8e-2 : 2e-1) << q;
  }
}

// int8 weights above the SBI crossover run the A8W8 GEMM (per-token int8 activations): 24
// sequences, each a 4-token prefill (96 tokens in one forward) and then 6 decode steps of all 24
// (batch 24 > 16, padded to the graph bucket 32), teacher-forced with the bf16 model's greedy
// tokens so that all runners see the same inputs. Against the CPU int8 twins (which route to
// cpu::gpu_linear_a8w8 above 16 tokens, as the GPU does) tightly; against the GPU with bf16
// weights within what int8 weights and int8 activations cost: the CPU twins measured 1.28e-1 of
// max|logit| against the bf16 layout on a 48-token pass of this fixture (int8 weights alone
// 7.4e-2) and 41 of 48 greedy tokens equal (test_device_layout.cpp,
// Int8AboveCrossoverStaysClose); bounds 1.8e-1 and 2/3 of the greedy tokens.
TEST(CudaModel, Int8AboveCrossoverStaysCloseToBf16) {
  REQUIRE_GPU();
  const std::string dir = testing::fixture_model("llama");
  constexpr int32_t kSeqs = 24;
  constexpr int32_t kPrompt = 4;
  constexpr int kSteps = 6;
  auto comm = make_single_rank_communicator();
  // 0: GPU int8, 1: CPU int8 twins, 2: GPU bf16.
  std::unique_ptr<Executor> ex[3];
  for (int which = 0; which < 3; ++which) {
    auto files = open_model(dir, true);
    ASSERT_TRUE(files.ok()) << files.status().to_string();
    auto model = Model::load(files->config, ParallelConfig{}, files->weights);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    RunnerOptions o;
    o.max_model_len = 64;
    o.num_kv_blocks = 8 * kSeqs;
    o.max_num_tokens = 128;
    o.max_num_seqs = 32;
    o.act_dtype = DType::kBF16;
    o.weight_dtype = which == 2 ? DType::kBF16 : DType::kI8;
    o.device = which == 1 ? Device::cpu() : Device::cuda(0);
    auto e = make_runner(files->config, ParallelConfig{}, std::move(*model), *comm, o);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    ex[which] = std::move(*e);
  }
  const int64_t V = ex[0]->config().vocab;
  constexpr int64_t kW = 4;  // block table width: 4 blocks per sequence
  std::vector<int32_t> tables(static_cast<size_t>(kSeqs * kW));
  std::iota(tables.begin(), tables.end(), 0);
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(V - 1));

  // The step's inputs (ForwardBatch holds spans of these).
  std::vector<int32_t> tokens, seqs, pos, rows;
  for (int32_t sq = 0; sq < kSeqs; ++sq) {
    for (int32_t p = 0; p < kPrompt; ++p) {
      tokens.push_back(tok(rng));
      seqs.push_back(sq);
      pos.push_back(p);
    }
    rows.push_back(sq * kPrompt + kPrompt - 1);
  }
  double worst_twin = 0, worst_bf16 = 0;
  int64_t same = 0, total = 0;
  for (int step = 0; step <= kSteps; ++step) {
    const std::string what = step == 0 ? "prefill" : "decode step " + std::to_string(step);
    ForwardBatch b;
    b.tokens = tokens;
    b.token_seq = seqs;
    b.token_pos = pos;
    b.block_tables = tables.data();
    b.max_blocks_per_seq = kW;
    b.n_seqs = kSeqs;
    b.logit_rows = rows;
    std::vector<float> lg[3];
    for (int which = 0; which < 3; ++which) {
      lg[which].resize(static_cast<size_t>(kSeqs * V));
      const Status st = ex[which]->forward(b, lg[which].data());
      ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
    }
    ASSERT_TRUE(all_finite(lg[0])) << what;
    const double vs_twin = testing::relative_error(lg[0], lg[1]);
    const double vs_bf16 = testing::relative_error(lg[0], lg[2]);
    worst_twin = std::max(worst_twin, vs_twin);
    worst_bf16 = std::max(worst_bf16, vs_bf16);
    EXPECT_LE(vs_twin, 1e-2) << what << ": GPU int8 vs its CPU twins";
    EXPECT_LE(vs_bf16, 1.8e-1) << what << ": GPU int8 vs GPU bf16";
    // The next step: one decode token per sequence, the bf16 model's greedy choice.
    tokens.clear();
    seqs.clear();
    pos.clear();
    rows.clear();
    for (int32_t sq = 0; sq < kSeqs; ++sq) {
      const int64_t want = argmax(lg[2].data() + sq * V, V);
      same += argmax(lg[0].data() + sq * V, V) == want;
      ++total;
      tokens.push_back(static_cast<int32_t>(want));
      seqs.push_back(sq);
      pos.push_back(kPrompt + step);
      rows.push_back(sq);
    }
  }
  std::printf(
      "[ info ] int8 above the crossover: GPU vs CPU twins worst %.2e, vs bf16 weights worst "
      "%.2e of max|logit|; greedy tokens equal to bf16's %lld of %lld\n",
      worst_twin, worst_bf16, static_cast<long long>(same), static_cast<long long>(total));
  EXPECT_GE(same * 3, total * 2) << "fewer than 2/3 of the greedy tokens equal bf16's";
}

TEST(CudaModel, ClearErrors) {
  REQUIRE_GPU();
  {
    EngineConfig cfg = cuda_config(testing::fixture_model("llama"));
    cfg.gpu_memory_utilization = 1e-6;
    auto e = Engine::create(cfg);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.status().code(), StatusCode::kOutOfMemory) << e.status().message();
    EXPECT_NE(e.status().message().find("GiB"), std::string::npos) << e.status().message();
  }
  {
    EngineConfig cfg;
    cfg.device = DeviceSpec::cuda(0);
    cfg.load_format = LoadFormat::kDummy;
    // 141 GB of bf16 weights: more than an H100 holds (the weights check names the free
    // memory); an H200 holds them under the default utilization, but then leaves no room for
    // the KV cache (that check names what is left after the weights).
    cfg.model_config = "llama3-70b";
    cfg.show_progress = false;
    auto e = Engine::create(cfg);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.status().code(), StatusCode::kOutOfMemory) << e.status().message();
    const std::string& msg = e.status().message();
    EXPECT_TRUE(msg.find("free") != std::string::npos ||
                msg.find("left after the weights") != std::string::npos)
        << msg;
  }
  {
    EngineConfig cfg = cuda_config(testing::fixture_model("llama"));
    cfg.device = DeviceSpec::cuda(99);
    auto e = Engine::create(cfg);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.status().code(), StatusCode::kOutOfRange) << e.status().message();
  }
}

// Real models (GGUF blocks dequantized to bf16 on the GPU): SmolLM2-135M (Q4_1, Llama family) and
// Gemma-3-270M (Q4_K_M: q/k norms, post norms, sliding-window layers, head_dim 256). 64 greedy
// tokens equal the CPU's, unless the CPU's own top-2 margin at the first difference is within
// the GPU's measured logit error (a near-tie bf16 may legitimately flip).
class RealModelGreedy : public ::testing::TestWithParam<const char*> {};

TEST_P(RealModelGreedy, MatchesCpu) {
  REQUIRE_GPU();
  const char* name = GetParam();
  auto resolved = open_model(name, false);
  if (!resolved.ok()) GTEST_SKIP() << name << " not fetched: " << resolved.status().message();
  EngineConfig cpu_cfg;
  cpu_cfg.model = name;
  cpu_cfg.max_model_len = 512;
  cpu_cfg.show_progress = false;
  EngineConfig gpu_cfg = cuda_config(name);
  gpu_cfg.max_model_len = 512;
  auto cpu = Engine::create(cpu_cfg);
  auto gpu = Engine::create(gpu_cfg);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  const char* prompts[] = {"The capital of France is",
                           "def fibonacci(n):", "Once upon a time, in a small village,"};
  for (const char* prompt : prompts) {
    GenerateRequest req;
    req.prompt = prompt;
    req.max_tokens = 64;
    req.sampling.temperature = 0.0f;
    req.ignore_eos = true;
    auto c = (*cpu)->generate(req, nullptr);
    auto g = (*gpu)->generate(req, nullptr);
    ASSERT_TRUE(c.ok() && g.ok());
    ASSERT_EQ(c->tokens.size(), 64u);
    ASSERT_EQ(g->tokens.size(), 64u);
    // The GPU's logit error on this prompt bounds what counts as a near-tie.
    auto pl_c = (*cpu)->score(c->prompt_tokens);
    auto pl_g = (*gpu)->score(c->prompt_tokens);
    ASSERT_TRUE(pl_c.ok() && pl_g.ok());
    double err = 0;
    for (size_t i = 0; i < pl_c->size(); ++i) {
      err = std::max(err, std::fabs(static_cast<double>((*pl_c)[i]) - (*pl_g)[i]));
    }
    std::printf("[ info ] '%s': prompt logits max |cuda - cpu| = %.3f (max|logit| %.1f)\n", prompt,
                err, max_abs(*pl_c));
    size_t i = 0;
    while (i < 64 && c->tokens[i] == g->tokens[i]) ++i;
    std::printf("[ info ] '%s': %zu of 64 greedy tokens equal; GPU text: %s\n", prompt, i,
                g->text.c_str());
    if (i == 64) continue;
    std::vector<int32_t> ctx = c->prompt_tokens;
    ctx.insert(ctx.end(), c->tokens.begin(), c->tokens.begin() + static_cast<long>(i));
    auto lc = (*cpu)->score(ctx);
    ASSERT_TRUE(lc.ok());
    const int64_t V = (*cpu)->info().vocab;
    std::vector<float> last(lc->end() - V, lc->end());
    std::vector<float> sorted = last;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    const double margin = sorted[0] - sorted[1];
    std::printf("[ info ] first difference at token %zu: CPU top-2 margin %.4f, GPU error %.4f\n",
                i, margin, err);
    EXPECT_LE(margin, 2 * err) << "divergence at token " << i << " is not a near-tie";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, RealModelGreedy, ::testing::Values("smollm2", "gemma3-270m"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n) {
                             if (ch == '-' || ch == '.') ch = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace strata
