// OpenAI-compatible routes. Parsing and validation happen on the connection's thread; generation
// events arrive on the engine loop thread and are turned into response bytes there (the
// Responder hands them to the connection's strand, so nothing here blocks the engine).
#include "server/openai_routes.h"

#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "core/json_depth.h"
#include "server/metrics.h"

namespace strata::server {

namespace {

using Json = nlohmann::ordered_json;

std::string dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// A request error: thrown inside a handler, turned into an error object at the top.
struct ApiError {
  int status;
  std::string message;
  std::string param;
  std::string code;
};

const char* error_type(int status) {
  switch (status) {
    case 400:
    case 413:
    case 422:
    case 431:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 405:
      return "invalid_request_error";
    case 503:
      return "service_unavailable";
    default:
      return "server_error";
  }
}

[[noreturn]] void bad(const std::string& param, const std::string& message,
                      const std::string& code = "invalid_value") {
  throw ApiError{400, message, param, code};
}

bool valid_utf8(const std::string& s) {
  size_t i = 0, n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else
      return false;
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += len;
  }
  return true;
}

// NOTE: nlohmann's parser keeps its own stack, but copying, comparing or dumping a value recurses
// once per level, so a body nested ~100,000 arrays deep would overflow the thread's stack in
// the code that reads it. Bodies deeper than this are refused before they are parsed.
constexpr int kMaxJsonDepth = 512;

Json parse_body(const HttpRequest& req) {
  if (!valid_utf8(req.body))
    throw ApiError{400, "request body is not valid UTF-8", "", "invalid_utf8"};
  if (json_too_deep(req.body, kMaxJsonDepth)) {
    throw ApiError{400,
                   "request body nesting too deep (more than " + std::to_string(kMaxJsonDepth) +
                       " levels of arrays/objects)",
                   "", "invalid_json"};
  }
  Json j = Json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ApiError{400, "request body is not valid JSON", "", "invalid_json"};
  if (!j.is_object()) throw ApiError{400, "request body must be a JSON object", "", "invalid_json"};
  return j;
}

bool present(const Json& j, const char* key) {
  return j.contains(key) && !j.at(key).is_null();
}

double get_number(const Json& j, const char* key, double def, double lo, double hi,
                  bool lo_open = false) {
  if (!present(j, key)) return def;
  const Json& v = j.at(key);
  if (!v.is_number()) bad(key, std::string("'") + key + "' must be a number", "invalid_type");
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo)) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "'%s' must be in %c%g, %g], got %g", key, lo_open ? '(' : '[',
                  lo, hi, x);
    bad(key, buf);
  }
  return x;
}

int64_t get_int(const Json& j, const char* key, int64_t def, int64_t lo, int64_t hi) {
  if (!present(j, key)) return def;
  const Json& v = j.at(key);
  if (!v.is_number_integer()) {
    if (v.is_number_float() && std::isfinite(v.get<double>()) &&
        v.get<double>() == std::floor(v.get<double>()) && std::fabs(v.get<double>()) < 9e15) {
      const auto x = static_cast<int64_t>(v.get<double>());
      if (x >= lo && x <= hi) return x;
    }
    if (!v.is_number()) bad(key, std::string("'") + key + "' must be an integer", "invalid_type");
  }
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    bad(key, std::string("'") + key + "' is out of range");
  }
  // NOTE: a float such as 1e30 is not converted (that would be undefined behaviour).
  const int64_t x = v.is_number_integer() ? v.get<int64_t>() : 0;
  if (!v.is_number_integer() || x < lo || x > hi) {
    bad(key, std::string("'") + key + "' must be an integer in [" + std::to_string(lo) + ", " +
                 std::to_string(hi) + "], got " + v.dump());
  }
  return x;
}

bool get_bool(const Json& j, const char* key, bool def) {
  if (!present(j, key)) return def;
  if (!j.at(key).is_boolean())
    bad(key, std::string("'") + key + "' must be a boolean", "invalid_type");
  return j.at(key).get<bool>();
}

