// Serving API: many concurrent requests through one model with continuous batching.
// The HTTP/OpenAI layer (src/server) and `strata bench-serve` use only this header.
//
// Threading: submit()/cancel()/metrics() may be called from any thread. Events for a request
// are delivered in order on the engine's loop thread through the request's callback; a
// callback must not block (hand the event to the connection's own executor and return).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "strata/engine.h"
#include "strata/sampling.h"
#include "strata/status.h"

namespace strata {

// What happens to a running sequence when the KV cache runs out of blocks: its blocks are
// swapped to host memory, or dropped and recomputed later; kByCost compares the two estimates
// (src/serving/scheduler.h documents the rule).
enum class PreemptionMode { kSwap, kRecompute, kByCost };

// The most the automatic CPU KV pool takes (kv_cache_bytes = 0): 1 GiB.
inline constexpr int64_t kAutoKvCacheBytes = int64_t{1} << 30;

struct ServingConfig {
  EngineConfig engine;                   // model, threads, tensor parallel size, max_model_len
  int64_t max_num_seqs = 64;             // sequences running at once
  int64_t max_num_batched_tokens = 512;  // per-step token budget (prompt chunks + decodes)
  int64_t block_size = 16;               // tokens per KV block
  int64_t num_kv_blocks = 0;             // 0: size from kv_cache_bytes
  // CPU KV pool in bytes; 0: room for max_num_seqs sequences of max_model_len, at most
  // kAutoKvCacheBytes. Host memory (pool and swap) is committed as blocks are first used.
  int64_t kv_cache_bytes = 0;
  int64_t swap_space_bytes = int64_t{1} << 30;  // host memory for preempted KV blocks
  bool enable_prefix_caching = true;
  PreemptionMode preemption_mode = PreemptionMode::kByCost;
  // KV offload (--kv-offload): the KV blocks live in a host pool (pinned on a GPU) and the
  // running sequences, split into groups, take turns on the device pool (num_kv_blocks on the
  // CPU, what fits on a GPU), each group loaded while the previous one runs. The running set may
  // then hold more blocks than the device pool. Single rank only; no prefix caching, and
  // preemption recomputes.
  bool kv_offload = false;
  int64_t kv_offload_groups = 0;  // 0: enough that half the device pool holds one group
                                  // (at most max_num_seqs)
  int64_t kv_host_bytes = 0;      // host pool; 0: max_num_seqs sequences of max_model_len,
                                  // at most 4x the device pool
  std::string served_model_name;  // name in /v1/models; default: the model path's last part
};

struct CompletionRequest {
  std::vector<int32_t> prompt_tokens;  // already tokenized (chat template applied)
  SamplingParams sampling;
  int64_t max_tokens = 16;
  int64_t min_tokens = 0;
  std::vector<std::string> stop;  // stop strings, matched on detokenized text, not emitted
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int top_logprobs = -1;  // -1: no logprobs; 0..20: chosen token (+ top n)
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // top_logprobs alternatives
};

struct CompletionEvent {
  std::string text;             // new complete UTF-8 text since the last event
  std::vector<int32_t> tokens;  // new token ids since the last event
  std::vector<TokenLogprob> logprobs;
  bool finished = false;
  std::string finish_reason;  // "stop", "length", "abort" (cancelled), "error"
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;     // total so far
  int64_t cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
  Status error;                      // set when finish_reason == "error"
};

struct ServingMetrics {
  int64_t running = 0, waiting = 0, swapped = 0;
  int64_t kv_blocks_total = 0, kv_blocks_used = 0;
  int64_t prompt_tokens_total = 0, generation_tokens_total = 0;
  int64_t requests_finished_total = 0, preemptions_total = 0;
  int64_t prefix_cache_hits_total = 0, prefix_cache_queries_total = 0;  // in tokens
  // Forward passes run, the tokens they carried, and the most passes in flight at once
  // (pipeline stages keep several); the pipeline bubble measured over every pass so far (idle
  // stage time over all stage time), -1 without pipeline stages.
  int64_t steps_total = 0, step_tokens_total = 0, max_steps_in_flight = 0;
  double pipeline_bubble = -1;
  int64_t running_max = 0;  // most sequences running at once so far (the batch reached)
  // KV offload: groups, host pool blocks, blocks copied host -> device and device -> host.
  int64_t kv_offload_groups = 0, kv_host_blocks_total = 0;
  int64_t kv_offload_loaded_blocks_total = 0, kv_offload_stored_blocks_total = 0;
  // Latency histograms: seconds, cumulative counts per bucket upper bound (Prometheus style).
  std::vector<double> bucket_bounds;
  std::vector<int64_t> ttft_buckets, tpot_buckets, e2e_buckets;
  double ttft_sum = 0, tpot_sum = 0, e2e_sum = 0;
  int64_t ttft_count = 0, tpot_count = 0, e2e_count = 0;
};

class ServingEngine {
 public:
  using Callback = std::function<void(const CompletionEvent&)>;

  // Loads the model and starts the engine loop thread.
  static Result<std::unique_ptr<ServingEngine>> create(const ServingConfig& config);
  virtual ~ServingEngine() = default;

  virtual const ModelInfo& info() const = 0;
  virtual const std::string& model_name() const = 0;
  virtual int64_t max_model_len() const = 0;

  virtual Result<std::vector<int32_t>> tokenize(const std::string& text, bool add_special) = 0;
  virtual std::string detokenize(const std::vector<int32_t>& tokens) = 0;
  // Render the model's chat template; `messages_json` is the OpenAI messages array (JSON text),
  // `tools_json` the tools array or empty.
  virtual Result<std::string> apply_chat_template(const std::string& messages_json,
                                                  bool add_generation_prompt,
                                                  const std::string& tools_json) = 0;

  // Queue a request; returns its id. Validation errors (empty prompt, too long for the
  // context, bad sampling values) return a Status and no callback is ever made.
  virtual Result<uint64_t> submit(CompletionRequest request, Callback on_event) = 0;
  // Cancel a queued or running request: its blocks are freed and it finishes with "abort".
  virtual void cancel(uint64_t id) = 0;
  virtual ServingMetrics metrics() const = 0;
  // Stop accepting requests; finish (drain=true) or abort in-flight ones, then stop the loop.
  virtual void shutdown(bool drain) = 0;

  // Tensor parallelism across processes (mpirun -np N): rank 0 serves (scheduler, sampling,
  // HTTP) and broadcasts every step; the other ranks only follow. On a follower, wait_follower()
  // blocks until rank 0 stops (ok) or the ranks fail (the error); it returns at once on rank 0.
  virtual int rank() const { return 0; }
  virtual Status wait_follower() { return Status(); }
};

// This process's rank when started by an MPI launcher (mpirun), else 0: serve commands start
// their HTTP server on rank 0 only.
int launcher_rank();

}  // namespace strata
