// What the CUDA tests of in-process ranks share (test_tp_cuda.cpp, test_layouts_cuda.cpp): eager
// kernel loading, the GPU check, running a function on n rank threads, the multi-rank run of a
// fixture model and its comparison with one rank.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../model/fixture_util.h"
#include "backends/cuda/cuda_device.h"
#include "core/mapped_file.h"
#include "core/status.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/model.h"
#include "runtime/executor.h"
#include "runtime/pipeline_schedule.h"
#include "runtime/sequence.h"

namespace strata::cuda_test {

// Ranks that share one GPU need kernels loaded eagerly (tp_executor.cpp says why); CUDA reads
// this when it starts, which in these binaries is after static initialization.
[[maybe_unused]] inline const bool kEagerLoading = [] {
  return setenv("CUDA_MODULE_LOADING", "EAGER", 0) == 0;
}();

inline bool have_gpu() {
  return cuda::cuda_device_count() > 0;
}

#define REQUIRE_GPU() \
  if (!::strata::cuda_test::have_gpu()) GTEST_SKIP() << "needs a CUDA device"

// Runs f(rank) on n threads and returns the first error message ("" when all succeed).
inline std::string on_ranks(int n, const std::function<Status(int)>& f) {
  std::vector<Status> st(static_cast<size_t>(n));
  std::vector<std::thread> t;
  for (int r = 0; r < n; ++r) t.emplace_back([&, r] { st[static_cast<size_t>(r)] = f(r); });
  for (auto& x : t) x.join();
  for (const Status& s : st) {
    if (!s.ok()) return s.to_string();
  }
  return "";
}

// The fixture at `dir` with tp ranks as threads on GPU 0, or (pp > 1) pp pipeline stages of tp
// ranks each; `o` gives the runner options (device and layouts included).
inline Result<std::unique_ptr<Executor>> cuda_tp_executor(const std::string& dir, int tp,
                                                          const RunnerOptions& o, int pp = 1) {
  STRATA_ASSIGN_OR_RETURN(std::string text, read_text_file(dir + "/config.json"));
  STRATA_ASSIGN_OR_RETURN(ModelConfig config, parse_hf_config(text, dir + "/config.json"));
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> ckpt, Checkpoint::open(dir));
  std::shared_ptr<TensorSource> src = ckpt;
  auto load = [config, src](const ParallelConfig& par) { return Model::load(config, par, src); };
  if (pp > 1) {
    STRATA_ASSIGN_OR_RETURN(std::vector<int64_t> bounds, pipeline_bounds(config.n_layers, pp, {}));
    return make_in_process_pp_executor(config, load, bounds, o, tp);
  }
  return make_in_process_tp_executor(config, load, tp, o);
}

// A prefill of the fixture's prompt, then greedy decode steps (forward_argmax: graph replays,
// except with batch-sharded attention, which runs eagerly), with tp ranks, or (pp > 1) pp
// pipeline stages, on GPU 0, the FFN in `layout`, attention in `attn`.
inline Result<std::vector<float>> cuda_tp_logits(const std::string& dir, int tp,
                                                 const std::vector<int32_t>& prompt, int n_decode,
                                                 std::vector<int32_t>* greedy, int64_t* replays,
                                                 int pp = 1, FfnLayout layout = FfnLayout::k1D,
                                                 AttnLayout attn = AttnLayout::kHeadSharded,
                                                 int64_t gather = 0) {
  RunnerOptions o;
  o.device = Device::cuda(0);
  o.act_dtype = DType::kBF16;
  o.max_model_len = 128;
  o.num_kv_blocks = 16;
  o.max_num_tokens = 64;
  o.max_num_seqs = 4;
  o.cuda_graphs = true;
  o.ffn_layout = layout;
  o.attn_layout = attn;
  o.ffn_gather_min_tokens = gather;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Executor> exec, cuda_tp_executor(dir, tp, o, pp));
  const int64_t V = exec->config().vocab;
  std::vector<float> logits(prompt.size() * static_cast<size_t>(V));
  SequenceKv seq;
  const ForwardFn fn = [&](const ForwardBatch& b, float* out) { return exec->forward(b, out); };
  STRATA_RETURN_IF_ERROR(
      forward_sequence(fn, 128, V, exec->cache(), seq, prompt, true, logits.data(), 16));
  // Greedy decode through forward_argmax (graph replays where the runner captures graphs).
  int32_t tok =
      static_cast<int32_t>(std::max_element(logits.end() - V, logits.end()) - (logits.end() - V));
  for (int i = 0; i < n_decode; ++i) {
    greedy->push_back(tok);
    STRATA_RETURN_IF_ERROR(seq.reserve(exec->cache(), seq.length + 1));
    const std::vector<int32_t> t{tok}, s{0}, p{static_cast<int32_t>(seq.length)}, rows{0};
    ForwardBatch b;
    b.tokens = t;
    b.token_seq = s;
    b.token_pos = p;
    b.block_tables = seq.block_table.data();
    b.max_blocks_per_seq = static_cast<int64_t>(seq.block_table.size());
    b.logit_rows = rows;
    STRATA_RETURN_IF_ERROR(exec->forward_argmax(b, &tok));
    seq.length += 1;
  }
  *replays = exec->graph_replays();
  return logits;
}

// The fixture's second reference prompt (a prefill, then n_decode greedy steps) through one rank
// and through tp ranks x pp stages in the given layouts: how far the many-rank logits are from
// one rank's (testing::relative_error), both runs' greedy tokens, the many-rank run's graph
// replays.
struct AgainstOneRank {
  double err = 0;
  std::vector<int32_t> one_ids, many_ids;
  int64_t replays = 0;
};

inline Result<AgainstOneRank> against_one_rank(const std::string& dir, int tp, int n_decode,
                                               int pp = 1, FfnLayout layout = FfnLayout::k1D,
                                               AttnLayout attn = AttnLayout::kHeadSharded,
                                               int64_t gather = 0) {
  STRATA_ASSIGN_OR_RETURN(testing::Reference ref, testing::load_reference(dir));
  AgainstOneRank r;
  int64_t one_replays = 0;
  STRATA_ASSIGN_OR_RETURN(std::vector<float> one, cuda_tp_logits(dir, 1, ref.inputs[1], n_decode,
                                                                 &r.one_ids, &one_replays));
  STRATA_ASSIGN_OR_RETURN(std::vector<float> many,
                          cuda_tp_logits(dir, tp, ref.inputs[1], n_decode, &r.many_ids, &r.replays,
                                         pp, layout, attn, gather));
  r.err = testing::relative_error(many, one);
  return r;
}

}  // namespace strata::cuda_test
