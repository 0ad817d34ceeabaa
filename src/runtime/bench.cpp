// Benchmark primitives (include/strata/bench.h) over the runtime: the executor's forward pass
// timed on seeded random token ids in fresh sequences, without tokenizer or sampling.
#include <algorithm>
#include <chrono>
#include <vector>

#include "core/status.h"
#include "memory/kv_pool.h"
#include "runtime/executor.h"
#include "runtime/sampler.h"
#include "runtime/sequence.h"
#include "strata/bench.h"

namespace strata {

namespace {

constexpr int64_t kBlockSize = 16;
constexpr int64_t kPrefillChunk = 512;

class BenchmarkImpl final : public Benchmark {
 public:
  const ModelInfo& info() const override { return info_; }
  double pipeline_bubble() const override { return exec_->measured_bubble(); }
  WeightStreamInfo weight_streaming() const override {
    WeightStreamInfo w;
    const ResidencyPlan* plan = exec_->residency_plan();
    if (plan == nullptr) return w;
    w.plan = plan->describe();
    w.prefetch = plan->options.prefetch;
    w.layers_resident = plan->n_resident;
    w.layers_streamed = plan->n_streamed;
    StreamStats st;
    if (!exec_->stream_stats(&st)) return w;
    w.streaming = true;
    w.tier = plan->options.offload == WeightOffload::kDisk ? "disk" : "host";
    w.bytes_per_pass = st.bytes_per_pass;
    w.slot_bytes = st.slot_bytes;
    w.passes = st.passes;
    w.bytes_copied = st.bytes;
    w.disk_bytes = st.disk_bytes;
    w.direct_io = st.direct_io;
    w.dp = exec_->data_parallel_size();
    w.fetch_parts = st.fetch_parts;
    w.fetch_pieces = st.fetch_pieces;
    for (const StreamStats& r : exec_->replica_stream_stats()) {
      w.replica_passes.push_back(r.passes);
      w.replica_bytes_copied.push_back(r.bytes);
    }
    if (w.replica_passes.empty()) {
      w.replica_passes.push_back(st.passes);
      w.replica_bytes_copied.push_back(st.bytes);
    }
    return w;
  }
  int rank() const override { return comm_->rank(); }

  Status init(const EngineConfig& cfg) {
    max_batch_tokens_ = std::max<int64_t>(1, cfg.max_num_batched_tokens);
    // The CPU pool holds one sequence's blocks (times max_num_seqs when given: batched
    // benchmarks); the CUDA pool fills --gpu-memory-utilization.
    ExecutorOptions eo;
    eo.block_size = kBlockSize;
    eo.cpu_seqs = std::max<int64_t>(1, cfg.max_num_seqs);
    STRATA_ASSIGN_OR_RETURN(LoadedExecutor loaded, load_executor(cfg, eo));
    info_ = std::move(loaded.info);
    max_len_ = loaded.max_len;
    comm_ = std::move(loaded.comm);
    exec_ = std::move(loaded.exec);
    return ok_status();
  }

  Result<double> time_prefill(int64_t n_prompt, uint64_t seed) override {
    if (n_prompt < 1 || n_prompt > max_len_) {
      return errorf(StatusCode::kInvalidArgument, "prompt length {} must be in [1, {}]", n_prompt,
                    max_len_);
    }
    const std::vector<int32_t> tokens = random_tokens(n_prompt, seed);
    std::vector<float> logits(static_cast<size_t>(exec_->config().vocab));
    SequenceKv seq;
    const auto t0 = std::chrono::steady_clock::now();
    Status st = run_tokens(seq, tokens, false, logits.data());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    seq.release(exec_->cache());
    if (!st.ok()) return st;
    return s;
  }

