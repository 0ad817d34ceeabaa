// Mixture-of-experts models on the CUDA backend (the expert kernels of
// src/backends/cuda/kernels/moe_*.cu) against three references, as tests/cuda/test_cuda_model.cpp
// does for the dense families: the CPU f32 reference, the same device layout run on the CPU
// through the bf16 twins, and Hugging Face transformers' logits stored with each fixture
// (tests/fixtures/moe, scripts/make_moe_fixtures.py). Tolerances are the dense families':
// 4e-2 of max|logit| against the f32 reference and transformers, 1e-2 against the twins.
//
// Covered: one prefill per reference sequence, decode steps replayed from CUDA graphs, a
// 100-token prefill (groups above the SBI bound: the tiled expert GEMM), a batch of decode steps
// of several sequences, int8 / fp8 experts, and the one-line refusal of a fixture whose hidden
// size the CUDA GEMMs cannot take (Qwen2-MoE's 44).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../model/fixture_util.h"
#include "backends/cuda/cuda_device.h"
#include "model/config.h"
#include "model/model.h"
#include "model/presets.h"
#include "parallel/comm.h"
#include "runtime/executor.h"
#include "runtime/model_loader.h"
#include "runtime/sequence.h"
#include "strata/engine.h"

namespace strata {
namespace {

bool have_gpu() {
  return cuda::cuda_device_count() > 0;
}

#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "needs a CUDA device"

bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

std::string moe_dir(const std::string& name) {
  return std::string(STRATA_FIXTURE_DIR) + "/moe/" + name;
}

EngineConfig cuda_config(const std::string& model) {
  EngineConfig cfg;
  cfg.model = model;
  cfg.device = DeviceSpec::cuda(0);
  cfg.max_model_len = 256;
  cfg.max_num_seqs = 8;
  cfg.gpu_memory_utilization = 0.3;
  cfg.show_progress = false;
  return cfg;
}

// The CPU reference (f32), the device layout on the CPU (bf16 twins) and on the GPU.
struct Runners {
  std::unique_ptr<Communicator> comm = make_single_rank_communicator();
  std::unique_ptr<Executor> cpu, twin, gpu;
};

Result<Runners> make_runners(const std::string& dir, DType wdt) {
  Runners r;
  RunnerOptions o;
  o.max_model_len = 192;
  o.num_kv_blocks = 64;
  o.max_num_tokens = 160;
  o.max_num_seqs = 8;
  o.weight_dtype = wdt;
  for (int which = 0; which < 3; ++which) {
    STRATA_ASSIGN_OR_RETURN(ModelFiles files, open_model(dir, true));
    STRATA_ASSIGN_OR_RETURN(auto model, Model::load(files.config, ParallelConfig{}, files.weights));
    RunnerOptions w = o;
    w.act_dtype = which == 0 ? DType::kF32 : DType::kBF16;
    // The f32 reference runs the checkpoint's weights as stored (no quantization).
    w.weight_dtype = which == 0 ? DType::kBF16 : wdt;
    w.device = which == 2 ? Device::cuda(0) : Device::cpu();
    STRATA_ASSIGN_OR_RETURN(
        auto e, make_runner(files.config, ParallelConfig{}, std::move(model), *r.comm, w));
    (which == 0 ? r.cpu : which == 1 ? r.twin : r.gpu) = std::move(e);
  }
  return r;
}

// Logits of every position of `seq`, in chunks of `chunk` tokens (1: decode steps).
std::vector<float> run_sequence(Executor& e, const std::vector<int32_t>& seq, int64_t chunk) {
  const int64_t V = e.config().vocab;
  std::vector<float> logits(seq.size() * static_cast<size_t>(V));
  SequenceKv kv;
  const ForwardFn fn = [&](const ForwardBatch& b, float* out) { return e.forward(b, out); };
  const Status st =
      forward_sequence(fn, e.max_model_len(), V, e.cache(), kv, seq, true, logits.data(), chunk);
  EXPECT_TRUE(st.ok()) << st.to_string();
  kv.release(e.cache());
  return logits;
}

struct MoeCase {
  const char* name;
  DType wdt;
  double tol_ref;  // vs the CPU f32 reference and transformers
  double tol_twin;
};

class CudaMoe : public ::testing::TestWithParam<MoeCase> {};

// Each reference sequence as one prefill and as decode steps (graph replays) on the GPU, against
// the CPU f32 reference, the CPU bf16 twins and transformers; then a 100-token random prefill
// (the tiled expert GEMM) against the same references.
TEST_P(CudaMoe, LogitsMatchCpuTwinAndTransformers) {
  REQUIRE_GPU();
  const MoeCase& c = GetParam();
  const std::string dir = moe_dir(c.name);
  auto ref = testing::load_reference(dir);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  auto rs = make_runners(dir, c.wdt);
  ASSERT_TRUE(rs.ok()) << rs.status().to_string();
  Executor& cpu = *rs->cpu;
  Executor& twin = *rs->twin;
  Executor& gpu = *rs->gpu;
  EXPECT_EQ(gpu.backend_name(), "CUDA");
  auto check = [&](const std::vector<int32_t>& seq, const std::vector<float>* hf, int64_t chunk,
                   const std::string& what) {
    const std::vector<float> lc = run_sequence(cpu, seq, 512);
    const std::vector<float> lt = run_sequence(twin, seq, chunk);
    const std::vector<float> lg = run_sequence(gpu, seq, chunk);
    ASSERT_TRUE(all_finite(lg)) << what;
    const size_t V = static_cast<size_t>(cpu.config().vocab);
    const testing::RowErrors vs_cpu = testing::row_errors(lg, lc, V, c.tol_ref);
    const double vs_twin = testing::relative_error(lg, lt);
    const testing::RowErrors vs_hf =
        hf != nullptr ? testing::row_errors(lg, *hf, V, c.tol_ref) : testing::RowErrors{};
    std::printf(
        "[ info ] %s %s %s: GPU vs twins %.2e, vs CPU %.2e (%.2e without the worst position), "
        "vs transformers %.2e (%.2e)\n",
        c.name, std::string(dtype_name(c.wdt)).c_str(), what.c_str(), vs_twin, vs_cpu.worst,
        vs_cpu.worst_routed, vs_hf.worst, vs_hf.worst_routed);
    // The kernels against their CPU twins: every position.
    EXPECT_LE(vs_twin, c.tol_twin) << what << ": GPU vs its CPU twins";
    // Against f32 references: bf16 rounding can flip a near-tie of the router at one position
    // (as on the CPU twins, tests/model/test_moe_models.cpp); every other position within the
    // dense families' bound. In a long random prefill such a flip also changes every later
    // position (their attention reads its K/V), so there only the twins are asserted.
    if (hf != nullptr) {
      EXPECT_LE(vs_cpu.worst_routed, c.tol_ref) << what << " vs CPU";
      EXPECT_LE(vs_cpu.over, 1) << what << " vs CPU";
      EXPECT_LE(vs_hf.worst_routed, c.tol_ref) << what << " vs transformers";
      EXPECT_LE(vs_hf.over, 1) << what << " vs transformers";
    }
  };
  for (size_t i = 0; i < ref->inputs.size(); ++i) {
    check(ref->inputs[i], &ref->logits[i], 512, "sequence " + std::to_string(i) + " prefill");
    check(ref->inputs[i], &ref->logits[i], 1, "sequence " + std::to_string(i) + " decode");
  }
  EXPECT_GE(gpu.graph_captures(), 1) << "decode steps run from CUDA graphs";
  EXPECT_GE(gpu.graph_replays(), 8);
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(cpu.config().vocab - 1));
  std::vector<int32_t> long_seq(100);
  for (int32_t& t : long_seq) t = tok(rng);
  check(long_seq, nullptr, 512, "100-token prefill");
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, CudaMoe,
    ::testing::Values(MoeCase{"mixtral", DType::kBF16, 4e-2, 1e-2},
                      MoeCase{"mixtral_bf16", DType::kBF16, 4e-2, 1e-2},
                      MoeCase{"olmoe", DType::kBF16, 4e-2, 1e-2},
                      MoeCase{"qwen3_moe_bf16", DType::kBF16, 4e-2, 1e-2},
                      // int8 / fp8: the dense families' bounds vs the f32 reference
                      // (test_cuda_model.cpp, QuantizedWeightsStayClose); vs the twins, which
                      // hold the same quantized values, the bf16 bound.
                      MoeCase{"mixtral", DType::kI8, 8e-2, 1e-2},
                      // fp8: the CPU twin test's bound (measured 2.4e-1 there, 2.6e-1 here);
                      // above 16 tokens the dense fp8 GEMMs run cuBLASLt with fp8 activations,
                      // which the twins (bf16 activations) do not model: 1.5e-1 measured at the
                      // 100-token prefill, 1e-7 in decode.
                      MoeCase{"qwen3_moe_bf16", DType::kFP8E4M3, 3e-1, 2e-1}),
    [](const auto& info) {
      return std::string(info.param.name) + "_" + std::string(dtype_name(info.param.wdt));
    });

// Several sequences decoding together (groups of several rows per expert) through the graph
// path, against the CPU reference and the twins with the same block tables.
TEST(CudaMoeBatch, DecodeStepsOfSeveralSequences) {
  REQUIRE_GPU();
  auto rs = make_runners(moe_dir("qwen3_moe_bf16"), DType::kBF16);
  ASSERT_TRUE(rs.ok()) << rs.status().to_string();
  Executor& cpu = *rs->cpu;
  Executor& twin = *rs->twin;
  Executor& gpu = *rs->gpu;
  const int64_t V = cpu.config().vocab;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(V - 1));
  std::vector<int32_t> ids(64);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const int64_t W = 8, S = 6;
  std::vector<int32_t> tables(ids.begin(), ids.begin() + S * W);
  double worst_twin = 0;
  auto check = [&](const ForwardBatch& b, const char* what) {
    const size_t n = b.logit_rows.size() * static_cast<size_t>(V);
    std::vector<float> lc(n), lt(n), lg(n);
    ASSERT_TRUE(cpu.forward(b, lc.data()).ok());
    ASSERT_TRUE(twin.forward(b, lt.data()).ok());
    const Status st = gpu.forward(b, lg.data());
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_TRUE(all_finite(lg)) << what;
    EXPECT_LE(testing::relative_error(lg, lc), 4e-2) << what;
    const double vs_twin = testing::relative_error(lg, lt);
    worst_twin = std::max(worst_twin, vs_twin);
    EXPECT_LE(vs_twin, 1e-2) << what << ": GPU vs its CPU twins";
  };
  // History: sequence s holds 3 + 4 s tokens.
  std::vector<int32_t> t1, s1, p1, r1;
  for (int32_t s = 0; s < S; ++s) {
    for (int32_t p = 0; p < 3 + 4 * s; ++p) {
      t1.push_back(tok(rng));
      s1.push_back(s);
      p1.push_back(p);
    }
    r1.push_back(static_cast<int32_t>(t1.size()) - 1);
  }
  ForwardBatch b1;
  b1.tokens = t1;
  b1.token_seq = s1;
  b1.token_pos = p1;
  b1.block_tables = tables.data();
  b1.max_blocks_per_seq = W;
  b1.n_seqs = S;
  b1.logit_rows = r1;
  check(b1, "history");
  for (int step = 0; step < 5; ++step) {
    std::vector<int32_t> t, sq, p, r;
    for (int32_t s = 0; s < S; ++s) {
      t.push_back(tok(rng));
      sq.push_back(s);
      p.push_back(3 + 4 * s + step);
      r.push_back(s);
    }
    ForwardBatch b = b1;
    b.tokens = t;
    b.token_seq = sq;
    b.token_pos = p;
    b.logit_rows = r;
    check(b, "decode step");
  }
  std::printf("[ info ] MoE decode batch of %lld: GPU vs CPU bf16 twins worst %.2e\n",
              static_cast<long long>(S), worst_twin);
  EXPECT_GE(gpu.graph_replays(), 4);
}

