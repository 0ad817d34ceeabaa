// ServingEngine implementation: owns the model, the paged KV cache, a host swap area and the
// Scheduler, and runs the loop thread described in engine_loop.h.
//
// Threading: submit()/cancel() only touch the incoming queues under mu_; everything else (the
// scheduler, the request states, the KV cache) belongs to the loop thread. metrics() reads a
// snapshot the loop publishes under metrics_mu_ after every step.
//
// NOTE: the executor's KvPool block manager is unused here: the Scheduler's own BlockManager
// (prefix caching, swap) decides which blocks each sequence owns, and the block tables it builds
// go straight to the executor, whatever its device.
#include "serving/engine_loop.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <limits>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "chat/chat_template.h"
#include "core/env.h"
#include "core/log.h"
#include "core/status.h"
#include "memory/kv_pool.h"
#include "runtime/executor.h"
#include "runtime/model_loader.h"
#include "runtime/sampler.h"
#include "serving/kv_offload.h"
#include "serving/scheduler.h"
#include "strata/serving.h"
#include "text/tokenizer.h"

namespace strata {

namespace {

constexpr double kLatencyBuckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075,
                                      0.1,   0.25,   0.5,   0.75, 1.0,   2.5,  5.0,
                                      7.5,   10.0,   20.0,  40.0, 80.0};
constexpr int kMaxTopLogprobs = 20;

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct RequestState {
  uint64_t id = 0;
  CompletionRequest req;
  ServingEngine::Callback on_event;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<StreamingDecoder> decoder;
  std::vector<int32_t> generated;
  std::string pending_text;  // decoded but not sent: may still become a stop string
  Clock::time_point arrival, first_token, last_token;
  int64_t cached_prompt_tokens = 0;
};

class ServingEngineImpl final : public ServingEngine {
 public:
  ~ServingEngineImpl() override { shutdown(/*drain=*/false); }

  Status init(const ServingConfig& cfg);

  const ModelInfo& info() const override { return info_; }
  const std::string& model_name() const override { return model_name_; }
  int64_t max_model_len() const override { return max_len_; }

  Result<std::vector<int32_t>> tokenize(const std::string& text, bool add_special) override {
    if (!tokenizer_) return no_tokenizer();
    return tokenizer_->encode(text, add_special);
  }
  std::string detokenize(const std::vector<int32_t>& tokens) override {
    return tokenizer_ ? tokenizer_->decode(tokens) : std::string();
  }
  Result<std::string> apply_chat_template(const std::string& messages_json,
                                          bool add_generation_prompt,
                                          const std::string& tools_json) override;
  Result<uint64_t> submit(CompletionRequest request, Callback on_event) override;
  void cancel(uint64_t id) override;
  ServingMetrics metrics() const override;
  void shutdown(bool drain) override;
  int rank() const override { return comm_ ? comm_->rank() : 0; }
  Status wait_follower() override {
    if (thread_.joinable() && rank() != 0) thread_.join();
    return follower_status_;
  }

 private:
  Status no_tokenizer() const {
    return errorf(StatusCode::kFailedPrecondition, "{}: the model has no tokenizer.json",
                  info_.path);
  }
  void loop();
  // One step's batch, owned until its forward pass has been waited for (pipelined executors
  // keep several in flight).
  struct StepJob {
    ScheduledStep step;  // a copy: the scheduler's own is rebuilt by the next schedule()
    std::vector<int32_t> tokens, token_seq, token_pos, block_tables, logit_rows, ids;
    std::vector<float> logits;
    std::vector<std::pair<uint64_t, int64_t>> with_logits;  // (request id, logits row)
    bool greedy = false;
    ForwardBatch batch;
  };
  void run_step();
  // --kv-offload: one step of the current group (serving/kv_offload.h).
  void run_offload_step();
  Status init_offload(const ServingConfig& cfg, SchedulerConfig& sc);
  void prepare(StepJob& job);
  void complete_oldest();
  void fail_step(const ScheduledStep& step, const Status& st);
  // Sample from `row` (raw logits, modified) and emit the event; may finish the request.
  void on_logits(RequestState& r, float* row);
  // The sampled token `tok` of r (lse: log-sum-exp of the raw logits, for logprobs).
  void emit_token(RequestState& r, int32_t tok, float lse, CompletionEvent ev);
  // True when r's next token is the plain argmax of the logits (the device can pick it).
  bool plain_greedy(const RequestState& r) const;
  void finish(RequestState& r, CompletionEvent ev, const char* reason);
  void publish_metrics();

  // Immutable after init.
  ModelInfo info_;
  std::string model_name_;
  int64_t max_len_ = 0;
  int64_t block_size_ = 16;
  int64_t num_blocks_ = 0;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Executor> exec_;
  size_t block_bytes_ = 0;      // one KV block, all layers, as a swap slot holds it
  int64_t max_seq_blocks_ = 0;  // most blocks one request may need