  Result<double> time_decode(int64_t n_context, int64_t n_gen, uint64_t seed) override {
    if (n_context < 0 || n_gen < 1 || n_context + n_gen > max_len_) {
      return errorf(StatusCode::kInvalidArgument,
                    "context {} + generated {} tokens must fit the context length {}", n_context,
                    n_gen, max_len_);
    }
    const std::vector<int32_t> tokens = random_tokens(n_context + n_gen, seed);
    std::vector<float> logits(static_cast<size_t>(exec_->config().vocab));
    SequenceKv seq;
    Status st = ok_status();
    if (n_context > 0) {
      st = run_tokens(seq, std::vector<int32_t>(tokens.begin(), tokens.begin() + n_context), false,
                      logits.data());
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; st.ok() && i < n_gen; ++i) {
      st = run_tokens(seq, std::vector<int32_t>{tokens[static_cast<size_t>(n_context + i)]}, false,
                      logits.data());
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    seq.release(exec_->cache());
    if (!st.ok()) return st;
    return s;
  }

  // `batch` fresh sequences of n tokens each, prefilled together in forward passes of at most
  // kMaxBatchTokens... (the executor's limit decides); returns their states.
  Status prefill_batch(std::vector<SequenceKv>& seqs, const std::vector<std::vector<int32_t>>& toks,
                       std::vector<int32_t>* last_ids, double* seconds) {
    const int64_t batch = static_cast<int64_t>(seqs.size());
    const int64_t n = static_cast<int64_t>(toks[0].size());
    for (auto& s : seqs) STRATA_RETURN_IF_ERROR(s.reserve(exec_->cache(), s.length + n));
    int64_t width = 0;
    for (auto& s : seqs)
      width = std::max<int64_t>(width, static_cast<int64_t>(s.block_table.size()));
    std::vector<int32_t> tables(static_cast<size_t>(batch * width), 0);
    for (int64_t i = 0; i < batch; ++i) {
      std::copy(seqs[static_cast<size_t>(i)].block_table.begin(),
                seqs[static_cast<size_t>(i)].block_table.end(), tables.begin() + i * width);
    }
    std::vector<int32_t> tokens, seq_ids, pos, rows;
    for (int64_t i = 0; i < batch; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        tokens.push_back(toks[static_cast<size_t>(i)][static_cast<size_t>(j)]);
        seq_ids.push_back(static_cast<int32_t>(i));
        pos.push_back(static_cast<int32_t>(seqs[static_cast<size_t>(i)].length + j));
      }
      rows.push_back(static_cast<int32_t>((i + 1) * n - 1));
    }
    ForwardBatch b;
    b.tokens = tokens;
    b.token_seq = seq_ids;
    b.token_pos = pos;
    b.block_tables = tables.data();
    b.max_blocks_per_seq = width;
    b.n_seqs = batch;
    b.logit_rows = rows;
    last_ids->resize(static_cast<size_t>(batch));
    const auto t0 = std::chrono::steady_clock::now();
    STRATA_RETURN_IF_ERROR(exec_->forward_argmax(b, last_ids->data()));
    if (seconds) {
      *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    for (auto& s : seqs) s.length += n;
    return ok_status();
  }

  Result<double> time_prefill_batch(int64_t batch, int64_t n_prompt, uint64_t seed) override {
    if (batch < 1 || n_prompt < 1 || n_prompt > max_len_) {
      return errorf(StatusCode::kInvalidArgument,
                    "prefill of {} x {} tokens: batch must be >= 1 and the length in [1, {}]",
                    batch, n_prompt, max_len_);
    }
    std::vector<SequenceKv> seqs(static_cast<size_t>(batch));
    std::vector<std::vector<int32_t>> toks;
    for (int64_t i = 0; i < batch; ++i)
      toks.push_back(random_tokens(n_prompt, seed * 7919 + static_cast<uint64_t>(i)));
    std::vector<int32_t> ids;
    double s = 0;
    exec_->reset_pipeline_stats();
    Status st = prefill_batch(seqs, toks, &ids, &s);
    for (auto& q : seqs) q.release(exec_->cache());
    if (!st.ok()) return st;
    return s;
  }

  Result<double> time_decode_batch(int64_t batch, int64_t n_context, int64_t n_gen,
                                   uint64_t seed) override {
    if (batch < 1 || n_context < 1 || n_gen < 1 || n_context + n_gen > max_len_) {
      return errorf(StatusCode::kInvalidArgument,
                    "decode of batch {}: context {} + generated {} tokens must fit the context "
                    "length {}",
                    batch, n_context, n_gen, max_len_);
    }
    std::vector<SequenceKv> seqs(static_cast<size_t>(batch));
    auto release = [&] {
      for (auto& q : seqs) q.release(exec_->cache());
    };
    std::vector<std::vector<int32_t>> toks;
    for (int64_t i = 0; i < batch; ++i)
      toks.push_back(random_tokens(n_context, seed * 7919 + static_cast<uint64_t>(i)));
    std::vector<int32_t> ids;
    // Prefill the contexts in groups that fit one forward pass; a context longer than a pass
    // (--max-num-batched-tokens) in chunks of a pass each, one sequence at a time.
    const int64_t per = std::max<int64_t>(1, max_batch_tokens_ / n_context);
    const int64_t chunk = std::min(n_context, max_batch_tokens_);
    for (int64_t b0 = 0; b0 < batch; b0 += per) {
      const int64_t b1 = std::min(batch, b0 + per);
      std::vector<SequenceKv> part(static_cast<size_t>(b1 - b0));
      std::vector<int32_t> pid;
      Status st = ok_status();
      for (int64_t c0 = 0; c0 < n_context && st.ok(); c0 += chunk) {
        const int64_t c1 = std::min(n_context, c0 + chunk);
        std::vector<std::vector<int32_t>> pt;
        for (int64_t i = b0; i < b1; ++i) {
          const std::vector<int32_t>& t = toks[static_cast<size_t>(i)];
          pt.emplace_back(t.begin() + c0, t.begin() + c1);
        }
        st = prefill_batch(part, pt, &pid, nullptr);
      }
      if (!st.ok()) {
        for (auto& q : part) q.release(exec_->cache());
        release();
        return st;
      }
      for (int64_t i = b0; i < b1; ++i) {
        seqs[static_cast<size_t>(i)] = std::move(part[static_cast<size_t>(i - b0)]);
        ids.push_back(pid[static_cast<size_t>(i - b0)]);
      }
    }
    std::vector<int32_t> seq_ids(static_cast<size_t>(batch)), pos(static_cast<size_t>(batch)),
        rows(static_cast<size_t>(batch)), tables;
    for (int64_t i = 0; i < batch; ++i) {
      seq_ids[static_cast<size_t>(i)] = static_cast<int32_t>(i);
      rows[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    }
    double total = 0;
    exec_->reset_pipeline_stats();  // the decode steps' bubble, not the prefill's
    for (int64_t g = 0; g < n_gen; ++g) {
      Status st = ok_status();
      for (auto& q : seqs) {
        st = q.reserve(exec_->cache(), q.length + 1);
        if (!st.ok()) break;
      }
      if (!st.ok()) {
        release();
        return st;
      }
      const int64_t width = static_cast<int64_t>(seqs[0].block_table.size());
      tables.assign(static_cast<size_t>(batch * width), 0);
      for (int64_t i = 0; i < batch; ++i) {
        const auto& bt = seqs[static_cast<size_t>(i)].block_table;
        std::copy(bt.begin(),
                  bt.begin() + std::min<int64_t>(width, static_cast<int64_t>(bt.size())),
                  tables.begin() + i * width);
        pos[static_cast<size_t>(i)] = static_cast<int32_t>(seqs[static_cast<size_t>(i)].length);
      }
      ForwardBatch b;
      b.tokens = ids;
      b.token_seq = seq_ids;
      b.token_pos = pos;
      b.block_tables = tables.data();
      b.max_blocks_per_seq = width;
      b.n_seqs = batch;
      b.logit_rows = rows;
      const auto t0 = std::chrono::steady_clock::now();
      st = exec_->forward_argmax(b, ids.data());
      total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!st.ok()) {
        release();
        return st;
      }
      for (auto& q : seqs) q.length += 1;
    }
    release();
    return total / static_cast<double>(n_gen);
  }

 private:
  std::vector<int32_t> random_tokens(int64_t n, uint64_t seed) const {
    SamplingParams p;
    p.seed = seed;
    Sampler rng(p);
    std::vector<int32_t> t(static_cast<size_t>(n));
    const int64_t V = exec_->config().vocab;
    for (auto& x : t)
      x = static_cast<int32_t>(std::min<int64_t>(
          V - 1, static_cast<int64_t>(rng.next_uniform() * static_cast<float>(V))));
    return t;
  }

  Status run_tokens(SequenceKv& seq, const std::vector<int32_t>& tokens, bool all_logits,
                    float* logits) {
    if (seq.length + static_cast<int64_t>(tokens.size()) > max_len_) {
      return errorf(StatusCode::kOutOfRange, "{} tokens exceed the context length {}",
                    seq.length + static_cast<int64_t>(tokens.size()), max_len_);
    }
    Executor& ex = *exec_;
    const ForwardFn fn = [&ex](const ForwardBatch& b, float* out) { return ex.forward(b, out); };
    return forward_sequence(fn, max_len_, ex.config().vocab, ex.cache(), seq, tokens, all_logits,
                            logits, kPrefillChunk);
  }

  ModelInfo info_;
  int64_t max_len_ = 0;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Executor> exec_;
  int64_t max_batch_tokens_ = 2048;  // the most tokens one forward pass takes (workspace)
};

}  // namespace

Result<std::unique_ptr<Benchmark>> Benchmark::create(const EngineConfig& config) {
  auto b = std::make_unique<BenchmarkImpl>();
  STRATA_RETURN_IF_ERROR(b->init(config));
  return std::unique_ptr<Benchmark>(std::move(b));
}

}  // namespace strata
