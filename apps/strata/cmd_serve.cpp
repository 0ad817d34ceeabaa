// `strata serve`: the OpenAI-compatible HTTP server over a ServingEngine.
//
// The server listens before the model loads, so /health answers 503 while loading; the model
// loads on a background thread. SIGTERM/SIGINT: stop accepting, let in-flight responses finish
// (bounded by --shutdown-timeout), abort what is left, exit 0.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "commands.h"
#include "server/http_server.h"
#include "server/openai_routes.h"
#include "strata/serving.h"

namespace strata::app {

namespace {

struct ServeOptions {
  ServingConfig serving;
  server::HttpServerOptions http;
  std::string api_key;
  double shutdown_timeout = 30;
  bool no_request_log = false;
  bool offline = false;
};

// The flags that need no model, checked before listening.
Status check_serve_options(ServeOptions& opt) {
  STRATA_RETURN_IF_ERROR(check_before_load(opt.serving.engine, nullptr));
  auto positive = [](double v, const char* flag) -> Status {
    if (!(v > 0)) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", v);
      return Status(StatusCode::kInvalidArgument,
                    std::string(flag) + " " + buf + " must be > 0 (seconds)");
    }
    return ok_status();
  };
  STRATA_RETURN_IF_ERROR(positive(opt.http.read_timeout_seconds, "--timeout"));
  if (!(opt.shutdown_timeout >= 0 && opt.shutdown_timeout < 1e9)) {
    return Status(StatusCode::kInvalidArgument, "--shutdown-timeout must be >= 0 (seconds)");
  }
  if (opt.http.threads < 1 || opt.http.threads > 1024) {
    return Status(StatusCode::kInvalidArgument,
                  "--http-threads " + std::to_string(opt.http.threads) + " must be in [1, 1024]");
  }
  if (opt.serving.max_num_seqs < 1) {
    return Status(StatusCode::kInvalidArgument,
                  "--max-num-seqs " + std::to_string(opt.serving.max_num_seqs) + " must be >= 1");
  }
  return ok_status();
}

// One log line per request, as it completes: method, path, status, completion tokens (when the
// answer reports usage), latency. Wraps the connection's Responder.
class LoggingResponder : public server::Responder {
 public:
  LoggingResponder(std::shared_ptr<server::Responder> inner, std::string method, std::string path)
      : inner_(std::move(inner)),
        method_(std::move(method)),
        path_(std::move(path)),
        t0_(std::chrono::steady_clock::now()) {}

  void respond(server::HttpResponse r) override {
    note(r.status, r.body);
    log_line();
    inner_->respond(std::move(r));
  }
  void start_stream(int status, const std::string& content_type) override {
    note(status, "");
    inner_->start_stream(status, content_type);
  }
  void write(std::string data) override {
    note(0, data);
    inner_->write(std::move(data));
  }
  void end() override {
    log_line();
    inner_->end();
  }
  ~LoggingResponder() override {
    if (!logged_) {  // the client went away before the answer was complete
      if (status_ == 0) status_ = 499;
      log_line();
    }
  }
  void on_disconnect(std::function<void()> fn) override { inner_->on_disconnect(std::move(fn)); }
  bool disconnected() const override { return inner_->disconnected(); }

 private:
  void note(int status, const std::string& body) {
    std::lock_guard<std::mutex> lock(mu_);
    if (status != 0) status_ = status;
    // The usage object's completion_tokens (the last one in a stream).
    const std::string key = "\"completion_tokens\":";
    for (size_t at = body.find(key); at != std::string::npos; at = body.find(key, at + 1)) {
      tokens_ = std::atoll(body.c_str() + at + key.size());
    }
  }
  void log_line() {
    std::lock_guard<std::mutex> lock(mu_);
    if (logged_) return;
    logged_ = true;
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
    std::string tokens = tokens_ >= 0 ? " " + std::to_string(tokens_) + " tokens" : "";
    std::fprintf(stderr, "strata: %s %s %d%s %.1f ms\n", method_.c_str(), path_.c_str(), status_,
                 tokens.c_str(), ms);
  }

