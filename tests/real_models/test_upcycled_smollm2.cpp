// Real weights through the mixture-of-experts path without a MoE download: SmolLM2-135M-Instruct
// (the Q4_1 GGUF of scripts/fetch_model.sh smollm2) upcycled in memory into two MoE models whose
// output must be the dense model's, run by the moe family program and compared with the dense
// llama program on the same file:
//   (a) copies  E = 4 identical copies of each layer's FFN (views of the same tensors), a random
//               router, top-2 renormalised: every token's weights sum to 1 over one function
//   (b) sliced  the FFN's intermediate dimension cut into E = 4 experts of F / 4 (gate / up rows,
//               down columns), all 4 selected: a zero router gives each weight 1/4 exactly, and
//               each expert's up projection is scaled by 4 (the Q4_1 blocks' f16 scale and min
//               times 4, exact), so every expert enters the sum with weight 1
// Greedy continuations must be identical; logits agree up to summation order (and, for (a),
// which GEMM path a group of tokens takes). Label `model`: skips when the file is absent.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>

#include "backends/cpu/quant.h"
#include "core/buffer.h"
#include "core/env.h"
#include "core/half.h"
#include "core/status.h"
#include "io/gguf.h"
#include "model/config.h"
#include "model/gguf_model.h"
#include "model/model.h"
#include "parallel/comm.h"
#include "runtime/executor.h"
#include "runtime/sequence.h"