// Greedy generation through the engine (CUDA graphs) equals transformers' continuation in its
// first tokens (bf16 may flip the near-ties of these small random models later on).
TEST(CudaMoeEngine, GreedyFollowsTransformers) {
  REQUIRE_GPU();
  for (const char* name : {"mixtral_bf16", "qwen3_moe_bf16", "olmoe"}) {
    const std::string dir = moe_dir(name);
    auto ref = testing::load_reference(dir);
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();
    auto gpu = Engine::create(cuda_config(dir));
    ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
    EXPECT_EQ((*gpu)->info().backend, "CUDA");
    GenerateRequest req;
    req.prompt_tokens = ref->greedy_prompt;
    req.max_tokens = static_cast<int64_t>(ref->greedy_tokens.size());
    req.sampling.temperature = 0.0f;
    req.ignore_eos = true;
    auto out = (*gpu)->generate(req, nullptr);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    ASSERT_EQ(out->tokens.size(), ref->greedy_tokens.size());
    size_t same = 0;
    while (same < out->tokens.size() && out->tokens[same] == ref->greedy_tokens[same]) ++same;
    std::printf("[ info ] %s greedy: first %zu of %zu tokens equal transformers'\n", name, same,
                out->tokens.size());
    EXPECT_GE(same, 4u) << name;
  }
}

