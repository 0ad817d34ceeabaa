#include "runtime/step.h"

#include <algorithm>

#include "core/status.h"

namespace strata {

namespace {

int64_t next_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

}  // namespace

// Layout: tokens[T] | seq[T] | pos[T] | cu_q[S+1] | kv_len[S] | tables[S*B].
size_t StepPacker::ints_needed(const StepLimits& l) {
  return static_cast<size_t>(3 * l.max_tokens + (l.max_seqs + 1) + l.max_seqs +
                             l.max_seqs * l.max_blocks_per_seq);
}

StepPacker::StepPacker(const StepLimits& limits, Buffer host, Buffer dev)
    : lim_(limits), ints_(ints_needed(limits)), host_(std::move(host)), dev_(std::move(dev)) {}

ops::StepArgs StepPacker::host_view(const ops::StepArgs& a) const {
  const auto* d = static_cast<const int32_t*>(dev_.data());
  const auto* h = static_cast<const int32_t*>(host_.data());
  if (d == h) return a;
  auto rebase = [&](const int32_t* p) { return p == nullptr ? p : h + (p - d); };
  ops::StepArgs v = a;
  v.tokens = rebase(a.tokens);
  v.token_seq = rebase(a.token_seq);
  v.token_pos = rebase(a.token_pos);
  v.cu_q = rebase(a.cu_q);
  v.kv_len = rebase(a.kv_len);
  v.block_tables = rebase(a.block_tables);
  return v;
}

Status StepPacker::pack(const ForwardBatch& b, PackedStep& st) {
  const int64_t n = static_cast<int64_t>(b.tokens.size());
  const int64_t T = lim_.max_tokens, S = lim_.max_seqs, B = lim_.max_blocks_per_seq;
  if (static_cast<int64_t>(b.token_seq.size()) != n ||
      static_cast<int64_t>(b.token_pos.size()) != n) {
    return errorf(StatusCode::kInvalidArgument,
                  "forward: token, sequence and position counts differ");
  }
  if (n > T) {
    return errorf(StatusCode::kInvalidArgument,
                  "forward: {} tokens in one batch, the workspace holds {} "
                  "(--max-num-batched-tokens)",
                  n, T);
  }
  if (b.max_blocks_per_seq > B) {
    return errorf(StatusCode::kInvalidArgument,
                  "forward: block tables of {} blocks exceed the {} of --max-model-len {}",
                  b.max_blocks_per_seq, B, lim_.max_model_len);
  }
  const int64_t n_out = static_cast<int64_t>(b.logit_rows.size());
  if (n_out > lim_.max_logit_rows) {
    return errorf(StatusCode::kInvalidArgument, "forward: {} logit rows, at most {}", n_out,
                  lim_.max_logit_rows);
  }
  // Runs: maximal spans of one sequence at consecutive positions.
  std::vector<int64_t> run_begin, run_seq;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t s = b.token_seq[static_cast<size_t>(i)];
    const int32_t pos = b.token_pos[static_cast<size_t>(i)];
    if (s < 0 || s >= b.n_seqs) {
      return errorf(StatusCode::kOutOfRange, "forward: token {} names sequence {} of {}", i, s,
                    b.n_seqs);
    }
    if (pos < 0 || pos >= lim_.max_model_len || pos / lim_.block_size >= b.max_blocks_per_seq) {
      return errorf(StatusCode::kOutOfRange, "position {} is past the context length {}", pos,
                    lim_.max_model_len);
    }
    const bool cont = i > 0 && b.token_seq[static_cast<size_t>(i - 1)] == s &&
                      b.token_pos[static_cast<size_t>(i - 1)] + 1 == pos;
    if (!cont) {
      run_begin.push_back(i);
      run_seq.push_back(s);
    }
  }
  const int64_t n_runs = static_cast<int64_t>(run_begin.size());
  run_begin.push_back(n);
  bool all_rows = n_out == n;
  for (int64_t i = 0; i < n_out; ++i) {
    const int32_t r = b.logit_rows[static_cast<size_t>(i)];
    if (r < 0 || r >= n) {
      return errorf(StatusCode::kInvalidArgument, "forward: bad logit row {}", r);
    }
    if (r != i) all_rows = false;
  }
  int64_t max_q = 0, max_kv = 0;
  for (int64_t r = 0; r < n_runs; ++r) {
    const int64_t len = run_begin[static_cast<size_t>(r + 1)] - run_begin[static_cast<size_t>(r)];
    max_q = std::max(max_q, len);
    const int64_t last = run_begin[static_cast<size_t>(r + 1)] - 1;
    max_kv = std::max<int64_t>(max_kv, b.token_pos[static_cast<size_t>(last)] + 1);
  }
  // Graphs: pure decode (one token per run, logits for every row), within the captured sizes.
  const bool graph = lim_.cuda_graphs && max_q == 1 && all_rows && n <= S;
  int64_t n_pad = n, kv_bound = max_kv;
  if (graph) {
    n_pad = std::min(next_pow2(n), S);
    kv_bound = std::min(std::max<int64_t>(next_pow2(max_kv), 256), B * lim_.block_size);
  }
  const int64_t runs_total = n_runs + (n_pad - n);
  if (runs_total > S) {
    return errorf(StatusCode::kInvalidArgument,
                  "forward: {} sequences in one batch, at most {} (--max-num-seqs)", runs_total, S);
  }
  int32_t* tok = static_cast<int32_t*>(host_.data());
  int32_t* seq = tok + T;
  int32_t* pos = seq + T;
  int32_t* cu = pos + T;
  int32_t* kvl = cu + S + 1;
  int32_t* tab = kvl + S;
  for (int64_t i = 0; i < n; ++i) {
    tok[i] = b.tokens[static_cast<size_t>(i)];
    pos[i] = b.token_pos[static_cast<size_t>(i)];
    if (tok[i] < 0 || tok[i] >= lim_.vocab) {
      return errorf(StatusCode::kOutOfRange,
                    "forward: token id {} is outside the vocabulary (0..{})", tok[i],
                    lim_.vocab - 1);
    }
  }
  for (int64_t r = 0; r < n_runs; ++r) {
    const int64_t b0 = run_begin[static_cast<size_t>(r)],
                  b1 = run_begin[static_cast<size_t>(r + 1)];
    for (int64_t i = b0; i < b1; ++i) seq[i] = static_cast<int32_t>(r);
    cu[r] = static_cast<int32_t>(b0);
    kvl[r] = b.token_pos[static_cast<size_t>(b1 - 1)] + 1;
    const int32_t* src = b.block_tables + run_seq[static_cast<size_t>(r)] * b.max_blocks_per_seq;
    for (int64_t k = 0; k < B; ++k) {
      const int32_t blk = k < b.max_blocks_per_seq ? src[k] : -1;
      if (k * lim_.block_size < kvl[r] && (blk < 0 || blk >= lim_.n_blocks)) {
        return errorf(StatusCode::kOutOfRange,
                      "forward: block {} of sequence {} is {}, outside the pool of {} blocks", k,
                      run_seq[static_cast<size_t>(r)], blk, lim_.n_blocks);
      }
      tab[r * B + k] = blk;
    }
  }
  // Padding rows (graphs): token 0 at position 0 of a sequence living in the scratch block.
  for (int64_t i = n; i < n_pad; ++i) {
    const int64_t r = n_runs + (i - n);
    tok[i] = 0;
    pos[i] = 0;
    seq[i] = static_cast<int32_t>(r);
    cu[r] = static_cast<int32_t>(i);
    kvl[r] = 1;
    for (int64_t k = 0; k < B; ++k) tab[r * B + k] = static_cast<int32_t>(lim_.n_blocks);
  }
  cu[runs_total] = static_cast<int32_t>(n_pad);