std::string random_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng(std::random_device{}() ^ counter.fetch_add(1));
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s%016llx%08llx", prefix, static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(counter.fetch_add(1) & 0xffffffff));
  return buf;
}

int64_t now_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

HttpResponse json_response(int status, const Json& body) {
  HttpResponse r;
  r.status = status;
  r.body = dump(body);
  return r;
}

int status_for(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk:
      return 200;
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      return 400;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kFailedPrecondition:
    case StatusCode::kCancelled:
      return 503;
    case StatusCode::kDeadlineExceeded:
      return 504;
    case StatusCode::kUnimplemented:
    case StatusCode::kDataLoss:
    case StatusCode::kIoError:
    case StatusCode::kOutOfMemory:
    case StatusCode::kInternal:
      return 500;
  }
  return 500;
}

std::vector<int32_t> token_array(const Json& v, const char* param, int64_t vocab) {
  std::vector<int32_t> out;
  out.reserve(v.size());
  for (const auto& t : v) {
    if (!t.is_number_integer())
      bad(param, std::string("'") + param + "' must hold integer token ids", "invalid_type");
    const int64_t id = t.get<int64_t>();
    if (id < 0 || (vocab > 0 && id >= vocab) || id > INT32_MAX) {
      bad(param, std::string("token id ") + std::to_string(id) + " in '" + param +
                     "' is out of range [0, " + std::to_string(vocab) + ")");
    }
    out.push_back(static_cast<int32_t>(id));
  }
  return out;
}

// Everything a generation needs besides the prompt.
struct GenOptions {
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;
};