  // Loop thread only.
  std::unique_ptr<Scheduler> sched_;
  std::atomic<bool> warned_no_template_{false};
  Buffer swap_;                                    // [num_swap_blocks, block_bytes_]
  std::deque<std::unique_ptr<StepJob>> inflight_;  // submitted steps, oldest first
  std::unique_ptr<KvOffloadPlan> offload_;         // --kv-offload
  KvOffloadCopies loads_, prefetch_, stores_;
  int64_t running_max_ = 0, offload_loaded_ = 0, offload_stored_ = 0;
  std::unordered_map<uint64_t, std::unique_ptr<RequestState>> requests_;
  std::vector<std::unique_ptr<RequestState>> incoming_local_;
  std::vector<uint64_t> cancels_local_;
  std::vector<float> logprob_scratch_;
  std::vector<int32_t> top_ids_;
  int64_t prompt_tokens_total_ = 0, generation_tokens_total_ = 0, finished_total_ = 0;
  int64_t steps_total_ = 0, step_tokens_total_ = 0, max_in_flight_ = 0;
  LatencyHistogram ttft_{default_latency_buckets()}, tpot_{default_latency_buckets()},
      e2e_{default_latency_buckets()};

  // Shared with submit()/cancel()/shutdown().
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<RequestState>> incoming_;
  std::vector<uint64_t> cancels_;
  uint64_t next_id_ = 1;
  bool accepting_ = true, stop_ = false, drain_ = true;
  std::thread thread_;
  std::mutex shutdown_mu_;
  Status follower_status_;  // ranks > 0: how run_follower ended