  std::shared_ptr<server::Responder> inner_;
  std::string method_, path_;
  std::chrono::steady_clock::time_point t0_;
  std::mutex mu_;
  int status_ = 0;
  long long tokens_ = -1;
  bool logged_ = false;
};

// The startup line that says what the KV cache reserved and why.
void log_kv_reservation(const ServeOptions& opt, ServingEngine& e) {
  const ModelInfo& i = e.info();
  const int64_t blocks = i.kv_cache_blocks, tokens = blocks * i.kv_block_size;
  const double mib = 1024.0 * 1024.0;
  std::string why;
  if (opt.serving.num_kv_blocks > 0) {
    why = "--num-kv-blocks";
  } else if (i.backend != "CPU") {
    why = "--gpu-memory-utilization";
  } else if (opt.serving.kv_cache_bytes > 0) {
    why = "--kv-cache-bytes";
  } else {
    const int64_t want = opt.serving.max_num_seqs * e.max_model_len();
    why = "--max-num-seqs " + std::to_string(opt.serving.max_num_seqs) + " x --max-model-len " +
          std::to_string(e.max_model_len());
    if (tokens < want) why += ", capped at 1 GiB; set --kv-cache-bytes for more";
  }
  if (i.backend == "CPU") {
    std::fprintf(stderr,
                 "strata: KV cache: %lld blocks of %lld tokens = %lld tokens, %.1f MiB (%s); "
                 "swap space %.1f MiB; host memory is committed as blocks are used\n",
                 static_cast<long long>(blocks), static_cast<long long>(i.kv_block_size),
                 static_cast<long long>(tokens),
                 static_cast<double>(tokens * i.kv_bytes_per_token) / mib, why.c_str(),
                 static_cast<double>(opt.serving.swap_space_bytes) / mib);
  } else {
    std::fprintf(stderr, "strata: KV cache: %lld blocks of %lld tokens = %lld tokens (%s)\n",
                 static_cast<long long>(blocks), static_cast<long long>(i.kv_block_size),
                 static_cast<long long>(tokens), why.c_str());
  }
}

int serve(ServeOptions& opt) {
  if (opt.serving.engine.model.empty()) {
    return report(Status(StatusCode::kInvalidArgument,
                         "a model is required: strata serve MODEL (or -m MODEL)"));
  }
  if (Status s = check_serve_options(opt); !s.ok()) return report(s);
  // Signals are taken synchronously by this thread; every thread started below inherits the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);

  if (launcher_rank() > 0) {
    // A tensor-parallel follower (mpirun): no HTTP server; it runs rank 0's steps until rank 0
    // stops. SIGTERM/SIGINT stay blocked here: rank 0 drains and then stops every rank.
    ServingConfig serving = opt.serving;
    auto path = resolve_model_arg(serving.engine.model, opt.offline);
    if (!path.ok()) return report(path.status());
    serving.engine.model = *path;
    auto engine = ServingEngine::create(serving);
    if (!engine.ok())
      return report(engine.status().with_context("loading " + opt.serving.engine.model));
    const Status st = (*engine)->wait_follower();
    return st.ok() ? 0 : report(st);
  }

  auto routes = std::make_shared<server::OpenAIRoutes>(server::OpenAIOptions{opt.api_key});
  auto http = server::HttpServer::create(
      opt.http,
      [routes, log = !opt.no_request_log](server::HttpRequest req,
                                          std::shared_ptr<server::Responder> r) {
        if (log) {
          r = std::make_shared<LoggingResponder>(std::move(r), req.method, req.target);
        }
        routes->handle(std::move(req), std::move(r));
      },
      &server::OpenAIRoutes::transport_error);
  if (!http.ok()) return report(http.status());
  (*http)->start();
  std::fprintf(stderr, "strata: listening on http://%s:%u (loading %s)\n", opt.http.host.c_str(),
               static_cast<unsigned>((*http)->port()), opt.serving.engine.model.c_str());
  std::fflush(stderr);

  std::atomic<int> load_state{0};  // 0 loading, 1 ready, 2 failed
  Status load_error;
  std::thread loader([&] {
    // A model by hub id downloads here, while /health answers 503.
    ServingConfig serving = opt.serving;
    auto path = resolve_model_arg(serving.engine.model, opt.offline);
    if (!path.ok()) {
      load_error = path.status();
      load_state = 2;
      return;
    }
    serving.engine.model = *path;
    // vLLM's default: the API names the model as -m gave it.
    if (serving.served_model_name.empty() && is_hub_reference(opt.serving.engine.model))
      serving.served_model_name = opt.serving.engine.model;
    auto engine = ServingEngine::create(serving);
    if (!engine.ok()) {
      load_error = engine.status();
      load_state = 2;
      return;
    }
    routes->set_engine(std::shared_ptr<ServingEngine>(std::move(*engine)));
    log_kv_reservation(opt, *routes->engine());
    std::fprintf(stderr, "strata: ready: serving '%s' (max_model_len %lld)\n",
                 routes->engine()->model_name().c_str(),
                 static_cast<long long>(routes->engine()->max_model_len()));
    std::fflush(stderr);
    load_state = 1;
  });

  int sig = 0;
  while (sig <= 0 && load_state != 2) {
    timespec ts{0, 100 * 1000 * 1000};
    sig = sigtimedwait(&sigs, nullptr, &ts);
  }
  if (load_state == 2 && sig <= 0) {
    loader.join();
    (*http)->stop();
    return report(load_error.with_context("loading " + opt.serving.engine.model));
  }

  std::fprintf(stderr, "strata: %s received: draining (at most %.0f s)\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM", opt.shutdown_timeout);
  std::fflush(stderr);
  (*http)->stop_accepting();
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(opt.shutdown_timeout);
  while ((*http)->in_flight() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  loader.join();
  if (auto engine = routes->engine()) {
    engine->shutdown(/*drain=*/false);  // aborts what is left; their responses end with "abort"
    const auto abort_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while ((*http)->in_flight() > 0 && std::chrono::steady_clock::now() < abort_deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  (*http)->stop();
  routes->set_engine(nullptr);
  std::fprintf(stderr, "strata: stopped\n");
  return 0;
}

}  // namespace

void add_serve_command(CLI::App& app, std::vector<Command>& commands) {
  auto opt = std::make_shared<ServeOptions>();
  CLI::App* sub =
      app.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching");
  auto* model_opt =
      sub->add_option("-m,--model", opt->serving.engine.model,
                      "Model: Hugging Face checkpoint directory, .gguf file, alias, or hub id "
                      "org/name[@REVISION][:FILE.gguf]");
  add_offline_flag(sub, opt->offline);
  // `strata serve MODEL`, as `vllm serve MODEL`.
  sub->add_option("model", opt->serving.engine.model, "The model, as -m gives it")
      ->excludes(model_opt);
  sub->add_option("--host", opt->http.host, "Address to listen on (default 127.0.0.1)");
  sub->add_option("--port", opt->http.port, "Port to listen on; 0 = any free port (default 8000)");
  sub->add_option("--api-key", opt->api_key,
                  "Require 'Authorization: Bearer KEY' on the API routes");
  sub->add_option("--served-model-name", opt->serving.served_model_name,
                  "Model name in the API (default: the model path's last part)");
  sub->add_option("--max-num-seqs", opt->serving.max_num_seqs,
                  "Sequences running at once (default 64)");
  sub->add_option("-c,--ctx-size,--max-model-len", opt->serving.engine.max_model_len,
                  "Context length; 0 = the model's own (default 0)");
  sub->add_option("--max-num-batched-tokens", opt->serving.max_num_batched_tokens,
                  "Token budget per engine step (default 512)");
  sub->add_option("--block-size", opt->serving.block_size,
                  "Tokens per KV-cache block (default 16)");
  sub->add_option("--num-kv-blocks", opt->serving.num_kv_blocks,
                  "KV-cache blocks; 0 = from --kv-cache-bytes");
  add_bytes_option(
      sub, "--kv-cache-bytes", opt->serving.kv_cache_bytes,
      "CPU KV-cache size: bytes or e.g. 512MiB; 0 = --max-num-seqs sequences of --max-model-len, "
      "at most 1 GiB (default 0)");
  add_bytes_option(sub, "--swap-space-bytes", opt->serving.swap_space_bytes,
                   "Host memory for preempted KV blocks: bytes or e.g. 4GiB (default 1GiB)");
  sub->add_option_function<double>(
      "--swap-space",
      [opt](double gib) {
        if (!(gib >= 0 && gib < 1e6)) throw CLI::ValidationError("--swap-space must be >= 0 (GiB)");
        opt->serving.swap_space_bytes = static_cast<int64_t>(gib * 1024 * 1024 * 1024);
      },
      "Host memory for preempted KV blocks in GiB, as vLLM's --swap-space");
  sub->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching",
                opt->serving.enable_prefix_caching,
                "Reuse KV blocks of shared prompt prefixes (default on)");
  add_kv_offload_options(sub, opt->serving);
  add_threads_option(sub, opt->serving.engine.num_threads);
  add_engine_device_options(sub, opt->serving.engine, /*with_dummy=*/true,
                            /*with_batch_tokens=*/false);
  sub->add_option("--http-threads", opt->http.threads, "HTTP I/O threads (default 4)");
  sub->add_option("--max-body-bytes", opt->http.max_body_bytes,
                  "Largest request body; larger gets 413 (default 8 MiB)");
  sub->add_option("--timeout", opt->http.read_timeout_seconds,
                  "Seconds to receive a request or keep an idle connection (default 60)");
  sub->add_option("--shutdown-timeout", opt->shutdown_timeout,
                  "Seconds to let in-flight requests finish on SIGTERM/SIGINT (default 30)");
  sub->add_flag("--disable-log-requests", opt->no_request_log,
                "No log line per request (method, path, status, tokens, latency)");
  opt->serving.engine.show_progress = false;

  commands.push_back({sub, [opt]() -> int { return serve(*opt); }});
}

}  // namespace strata::app