// Sampling and stopping fields shared by both endpoints. `chat` changes only the logprobs shape
// and the default max_tokens.
void parse_sampling(const Json& j, bool chat, int64_t vocab, CompletionRequest& req,
                    GenOptions& opt) {
  auto& s = req.sampling;
  s.temperature = static_cast<float>(get_number(j, "temperature", 1.0, 0.0, 2.0));
  s.top_p = static_cast<float>(get_number(j, "top_p", 1.0, 0.0, 1.0, /*lo_open=*/true));
  const int64_t top_k = get_int(j, "top_k", 0, -1, INT32_MAX);
  s.top_k = top_k < 0 ? 0 : static_cast<int>(top_k);
  s.min_p = static_cast<float>(get_number(j, "min_p", 0.0, 0.0, 1.0));
  s.presence_penalty = static_cast<float>(get_number(j, "presence_penalty", 0.0, -2.0, 2.0));
  s.frequency_penalty = static_cast<float>(get_number(j, "frequency_penalty", 0.0, -2.0, 2.0));
  s.repetition_penalty =
      static_cast<float>(get_number(j, "repetition_penalty", 1.0, 0.0, 100.0, true));
  if (present(j, "seed")) {
    s.seed = static_cast<uint64_t>(get_int(j, "seed", 0, INT64_MIN, INT64_MAX));
  } else {
    s.seed = std::random_device{}();
  }
  if (present(j, "logit_bias")) {
    const Json& lb = j.at("logit_bias");
    if (!lb.is_object())
      bad("logit_bias", "'logit_bias' must be an object of token id -> bias", "invalid_type");
    for (const auto& [key, val] : lb.items()) {
      char* end = nullptr;
      const long long id = std::strtoll(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || id < 0 || (vocab > 0 && id >= vocab) || id > INT32_MAX) {
        bad("logit_bias", "'logit_bias' key '" + key + "' is not a token id in [0, " +
                              std::to_string(vocab) + ")");
      }
      if (!val.is_number() || !std::isfinite(val.get<double>()) || val.get<double>() < -100 ||
          val.get<double>() > 100) {
        bad("logit_bias", "'logit_bias' values must be numbers in [-100, 100]");
      }
      s.logit_bias.emplace_back(static_cast<int32_t>(id), val.get<float>());
    }
  }

  if (get_int(j, "n", 1, 1, INT32_MAX) != 1) bad("n", "only n=1 is supported");
  if (get_int(j, "best_of", 1, 1, INT32_MAX) != 1) bad("best_of", "only best_of=1 is supported");
  if (get_bool(j, "echo", false)) bad("echo", "'echo' is not supported");

  if (present(j, "stop")) {
    const Json& st = j.at("stop");
    if (st.is_string()) {
      if (!st.get<std::string>().empty()) req.stop.push_back(st.get<std::string>());
    } else if (st.is_array()) {
      if (st.size() > 16) bad("stop", "at most 16 stop strings are allowed");
      for (const auto& x : st) {
        if (!x.is_string())
          bad("stop", "'stop' must be a string or a list of strings", "invalid_type");
        if (!x.get<std::string>().empty()) req.stop.push_back(x.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or a list of strings", "invalid_type");
    }
  }
  if (present(j, "stop_token_ids")) {
    if (!j.at("stop_token_ids").is_array())
      bad("stop_token_ids", "'stop_token_ids' must be a list", "invalid_type");
    req.stop_token_ids = token_array(j.at("stop_token_ids"), "stop_token_ids", vocab);
  }
  req.ignore_eos = get_bool(j, "ignore_eos", false);
  req.min_tokens = get_int(j, "min_tokens", 0, 0, INT32_MAX);

  if (chat) {
    opt.logprobs = get_bool(j, "logprobs", false);
    const int64_t top = get_int(j, "top_logprobs", 0, 0, 20);
    if (present(j, "top_logprobs") && !opt.logprobs)
      bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    req.top_logprobs = opt.logprobs ? static_cast<int>(top) : -1;
  } else {
    if (present(j, "logprobs")) {
      if (j.at("logprobs").is_boolean())
        bad("logprobs", "'logprobs' must be an integer for completions", "invalid_type");
      req.top_logprobs = static_cast<int>(get_int(j, "logprobs", 0, 0, 20));
      opt.logprobs = true;
    }
  }

  opt.stream = get_bool(j, "stream", false);
  if (present(j, "stream_options")) {
    const Json& so = j.at("stream_options");
    if (!so.is_object())
      bad("stream_options", "'stream_options' must be an object", "invalid_type");
    if (!opt.stream)
      bad("stream_options", "'stream_options' is only allowed when 'stream' is true");
    opt.include_usage = get_bool(so, "include_usage", false);
  }
}

// max_tokens / max_completion_tokens against the context.
void parse_max_tokens(const Json& j, bool chat, int64_t prompt_len, int64_t max_model_len,
                      CompletionRequest& req) {
  if (prompt_len == 0) bad(chat ? "messages" : "prompt", "the prompt is empty");
  if (prompt_len >= max_model_len) {
    bad(chat ? "messages" : "prompt",
        "This model's maximum context length is " + std::to_string(max_model_len) +
            " tokens. However, your prompt has " + std::to_string(prompt_len) +
            " tokens; there is no room to generate.",
        "context_length_exceeded");
  }
  const char* key = present(j, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  const int64_t room = max_model_len - prompt_len;
  if (present(j, key)) {
    req.max_tokens = get_int(j, key, 16, 1, INT32_MAX);
    if (req.max_tokens > room) {
      bad(key,
          "This model's maximum context length is " + std::to_string(max_model_len) +
              " tokens. However, you requested " + std::to_string(prompt_len + req.max_tokens) +
              " tokens (" + std::to_string(prompt_len) + " in the prompt, " +
              std::to_string(req.max_tokens) + " for the completion).",
          "context_length_exceeded");
    }
  } else {
    req.max_tokens = chat ? room : std::min<int64_t>(16, room);
  }
  if (req.min_tokens > req.max_tokens) bad("min_tokens", "'min_tokens' must not exceed max_tokens");
}

// A chat template failure; the template engine's messages already start "chat template: ".
[[noreturn]] void template_error(const Status& s) {
  const std::string prefix = "chat template: ";
  const std::string& m = s.message();
  bad("messages", m.rfind(prefix, 0) == 0 ? m : prefix + m, "chat_template_error");
}

// Chat messages -> the array the template sees: content flattened to a string.
Json normalize_messages(const Json& j) {
  if (!present(j, "messages") || !j.at("messages").is_array() || j.at("messages").empty()) {
    bad("messages", "'messages' must be a non-empty list", "invalid_type");
  }
  Json out = Json::array();
  for (const auto& m : j.at("messages")) {
    if (!m.is_object()) bad("messages", "each message must be an object", "invalid_type");
    if (!m.contains("role") || !m.at("role").is_string())
      bad("messages", "each message needs a string 'role'");
    const std::string role = m.at("role").get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" &&
        role != "developer") {
      bad("messages",
          "unknown role '" + role + "' (expected system, developer, user, assistant or tool)");
    }
    Json msg = m;
    if (m.contains("content")) {
      const Json& c = m.at("content");
      if (c.is_array()) {
        std::string text;
        for (const auto& part : c) {
          if (!part.is_object() || !part.contains("type") || part.at("type") != "text" ||
              !part.contains("text") || !part.at("text").is_string()) {
            bad("messages",
                "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported");
          }
          if (!text.empty()) text += "\n";
          text += part.at("text").get<std::string>();
        }
        msg["content"] = text;
      } else if (!c.is_string() && !c.is_null()) {
        bad("messages", "message 'content' must be a string, a list of text parts or null",
            "invalid_type");
      }
    } else if (role != "assistant") {
      bad("messages", "a '" + role + "' message needs 'content'");
    }
    out.push_back(std::move(msg));
  }
  return out;
}

Json logprob_top_entries(ServingEngine& e, const TokenLogprob& lp) {
  Json top = Json::array();
  for (const auto& [tok, val] : lp.top) {
    const std::string s = e.detokenize({tok});
    Json bytes = Json::array();
    for (unsigned char c : s) bytes.push_back(static_cast<int>(c));
    top.push_back(Json{{"token", s}, {"logprob", val}, {"bytes", bytes}});
  }
  return top;
}

// Chat logprobs: {"content": [{token, logprob, bytes, top_logprobs}]}.
Json chat_logprobs(ServingEngine& e, const std::vector<TokenLogprob>& lps) {
  Json content = Json::array();
  for (const auto& lp : lps) {
    const std::string s = e.detokenize({lp.token});
    Json bytes = Json::array();
    for (unsigned char c : s) bytes.push_back(static_cast<int>(c));
    content.push_back(Json{{"token", s},
                           {"logprob", lp.logprob},
                           {"bytes", bytes},
                           {"top_logprobs", logprob_top_entries(e, lp)}});
  }
  return Json{{"content", content}};
}

// Completion logprobs: {tokens, token_logprobs, top_logprobs, text_offset}.
Json completion_logprobs(ServingEngine& e, const std::vector<TokenLogprob>& lps, int64_t offset) {
  Json tokens = Json::array(), vals = Json::array(), tops = Json::array(), offs = Json::array();
  for (const auto& lp : lps) {
    const std::string s = e.detokenize({lp.token});
    tokens.push_back(s);
    vals.push_back(lp.logprob);
    Json top = Json::object();
    for (const auto& [tok, val] : lp.top) top[e.detokenize({tok})] = val;
    tops.push_back(top);
    offs.push_back(offset);
    offset += static_cast<int64_t>(s.size());
  }
  return Json{
      {"tokens", tokens}, {"token_logprobs", vals}, {"top_logprobs", tops}, {"text_offset", offs}};
}

Json usage_json(const CompletionEvent& ev) {
  Json u{{"prompt_tokens", ev.prompt_tokens},
         {"completion_tokens", ev.completion_tokens},
         {"total_tokens", ev.prompt_tokens + ev.completion_tokens}};
  if (ev.cached_prompt_tokens > 0)
    u["prompt_tokens_details"] = Json{{"cached_tokens", ev.cached_prompt_tokens}};
  return u;
}

// One generation in flight: turns engine events into a response.
class Generation : public std::enable_shared_from_this<Generation> {
 public:
  Generation(std::shared_ptr<ServingEngine> engine, std::shared_ptr<Responder> r, bool chat,
             GenOptions opt)
      : engine_(std::move(engine)), r_(std::move(r)), chat_(chat), opt_(opt) {
    id_ = random_id(chat ? "chatcmpl-" : "cmpl-");
    created_ = now_seconds();
    model_ = engine_->model_name();
  }

  // Events may arrive (on the engine thread) before submit() has returned: they wait in
  // `early_` until the stream's headers are out.
  void start_stream() {
    std::lock_guard<std::mutex> lock(mu_);
    r_->start_stream(200, "text/event-stream; charset=utf-8");
    if (chat_) {  // the first delta carries the role
      send(chunk(Json{{"role", "assistant"}, {"content", ""}}, Json(), Json()));
    }
    started_ = true;
    for (const auto& ev : early_) handle_event(ev);
    early_.clear();
  }

  void on_event(const CompletionEvent& ev) {
    std::lock_guard<std::mutex> lock(mu_);
    if (opt_.stream && !started_) {
      early_.push_back(ev);
      return;
    }
    handle_event(ev);
  }

 private:
  void handle_event(const CompletionEvent& ev) {
    if (done_) return;
    if (ev.finished && ev.finish_reason == "error") {
      done_ = true;
      const std::string msg = ev.error.ok() ? "the engine failed" : ev.error.message();
      if (opt_.stream) {
        Json err{{"error",
                  {{"message", msg},
                   {"type", "server_error"},
                   {"param", nullptr},
                   {"code", "engine_error"}}}};
        r_->write("data: " + dump(err) + "\n\n");
        r_->write("data: [DONE]\n\n");
        r_->end();
      } else {
        r_->respond(OpenAIRoutes::error_response(
            status_for(ev.error.ok() ? Status(StatusCode::kInternal, msg) : ev.error), msg,
            "server_error", "", "engine_error"));
      }
      return;
    }
    if (opt_.stream) {
      stream_event(ev);
    } else {
      text_ += ev.text;
      if (opt_.logprobs) logprobs_.insert(logprobs_.end(), ev.logprobs.begin(), ev.logprobs.end());
      if (ev.finished) finish_whole(ev);
    }
  }

  Json chunk(const Json& delta_or_text, const Json& finish, const Json& logprobs) {
    Json choice{{"index", 0}};
    if (chat_) {
      choice["delta"] = delta_or_text;
      choice["logprobs"] = logprobs;
    } else {
      choice["text"] = delta_or_text;
      choice["logprobs"] = logprobs;
    }
    choice["finish_reason"] = finish;
    Json c{{"id", id_},
           {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
           {"created", created_},
           {"model", model_},
           {"choices", Json::array({choice})}};
    if (opt_.include_usage) c["usage"] = nullptr;
    return c;
  }

  void send(const Json& j) { r_->write("data: " + dump(j) + "\n\n"); }

  void stream_event(const CompletionEvent& ev) {
    // A chunk per event that carries text or tokens (a model without a tokenizer, e.g. random
    // weights for benchmarks, still streams one chunk per token, with empty text).
    if (!ev.text.empty() || !ev.logprobs.empty() || (!ev.finished && !ev.tokens.empty())) {
      Json lp;
      if (opt_.logprobs && !ev.logprobs.empty()) {
        lp = chat_ ? chat_logprobs(*engine_, ev.logprobs)
                   : completion_logprobs(*engine_, ev.logprobs, text_offset_);
      }
      text_offset_ += static_cast<int64_t>(ev.text.size());
      send(chunk(chat_ ? Json{{"content", ev.text}} : Json(ev.text), Json(), lp));
    }
    if (ev.finished) {
      done_ = true;
      send(chunk(chat_ ? Json::object() : Json(""), ev.finish_reason, Json()));
      if (opt_.include_usage) {
        Json u{{"id", id_},
               {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
               {"created", created_},
               {"model", model_},
               {"choices", Json::array()},
               {"usage", usage_json(ev)}};
        send(u);
      }
      r_->write("data: [DONE]\n\n");
      r_->end();
    }
  }

  void finish_whole(const CompletionEvent& ev) {
    done_ = true;
    Json choice{{"index", 0}};
    Json lp;
    if (opt_.logprobs)
      lp = chat_ ? chat_logprobs(*engine_, logprobs_) : completion_logprobs(*engine_, logprobs_, 0);
    if (chat_) {
      choice["message"] = Json{{"role", "assistant"}, {"content", text_}};
    } else {
      choice["text"] = text_;
    }
    choice["logprobs"] = lp;
    choice["finish_reason"] = ev.finish_reason;
    Json body{{"id", id_},
              {"object", chat_ ? "chat.completion" : "text_completion"},
              {"created", created_},
              {"model", model_},
              {"choices", Json::array({choice})},
              {"usage", usage_json(ev)}};
    r_->respond(json_response(200, body));
  }

  std::shared_ptr<ServingEngine> engine_;
  std::shared_ptr<Responder> r_;
  bool chat_;
  GenOptions opt_;
  std::string id_, model_;
  int64_t created_ = 0;
  bool done_ = false;
  std::string text_;
  int64_t text_offset_ = 0;
  std::vector<TokenLogprob> logprobs_;
  std::mutex mu_;
  bool started_ = false;
  std::vector<CompletionEvent> early_;
};

void check_model(const Json& j, ServingEngine& e) {
  if (!present(j, "model")) return;
  if (!j.at("model").is_string()) bad("model", "'model' must be a string", "invalid_type");
  const std::string m = j.at("model").get<std::string>();
  if (m != e.model_name()) {
    throw ApiError{
        404, "The model '" + m + "' does not exist; this server serves '" + e.model_name() + "'",
        "model", "model_not_found"};
  }
}

void generate(const std::shared_ptr<ServingEngine>& engine, const HttpRequest& http, bool chat,
              const std::shared_ptr<Responder>& r) {
  const Json j = parse_body(http);
  check_model(j, *engine);
  const int64_t vocab = engine->info().vocab;
  CompletionRequest req;
  GenOptions opt;

  if (chat) {
    const Json messages = normalize_messages(j);
    std::string tools;
    if (present(j, "tools")) {
      if (!j.at("tools").is_array()) bad("tools", "'tools' must be a list", "invalid_type");
      tools = dump(j.at("tools"));
    }
    const bool add_gen = get_bool(j, "add_generation_prompt", true);
    auto rendered = engine->apply_chat_template(dump(messages), add_gen, tools);
    if (!rendered.ok()) template_error(rendered.status());
    auto toks = engine->tokenize(*rendered, /*add_special=*/false);
    if (!toks.ok()) bad("messages", toks.status().message());
    req.prompt_tokens = std::move(*toks);
  } else {
    if (!present(j, "prompt")) bad("prompt", "'prompt' is required", "missing_required_parameter");
    const Json* pp = &j.at("prompt");  // a pointer, not a copy: nothing here recurses
    if (pp->is_array() && pp->size() == 1 && ((*pp)[0].is_string() || (*pp)[0].is_array()))
      pp = &(*pp)[0];
    const Json& p = *pp;
    if (p.is_string()) {
      auto toks = engine->tokenize(p.get<std::string>(), /*add_special=*/true);
      if (!toks.ok()) bad("prompt", toks.status().message());
      req.prompt_tokens = std::move(*toks);
    } else if (p.is_array() && (p.empty() || p[0].is_number())) {
      req.prompt_tokens = token_array(p, "prompt", vocab);
    } else if (p.is_array()) {
      bad("prompt", "batched prompts are not supported: send one prompt per request");
    } else {
      bad("prompt", "'prompt' must be a string or a list of token ids", "invalid_type");
    }
  }
  parse_sampling(j, chat, vocab, req, opt);
  parse_max_tokens(j, chat, static_cast<int64_t>(req.prompt_tokens.size()), engine->max_model_len(),
                   req);

  auto gen = std::make_shared<Generation>(engine, r, chat, opt);
  auto id = engine->submit(std::move(req), [gen](const CompletionEvent& ev) { gen->on_event(ev); });
  if (!id.ok()) {
    const int status = status_for(id.status());
    throw ApiError{status, id.status().message(), "",
                   status == 400 ? "invalid_value" : "engine_error"};
  }
  if (opt.stream) gen->start_stream();
  std::weak_ptr<ServingEngine> weak = engine;
  r->on_disconnect([weak, id = *id] {
    if (auto e = weak.lock()) e->cancel(id);
  });
}

void tokenize_route(ServingEngine& e, const HttpRequest& http,
                    const std::shared_ptr<Responder>& r) {
  const Json j = parse_body(http);
  check_model(j, e);
  std::vector<int32_t> tokens;
  if (present(j, "messages")) {
    const Json messages = normalize_messages(j);
    auto rendered =
        e.apply_chat_template(dump(messages), get_bool(j, "add_generation_prompt", true), "");
    if (!rendered.ok()) template_error(rendered.status());
    auto t = e.tokenize(*rendered, get_bool(j, "add_special_tokens", false));
    if (!t.ok()) bad("messages", t.status().message());
    tokens = std::move(*t);
  } else {
    if (!present(j, "prompt") || !j.at("prompt").is_string())
      bad("prompt", "'prompt' must be a string", "invalid_type");
    auto t = e.tokenize(j.at("prompt").get<std::string>(), get_bool(j, "add_special_tokens", true));
    if (!t.ok()) bad("prompt", t.status().message());
    tokens = std::move(*t);
  }
  Json body{{"count", tokens.size()}, {"max_model_len", e.max_model_len()}, {"tokens", tokens}};
  if (get_bool(j, "return_token_strs", false)) {
    Json strs = Json::array();
    for (int32_t t : tokens) strs.push_back(e.detokenize({t}));
    body["token_strs"] = strs;
  }
  r->respond(json_response(200, body));
}

void detokenize_route(ServingEngine& e, const HttpRequest& http,
                      const std::shared_ptr<Responder>& r) {
  const Json j = parse_body(http);
  check_model(j, e);
  if (!present(j, "tokens") || !j.at("tokens").is_array())
    bad("tokens", "'tokens' must be a list of token ids", "invalid_type");
  const auto tokens = token_array(j.at("tokens"), "tokens", e.info().vocab);
  r->respond(json_response(200, Json{{"prompt", e.detokenize(tokens)}}));
}

// "Authorization: Bearer <key>": the scheme is case-insensitive (RFC 9110 section 11.1), the
// key is compared in constant time. Two Authorization headers (joined with ", " by the HTTP
// layer) are a 400, not "the last one wins".
void check_api_key(const std::string& header, const std::string& key) {
  if (header.find(',') != std::string::npos) {
    throw ApiError{400,
                   "more than one Authorization header (send one 'Authorization: Bearer <key>')",
                   "", "invalid_request"};
  }
  auto lower = [](char c) {
    return static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  };
  const std::string scheme = "bearer";
  bool ok = header.size() > scheme.size() && header[scheme.size()] == ' ';
  for (size_t i = 0; ok && i < scheme.size(); ++i) ok = lower(header[i]) == scheme[i];
  size_t start = scheme.size();
  while (ok && start < header.size() && header[start] == ' ') ++start;
  const std::string given = ok ? header.substr(start) : std::string();
  unsigned diff = given.size() == key.size() ? 0u : 1u;
  for (size_t i = 0; i < key.size(); ++i) {
    diff |= static_cast<unsigned char>((i < given.size() ? given[i] : 0) ^ key[i]);
  }
  if (!ok || diff != 0) {
    throw ApiError{401, "invalid or missing API key (send 'Authorization: Bearer <key>')", "",
                   "invalid_api_key"};
  }
}

}  // namespace

HttpResponse OpenAIRoutes::error_response(int status, const std::string& message,
                                          const std::string& type, const std::string& param,
                                          const std::string& code) {
  Json err{{"message", message},
           {"type", type},
           {"param", param.empty() ? Json() : Json(param)},
           {"code", code.empty() ? Json() : Json(code)}};
  return json_response(status, Json{{"error", err}});
}

HttpResponse OpenAIRoutes::transport_error(int status) {
  switch (status) {
    case 413:
      return error_response(413, "request body too large", error_type(413), "",
                            "request_too_large");
    case 431:
      return error_response(431, "request headers too large", error_type(431), "",
                            "headers_too_large");
    default:
      return error_response(status, "malformed HTTP request", error_type(status), "",
                            "bad_request");
  }
}

void OpenAIRoutes::set_engine(std::shared_ptr<ServingEngine> engine) {
  std::lock_guard<std::mutex> lock(mu_);
  engine_ = std::move(engine);
}

std::shared_ptr<ServingEngine> OpenAIRoutes::engine() const {
  std::lock_guard<std::mutex> lock(mu_);
  return engine_;
}

void OpenAIRoutes::handle(HttpRequest req, std::shared_ptr<Responder> r) {
  const std::string& path = req.target;
  const bool get = req.method == "GET" || req.method == "HEAD";
  const bool post = req.method == "POST";
  auto method_not_allowed = [&] {
    r->respond(error_response(405, "method " + req.method + " not allowed on " + path,
                              error_type(405), "", "method_not_allowed"));
  };
  try {
    if (path == "/health" || path == "/ping") {
      if (!get) return method_not_allowed();
      if (!engine()) throw ApiError{503, "the model is loading", "", "model_loading"};
      HttpResponse ok;
      ok.content_type = "text/plain";
      r->respond(ok);
      return;
    }
    if (path == "/version") {
      r->respond(json_response(200, Json{{"version", "0.1.0"}}));
      return;
    }
    if (path == "/metrics") {
      if (!get) return method_not_allowed();
      auto e = engine();
      if (!e) throw ApiError{503, "the model is loading", "", "model_loading"};
      HttpResponse m;
      m.content_type = "text/plain; version=0.0.4; charset=utf-8";
      m.body = render_metrics(e->metrics(), e->model_name());
      r->respond(std::move(m));
      return;
    }
    const bool known = path == "/v1/completions" || path == "/v1/chat/completions" ||
                       path == "/v1/models" || path == "/tokenize" || path == "/detokenize";
    if (!known) throw ApiError{404, "no route for " + req.method + " " + path, "", "not_found"};
    if (!options_.api_key.empty()) check_api_key(req.header("authorization"), options_.api_key);
    auto e = engine();
    if (!e) throw ApiError{503, "the model is loading", "", "model_loading"};
    if (path == "/v1/models") {
      if (!get) return method_not_allowed();
      Json model{{"id", e->model_name()},
                 {"object", "model"},
                 {"created", now_seconds()},
                 {"owned_by", "strata"},
                 {"root", e->info().path},
                 {"parent", nullptr},
                 {"max_model_len", e->max_model_len()},
                 {"vocab_size", e->info().vocab}};
      r->respond(json_response(200, Json{{"object", "list"}, {"data", Json::array({model})}}));
      return;
    }
    if (!post) return method_not_allowed();
    if (path == "/v1/completions") return generate(e, req, false, r);
    if (path == "/v1/chat/completions") return generate(e, req, true, r);
    if (path == "/tokenize") return tokenize_route(*e, req, r);
    return detokenize_route(*e, req, r);
  } catch (const ApiError& err) {
    r->respond(
        error_response(err.status, err.message, error_type(err.status), err.param, err.code));
  } catch (const std::exception& ex) {
    r->respond(error_response(500, std::string("internal error: ") + ex.what(), error_type(500), "",
                              "internal_error"));
  }
}

}  // namespace strata::server