  mutable std::mutex metrics_mu_;
  ServingMetrics metrics_;
};

Status ServingEngineImpl::init(const ServingConfig& cfg) {
  if (cfg.block_size < 1 || cfg.max_num_seqs < 1 || cfg.max_num_batched_tokens < 1) {
    return errorf(StatusCode::kInvalidArgument,
                  "serving: block_size, max_num_seqs and max_num_batched_tokens must be >= 1");
  }
  if (cfg.num_kv_blocks < 0 || cfg.kv_cache_bytes < 0 || cfg.swap_space_bytes < 0) {
    return errorf(StatusCode::kInvalidArgument,
                  "serving: num_kv_blocks, kv_cache_bytes and swap_space_bytes must be >= 0");
  }
  ExecutorOptions eo;
  eo.block_size = cfg.block_size;
  eo.cpu_blocks = cfg.num_kv_blocks;
  eo.cpu_kv_bytes = cfg.kv_cache_bytes;
  eo.cpu_seqs = cfg.max_num_seqs;  // kv_cache_bytes 0: max_num_seqs sequences of max_model_len,
  eo.cpu_kv_max_bytes = kAutoKvCacheBytes;  // at most this
  eo.cuda_blocks = cfg.num_kv_blocks;
  EngineConfig ecfg = cfg.engine;
  if (ecfg.max_num_seqs <= 0) ecfg.max_num_seqs = cfg.max_num_seqs;
  ecfg.max_num_batched_tokens = std::max(ecfg.max_num_batched_tokens, cfg.max_num_batched_tokens);
  STRATA_ASSIGN_OR_RETURN(LoadedExecutor loaded, load_executor(ecfg, eo));
  info_ = std::move(loaded.info);
  max_len_ = loaded.max_len;
  comm_ = std::move(loaded.comm);
  tokenizer_ = std::move(loaded.tokenizer);
  exec_ = std::move(loaded.exec);
  if (cfg.kv_offload && (comm_->size() > 1 || cfg.engine.parallel.tp > 1 ||
                         cfg.engine.parallel.pp > 1 || cfg.engine.parallel.ep > 1)) {
    return errorf(StatusCode::kInvalidArgument,
                  "--kv-offload runs on one rank: drop --tp, --pp and --ep (and mpirun)");
  }
  if (comm_->size() > 1) {
    // Ranks as processes: rank 0 drives, the others follow its steps.
    if (comm_->rank() != 0) {
      thread_ = std::thread([this] { follower_status_ = run_follower(*exec_, *comm_); });
      return ok_status();
    }
    exec_ = make_driver_executor(std::move(exec_), *comm_);
  }
  model_name_ = cfg.served_model_name;
  if (model_name_.empty()) {
    std::filesystem::path p(cfg.engine.model);
    model_name_ = p.has_filename() ? p.filename().string() : p.parent_path().filename().string();
    if (model_name_.empty()) model_name_ = info_.path;
  }
  block_size_ = cfg.block_size;
  block_bytes_ = exec_->block_bytes();
  const auto block_bytes = static_cast<int64_t>(block_bytes_);
  num_blocks_ = exec_->cache().config().n_blocks;
  // Batch-sharded attention: a sequence's blocks are one rank's (KvPoolConfig::n_owners).
  const int kv_owners = exec_->cache().config().n_owners;
  max_seq_blocks_ = exec_->cache().blocks().min_owner_total();
  const int64_t num_swap = cfg.kv_offload ? 0 : cfg.swap_space_bytes / block_bytes;
  // Committed as blocks are swapped out (an anonymous mapping), not at start.
  STRATA_ASSIGN_OR_RETURN(swap_, allocate_host(static_cast<size_t>(num_swap) * block_bytes_));

  SchedulerConfig sc;
  sc.num_blocks = num_blocks_;
  sc.num_swap_blocks = num_swap;
  sc.block_size = block_size_;
  sc.max_num_seqs = cfg.max_num_seqs;
  sc.max_num_batched_tokens = cfg.max_num_batched_tokens;
  sc.max_model_len = max_len_;
  sc.watermark_blocks = num_blocks_ / 100;  // 1%, as vLLM
  sc.enable_prefix_caching = cfg.enable_prefix_caching;
  sc.preemption_mode = cfg.preemption_mode;
  sc.block_bytes = block_bytes;
  sc.kv_owners = kv_owners;
  if (cfg.kv_offload) STRATA_RETURN_IF_ERROR(init_offload(cfg, sc));
  sched_ = std::make_unique<Scheduler>(sc);
  publish_metrics();
  thread_ = std::thread([this] { loop(); });
  return ok_status();
}

Result<std::string> ServingEngineImpl::apply_chat_template(const std::string& messages_json,
                                                           bool add_generation_prompt,
                                                           const std::string& tools_json) {
  if (!tokenizer_) return no_tokenizer();
  nlohmann::ordered_json messages = nlohmann::ordered_json::parse(messages_json, nullptr, false);
  if (messages.is_discarded() || !messages.is_array()) {
    return errorf(StatusCode::kInvalidArgument, "messages: expected a JSON array");
  }
  if (tokenizer_->chat_template().empty()) {
    // Base models ship no template: the messages as plain text, with a warning once.
    if (!warned_no_template_.exchange(true)) {
      log_warn("{}: the model has no chat template; chat requests are sent as plain text",
               info_.path);
    }
    const int32_t bos = tokenizer_->bos_id();
    return plain_chat_prompt(messages, bos >= 0 ? tokenizer_->id_to_token(bos) : std::string());
  }
  nlohmann::ordered_json tools = nullptr;
  if (!tools_json.empty()) {
    tools = nlohmann::ordered_json::parse(tools_json, nullptr, false);
    if (tools.is_discarded() || !tools.is_array()) {
      return errorf(StatusCode::kInvalidArgument, "tools: expected a JSON array");
    }
  }
  const int32_t bos = tokenizer_->bos_id(), eos = tokenizer_->eos_id();
  return strata::apply_chat_template(tokenizer_->chat_template(), messages, add_generation_prompt,
                                     bos >= 0 ? tokenizer_->id_to_token(bos) : std::string(),
                                     eos >= 0 ? tokenizer_->id_to_token(eos) : std::string(),
                                     tools);
}

Result<uint64_t> ServingEngineImpl::submit(CompletionRequest request, Callback on_event) {
  const int64_t n_prompt = static_cast<int64_t>(request.prompt_tokens.size());
  if (n_prompt == 0) return errorf(StatusCode::kInvalidArgument, "the prompt is empty");
  for (int32_t t : request.prompt_tokens) {
    if (t < 0 || t >= info_.vocab) {
      return errorf(StatusCode::kInvalidArgument,
                    "prompt token id {} is outside the vocabulary (0..{})", t, info_.vocab - 1);
    }
  }
  if (n_prompt >= max_len_) {
    return errorf(StatusCode::kOutOfRange,
                  "the prompt is {} tokens, but the context length is {} (needs room for at "
                  "least one new token)",
                  n_prompt, max_len_);
  }
  if (request.max_tokens < 1) {
    return errorf(StatusCode::kInvalidArgument, "max_tokens must be >= 1");
  }
  if (request.min_tokens < 0 || request.min_tokens > request.max_tokens) {
    return errorf(StatusCode::kInvalidArgument, "min_tokens must be in [0, max_tokens]");
  }
  if (request.top_logprobs < -1 || request.top_logprobs > kMaxTopLogprobs) {
    return errorf(StatusCode::kInvalidArgument, "top_logprobs must be in [0, {}]", kMaxTopLogprobs);
  }
  for (const std::string& s : request.stop) {
    if (s.empty()) return errorf(StatusCode::kInvalidArgument, "stop strings must not be empty");
  }
  STRATA_RETURN_IF_ERROR(validate_sampling(request.sampling));
  const int64_t max_len = std::min(n_prompt + request.max_tokens, max_len_);
  if ((max_len + block_size_ - 1) / block_size_ > max_seq_blocks_) {
    return errorf(StatusCode::kOutOfRange,
                  "prompt + max_tokens ({} tokens) needs more KV blocks than the cache has ({})",
                  max_len, max_seq_blocks_);
  }
  auto r = std::make_unique<RequestState>();
  r->sampler = std::make_unique<Sampler>(request.sampling);
  if (tokenizer_) r->decoder = std::make_unique<StreamingDecoder>(*tokenizer_);
  r->req = std::move(request);
  r->on_event = std::move(on_event);
  r->generated.reserve(static_cast<size_t>(r->req.max_tokens));
  r->arrival = Clock::now();
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!accepting_) {
      return errorf(StatusCode::kFailedPrecondition, "the serving engine is shutting down");
    }
    id = next_id_++;
    r->id = id;
    incoming_.push_back(std::move(r));
  }
  cv_.notify_one();
  return id;
}

