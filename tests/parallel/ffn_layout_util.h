// Shared by the FFN-layout tests under mpirun (test_ffn_layouts.cpp) and in one process
// (tests/model/test_ffn_layouts_inproc.cpp): a prompt's logits (prefill in chunks of 5 tokens,
// so a step's token count is rarely a multiple of the ranks) followed by greedy decode steps,
// each step's logits kept.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "core/status.h"
#include "model/config.h"
#include "runtime/executor.h"
#include "runtime/sequence.h"

namespace strata::testing {

struct LayoutRun {
  std::vector<float> logits;  // prompt positions, then one row per decode step
  std::vector<int32_t> ids;   // the greedy continuation
};

// `exec` over `prompt`, then `steps` greedy decode steps (argmax of each step's logits on the
// host: every rank holds the full logits, so every rank picks the same token).
inline Result<LayoutRun> run_layout(Executor& exec, const std::vector<int32_t>& prompt, int steps) {
  const int64_t V = exec.config().vocab;
  LayoutRun out;
  out.logits.resize(prompt.size() * static_cast<size_t>(V));
  SequenceKv seq;
  const ForwardFn fn = [&](const ForwardBatch& b, float* l) { return exec.forward(b, l); };
  STRATA_RETURN_IF_ERROR(forward_sequence(fn, exec.max_model_len(), V, exec.cache(), seq, prompt,
                                          true, out.logits.data(), 5));
  const float* last = out.logits.data() + (prompt.size() - 1) * static_cast<size_t>(V);
  auto next = static_cast<int32_t>(std::max_element(last, last + V) - last);
  std::vector<float> row(static_cast<size_t>(V));
  for (int s = 0; s < steps; ++s) {
    out.ids.push_back(next);
    const int32_t tok[1] = {next};
    STRATA_RETURN_IF_ERROR(
        forward_sequence(fn, exec.max_model_len(), V, exec.cache(), seq, tok, false, row.data()));
    out.logits.insert(out.logits.end(), row.begin(), row.end());
    next = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
  }
  return out;
}

inline RunnerOptions layout_runner_options() {
  RunnerOptions ro;  // the CPU reference: f32 activations, the weights as stored
  ro.block_size = 4;
  ro.num_kv_blocks = 16;
  ro.max_model_len = 64;
  ro.max_num_tokens = 64;
  ro.max_num_seqs = 4;
  return ro;
}

inline const std::vector<int32_t>& layout_prompt() {
  static const std::vector<int32_t> p = {1, 17, 33, 80, 5, 9, 120, 44, 3, 61, 7, 250, 19};
  return p;
}

// The llama fixture's weights read as 8 query heads and 4 KV heads of head_dim 8 (the same
// matrices: q [64, 64], k / v [32, 64]) so that 8 ranks can shard the heads: config.json
// rewritten, model.safetensors linked. Written under `dir`.
inline Status write_wide_llama(const std::string& fixture, const std::string& dir) {
  STRATA_ASSIGN_OR_RETURN(std::string cfg, read_text_file(fixture + "/config.json"));
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"head_dim\": 16", "\"head_dim\": 8"},
           {"\"num_attention_heads\": 4", "\"num_attention_heads\": 8"},
           {"\"num_key_value_heads\": 2", "\"num_key_value_heads\": 4"}}) {
    const size_t at = cfg.find(from);
    if (at == std::string::npos) {
      return errorf(StatusCode::kNotFound, "{}/config.json has no {}", fixture, from);
    }
    cfg.replace(at, from.size(), to);
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  {
    std::ofstream f(dir + "/config.json");
    f << cfg;
    if (!f) return errorf(StatusCode::kInternal, "cannot write {}/config.json", dir);
  }
  std::filesystem::remove(dir + "/model.safetensors", ec);
  std::filesystem::create_symlink(fixture + "/model.safetensors", dir + "/model.safetensors", ec);
  if (ec) return errorf(StatusCode::kInternal, "cannot link {}: {}", dir, ec.message());
  return ok_status();
}

}  // namespace strata::testing