// ---- random weights at shapes the fixtures lack
// --------------------------------------------------- Random weights are the same values on every
// device (a counter-based hash of seed and index), so the GPU and the CPU twins run the same model
// from the seed alone.

// Logits of `seq` on the device layout with random weights (seed 3) on `device`.
std::vector<float> run_random(const ModelConfig& c, Device device, const std::vector<int32_t>& seq,
                              int64_t chunk, int64_t* graph_replays) {
  auto comm = make_single_rank_communicator();
  RunnerOptions o;
  o.device = device;
  o.act_dtype = DType::kBF16;
  o.max_model_len = 128;
  o.num_kv_blocks = 16;
  o.max_num_tokens = 96;
  o.max_num_seqs = 4;
  o.seed = 3;
  auto e = make_runner(c, ParallelConfig{}, nullptr, *comm, o);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  if (!e.ok()) return {};
  std::vector<float> out = run_sequence(**e, seq, chunk);
  if (graph_replays != nullptr) *graph_replays = (*e)->graph_replays();
  return out;
}

// GPU vs CPU twins on random weights: a 90-token prefill (groups above the SBI bound) and 8
// decode steps (graph replays).
void expect_random_model_matches_twins(const ModelConfig& c, const char* what) {
  std::mt19937 rng(17);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab - 1));
  std::vector<int32_t> seq(90);
  for (int32_t& t : seq) t = tok(rng);
  const std::vector<int32_t> short_seq(seq.begin(), seq.begin() + 8);
  for (int64_t chunk : {int64_t{90}, int64_t{1}}) {
    const std::vector<int32_t>& s = chunk == 1 ? short_seq : seq;
    int64_t replays = 0;
    const std::vector<float> twin = run_random(c, Device::cpu(), s, chunk, nullptr);
    const std::vector<float> gpu = run_random(c, Device::cuda(0), s, chunk, &replays);
    ASSERT_EQ(gpu.size(), twin.size()) << what;
    ASSERT_TRUE(all_finite(gpu)) << what;
    const testing::RowErrors err =
        testing::row_errors(gpu, twin, static_cast<size_t>(c.vocab), 1e-2);
    std::printf(
        "[ info ] %s random weights, chunk %lld: GPU vs twins %.2e (%.2e without the "
        "worst position)\n",
        what, static_cast<long long>(chunk), err.worst, err.worst_routed);
    // One layer, so a router near-tie flipped by the attention kernels' bf16 rounding changes
    // only its own position; with 128 experts and top-8 on random weights a few of 90 positions
    // flip. At most one in 20 positions may differ; the rest match the twins within 1e-2.
    const int allowed = std::max<int>(1, static_cast<int>(s.size()) / 20);
    EXPECT_LE(err.over, allowed) << what << " chunk " << chunk;
    if (chunk == 1) EXPECT_GE(replays, 4) << what << ": decode steps replay CUDA graphs";
  }
}