void ServingEngineImpl::cancel(uint64_t id) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    cancels_.push_back(id);
  }
  cv_.notify_one();
}

void ServingEngineImpl::shutdown(bool drain) {
  std::lock_guard<std::mutex> guard(shutdown_mu_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    accepting_ = false;
    stop_ = true;
    drain_ = drain_ && drain;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void ServingEngineImpl::loop() {
  for (;;) {
    bool stop = false, drain = true;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] {
        return stop_ || !incoming_.empty() || !cancels_.empty() || sched_->has_work() ||
               !inflight_.empty();
      });
      incoming_local_.swap(incoming_);
      cancels_local_.swap(cancels_);
      stop = stop_;
      drain = drain_;
    }
    for (auto& r : incoming_local_) {
      const uint64_t id = r->id;
      Status st = sched_->add(id, r->req.prompt_tokens, r->req.max_tokens);
      RequestState& ref = *r;
      requests_.emplace(id, std::move(r));
      if (!st.ok()) {
        CompletionEvent ev;
        ev.error = st;
        finish(ref, std::move(ev), "error");
      }
    }
    incoming_local_.clear();
    if (stop && !drain) {
      for (auto& [id, r] : requests_) cancels_local_.push_back(id);
    }
    for (uint64_t id : cancels_local_) {
      auto it = requests_.find(id);
      if (it != requests_.end()) finish(*it->second, CompletionEvent{}, "abort");
    }
    cancels_local_.clear();
    if (sched_->has_work() || !inflight_.empty()) run_step();
    publish_metrics();
    if (stop && !sched_->has_work() && inflight_.empty()) break;
  }
}

Status ServingEngineImpl::init_offload(const ServingConfig& cfg, SchedulerConfig& sc) {
  if (cfg.kv_offload_groups < 0 || cfg.kv_offload_groups == 1 || cfg.kv_host_bytes < 0) {
    return errorf(StatusCode::kInvalidArgument,
                  "--kv-offload-groups must be 0 (automatic) or >= 2, --kv-host-gib >= 0");
  }
  const int64_t seq_blocks = (max_len_ + block_size_ - 1) / block_size_;
  const int64_t region = num_blocks_ / 2;
  if (region < seq_blocks) {
    return errorf(StatusCode::kInvalidArgument,
                  "--kv-offload: half the device KV pool ({} of {} blocks) must hold one "
                  "sequence of the context length {} ({} blocks); lower --max-model-len or "
                  "give the pool more memory",
                  region, num_blocks_, max_len_, seq_blocks);
  }
  int64_t host_blocks = cfg.kv_host_bytes / static_cast<int64_t>(block_bytes_);
  if (cfg.kv_host_bytes == 0)
    host_blocks = std::min(cfg.max_num_seqs * seq_blocks, 4 * num_blocks_);
  if (host_blocks <= num_blocks_) {
    return errorf(StatusCode::kInvalidArgument,
                  "--kv-host-gib: the host KV pool ({} blocks of {} KiB) must be larger than the "
                  "device pool ({} blocks), or there is nothing to offload",
                  host_blocks, block_bytes_ >> 10, num_blocks_);
  }
  // By default no more groups than sequences may run (a group of none is a wasted turn).
  const int64_t groups = cfg.kv_offload_groups > 0
                             ? cfg.kv_offload_groups
                             : std::min(default_offload_groups(num_blocks_, host_blocks),
                                        std::max<int64_t>(2, cfg.max_num_seqs));
  STRATA_RETURN_IF_ERROR(exec_->kv_offload_enable(host_blocks));
  offload_ = std::make_unique<KvOffloadPlan>(num_blocks_, host_blocks, block_size_, groups);
  sc.num_blocks = host_blocks;
  sc.offload_groups = groups;
  sc.group_blocks = region;
  sc.watermark_blocks = host_blocks / 100;
  sc.enable_prefix_caching = false;
  sc.preemption_mode = PreemptionMode::kRecompute;
  max_seq_blocks_ = region;
  log_info(
      "KV offload: {} host blocks ({:.2f} GiB), {} device blocks in two regions of {}, {} "
      "groups",
      host_blocks, static_cast<double>(host_blocks) * static_cast<double>(block_bytes_) / (1 << 30),
      num_blocks_, region, groups);
  return ok_status();
}

