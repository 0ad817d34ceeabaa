// FakeServingEngine: a deterministic stand-in for the real ServingEngine, for server tests.
//
// Tokens are bytes (+3; 1 = BOS); the chat template is "role: content\n" lines. A request's
// k-th generated token is the letter 'a' + (sum(prompt) + k) % 26, one token per request every
// `token_delay` on one loop thread (like the real engine, callbacks come from that thread).
// A prompt whose text contains "ENGINE_ERROR" finishes with finish_reason "error".
// cancel() is recorded; a cancelled request finishes with "abort".
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "strata/serving.h"

namespace strata::testing {

class FakeServingEngine : public ServingEngine {
 public:
  explicit FakeServingEngine(std::chrono::milliseconds token_delay = std::chrono::milliseconds(1),
                             int64_t max_model_len = 256)
      : delay_(token_delay), max_model_len_(max_model_len) {
    info_.path = "/models/fake";
    info_.architecture = "fake";
    info_.vocab = 300;
    info_.context_length = max_model_len;
    loop_ = std::thread([this] { run(); });
  }
  ~FakeServingEngine() override { shutdown(false); }

  static constexpr int32_t kBos = 1;
  static std::string expected_text(const std::vector<int32_t>& prompt, int64_t n) {
    int64_t sum = 0;
    for (int32_t t : prompt) sum += t;
    std::string s;
    for (int64_t k = 0; k < n; ++k) s += static_cast<char>('a' + (sum + k) % 26);
    return s;
  }
  static std::vector<int32_t> encode(const std::string& text, bool bos) {
    std::vector<int32_t> out;
    if (bos) out.push_back(kBos);
    for (unsigned char c : text) out.push_back(static_cast<int32_t>(c) + 3);
    return out;
  }

  const ModelInfo& info() const override { return info_; }
  const std::string& model_name() const override { return name_; }
  int64_t max_model_len() const override { return max_model_len_; }

  Result<std::vector<int32_t>> tokenize(const std::string& text, bool add_special) override {
    return encode(text, add_special);
  }
  std::string detokenize(const std::vector<int32_t>& tokens) override {
    std::string s;
    for (int32_t t : tokens) {
      if (t >= 3 && t < 259) s += static_cast<char>(t - 3);
    }
    return s;
  }
  Result<std::string> apply_chat_template(const std::string& messages_json,
                                          bool add_generation_prompt, const std::string&) override {
    // Minimal: the messages JSON text itself is the conversation, plus the generation prompt.
    last_template_input_ = messages_json;
    // As the template engine words its errors (src/chat/chat_template.cpp).
    if (messages_json.find("TEMPLATE_ERROR") != std::string::npos)
      return Status(StatusCode::kInvalidArgument, "chat template: line 1: TEMPLATE_ERROR raised");
    return messages_json + (add_generation_prompt ? "\nassistant:" : "");
  }