// Qwen2-MoE with a shared expert behind its sigmoid gate, q/k/v biases and a dense layer
// (mlp_only_layers): the fixture's config with hidden 64 (its 44 does not fit the CUDA GEMMs),
// dense FFN 48 and shared FFN 32; the expert FFN stays 20 (padded to 32 on the device).
TEST(CudaMoeRandom, Qwen2MoeSharedExpertMatchesTwins) {
  REQUIRE_GPU();
  std::ifstream f(moe_dir("qwen2_moe") + "/config.json");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string json = ss.str();
  for (auto [from, to] :
       {std::pair<std::string, std::string>{"\"hidden_size\": 44", "\"hidden_size\": 64"},
        {"\"intermediate_size\": 52", "\"intermediate_size\": 48"},
        {"\"shared_expert_intermediate_size\": 28", "\"shared_expert_intermediate_size\": 32"}}) {
    const size_t at = json.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    json.replace(at, from.size(), to);
  }
  auto c = parse_hf_config(json, "qwen2_moe (hidden 64)");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_GT(c->shared_expert_ffn_dim, 0);
  expect_random_model_matches_twins(*c, "qwen2_moe hidden 64");
}

// One layer of Qwen3-30B-A3B's real shapes (hidden 2048, 128 experts of FFN 768, top-8) with a
// small vocabulary: the grouped SBI kernels at decode and the tiled GEMM at prefill over the
// real expert count.
TEST(CudaMoeRandom, Qwen3_30bLayerMatchesTwins) {
  REQUIRE_GPU();
  auto c = model_config_preset("qwen3-30b-a3b");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  c->n_layers = 1;
  c->layer_is_moe.assign(1, true);
  c->vocab = 1024;
  expect_random_model_matches_twins(*c, "qwen3-30b-a3b 1 layer");
}

// Qwen2-MoE's fixture has hidden size 44: the CUDA GEMMs need multiples of 8, so loading it on
// the GPU fails with one line naming the weight (the CPU twins run it: test_moe_models.cpp).
TEST(CudaMoeEngine, UnalignedHiddenIsRefused) {
  REQUIRE_GPU();
  auto gpu = Engine::create(cuda_config(moe_dir("qwen2_moe")));
  ASSERT_FALSE(gpu.ok());
  const std::string msg = gpu.status().to_string();
  EXPECT_NE(msg.find("multiple of 8"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

}  // namespace
}  // namespace strata