void ServingEngineImpl::run_offload_step() {
  KvOffloadPlan& plan = *offload_;
  const ScheduledStep& step = sched_->schedule(0, 0, plan.group());
  if (step.empty()) {
    plan.advance(/*ran=*/false);
    return;
  }
  auto job = std::make_unique<StepJob>();
  job->step = step;
  // 1. The step's blocks into this step's region; the forward waits for those loaded now.
  loads_.clear();
  Status st = plan.begin_step(job->step, &loads_)
                  ? ok_status()
                  : errorf(StatusCode::kInternal, "KV offload: a group outgrew its region");
  if (st.ok() && !loads_.empty()) st = exec_->kv_offload_load(loads_.device, loads_.host);
  if (st.ok()) st = exec_->kv_offload_wait_loads();
  // 2. Prefetch the next group into the other region while this step runs.
  prefetch_.clear();
  if (st.ok()) {
    const auto next = static_cast<int32_t>((plan.group() + 1) % plan.groups());
    const std::vector<const SchedSequence*> members = sched_->group_members(next);
    if (!plan.prefetch(members, &prefetch_)) prefetch_.clear();
    // Issued even when empty: the next forward pass in that region writes slots that the last
    // store from there may still be reading, and it waits for this transfer, which waits for
    // that store.
    st = exec_->kv_offload_load(prefetch_.device, prefetch_.host);
  }
  if (!st.ok()) {
    fail_step(job->step, st);
    return;
  }
  offload_loaded_ += static_cast<int64_t>(loads_.size() + prefetch_.size());
  // 3. The forward pass on this region (block tables translated to device slots).
  prepare(*job);
  st = exec_->submit(job->batch, job->greedy ? nullptr : job->logits.data(),
                     job->greedy ? job->ids.data() : nullptr);
  // 4. The blocks it wrote go back to the host pool after it.
  stores_.clear();
  if (st.ok()) {
    plan.stores(job->step, &stores_);
    st = exec_->kv_offload_store(stores_.device, stores_.host);
    offload_stored_ += static_cast<int64_t>(stores_.size());
  }
  if (!st.ok()) {
    fail_step(job->step, st);
    return;
  }
  inflight_.push_back(std::move(job));
  complete_oldest();
  plan.advance(/*ran=*/true);
}

void ServingEngineImpl::run_step() {
  if (offload_) {
    run_offload_step();
    return;
  }
  // Up to pipeline_depth() steps of disjoint sequences in flight (pipeline stages: seed 000's
  // generation schedule), each about 1/depth of the running sequences; else one step at a time.
  const int depth = std::max(1, exec_->pipeline_depth());
  while (static_cast<int>(inflight_.size()) < depth && sched_->has_work()) {
    // Pipelined: each step decodes about 1/depth of the running sequences and holds at most
    // 1/depth of max_num_seqs, so the steps in flight stay balanced and admissions go on.
    const int64_t decodes =
        depth > 1 ? std::max<int64_t>(1, (sched_->stats().running + depth - 1) / depth) : 0;
    const int64_t cap =
        depth > 1 ? std::max<int64_t>(1, (sched_->config().max_num_seqs + depth - 1) / depth) : 0;
    const ScheduledStep& step = sched_->schedule(cap, decodes);
    if (!step.swap_out.empty() || !step.swap_in.empty()) {
      // Swaps copy KV blocks through the executor: nothing may be in flight.
      while (!inflight_.empty()) complete_oldest();
      Status swap_st = ok_status();
      for (const BlockCopy& c : step.swap_out) {
        if (swap_st.ok()) {
          swap_st = exec_->copy_block_to_host(
              c.device_block, static_cast<uint8_t*>(swap_.data()) + c.host_slot * block_bytes_);
        }
      }
      for (const BlockCopy& c : step.swap_in) {
        if (swap_st.ok()) {
          swap_st = exec_->copy_block_from_host(
              c.device_block, static_cast<uint8_t*>(swap_.data()) + c.host_slot * block_bytes_);
        }
      }
      if (!swap_st.ok()) {
        fail_step(step, swap_st);
        return;
      }
    }
    if (step.empty()) break;
    auto job = std::make_unique<StepJob>();
    job->step = step;
    prepare(*job);
    const Status st = exec_->submit(job->batch, job->greedy ? nullptr : job->logits.data(),
                                    job->greedy ? job->ids.data() : nullptr);
    if (!st.ok()) {
      fail_step(job->step, st);
      return;
    }
    inflight_.push_back(std::move(job));
    ++steps_total_;
    step_tokens_total_ += static_cast<int64_t>(inflight_.back()->tokens.size());
    max_in_flight_ = std::max(max_in_flight_, static_cast<int64_t>(inflight_.size()));
  }
  if (!inflight_.empty()) complete_oldest();
}