  const int32_t* d = static_cast<const int32_t*>(dev_.data());
  ops::StepArgs& a = st.args;
  a.n_tokens = n_pad;
  a.n_seqs = runs_total;
  a.max_q_len = max_q;
  a.max_kv_len = kv_bound;
  a.tokens = d;
  a.token_seq = d + T;
  a.token_pos = d + 2 * T;
  a.cu_q = d + 3 * T;
  a.kv_len = a.cu_q + S + 1;
  a.block_tables = a.kv_len + S;
  a.max_blocks_per_seq = B;
  st.n_real = n;
  st.n_out = n_out;
  st.graph = graph;
  st.graph_key = {n_pad, kv_bound};
  st.out_runs.clear();
  if (!all_rows) {
    for (int64_t i = 0; i < n_out; ++i) {
      const int64_t r = b.logit_rows[static_cast<size_t>(i)];
      if (!st.out_runs.empty() && st.out_runs.back().first + st.out_runs.back().second == r) {
        st.out_runs.back().second++;
      } else {
        st.out_runs.emplace_back(r, 1);
      }
    }
  }
  st.head.n_out = graph ? n_pad : n_out;
  st.head.all_rows = all_rows;
  st.head.out_runs = &st.out_runs;
  st.head.argmax = false;
  return ok_status();
}

}  // namespace strata
