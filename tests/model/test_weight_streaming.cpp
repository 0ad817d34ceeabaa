// Weight streaming (ZeRO-Inference, issue 13) on the CPU: the device layout's bf16 twins with
// some or all layers streamed into two (or three) slots — from host memory, or read from the
// checkpoint file on every pass — give logits bit-identical to the same model with every layer
// resident (the independent reference: the same kernels over weights that never move). A slot
// overwritten too early, a layer read from the wrong slot, or a blob packed differently from the
// upload would change them. Also: the plan's arithmetic and its one-line errors.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "core/mapped_file.h"
#include "fixture_util.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/residency.h"
#include "parallel/comm.h"
#include "runtime/executor.h"
#include "runtime/sequence.h"

namespace strata {
namespace {

struct Runner {
  std::unique_ptr<Communicator> comm = make_single_rank_communicator();
  std::unique_ptr<Executor> exec;
};

Result<ModelConfig> fixture_config(const std::string& dir) {
  STRATA_ASSIGN_OR_RETURN(std::string text, read_text_file(dir + "/config.json"));
  return parse_hf_config(text, dir + "/config.json");
}

Result<Runner> make(const std::string& dir, const ResidencyOptions& res, DType act = DType::kBF16) {
  STRATA_ASSIGN_OR_RETURN(ModelConfig config, fixture_config(dir));
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> ckpt, Checkpoint::open(dir));
  STRATA_ASSIGN_OR_RETURN(auto model, Model::load(config, ParallelConfig{}, ckpt));
  Runner r;
  RunnerOptions o;
  o.act_dtype = act;
  o.max_model_len = 128;
  o.num_kv_blocks = 32;
  o.max_num_tokens = 64;
  o.max_num_seqs = 8;
  o.residency = res;
  STRATA_ASSIGN_OR_RETURN(r.exec,
                          make_runner(config, ParallelConfig{}, std::move(model), *r.comm, o));
  return r;
}

Result<std::vector<float>> score(Executor& e, const std::vector<int32_t>& ids) {
  const int64_t V = e.config().vocab;
  std::vector<float> logits(ids.size() * static_cast<size_t>(V));
  SequenceKv seq;
  const ForwardFn fn = [&](const ForwardBatch& b, float* out) { return e.forward(b, out); };
  // Chunks of 5: several forward passes (prefill over cached blocks), then decode-sized ones.
  Status s = forward_sequence(fn, 128, V, e.cache(), seq, ids, true, logits.data(), 5);
  seq.release(e.cache());
  if (!s.ok()) return s;
  return logits;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A budget that keeps `resident` layers next to the non-layer weights and `slots` slots.
int64_t budget_for(const ModelConfig& c, int64_t resident, int slots = 2) {
  return device_nonlayer_bytes(c, ParallelConfig{}, DType::kBF16) +
         (slots + resident) * device_layer_bytes(c, ParallelConfig{}, DType::kBF16);
}

class WeightStreaming : public ::testing::TestWithParam<const char*> {};

// Host tier: every layer streamed, one layer resident, all but one resident; prefetch on and off;
// two and three slots.
TEST_P(WeightStreaming, HostTierLogitsEqualResident) {
  const std::string dir = testing::fixture_model(GetParam());
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " not present";
  auto ref = testing::load_reference(dir);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  auto config = fixture_config(dir);
  ASSERT_TRUE(config.ok());
  const int64_t L = config->n_layers;
  auto resident = make(dir, ResidencyOptions{});
  ASSERT_TRUE(resident.ok()) << resident.status().to_string();
  std::vector<std::vector<float>> want;
  for (const auto& ids : ref->inputs) {
    auto l = score(*resident->exec, ids);
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    want.push_back(*l);
  }
  struct Case {
    int64_t budget;  // 0: --offload-weights cpu, every layer streamed
    int slots;
    int64_t resident;
    int64_t max_resident;  // -1: as the budget says
  };
  // The smallest budget (non-layer weights and two slots: every layer streamed), no budget, two
  // and three slots, and resident layers before streamed ones (one resident; all but one).
  constexpr int64_t kLarge = int64_t{1} << 40;
  std::vector<Case> cases = {{budget_for(*config, 0), 2, 0, -1},
                             {0, 2, 0, -1},
                             {0, 3, 0, -1},
                             {kLarge, 2, 1, 1},
                             {kLarge, 2, L - 1, L - 1}};
  for (const Case& c : cases) {
    // Two-layer models fit the smallest budget (two slots are the whole model).
    if (c.budget > 0 && c.budget < kLarge && L <= 2) continue;
    for (bool prefetch : {true, false}) {
      ResidencyOptions o;
      o.offload = WeightOffload::kCpu;
      o.gpu_weight_budget = c.budget;
      o.n_slots = c.slots;
      o.max_resident_layers = c.max_resident;
      o.prefetch = prefetch;
      auto s = make(dir, o);
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      const ResidencyPlan* plan = s->exec->residency_plan();
      ASSERT_NE(plan, nullptr);
      EXPECT_EQ(plan->n_resident, c.resident) << GetParam() << " budget " << c.budget;
      EXPECT_EQ(plan->n_streamed, L - c.resident);
      for (size_t i = 0; i < ref->inputs.size(); ++i) {
        auto got = score(*s->exec, ref->inputs[i]);
        ASSERT_TRUE(got.ok()) << got.status().to_string();
        EXPECT_TRUE(bit_equal(*got, want[i]))
            << GetParam() << ": streamed logits differ from resident (budget " << c.budget << ", "
            << c.slots << " slots, prefetch " << prefetch << ", sequence " << i << ", max err "
            << testing::relative_error(*got, want[i]) << ")";
      }
      StreamStats st;
      ASSERT_TRUE(s->exec->stream_stats(&st));
      EXPECT_GT(st.passes, 1);
      // Every pass copies every streamed layer once (prefetch may run ahead by the slots).
      EXPECT_GE(st.layers, st.passes * plan->n_streamed);
      EXPECT_LE(st.layers, st.passes * plan->n_streamed + c.slots);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, WeightStreaming,
                         ::testing::Values("llama", "llama_bf16", "qwen2", "gpt2", "neox",
                                           "gemma3"));

// Disk tier: the layers read from the checkpoint's own files (O_DIRECT where the file system
// takes it) and packed on the host on every pass; f32 and bf16 checkpoints, one file and two
// shards.
TEST(WeightStreamingDisk, LogitsEqualResident) {
  for (const char* name : {"llama", "llama_bf16", "llama_sharded", "qwen2", "gemma3"}) {
    const std::string dir = testing::fixture_model(name);
    auto ref = testing::load_reference(dir);
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();
    auto config = fixture_config(dir);
    ASSERT_TRUE(config.ok());
    auto resident = make(dir, ResidencyOptions{});
    ASSERT_TRUE(resident.ok()) << resident.status().to_string();
    auto want = score(*resident->exec, ref->inputs[0]);
    ASSERT_TRUE(want.ok());
    for (int64_t keep : {int64_t{0}, int64_t{1}}) {
      for (bool prefetch : {true, false}) {
        ResidencyOptions o;
        o.offload = WeightOffload::kDisk;
        o.gpu_weight_budget = keep == 0 ? 0 : int64_t{1} << 40;
        o.max_resident_layers = keep == 0 ? -1 : keep;
        o.prefetch = prefetch;
        auto s = make(dir, o);
        ASSERT_TRUE(s.ok()) << name << ": " << s.status().to_string();
        ASSERT_EQ(s->exec->residency_plan()->n_resident, keep);
        auto got = score(*s->exec, ref->inputs[0]);
        ASSERT_TRUE(got.ok()) << got.status().to_string();
        EXPECT_TRUE(bit_equal(*got, *want))
            << name << ": disk-streamed logits differ from resident (" << keep
            << " resident, prefetch " << prefetch << ", max err "
            << testing::relative_error(*got, *want) << ")";
        StreamStats st;
        ASSERT_TRUE(s->exec->stream_stats(&st));
        // Every streamed layer was read from the file at least once per pass.
        const int64_t streamed = config->n_layers - keep;
        EXPECT_GE(st.layers, st.passes * streamed);
        EXPECT_GT(st.disk_bytes, 0);
        std::printf("[ info ] %s disk tier: %lld passes, %lld bytes read (%s)\n", name,
                    static_cast<long long>(st.passes), static_cast<long long>(st.disk_bytes),
                    st.direct_io ? "O_DIRECT" : "page cache");
      }
    }
  }
}

TEST(WeightStreamingPlan, DescribesEveryLayer) {
  auto c = model_config_preset("llama3-8b");  // 32 layers: budgets between the extremes
  ASSERT_TRUE(c.ok());
  ResidencyOptions o;
  o.gpu_weight_budget = budget_for(*c, 1);
  auto p = plan_residency(*c, ParallelConfig{}, DType::kBF16, o);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->n_resident, 1);
  EXPECT_EQ(p->n_slots, 2);
  EXPECT_EQ(p->tier[0], LayerTier::kResident);
  EXPECT_EQ(p->tier[1], LayerTier::kHost);
  EXPECT_EQ(p->device_bytes(), o.gpu_weight_budget);
  const auto lines = p->describe();
  ASSERT_GE(lines.size(), 4u);
  EXPECT_NE(lines[2].find("layer 0: resident"), std::string::npos) << lines[2];
  EXPECT_NE(lines[3].find("layers 1-31: host"), std::string::npos) << lines[3];
  // Two more layers' bytes: two more resident layers.
  o.gpu_weight_budget = budget_for(*c, 3);
  auto three = plan_residency(*c, ParallelConfig{}, DType::kBF16, o);
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(three->n_resident, 3);
  EXPECT_EQ(three->streamed_bytes_per_pass(), 29 * three->layer_bytes);
  // A budget the whole model fits: every layer resident, no slots.
  o.gpu_weight_budget = p->all_resident_bytes;
  auto all = plan_residency(*c, ParallelConfig{}, DType::kBF16, o);
  ASSERT_TRUE(all.ok());
  EXPECT_FALSE(all->streaming());
  EXPECT_EQ(all->n_slots, 0);
  // int8 layers stream about half the bytes of bf16 ones.
  const int64_t b16 = device_layer_bytes(*c, ParallelConfig{}, DType::kBF16);
  const int64_t b8 = device_layer_bytes(*c, ParallelConfig{}, DType::kI8);
  EXPECT_LT(b8, b16 * 6 / 10);
}

TEST(WeightStreamingPlan, ClearErrors) {
  auto c = model_config_preset("llama3-8b");
  ASSERT_TRUE(c.ok());
  // A budget below the non-layer weights and two slots: the numbers in one line.
  ResidencyOptions o;
  o.gpu_weight_budget = budget_for(*c, 0) - 1;
  auto p = plan_residency(*c, ParallelConfig{}, DType::kBF16, o);
  ASSERT_FALSE(p.ok());
  const std::string m = p.status().message();
  EXPECT_NE(m.find("--gpu-weight-budget"), std::string::npos) << m;
  EXPECT_NE(m.find("streaming slots"), std::string::npos) << m;
  EXPECT_NE(m.find("GiB at least"), std::string::npos) << m;
  EXPECT_NE(m.find("all 32 layers resident: 14.96 GiB"), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  // A device too small for the model even streamed.
  o.gpu_weight_budget = budget_for(*c, 1);
  auto q = plan_residency(*c, ParallelConfig{}, DType::kBF16, o, /*device_free=*/1000, "tiny GPU");
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("cannot run even streamed on tiny GPU"), std::string::npos)
      << q.status().message();
  // One slot is not streaming.
  o.n_slots = 1;
  EXPECT_FALSE(plan_residency(*c, ParallelConfig{}, DType::kBF16, o).ok());
  // Tensor parallelism is not built with streaming.
  o.n_slots = 2;
  ParallelConfig tp;
  tp.tp_size = 2;
  auto t = plan_residency(*c, tp, DType::kBF16, o);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kUnimplemented);
}

TEST(WeightStreamingPlan, RunnerErrors) {
  const std::string dir = testing::fixture_model("llama");
  ResidencyOptions o;
  o.offload = WeightOffload::kCpu;
  // The f32 reference runs the weights as stored: nothing to stream.
  auto f32 = make(dir, o, DType::kF32);
  ASSERT_FALSE(f32.ok());
  EXPECT_NE(f32.status().message().find("--offload-weights"), std::string::npos);
  // A budget too small, through the runner.
  auto c = fixture_config(dir);
  ASSERT_TRUE(c.ok());
  o.gpu_weight_budget = 1000;
  auto small = make(dir, o);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("too small"), std::string::npos)
      << small.status().message();
  // The disk tier needs a checkpoint file: not random weights.
  Runner r;
  RunnerOptions ro;
  ro.act_dtype = DType::kBF16;
  ro.max_model_len = 64;
  ro.num_kv_blocks = 8;
  ro.max_num_tokens = 16;
  ro.max_num_seqs = 2;
  ro.residency.offload = WeightOffload::kDisk;
  auto dummy = make_runner(*c, ParallelConfig{}, nullptr, *r.comm, ro);
  ASSERT_FALSE(dummy.ok());
  EXPECT_NE(dummy.status().message().find("checkpoint file"), std::string::npos)
      << dummy.status().message();
}

// GPT-2 stores its linear weights transposed (Conv1D): the model reads copies made at load, so
// the disk tier cannot read them in place, and says so.
TEST(WeightStreamingDisk, RelaidOutTensorsAreRefused) {
  ResidencyOptions o;
  o.offload = WeightOffload::kDisk;
  auto s = make(testing::fixture_model("gpt2"), o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--offload-weights cpu"), std::string::npos)
      << s.status().message();
}

// Random weights (--load-format dummy, as the benchmark's shape presets use) stream from host
// memory too: the blob is copied down from the device layout, so quantized layers work.
TEST(WeightStreamingPlan, RandomWeightsStream) {
  auto c = fixture_config(testing::fixture_model("llama"));
  ASSERT_TRUE(c.ok());
  std::vector<int32_t> ids = {1, 5, 9, 13, 17, 21, 25, 29};
  std::vector<std::vector<float>> out;
  for (bool stream : {false, true}) {
    Runner r;
    RunnerOptions ro;
    ro.act_dtype = DType::kBF16;
    ro.max_model_len = 64;
    ro.num_kv_blocks = 8;
    ro.max_num_tokens = 16;
    ro.max_num_seqs = 2;
    ro.seed = 7;
    if (stream) ro.residency.offload = WeightOffload::kCpu;
    auto e = make_runner(*c, ParallelConfig{}, nullptr, *r.comm, ro);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    auto l = score(**e, ids);
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    out.push_back(*l);
  }
  EXPECT_TRUE(bit_equal(out[0], out[1]));
}

}  // namespace
}  // namespace strata