void ServingEngineImpl::prepare(StepJob& job) {
  const ScheduledStep& step = job.step;
  int64_t max_blocks = 1;
  for (const ScheduledSeq& s : step.seqs) {
    max_blocks = std::max(max_blocks, static_cast<int64_t>(s.seq->block_table.size()));
  }
  const auto n_seqs = static_cast<int64_t>(step.seqs.size());
  job.block_tables.assign(static_cast<size_t>(n_seqs * max_blocks), 0);
  for (int64_t i = 0; i < n_seqs; ++i) {
    const ScheduledSeq& s = step.seqs[static_cast<size_t>(i)];
    for (int64_t p = s.begin; p < s.end; ++p) {
      job.tokens.push_back(s.seq->tokens[static_cast<size_t>(p)]);
      job.token_seq.push_back(static_cast<int32_t>(i));
      job.token_pos.push_back(static_cast<int32_t>(p));
    }
    if (offload_) {
      // Host blocks -> the device slots they sit in for this step.
      for (size_t b = 0; b < s.seq->block_table.size(); ++b) {
        job.block_tables[static_cast<size_t>(i * max_blocks) + b] =
            offload_->device_block(s.seq->block_table[b]);
      }
    } else {
      std::copy(s.seq->block_table.begin(), s.seq->block_table.end(),
                job.block_tables.begin() + i * max_blocks);
    }
    if (s.needs_logits) {
      job.logit_rows.push_back(static_cast<int32_t>(job.tokens.size() - 1));
      job.with_logits.emplace_back(s.id, static_cast<int64_t>(job.logit_rows.size() - 1));
    }
    if (s.begin < s.seq->n_prompt) {
      prompt_tokens_total_ += std::min(s.end, s.seq->n_prompt) - s.begin;
    }
  }
  job.batch.tokens = job.tokens;
  job.batch.token_seq = job.token_seq;
  job.batch.token_pos = job.token_pos;
  job.batch.block_tables = job.block_tables.data();
  job.batch.max_blocks_per_seq = max_blocks;
  job.batch.n_seqs = n_seqs;
  job.batch.logit_rows = job.logit_rows;
  // When every request wanting a token this step is plain greedy, the executor picks the tokens
  // (on the GPU: only the ids come back, not [rows, vocab] logits).
  job.greedy = !job.with_logits.empty();
  for (auto& [id, row] : job.with_logits) {
    auto it = requests_.find(id);
    if (it != requests_.end() && !plain_greedy(*it->second)) job.greedy = false;
  }
  if (job.greedy) {
    job.ids.resize(job.logit_rows.size());
  } else {
    job.logits.resize(job.logit_rows.size() * static_cast<size_t>(info_.vocab));
  }
}

void ServingEngineImpl::complete_oldest() {
  std::unique_ptr<StepJob> job = std::move(inflight_.front());
  inflight_.pop_front();
  const Status st = exec_->wait();
  if (!st.ok()) {
    fail_step(job->step, st);
    return;
  }
  sched_->complete_step(job->step);
  const int64_t V = info_.vocab;
  for (auto& [id, row] : job->with_logits) {
    auto it = requests_.find(id);  // cancelled while in flight: gone
    if (it == requests_.end()) continue;
    if (job->greedy) {
      emit_token(*it->second, job->ids[static_cast<size_t>(row)], 0.0f, CompletionEvent{});
    } else {
      on_logits(*it->second, job->logits.data() + row * V);
    }
  }
}

void ServingEngineImpl::fail_step(const ScheduledStep& step, const Status& st) {
  std::vector<uint64_t> ids;
  for (const ScheduledSeq& s : step.seqs) ids.push_back(s.id);
  for (uint64_t id : ids) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    CompletionEvent ev;
    ev.error = st;
    finish(*it->second, std::move(ev), "error");
  }
}