namespace strata {
namespace {

std::string model_path() {
  if (const char* p = std::getenv("STRATA_SMOLLM2_GGUF")) return p;
  return env_config().cache_dir + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

constexpr int64_t kExperts = 4;

enum class Upcycle { kCopies, kSliced };

// The dense checkpoint under MoE names: model.layers.N.mlp.gate.weight (the router) and
// model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight, built from the dense
// mlp.{gate,up,down}_proj of the same layer; every other name passes through.
class UpcycledSource final : public TensorSource {
 public:
  UpcycledSource(std::shared_ptr<TensorSource> dense, const ModelConfig& c, Upcycle mode)
      : dense_(std::move(dense)), c_(c), mode_(mode) {}

  bool has(const std::string& name) const override {
    std::smatch m;
    if (std::regex_match(name, m, kRouter)) return true;
    if (std::regex_match(name, m, kExpert)) return std::stoll(m[2]) < kExperts;
    return dense_->has(name);
  }

  Result<Tensor> tensor(const std::string& name) const override {
    std::smatch m;
    const int64_t H = c_.hidden, F = c_.ffn_dim, Fe = F / kExperts;
    if (std::regex_match(name, m, kRouter)) {
      const int64_t layer = std::stoll(m[1]);
      Tensor t = owned(DType::kF32, {kExperts, H});
      float* w = static_cast<float*>(t.data);
      std::mt19937 gen(static_cast<uint32_t>(1000 + layer));
      std::normal_distribution<float> dist(0.0f, 0.05f);
      for (int64_t i = 0; i < kExperts * H; ++i) {
        w[i] = mode_ == Upcycle::kCopies ? dist(gen) : 0.0f;
      }
      return t;
    }
    if (!std::regex_match(name, m, kExpert)) return dense_->tensor(name);
    const std::string layer = m[1], proj = m[3];
    const int64_t e = std::stoll(m[2]);
    STRATA_ASSIGN_OR_RETURN(Tensor d,
                            dense_->tensor("model.layers." + layer + ".mlp." + proj + ".weight"));
    if (mode_ == Upcycle::kCopies) return d;
    if (proj == "gate_proj") return d.slice_rows(e * Fe, (e + 1) * Fe);
    if (proj == "up_proj") return scaled(d.slice_rows(e * Fe, (e + 1) * Fe), kExperts);
    return column_block(d, e * Fe, (e + 1) * Fe);  // down_proj [H, F] -> [H, Fe]
  }
  std::string describe() const override { return "upcycled " + dense_->describe(); }

 private:
  Tensor owned(DType dt, std::initializer_list<int64_t> shape) const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    auto b = allocate_host(static_cast<size_t>(dtype_bytes(dt, n)));
    buffers_.push_back(std::move(b).value());
    return Tensor::make(buffers_.back().data(), dt, shape);
  }
  // Columns [c0, c1) of a row-major matrix of whole blocks, copied.
  Tensor column_block(const Tensor& t, int64_t c0, int64_t c1) const {
    Tensor out = owned(t.dtype, {t.dim(0), c1 - c0});
    const int64_t skip = dtype_bytes(t.dtype, c0), width = dtype_bytes(t.dtype, c1 - c0);
    for (int64_t r = 0; r < t.dim(0); ++r) {
      std::memcpy(
          static_cast<char*>(out.data) + r * width,
          static_cast<const char*>(t.data) + r * dtype_bytes(t.dtype, t.row_stride()) + skip,
          static_cast<size_t>(width));
    }
    return out;
  }
  // A copy of a Q4_1 matrix times s (a power of two): each block's f16 scale d and min m times s,
  // exact while they stay normal f16 values.
  Tensor scaled(const Tensor& t, float s) const {
    Tensor out = column_block(t, 0, t.dim(1));
    EXPECT_EQ(t.dtype, DType::kQ4_1) << "the upcycling test scales Q4_1 blocks";
    const int64_t blocks = t.dim(0) * t.dim(1) / 32;
    auto* p = static_cast<uint8_t*>(out.data);
    for (int64_t b = 0; b < blocks; ++b) {
      for (int half = 0; half < 2; ++half) {
        uint16_t h;
        std::memcpy(&h, p + b * 20 + half * 2, 2);
        const float v = f16_to_f32(h) * s;
        h = f32_to_f16(v);
        EXPECT_EQ(f16_to_f32(h), v) << "inexact scale in block " << b;
        std::memcpy(p + b * 20 + half * 2, &h, 2);
      }
    }
    return out;
  }

  inline static const std::regex kRouter{R"(model\.layers\.(\d+)\.mlp\.gate\.weight)"};
  inline static const std::regex kExpert{
      R"(model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight)"};
  std::shared_ptr<TensorSource> dense_;
  ModelConfig c_;
  Upcycle mode_;
  mutable std::vector<Buffer> buffers_;
};

struct Runner {
  std::unique_ptr<Communicator> comm = make_single_rank_communicator();
  std::unique_ptr<Executor> exec;
};

Result<Runner> make(const ModelConfig& config, std::shared_ptr<TensorSource> src) {
  STRATA_ASSIGN_OR_RETURN(auto model, Model::load(config, ParallelConfig{}, std::move(src)));
  Runner r;
  RunnerOptions o;
  o.act_dtype = DType::kF32;
  o.max_model_len = 256;
  o.num_kv_blocks = 32;
  o.max_num_tokens = 64;
  o.max_num_seqs = 2;
  STRATA_ASSIGN_OR_RETURN(r.exec,
                          make_runner(config, ParallelConfig{}, std::move(model), *r.comm, o));
  return r;
}

struct Output {
  std::vector<float> prompt_logits;  // [n_prompt, vocab]
  std::vector<int32_t> greedy;
};

Result<Output> run(Executor& e, const std::vector<int32_t>& prompt, int n_new) {
  const int64_t V = e.config().vocab;
  Output out;
  out.prompt_logits.resize(prompt.size() * static_cast<size_t>(V));
  SequenceKv seq;
  const ForwardFn fn = [&](const ForwardBatch& b, float* l) { return e.forward(b, l); };
  Status s = forward_sequence(fn, 256, V, e.cache(), seq, prompt, true, out.prompt_logits.data());
  std::vector<float> last(out.prompt_logits.end() - V, out.prompt_logits.end());
  for (int i = 0; s.ok() && i < n_new; ++i) {
    const int32_t next =
        static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
    out.greedy.push_back(next);
    const std::vector<int32_t> one = {next};
    s = forward_sequence(fn, 256, V, e.cache(), seq, one, false, last.data());
  }
  seq.release(e.cache());
  if (!s.ok()) return s;
  return out;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0.0, m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
    m = std::max(m, std::fabs(static_cast<double>(b[i])));
  }
  return d / m;
}

TEST(UpcycledSmolLM2, MoeOutputEqualsDense) {
  // Dense and MoE layers reach prefill with different token counts (an expert's share may fall
  // under the GEMM's 16), so both keep f32 activations: the 1e-3 bound is f32-level.
  cpu::set_quant_prefill(QuantPrefill::kF32);
  struct stat st {};
  if (::stat(model_path().c_str(), &st) != 0) GTEST_SKIP() << "no SmolLM2 GGUF at " << model_path();
  auto file = GgufFile::open(model_path());
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  auto shared = std::make_shared<const GgufFile>(std::move(file).value());
  auto dense_cfg = model_config_from_gguf(*shared);
  ASSERT_TRUE(dense_cfg.ok()) << dense_cfg.status().to_string();
  auto dense_src = make_gguf_tensor_source(shared, dense_cfg->family);
  auto dense = make(*dense_cfg, dense_src);
  ASSERT_TRUE(dense.ok()) << dense.status().to_string();

  std::ifstream in(std::string(STRATA_FIXTURE_DIR) + "/smollm2/reference.json");
  const auto ref = nlohmann::json::parse(in);
  for (Upcycle mode : {Upcycle::kCopies, Upcycle::kSliced}) {
    const char* what = mode == Upcycle::kCopies ? "copies" : "sliced";
    ModelConfig c = *dense_cfg;
    c.family = ArchFamily::kMoe;
    c.architecture = std::string("upcycled-") + what;
    c.n_experts = kExperts;
    c.n_experts_used = mode == Upcycle::kCopies ? 2 : kExperts;
    c.expert_ffn_dim = mode == Upcycle::kCopies ? c.ffn_dim : c.ffn_dim / kExperts;
    c.moe_renormalize = mode == Upcycle::kCopies;
    c.layer_is_moe.assign(static_cast<size_t>(c.n_layers), true);
    ASSERT_TRUE(c.validate(what).ok());
    auto moe = make(c, std::make_shared<UpcycledSource>(dense_src, c, mode));
    ASSERT_TRUE(moe.ok()) << moe.status().to_string();
    for (const auto& p : ref["prompts"]) {
      const std::vector<int32_t> prompt = p["ids"].get<std::vector<int32_t>>();
      auto want = run(*dense->exec, prompt, 24);
      auto got = run(*moe->exec, prompt, 24);
      ASSERT_TRUE(want.ok()) << want.status().to_string();
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      const double err = rel_err(got->prompt_logits, want->prompt_logits);
      std::printf("[ info ] %s, prompt '%s': prompt logits vs dense %.2e\n", what,
                  p["text"].get<std::string>().c_str(), err);
      EXPECT_LE(err, 1e-3) << what;
      EXPECT_EQ(got->greedy, want->greedy) << what << ": " << p["text"];
    }
  }
}

}  // namespace
}  // namespace strata
