// Shared by the FFN-layout tests under mpirun (test_ffn_layouts.cpp) and in one process
// (tests/model/test_ffn_layouts_inproc.cpp): a prompt's logits (prefill in chunks of 5 tokens,
// so a step's token count is rarely a multiple of the ranks) followed by greedy decode steps,
// each step's logits kept.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
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

// Several sequences at once (the attention layouts): prompts[s] as one prefill step of every
// sequence (runs of different lengths), then `steps` greedy decode steps of one token per
// sequence, sequence 0 sitting out the odd steps. logits: each sequence's last prompt row, then
// each step's rows. Each sequence's first block is taken before any other (batch-sharded
// attention: each on the rank with the most free blocks, so the sequences spread over the ranks).
// `inspect` (if set) sees the sequences before their blocks are released. With swap_step >= 0,
// every sequence is swapped out before that decode step (its blocks copied to host slots and
// released) and back in under new blocks of the same owner (KvPoolConfig::n_owners), the new
// first block differing from the old one.
inline Result<LayoutRun> run_batch_layout(
    Executor& exec, const std::vector<std::vector<int32_t>>& prompts, int steps,
    const std::function<void(const std::vector<SequenceKv>&)>& inspect = {}, int swap_step = -1) {
  const int64_t V = exec.config().vocab;
  const auto S = static_cast<int64_t>(prompts.size());
  KvPool& pool = exec.cache();
  std::vector<SequenceKv> seqs(static_cast<size_t>(S));
  for (SequenceKv& q : seqs) STRATA_RETURN_IF_ERROR(q.reserve(pool, 1));
  int64_t mb = 0;
  for (int64_t s = 0; s < S; ++s) {
    SequenceKv& q = seqs[static_cast<size_t>(s)];
    STRATA_RETURN_IF_ERROR(
        q.reserve(pool, static_cast<int64_t>(prompts[static_cast<size_t>(s)].size()) + steps));
    mb = std::max<int64_t>(mb, static_cast<int64_t>(q.block_table.size()));
  }
  std::vector<int32_t> tables(static_cast<size_t>(S * mb), 0);
  for (int64_t s = 0; s < S; ++s) {
    const auto& t = seqs[static_cast<size_t>(s)].block_table;
    std::copy(t.begin(), t.end(), tables.begin() + s * mb);
  }
  LayoutRun out;
  std::vector<int32_t> next(static_cast<size_t>(S));
  for (int step = -1; step < steps; ++step) {
    for (int64_t s = 0; step == swap_step && s < S; ++s) {
      std::vector<int32_t>& t = seqs[static_cast<size_t>(s)].block_table;
      const size_t bb = exec.block_bytes();
      std::vector<std::vector<char>> host(t.size(), std::vector<char>(bb));
      for (size_t i = 0; i < t.size(); ++i) {
        STRATA_RETURN_IF_ERROR(exec.copy_block_to_host(t[i], host[i].data()));
      }
      const int32_t old_first = t[0];
      const int owner = pool.blocks().owner_of(old_first);
      for (int32_t b : t) pool.blocks().release(b);
      std::vector<int32_t> spacers;
      int32_t first = pool.blocks().allocate(owner);
      while (first == old_first) {
        spacers.push_back(first);
        first = pool.blocks().allocate(owner);
      }
      if (first < 0) return Status(StatusCode::kOutOfMemory, "swap test: no block");
      const size_t n_blocks = t.size();
      t.assign(1, first);
      while (t.size() < n_blocks) {
        t.push_back(pool.blocks().allocate(owner));
        if (t.back() < 0) return Status(StatusCode::kOutOfMemory, "swap test: no block");
      }
      for (int32_t b : spacers) pool.blocks().release(b);
      for (size_t i = 0; i < t.size(); ++i) {
        STRATA_RETURN_IF_ERROR(exec.copy_block_from_host(t[i], host[i].data()));
      }
      std::copy(t.begin(), t.end(), tables.begin() + s * mb);
    }
    std::vector<int32_t> tokens, seq_ids, pos, rows;
    for (int64_t s = 0; s < S; ++s) {
      if (step >= 0 && s == 0 && S > 1 && step % 2 == 1) continue;
      SequenceKv& q = seqs[static_cast<size_t>(s)];
      std::vector<int32_t> add;
      if (step < 0) {
        add = prompts[static_cast<size_t>(s)];
      } else {
        add = {next[static_cast<size_t>(s)]};
        out.ids.push_back(add[0]);
      }
      for (int32_t t : add) {
        tokens.push_back(t);
        seq_ids.push_back(static_cast<int32_t>(s));
        pos.push_back(static_cast<int32_t>(q.length++));
      }
      rows.push_back(static_cast<int32_t>(tokens.size() - 1));
    }
    ForwardBatch b;
    b.tokens = tokens;
    b.token_seq = seq_ids;
    b.token_pos = pos;
    b.block_tables = tables.data();
    b.max_blocks_per_seq = mb;
    b.n_seqs = S;
    b.logit_rows = rows;
    std::vector<float> l(rows.size() * static_cast<size_t>(V));
    STRATA_RETURN_IF_ERROR(exec.forward(b, l.data()));
    out.logits.insert(out.logits.end(), l.begin(), l.end());
    size_t r = 0;
    for (int64_t s = 0; s < S; ++s) {
      if (step >= 0 && s == 0 && S > 1 && step % 2 == 1) continue;
      const float* row = l.data() + r++ * static_cast<size_t>(V);
      next[static_cast<size_t>(s)] = static_cast<int32_t>(std::max_element(row, row + V) - row);
    }
  }
  if (inspect) inspect(seqs);
  for (SequenceKv& q : seqs) q.release(pool);
  return out;
}

// Prompts of different lengths for run_batch_layout: the first `n` of 3, 9, 5, 13, 1, 11, 7
// tokens.
inline std::vector<std::vector<int32_t>> batch_prompts(int n) {
  static const int kLen[] = {3, 9, 5, 13, 1, 11, 7};
  std::vector<std::vector<int32_t>> out;
  for (int s = 0; s < n; ++s) {
    std::vector<int32_t> p;
    for (int i = 0; i < kLen[s % 7]; ++i) p.push_back((37 * s + 11 * i + 1) % 400);
    out.push_back(std::move(p));
  }
  return out;
}

// Room for run_batch_layout's batches (up to 7 sequences, 49 prompt tokens).
inline RunnerOptions batch_runner_options() {
  RunnerOptions ro;
  ro.block_size = 4;
  ro.num_kv_blocks = 64;
  ro.max_model_len = 64;
  ro.max_num_tokens = 64;
  ro.max_num_seqs = 8;
  return ro;
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

// A test case's name for gtest: model_tpN_layout[_gatherT], '-' as '_'.
inline std::string layout_case_name(const char* model, int tp, FfnLayout layout,
                                    int64_t gather = 0) {
  std::string name =
      std::string(model) + "_tp" + std::to_string(tp) + "_" + ffn_layout_name(layout);
  if (gather > 0) name += "_gather" + std::to_string(gather);
  for (char& ch : name) {
    if (ch == '-') ch = '_';
  }
  return name;
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