void ServingEngineImpl::on_logits(RequestState& r, float* row) {
  const int64_t V = info_.vocab;
  const CompletionRequest& q = r.req;
  const auto n_gen = static_cast<int64_t>(r.generated.size());
  CompletionEvent ev;
  // Log-softmax of the raw logits, before penalties, masks and temperature.
  float lse = 0.0f;
  if (q.top_logprobs >= 0) {
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < V; ++i) mx = std::max(mx, row[i]);
    double sum = 0.0;
    for (int64_t i = 0; i < V; ++i) sum += std::exp(static_cast<double>(row[i] - mx));
    lse = mx + static_cast<float>(std::log(sum));
    logprob_scratch_.assign(row, row + V);
  }
  // min_tokens: end-of-sequence and stop tokens cannot be sampled yet.
  if (n_gen < q.min_tokens) {
    const float ninf = -std::numeric_limits<float>::infinity();
    if (!q.ignore_eos && tokenizer_) {
      for (int32_t t : tokenizer_->eot_ids()) {
        if (t >= 0 && t < V) row[t] = ninf;
      }
    }
    for (int32_t t : q.stop_token_ids) {
      if (t >= 0 && t < V) row[t] = ninf;
    }
  }
  const int32_t tok = r.sampler->sample(row, V, q.prompt_tokens, r.generated);
  emit_token(r, tok, lse, std::move(ev));
}

bool ServingEngineImpl::plain_greedy(const RequestState& r) const {
  const CompletionRequest& q = r.req;
  const SamplingParams& p = q.sampling;
  return p.temperature <= 0.0f && q.top_logprobs < 0 && p.repetition_penalty == 1.0f &&
         p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f && p.logit_bias.empty() &&
         static_cast<int64_t>(r.generated.size()) >= q.min_tokens;
}

void ServingEngineImpl::emit_token(RequestState& r, int32_t tok, float lse, CompletionEvent ev) {
  const CompletionRequest& q = r.req;
  const auto n_gen = static_cast<int64_t>(r.generated.size());
  const int64_t V = info_.vocab;
  const Clock::time_point now = Clock::now();
  if (n_gen == 0) {
    r.first_token = now;
    ttft_.observe(seconds_between(r.arrival, now));
  }
  r.last_token = now;
  ++generation_tokens_total_;
  if (q.top_logprobs >= 0) {
    TokenLogprob lp;
    lp.token = tok;
    lp.logprob = logprob_scratch_[static_cast<size_t>(tok)] - lse;
    if (q.top_logprobs > 0) {
      std::vector<int32_t>& ids = top_ids_;
      ids.resize(static_cast<size_t>(V));
      for (int64_t i = 0; i < V; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>(i);
      const auto k = std::min<int64_t>(q.top_logprobs, V);
      std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
        return logprob_scratch_[static_cast<size_t>(a)] > logprob_scratch_[static_cast<size_t>(b)];
      });
      for (int64_t i = 0; i < k; ++i) {
        const int32_t id = ids[static_cast<size_t>(i)];
        lp.top.emplace_back(id, logprob_scratch_[static_cast<size_t>(id)] - lse);
      }
    }
    ev.logprobs.push_back(std::move(lp));
  }
  ev.tokens.push_back(tok);

  const bool is_stop_token =
      (!q.ignore_eos && tokenizer_ && tokenizer_->is_eot(tok)) ||
      std::find(q.stop_token_ids.begin(), q.stop_token_ids.end(), tok) != q.stop_token_ids.end();
  if (is_stop_token) {
    // The stop token is reported in `tokens` but adds no text.
    if (r.decoder) r.pending_text += r.decoder->flush();
    ev.text = std::move(r.pending_text);
    ++ev.completion_tokens;
    finish(r, std::move(ev), "stop");
    return;
  }
  r.generated.push_back(tok);
  sched_->append_token(r.id, tok);
  if (r.decoder) r.pending_text += r.decoder->push(tok);
  const bool at_length =
      static_cast<int64_t>(r.generated.size()) >= q.max_tokens ||
      static_cast<int64_t>(q.prompt_tokens.size() + r.generated.size()) >= max_len_;
  if (at_length && r.decoder) r.pending_text += r.decoder->flush();
  const bool check_stops =
      !q.stop.empty() && static_cast<int64_t>(r.generated.size()) >= q.min_tokens;
  if (check_stops) {
    const size_t pos = find_stop(r.pending_text, q.stop);
    if (pos != std::string::npos) {
      ev.text = r.pending_text.substr(0, pos);
      r.pending_text.clear();
      finish(r, std::move(ev), "stop");
      return;
    }
  }
  if (at_length) {
    ev.text = std::move(r.pending_text);
    r.pending_text.clear();
    finish(r, std::move(ev), "length");
    return;
  }
  const size_t hold = check_stops ? stop_holdback(r.pending_text, q.stop) : 0;
  ev.text = r.pending_text.substr(0, r.pending_text.size() - hold);
  r.pending_text.erase(0, r.pending_text.size() - hold);
  ev.prompt_tokens = static_cast<int64_t>(q.prompt_tokens.size());
  ev.completion_tokens = static_cast<int64_t>(r.generated.size());
  if (const SchedSequence* s = sched_->find(r.id)) ev.cached_prompt_tokens = s->n_cached_prompt;
  if (r.on_event) r.on_event(ev);
}

