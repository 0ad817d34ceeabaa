// libFuzzer target for the OpenAI request parsing (JSON body -> CompletionRequest) of
// src/server/openai_routes.cpp, driven through OpenAIRoutes::handle with an in-process engine and
// responder (no sockets). The first input byte picks the route; the rest is the body. Any body
// must get exactly one complete answer: 200 (a generation, tokens or text) or a 4xx error object,
// never a crash, a hang, a 500 (an exception that escaped the validation) or a second answer.
// Seeds: tests/fuzz/corpus/openai_request/ (valid requests of every route, nesting, huge numbers).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "server/openai_routes.h"

namespace {

using strata::CompletionEvent;
using strata::CompletionRequest;
using strata::Result;
using strata::Status;
using strata::StatusCode;

// Tokens are bytes + 3; the "template" is the messages JSON itself. submit() finishes the request
// at once (on the calling thread, before it returns, as the real engine's loop thread may).
class InstantEngine : public strata::ServingEngine {
 public:
  InstantEngine() {
    info_.path = "/models/fuzz";
    info_.architecture = "fuzz";
    info_.vocab = 300;
    info_.context_length = 256;
  }
  const strata::ModelInfo& info() const override { return info_; }
  const std::string& model_name() const override { return name_; }
  int64_t max_model_len() const override { return 256; }
  Result<std::vector<int32_t>> tokenize(const std::string& text, bool add_special) override {
    std::vector<int32_t> out;
    if (add_special) out.push_back(1);
    for (unsigned char c : text) out.push_back(static_cast<int32_t>(c) + 3);
    return out;
  }
  std::string detokenize(const std::vector<int32_t>& tokens) override {
    std::string s;
    for (int32_t t : tokens) {
      if (t >= 3 && t < 259) s += static_cast<char>(t - 3);
    }
    return s;
  }
  Result<std::string> apply_chat_template(const std::string& messages_json, bool add_gen,
                                          const std::string&) override {
    return messages_json + (add_gen ? "\nassistant:" : "");
  }
  Result<uint64_t> submit(CompletionRequest request, Callback on_event) override {
    if (request.prompt_tokens.empty() || request.prompt_tokens.size() >= 256)
      return Status(StatusCode::kInvalidArgument, "bad prompt length");
    if (request.max_tokens < 1 || request.max_tokens > 256)
      __builtin_trap();  // the routes must have bounded max_tokens by the context
    CompletionEvent ev;
    ev.text = "ok";
    ev.tokens = {'o' + 3, 'k' + 3};
    for (int32_t t : ev.tokens) {
      strata::TokenLogprob lp;
      lp.token = t;
      lp.logprob = -0.5f;
      for (int k = 0; k < request.top_logprobs; ++k) lp.top.emplace_back(t, -0.5f);
      ev.logprobs.push_back(lp);
    }
    ev.finished = true;
    ev.finish_reason = "length";
    ev.prompt_tokens = static_cast<int64_t>(request.prompt_tokens.size());
    ev.completion_tokens = 2;
    on_event(ev);
    return ++next_id_;
  }
  void cancel(uint64_t) override {}
  strata::ServingMetrics metrics() const override { return {}; }
  void shutdown(bool) override {}

 private:
  strata::ModelInfo info_;
  std::string name_ = "fuzz-model";
  uint64_t next_id_ = 0;
};

class Recorder : public strata::server::Responder {
 public:
  void respond(strata::server::HttpResponse r) override {
    if (done_ || streaming_) __builtin_trap();  // a second answer
    done_ = true;
    status_ = r.status;
    body_ = std::move(r.body);
  }
  void start_stream(int status, const std::string&) override {
    if (done_ || streaming_) __builtin_trap();
    streaming_ = true;
    status_ = status;
  }
  void write(std::string data) override {
    if (!streaming_ || done_) __builtin_trap();
    body_ += data;
  }
  void end() override {
    if (!streaming_ || done_) __builtin_trap();
    done_ = true;
  }
  void on_disconnect(std::function<void()>) override {}
  bool disconnected() const override { return false; }

  bool done_ = false, streaming_ = false;
  int status_ = 0;
  std::string body_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const char* kRoutes[] = {"/v1/completions", "/v1/chat/completions", "/tokenize",
                                  "/detokenize"};
  static auto engine = std::make_shared<InstantEngine>();
  strata::server::OpenAIRoutes routes(strata::server::OpenAIOptions{});
  routes.set_engine(engine);
  strata::server::HttpRequest req;
  req.method = "POST";
  req.target = kRoutes[data[0] % 4];
  req.body.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  auto rec = std::make_shared<Recorder>();
  routes.handle(req, rec);
  if (!rec->done_) __builtin_trap();  // no answer (or a stream never ended)
  if (rec->status_ != 200 && !(rec->status_ >= 400 && rec->status_ < 500)) __builtin_trap();
  if (!rec->streaming_) {
    // Every whole answer is one JSON object; an error names what was wrong.
    const auto j = nlohmann::json::parse(rec->body_, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) __builtin_trap();
    if (rec->status_ != 200) {
      if (!j.contains("error") || !j["error"].contains("message") ||
          !j["error"]["message"].is_string() || j["error"]["message"].get<std::string>().empty())
        __builtin_trap();
    }
  }
  return 0;
}
