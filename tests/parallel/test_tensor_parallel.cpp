// Tensor parallelism on the CPU under mpirun: the logits of TP=N (this run's world size) must
// equal the single-rank logits, computed in the same process, within 1e-5 relative.
#include <gtest/gtest.h>

#include "../model/fixture_util.h"
#include "core/mapped_file.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/model.h"
#include "parallel/comm.h"
#include "runtime/executor.h"
#include "runtime/sequence.h"

namespace strata {

Communicator* g_comm = nullptr;  // every test of this binary runs on all ranks of the mpirun

namespace {

Result<std::vector<float>> logits_for(const std::string& dir, const ParallelConfig& par,
                                      Communicator& comm, const std::vector<int32_t>& ids) {
  STRATA_ASSIGN_OR_RETURN(std::string text, read_text_file(dir + "/config.json"));
  STRATA_ASSIGN_OR_RETURN(ModelConfig config, parse_hf_config(text, dir + "/config.json"));
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> ckpt, Checkpoint::open(dir));
  STRATA_ASSIGN_OR_RETURN(auto model, Model::load(config, par, ckpt));
  RunnerOptions ro;  // the CPU reference: f32 activations, the weights as stored
  ro.block_size = 4;
  ro.num_kv_blocks = 8;
  STRATA_ASSIGN_OR_RETURN(auto exec, make_runner(config, par, std::move(model), comm, ro));
  std::vector<float> logits(ids.size() * static_cast<size_t>(config.vocab));
  SequenceKv seq;
  // Chunk of 5 so prefill spans several forward calls and KV blocks.
  const ForwardFn fn = [&](const ForwardBatch& b, float* out) { return exec->forward(b, out); };
  STRATA_RETURN_IF_ERROR(forward_sequence(fn, config.max_position_embeddings, config.vocab,
                                          exec->cache(), seq, ids, true, logits.data(), 5));
  return logits;
}

class TensorParallel : public ::testing::TestWithParam<const char*> {};

TEST_P(TensorParallel, MatchesSingleRank) {
  const std::string dir = testing::fixture_model(GetParam());
  auto ref = testing::load_reference(dir);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  auto single = make_single_rank_communicator();
  ParallelConfig one;
  ParallelConfig tp;
  tp.tp_size = g_comm->size();
  tp.tp_rank = g_comm->rank();
  for (const auto& ids : ref->inputs) {
    auto a = logits_for(dir, one, *single, ids);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    auto b = logits_for(dir, tp, *g_comm, ids);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_LE(testing::relative_error(*b, *a), 1e-5) << GetParam() << " rank " << tp.tp_rank;
  }
}

// Fixtures whose heads and ffn split over 2 and 4 ranks (llama: 2 KV heads, replicated at 4).
INSTANTIATE_TEST_SUITE_P(Fixtures, TensorParallel,
                         ::testing::Values("llama", "llama_bf16", "gpt2", "neox", "neox_seq",
                                           "gemma3"));

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto comm = strata::make_mpi_communicator();
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().to_string().c_str());
    return 1;
  }
  strata::g_comm = comm->get();
  // Only rank 0 prints results; every rank runs every test (collectives need all ranks).
  if ((*comm)->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  // Any rank's failure fails the run.
  float f = static_cast<float>(rc != 0);
  (void)(*comm)->all_reduce_sum(&f, 1);
  return f > 0 ? 1 : 0;
}