void ServingEngineImpl::finish(RequestState& r, CompletionEvent ev, const char* reason) {
  if (const SchedSequence* s = sched_->find(r.id)) r.cached_prompt_tokens = s->n_cached_prompt;
  sched_->finish(r.id);
  const Clock::time_point now = Clock::now();
  ev.finished = true;
  ev.finish_reason = reason;
  ev.prompt_tokens = static_cast<int64_t>(r.req.prompt_tokens.size());
  ev.completion_tokens = static_cast<int64_t>(r.generated.size()) + ev.completion_tokens;
  ev.cached_prompt_tokens = r.cached_prompt_tokens;
  if (r.generated.size() > 1) {
    tpot_.observe(seconds_between(r.first_token, r.last_token) /
                  static_cast<double>(r.generated.size() - 1));
  }
  e2e_.observe(seconds_between(r.arrival, now));
  // request_success_total counts requests that ran to their end (stop or length), as vLLM's;
  // cancelled ("abort") and failed ("error") requests are not successes.
  if (std::strcmp(reason, "stop") == 0 || std::strcmp(reason, "length") == 0) ++finished_total_;
  const uint64_t id = r.id;
  if (r.on_event) r.on_event(ev);
  requests_.erase(id);
}

void ServingEngineImpl::publish_metrics() {
  const SchedulerStats st = sched_->stats();
  running_max_ = std::max(running_max_, st.running);
  std::lock_guard<std::mutex> lk(metrics_mu_);
  ServingMetrics& m = metrics_;
  m.running = st.running;
  m.waiting = st.waiting;
  m.swapped = st.swapped;
  m.kv_blocks_total = st.blocks_total;
  m.kv_blocks_used = st.blocks_used;
  m.prompt_tokens_total = prompt_tokens_total_;
  m.generation_tokens_total = generation_tokens_total_;
  m.requests_finished_total = finished_total_;
  m.preemptions_total = st.preemptions_total;
  m.prefix_cache_hits_total = st.prefix_cache_hit_tokens;
  m.prefix_cache_queries_total = st.prefix_cache_queries_tokens;
  m.steps_total = steps_total_;
  m.step_tokens_total = step_tokens_total_;
  m.max_steps_in_flight = max_in_flight_;
  m.pipeline_bubble = exec_->measured_bubble();
  m.running_max = running_max_;
  if (offload_) {
    m.kv_offload_groups = offload_->groups();
    m.kv_host_blocks_total = st.blocks_total;
    m.kv_offload_loaded_blocks_total = offload_loaded_;
    m.kv_offload_stored_blocks_total = offload_stored_;
  }
  m.bucket_bounds = ttft_.bounds;
  m.ttft_buckets = ttft_.buckets;
  m.tpot_buckets = tpot_.buckets;
  m.e2e_buckets = e2e_.buckets;
  m.ttft_sum = ttft_.sum;
  m.tpot_sum = tpot_.sum;
  m.e2e_sum = e2e_.sum;
  m.ttft_count = ttft_.count;
  m.tpot_count = tpot_.count;
  m.e2e_count = e2e_.count;
}

ServingMetrics ServingEngineImpl::metrics() const {
  std::lock_guard<std::mutex> lk(metrics_mu_);
  return metrics_;
}

}  // namespace

LatencyHistogram::LatencyHistogram(std::span<const double> upper_bounds)
    : bounds(upper_bounds.begin(), upper_bounds.end()), buckets(upper_bounds.size(), 0) {}

void LatencyHistogram::observe(double seconds) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (seconds <= bounds[i]) ++buckets[i];
  }
  sum += seconds;
  ++count;
}

std::span<const double> default_latency_buckets() {
  return kLatencyBuckets;
}

size_t stop_holdback(std::string_view text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const std::string& s : stops) {
    const size_t max_k = std::min(s.size() - 1, text.size());
    for (size_t k = max_k; k > hold; --k) {
      if (text.substr(text.size() - k) == std::string_view(s).substr(0, k)) {
        hold = k;
        break;
      }
    }
  }
  return hold;
}

size_t find_stop(std::string_view text, const std::vector<std::string>& stops) {
  size_t best = std::string_view::npos;
  for (const std::string& s : stops) best = std::min(best, text.find(s));
  return best;
}

int launcher_rank() {
  return std::max(0, env_config().launcher_rank);
}

Result<std::unique_ptr<ServingEngine>> ServingEngine::create(const ServingConfig& config) {
  auto engine = std::make_unique<ServingEngineImpl>();
  STRATA_RETURN_IF_ERROR(engine->init(config));
  return std::unique_ptr<ServingEngine>(std::move(engine));
}

}  // namespace strata