  Result<uint64_t> submit(CompletionRequest request, Callback on_event) override {
    if (request.prompt_tokens.empty()) return Status(StatusCode::kInvalidArgument, "empty prompt");
    if (static_cast<int64_t>(request.prompt_tokens.size()) >= max_model_len_) {
      return Status(StatusCode::kOutOfRange, "prompt too long");
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Status(StatusCode::kFailedPrecondition, "engine is shutting down");
    const uint64_t id = next_id_++;
    Req r;
    r.request = std::move(request);
    r.cb = std::move(on_event);
    r.error = detokenize(r.request.prompt_tokens).find("ENGINE_ERROR") != std::string::npos;
    for (int32_t t : r.request.prompt_tokens) r.sum += t;
    active_.emplace(id, std::move(r));
    submitted_.push_back(id);
    cv_.notify_all();
    return id;
  }

  void cancel(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_.insert(id);
    auto it = active_.find(id);
    if (it != active_.end()) it->second.cancelled = true;
  }

  ServingMetrics metrics() const override {
    std::lock_guard<std::mutex> lock(mu_);
    ServingMetrics m;
    m.running = static_cast<int64_t>(active_.size());
    m.kv_blocks_total = 100;
    m.kv_blocks_used = m.running;
    m.prompt_tokens_total = prompt_total_;
    m.generation_tokens_total = gen_total_;
    m.requests_finished_total = finished_;
    m.bucket_bounds = {0.01, 0.1, 1.0};
    m.ttft_buckets = {finished_, finished_, finished_};
    m.tpot_buckets = m.ttft_buckets;
    m.e2e_buckets = m.ttft_buckets;
    m.ttft_count = m.tpot_count = m.e2e_count = finished_;
    return m;
  }

  void shutdown(bool drain) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_ && !loop_.joinable()) return;
      stopping_ = true;
      if (!drain) {
        for (auto& [id, r] : active_) r.cancelled = true;
      }
      cv_.notify_all();
    }
    if (loop_.joinable()) loop_.join();
  }

  // ---- for assertions ----
  bool was_cancelled(uint64_t id) const {
    std::lock_guard<std::mutex> lock(mu_);
    return cancelled_.count(id) > 0;
  }
  std::vector<uint64_t> submitted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return submitted_;
  }
  size_t cancelled_count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cancelled_.size();
  }
  int64_t running() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(active_.size());
  }
  std::string last_template_input_;

 private:
  struct Req {
    CompletionRequest request;
    Callback cb;
    int64_t sum = 0;
    int64_t produced = 0;
    bool cancelled = false;
    bool error = false;
  };

  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || !active_.empty(); });
      if (active_.empty() && stopping_) return;
      // One step: every active request makes one token (or finishes).
      std::vector<std::pair<Callback, CompletionEvent>> events;
      for (auto it = active_.begin(); it != active_.end();) {
        Req& r = it->second;
        CompletionEvent ev;
        ev.prompt_tokens = static_cast<int64_t>(r.request.prompt_tokens.size());
        if (r.cancelled) {
          ev.finished = true;
          ev.finish_reason = "abort";
        } else if (r.error) {
          ev.finished = true;
          ev.finish_reason = "error";
          ev.error = Status(StatusCode::kInternal, "fake engine failure");
        } else {
          const char c = static_cast<char>('a' + (r.sum + r.produced) % 26);
          ev.text = std::string(1, c);
          ev.tokens = {static_cast<int32_t>(c) + 3};
          if (r.request.top_logprobs >= 0) {
            TokenLogprob lp;
            lp.token = ev.tokens[0];
            lp.logprob = -0.5f;
            for (int k = 0; k < r.request.top_logprobs; ++k)
              lp.top.emplace_back(ev.tokens[0] + k, -0.5f - k);
            ev.logprobs.push_back(lp);
          }
          ++r.produced;
          ++gen_total_;
          if (r.produced >= r.request.max_tokens) {
            ev.finished = true;
            ev.finish_reason = "length";
          }
        }
        ev.completion_tokens = r.produced;
        events.emplace_back(r.cb, ev);
        if (ev.finished) {
          prompt_total_ += ev.prompt_tokens;
          ++finished_;
          it = active_.erase(it);
        } else {
          ++it;
        }
      }
      lock.unlock();
      for (auto& [cb, ev] : events) cb(ev);
      std::this_thread::sleep_for(delay_);
      lock.lock();
    }
  }

  std::chrono::milliseconds delay_;
  int64_t max_model_len_;
  ModelInfo info_;
  std::string name_ = "fake-model";
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Req> active_;
  std::vector<uint64_t> submitted_;
  std::set<uint64_t> cancelled_;
  int64_t prompt_total_ = 0, gen_total_ = 0, finished_ = 0;
  uint64_t next_id_ = 1;
  bool stopping_ = false;
  std::thread loop_;
};

}  // namespace strata::testing
