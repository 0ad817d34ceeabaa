// Tensor parallelism with ranks as threads of one process (make_in_process_tp_executor), on the
// CPU: TP = 2, 3, 4 against TP = 1 on the fixtures, for the f32 reference (within 1e-5 relative,
// as the MPI test) and for the device layout on the bf16 twins (the GPU path's arithmetic;
// within a bf16 tolerance). Covers column / row sharding, replicated KV heads (mistral and qwen2:
// one KV head; gemma3 at TP 4: two), vocab-parallel embedding and LM head with padding (vocab
// 431), biases added once after the all-reduce (gpt2, neox, qwen2) and NeoX's parallel block.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/mapped_file.h"
#include "fixture_util.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/model.h"
#include "runtime/executor.h"
#include "runtime/sequence.h"

namespace strata {
namespace {

Result<std::vector<float>> tp_logits(const std::string& dir, int tp, DType act,
                                     const std::vector<int32_t>& ids) {
  STRATA_ASSIGN_OR_RETURN(std::string text, read_text_file(dir + "/config.json"));
  STRATA_ASSIGN_OR_RETURN(ModelConfig config, parse_hf_config(text, dir + "/config.json"));
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> ckpt, Checkpoint::open(dir));
  std::shared_ptr<TensorSource> src = ckpt;
  RunnerOptions o;
  o.act_dtype = act;
  o.max_model_len = 64;
  o.num_kv_blocks = 8;
  o.block_size = 4;
  o.max_num_tokens = 64;
  o.max_num_seqs = 4;
  auto load = [&](const ParallelConfig& par) { return Model::load(config, par, src); };
  STRATA_ASSIGN_OR_RETURN(auto exec, make_in_process_tp_executor(config, load, tp, o));
  std::vector<float> logits(ids.size() * static_cast<size_t>(config.vocab));
  SequenceKv seq;
  const ForwardFn fn = [&](const ForwardBatch& b, float* out) { return exec->forward(b, out); };
  // Chunks of 5: prefill over several calls and KV blocks, then the continuation.
  STRATA_RETURN_IF_ERROR(
      forward_sequence(fn, 64, config.vocab, exec->cache(), seq, ids, true, logits.data(), 5));
  return logits;
}

struct Case {
  const char* model;
  int tp;
};

class TpInProcess : public ::testing::TestWithParam<Case> {};

TEST_P(TpInProcess, MatchesOneRank) {
  const Case& c = GetParam();
  const std::string dir = testing::fixture_model(c.model);
  auto ref = testing::load_reference(dir);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  const std::vector<int32_t>& ids = ref->inputs[1];
  for (DType act : {DType::kF32, DType::kBF16}) {
    auto one = tp_logits(dir, 1, act, ids);
    ASSERT_TRUE(one.ok()) << one.status().to_string();
    auto many = tp_logits(dir, c.tp, act, ids);
    ASSERT_TRUE(many.ok()) << many.status().to_string();
    const double err = testing::relative_error(*many, *one);
    std::printf("[ info ] %s TP=%d %s: %.2e of max|logit| from TP=1\n", c.model, c.tp,
                act == DType::kF32 ? "f32" : "bf16 twins", err);
    EXPECT_LE(err, act == DType::kF32 ? 1e-5 : 2e-2) << c.model << " TP " << c.tp;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TpInProcess,
                         ::testing::Values(Case{"llama", 2}, Case{"llama", 4}, Case{"mistral", 2},
                                           Case{"qwen2", 3}, Case{"gpt2", 4}, Case{"neox", 2},
                                           Case{"neox_seq", 4}, Case{"gemma3", 4}),
                         [](const auto& info) {
                           return std::string(info.param.model) + "_tp" +
                                  std::to_string(info.param.tp);
                         });

}  // namespace
}  // namespace strata
