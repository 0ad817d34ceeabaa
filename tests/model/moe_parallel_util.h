// Shared by the expert-parallel tests (tests/parallel under mpirun, tests/model in-process,
// tests/cuda on one GPU): a MoE fixture's logits and greedy continuation from one executor, and
// the ops::all_to_all_v check with uneven and empty splits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "core/status.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/model.h"
#include "ops/ops.h"
#include "parallel/comm.h"
#include "runtime/executor.h"
#include "runtime/sequence.h"

namespace strata::testing {

inline std::string moe_fixture(const std::string& name) {
  return std::string(STRATA_FIXTURE_DIR) + "/moe/" + name;
}

inline Result<ModelConfig> moe_config(const std::string& dir) {
  STRATA_ASSIGN_OR_RETURN(std::string text, read_text_file(dir + "/config.json"));
  return parse_hf_config(text, dir + "/config.json");
}

// load(par) for a fixture: the checkpoint sharded for par.
inline std::function<Result<std::unique_ptr<Model>>(const ParallelConfig&)> moe_loader(
    const std::string& dir, const ModelConfig& config) {
  return [dir, config](const ParallelConfig& par) -> Result<std::unique_ptr<Model>> {
    STRATA_ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> ckpt, Checkpoint::open(dir));
    return Model::load(config, par, ckpt);
  };
}

struct MoeRun {
  std::vector<float> logits;    // [ids, vocab] of the prompt, prefilled in chunks of 5
  std::vector<int32_t> greedy;  // argmax continuation, one token per forward pass
  std::vector<int32_t> routes;  // every sparse layer's top-k ids, pass after pass (the caller's)
};

// The prompt's logits through `exec` (prefill in chunks of 5: several forward calls of uneven
// sizes, a last one smaller than the number of ranks), then n_greedy decode steps.
inline Result<MoeRun> moe_run(Executor& exec, const std::vector<int32_t>& ids, int n_greedy) {
  const ModelConfig& config = exec.config();
  MoeRun out;
  out.logits.resize(ids.size() * static_cast<size_t>(config.vocab));
  SequenceKv seq;
  const ForwardFn fn = [&](const ForwardBatch& b, float* o) { return exec.forward(b, o); };
  STRATA_RETURN_IF_ERROR(forward_sequence(fn, config.max_position_embeddings, config.vocab,
                                          exec.cache(), seq, ids, true, out.logits.data(), 5));
  const float* last = out.logits.data() + (ids.size() - 1) * static_cast<size_t>(config.vocab);
  int32_t next = static_cast<int32_t>(std::max_element(last, last + config.vocab) - last);
  std::vector<float> row(static_cast<size_t>(config.vocab));
  for (int i = 0; i < n_greedy; ++i) {
    out.greedy.push_back(next);
    const std::vector<int32_t> one{next};
    STRATA_RETURN_IF_ERROR(forward_sequence(fn, config.max_position_embeddings, config.vocab,
                                            exec.cache(), seq, one, true, row.data(), 5));
    next = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
  }
  return out;
}

// ops::all_to_all_v over `c` on host rows of 3 floats: rank s sends (s + r) % 3 rows to rank r
// (rank 0 sends none to itself, some ranks receive nothing from some peers), and the last rank
// sends nothing at all. Returns an empty string on success, else the first failure.
inline std::string check_all_to_all_rows(Communicator& c) {
  const int me = c.rank(), n = c.size();
  const int64_t cols = 3;
  auto rows_of = [n](int s, int r) -> int64_t { return s == n - 1 ? 0 : (s + r) % 3; };
  std::vector<int64_t> send_rows(static_cast<size_t>(n)), recv_rows(static_cast<size_t>(n));
  std::vector<float> send, recv;
  for (int r = 0; r < n; ++r) {
    send_rows[static_cast<size_t>(r)] = rows_of(me, r);
    for (int64_t j = 0; j < rows_of(me, r); ++j) {
      for (int64_t i = 0; i < cols; ++i)
        send.push_back(static_cast<float>(me * 1000 + r * 10 + j) + 0.25f * i);
    }
  }
  int64_t total = 0;
  for (int s = 0; s < n; ++s) {
    recv_rows[static_cast<size_t>(s)] = rows_of(s, me);
    total += rows_of(s, me);
  }
  // One spare row each, so that no tensor is empty and nothing is written past what was asked.
  send.resize(send.size() + cols, -1.0f);
  recv.assign(static_cast<size_t>((total + 1) * cols), -7.0f);
  ops::Context ctx{Device::cpu()};
  Tensor ts =
      Tensor::make(send.data(), DType::kF32, {static_cast<int64_t>(send.size()) / cols, cols});
  Tensor tr = Tensor::make(recv.data(), DType::kF32, {total + 1, cols});
  Status st = ops::all_to_all_v(ctx, c, ts, send_rows.data(), tr, recv_rows.data());
  if (!st.ok()) return "rank " + std::to_string(me) + ": " + st.to_string();
  int64_t row = 0;
  for (int s = 0; s < n; ++s) {
    for (int64_t j = 0; j < rows_of(s, me); ++j, ++row) {
      for (int64_t i = 0; i < cols; ++i) {
        const float want = static_cast<float>(s * 1000 + me * 10 + j) + 0.25f * i;
        if (recv[static_cast<size_t>(row * cols + i)] != want) {
          return "rank " + std::to_string(me) + ": row " + std::to_string(row) + " from rank " +
                 std::to_string(s) + " is wrong";
        }
      }
    }
  }
  for (int64_t i = 0; i < cols; ++i) {
    if (recv[static_cast<size_t>(total * cols + i)] != -7.0f) {
      return "rank " + std::to_string(me) + ": wrote past the received rows";
    }
  }
  return "";
}

}  // namespace strata::testing
