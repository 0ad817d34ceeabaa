// `strata bench-serve`: a load generator for an OpenAI-compatible server (strata serve, vLLM, ...).
//
// Sends --num-prompts streaming /v1/completions requests (token-id prompts, ignore_eos, fixed
// max_tokens) at --request-rate (Poisson arrivals, seeded; inf = all at once), at most
// --max-concurrency in flight, and prints vLLM's "Serving Benchmark Result" block so numbers
// compare directly: TTFT, TPOT = (e2e - ttft) / (out_tokens - 1), ITL between chunks, E2EL.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <semaphore>
#include <thread>

#include "commands.h"
#include "server/http_client.h"

namespace strata::app {

namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;
  std::string model;
  std::string api_key;
  int num_prompts = 100;
  std::string request_rate = "inf";
  int max_concurrency = 0;
  std::string dataset = "random";
  int input_len = 128;
  int output_len = 128;
  double range_ratio = 0.0;
  uint64_t seed = 0;
  std::string json_path;
  double timeout = 600;
  std::string base_url;  // http://host[:port][/path]: sets host and port
};

struct Prompt {
  std::vector<int32_t> tokens;
  int output_len = 0;
};

struct RequestResult {
  bool success = false;
  std::string error;
  int prompt_len = 0;
  int64_t output_tokens = 0;
  double ttft = 0, latency = 0;  // seconds
  std::vector<double> itl;
};

double percentile(std::vector<double> v, double p) {  // numpy's default (linear) method
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = p / 100.0 * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}

double mean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

double stddev(const std::vector<double>& v) {
  if (v.empty()) return 0;
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size()));
}

// Prompts of random token ids. random: lengths uniform in len*(1 -+ range_ratio).
// sharegpt-like: long-tailed lengths, log-normal around the given lengths (sigma 1.0 for input,
// 0.8 for output), like ShareGPT conversations, generated locally.
std::vector<Prompt> make_prompts(const BenchOptions& o, int64_t vocab, int64_t max_model_len) {
  std::mt19937_64 rng(o.seed);
  const int64_t lo_id = vocab > 1000 ? 100 : 0;  // skip the low ids where special tokens live
  std::uniform_int_distribution<int64_t> tok(lo_id, std::max<int64_t>(lo_id, vocab - 1));
  std::vector<Prompt> out;
  for (int i = 0; i < o.num_prompts; ++i) {
    int64_t in, outl;
    if (o.dataset == "sharegpt-like") {
      std::lognormal_distribution<double> din(std::log(std::max(1, o.input_len)), 1.0);
      std::lognormal_distribution<double> dout(std::log(std::max(1, o.output_len)), 0.8);
      in = std::clamp<int64_t>(std::llround(din(rng)), 4, 8 * std::max(1, o.input_len));
      outl = std::clamp<int64_t>(std::llround(dout(rng)), 1, 8 * std::max(1, o.output_len));
    } else {
      auto draw = [&](int len) {
        const int64_t a = std::max<int64_t>(1, std::llround(len * (1.0 - o.range_ratio)));
        const int64_t b = std::max<int64_t>(a, std::llround(len * (1.0 + o.range_ratio)));
        return std::uniform_int_distribution<int64_t>(a, b)(rng);
      };
      in = draw(o.input_len);
      outl = draw(o.output_len);
    }
    if (max_model_len > 0 && in + outl > max_model_len) {  // keep every request valid
      outl = std::max<int64_t>(1, std::min<int64_t>(outl, max_model_len / 2));
      in = std::max<int64_t>(1, std::min<int64_t>(in, max_model_len - outl));
    }
    Prompt p;
    p.output_len = static_cast<int>(outl);
    for (int64_t k = 0; k < in; ++k) p.tokens.push_back(static_cast<int32_t>(tok(rng)));
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> auth(const BenchOptions& o) {
  if (o.api_key.empty()) return {};
  return {{"Authorization", "Bearer " + o.api_key}};
}

RequestResult run_one(const BenchOptions& o, const Prompt& p) {
  RequestResult r;
  r.prompt_len = static_cast<int>(p.tokens.size());
  const Json body{{"model", o.model},
                  {"prompt", p.tokens},
                  {"max_tokens", p.output_len},
                  {"temperature", 0.0},
                  {"ignore_eos", true},
                  {"stream", true},
                  {"stream_options", {{"include_usage", true}}}};
  const auto t0 = Clock::now();
  auto client = server::HttpClient::connect(o.host, o.port, o.timeout);
  if (!client.ok()) {
    r.error = client.status().message();
    return r;
  }
  server::SseParser sse;
  bool first = true, done = false;
  int64_t chunks = 0;
  Clock::time_point last = t0;
  std::string error;
  auto resp =
      client->request("POST", "/v1/completions", body.dump(), auth(o), [&](std::string_view bytes) {
        sse.feed(bytes, [&](const std::string& data) {
          if (data == "[DONE]") {
            done = true;
            return;
          }
          Json j = Json::parse(data, nullptr, false);
          if (j.is_discarded()) return;
          if (j.contains("error")) {
            error = j["error"].value("message", std::string("stream error"));
            return;
          }
          if (j.contains("usage") && j["usage"].is_object()) {
            r.output_tokens = j["usage"].value("completion_tokens", int64_t{0});
          }
          if (!j.contains("choices") || j["choices"].empty()) return;
          // A token chunk: text, or (from a server streaming a model without a tokenizer)
          // empty text before the finish chunk.
          const Json& choice = j["choices"][0];
          const std::string text = choice.value("text", std::string());
          if (text.empty() && !choice["finish_reason"].is_null()) return;
          const auto now = Clock::now();
          if (first) {
            r.ttft = std::chrono::duration<double>(now - t0).count();
            first = false;
          } else {
            r.itl.push_back(std::chrono::duration<double>(now - last).count());
          }
          last = now;
          ++chunks;
        });
        return true;
      });
  r.latency = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!resp.ok()) {
    r.error = resp.status().message();
  } else if (resp->status != 200) {
    r.error = "HTTP " + std::to_string(resp->status);
  } else if (!error.empty()) {
    r.error = error;
  } else if (!done) {
    r.error = "stream ended without [DONE]";
  } else {
    if (r.output_tokens == 0) r.output_tokens = chunks;
    r.success = true;
  }
  return r;
}

int bench(BenchOptions o) {
  double rate = std::numeric_limits<double>::infinity();
  if (o.request_rate != "inf") {
    try {
      rate = std::stod(o.request_rate);
    } catch (...) {
      return report(
          Status(StatusCode::kInvalidArgument, "--request-rate must be a number or 'inf'"));
    }
    if (!(rate > 0))
      return report(Status(StatusCode::kInvalidArgument, "--request-rate must be > 0"));
  }
  if (o.dataset != "random" && o.dataset != "sharegpt-like") {
    return report(
        Status(StatusCode::kInvalidArgument, "--dataset must be random or sharegpt-like"));
  }
  if (o.num_prompts <= 0)
    return report(Status(StatusCode::kInvalidArgument, "--num-prompts must be > 0"));
  if (!(o.timeout > 0))
    return report(Status(StatusCode::kInvalidArgument, "--timeout must be > 0 (seconds)"));
  if (o.input_len < 1 || o.output_len < 1) {
    return report(
        Status(StatusCode::kInvalidArgument, "--input-len and --output-len must be >= 1"));
  }
  if (!o.base_url.empty()) {
    // http://HOST[:PORT][/...]; the path (e.g. /v1) is where the routes are anyway.
    const std::string scheme = "http://";
    std::string rest = o.base_url.rfind(scheme, 0) == 0 ? o.base_url.substr(scheme.size()) : "";
    rest = rest.substr(0, rest.find('/'));
    const size_t colon = rest.rfind(':');
    std::string host = rest.substr(0, colon),
                port = colon == std::string::npos ? "80" : rest.substr(colon + 1);
    char* end = nullptr;
    const long p = std::strtol(port.c_str(), &end, 10);
    if (host.empty() || port.empty() || *end != '\0' || p < 1 || p > 65535) {
      return report(Status(StatusCode::kInvalidArgument,
                           "--base-url '" + o.base_url + "': expected http://HOST[:PORT][/v1]"));
    }
    o.host = host;
    o.port = static_cast<uint16_t>(p);
  }

  // The model's name, context and vocabulary size from /v1/models.
  int64_t vocab = 0, max_model_len = 0;
  {
    auto c = server::HttpClient::connect(o.host, o.port, 30);
    if (!c.ok()) return report(c.status());
    auto resp = c->request("GET", "/v1/models", "", auth(o));
    if (!resp.ok()) return report(resp.status());
    if (resp->status != 200) {
      return report(
          Status(StatusCode::kFailedPrecondition,
                 "GET /v1/models: HTTP " + std::to_string(resp->status) + ": " + resp->body));
    }
    Json j = Json::parse(resp->body, nullptr, false);
    if (j.is_discarded() || !j.contains("data") || j["data"].empty()) {
      return report(Status(StatusCode::kDataLoss, "GET /v1/models: unexpected answer"));
    }
    const Json& m = j["data"][0];
    if (o.model.empty()) o.model = m.value("id", std::string());
    max_model_len = m.value("max_model_len", int64_t{0});
    vocab = m.value("vocab_size", int64_t{0});
    if (vocab <= 0) vocab = 1000;
  }
  const auto prompts = make_prompts(o, vocab, max_model_len);

  std::printf(
      "strata bench-serve: %d prompts, dataset %s, request rate %s, max concurrency %s, model %s\n",
      o.num_prompts, o.dataset.c_str(), o.request_rate.c_str(),
      o.max_concurrency > 0 ? std::to_string(o.max_concurrency).c_str() : "none", o.model.c_str());
  std::fflush(stdout);

  std::vector<RequestResult> results(prompts.size());
  const int limit = o.max_concurrency > 0 ? o.max_concurrency : static_cast<int>(prompts.size());
  std::counting_semaphore<> slots(limit);
  std::mt19937_64 rng(o.seed ^ 0x9e3779b97f4a7c15ull);
  std::exponential_distribution<double> gap(std::isinf(rate) ? 1.0 : rate);
  std::vector<std::thread> threads;
  threads.reserve(prompts.size());
  const auto start = Clock::now();
  auto next = start;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (!std::isinf(rate)) {
      std::this_thread::sleep_until(next);
      next += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(rng)));
    }
    slots.acquire();
    threads.emplace_back([&, i] {
      results[i] = run_one(o, prompts[i]);
      slots.release();
    });
  }
  for (auto& t : threads) t.join();
  const double duration = std::chrono::duration<double>(Clock::now() - start).count();

  int completed = 0, failed = 0;
  int64_t total_in = 0, total_out = 0;
  std::vector<double> ttfts, tpots, itls, e2els;
  std::string first_error;
  for (const auto& r : results) {
    if (!r.success) {
      ++failed;
      if (first_error.empty()) first_error = r.error;
      continue;
    }
    ++completed;
    total_in += r.prompt_len;
    total_out += r.output_tokens;
    ttfts.push_back(r.ttft * 1e3);
    e2els.push_back(r.latency * 1e3);
    if (r.output_tokens > 1)
      tpots.push_back((r.latency - r.ttft) * 1e3 / static_cast<double>(r.output_tokens - 1));
    for (double x : r.itl) itls.push_back(x * 1e3);
  }

  auto line = [](const char* name, double v) { std::printf("%-40s %-10.2f\n", name, v); };
  auto iline = [](const char* name, int64_t v) {
    std::printf("%-40s %-10lld\n", name, static_cast<long long>(v));
  };
  std::printf("============ Serving Benchmark Result ============\n");
  iline("Successful requests:", completed);
  if (failed > 0) iline("Failed requests:", failed);
  if (o.max_concurrency > 0) iline("Maximum request concurrency:", o.max_concurrency);
  line("Benchmark duration (s):", duration);
  iline("Total input tokens:", total_in);
  iline("Total generated tokens:", total_out);
  line("Request throughput (req/s):", completed / duration);
  line("Output token throughput (tok/s):", static_cast<double>(total_out) / duration);
  line("Total Token throughput (tok/s):", static_cast<double>(total_in + total_out) / duration);
  auto section = [&](const char* title, const char* abbrev, const std::vector<double>& v) {
    std::printf("%s\n", title);
    char buf[64];
    std::snprintf(buf, sizeof buf, "Mean %s (ms):", abbrev);
    line(buf, mean(v));
    std::snprintf(buf, sizeof buf, "Median %s (ms):", abbrev);
    line(buf, percentile(v, 50));
    std::snprintf(buf, sizeof buf, "P99 %s (ms):", abbrev);
    line(buf, percentile(v, 99));
  };
  section("---------------Time to First Token----------------", "TTFT", ttfts);
  section("-----Time per Output Token (excl. 1st token)------", "TPOT", tpots);
  section("---------------Inter-token Latency----------------", "ITL", itls);
  section("----------------End-to-end Latency----------------", "E2EL", e2els);
  std::printf("==================================================\n");
  if (failed > 0)
    std::fprintf(stderr, "strata: bench-serve: %d requests failed; first error: %s\n", failed,
                 first_error.c_str());
  std::fflush(stdout);

  if (!o.json_path.empty()) {
    Json j{{"backend", "strata"},
           {"model_id", o.model},
           {"dataset", o.dataset},
           {"num_prompts", o.num_prompts},
           {"request_rate", std::isinf(rate) ? Json("inf") : Json(rate)},
           {"max_concurrency", o.max_concurrency > 0 ? Json(o.max_concurrency) : Json()},
           {"seed", o.seed},
           {"duration", duration},
           {"completed", completed},
           {"failed", failed},
           {"total_input_tokens", total_in},
           {"total_output_tokens", total_out},
           {"request_throughput", completed / duration},
           {"output_throughput", static_cast<double>(total_out) / duration},
           {"total_token_throughput", static_cast<double>(total_in + total_out) / duration}};
    auto stats = [&](const char* key, const std::vector<double>& v) {
      j[std::string("mean_") + key + "_ms"] = mean(v);
      j[std::string("median_") + key + "_ms"] = percentile(v, 50);
      j[std::string("std_") + key + "_ms"] = stddev(v);
      j[std::string("p99_") + key + "_ms"] = percentile(v, 99);
    };
    stats("ttft", ttfts);
    stats("tpot", tpots);
    stats("itl", itls);
    stats("e2el", e2els);
    Json in_lens = Json::array(), out_lens = Json::array(), ttft_s = Json::array(),
         errors = Json::array();
    for (const auto& r : results) {
      in_lens.push_back(r.prompt_len);
      out_lens.push_back(r.output_tokens);
      ttft_s.push_back(r.ttft);
      errors.push_back(r.error);
    }
    j["input_lens"] = in_lens;
    j["output_lens"] = out_lens;
    j["ttfts"] = ttft_s;
    j["errors"] = errors;
    std::ofstream f(o.json_path);
    if (!f) return report(Status(StatusCode::kIoError, "cannot write " + o.json_path));
    f << j.dump(2) << "\n";
  }
  return failed > 0 ? 1 : 0;
}

}  // namespace

void add_bench_serve_command(CLI::App& app, std::vector<Command>& commands) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* sub = app.add_subcommand("bench-serve",
                                     "Load-test an OpenAI-compatible server (vLLM-style report)");
  auto* host_opt = sub->add_option("--host", o->host, "Server host (default 127.0.0.1)");
  auto* port_opt = sub->add_option("--port", o->port, "Server port (default 8000)");
  sub->add_option("--base-url", o->base_url,
                  "The server as vLLM's bench takes it: http://HOST[:PORT][/v1] (instead of "
                  "--host/--port)")
      ->excludes(host_opt)
      ->excludes(port_opt);
  sub->add_option("--model", o->model, "Model name to send (default: the first of /v1/models)");
  sub->add_option("--api-key", o->api_key, "Bearer token for the server");
  sub->add_option("--num-prompts", o->num_prompts, "Requests to send (default 100)");
  sub->add_option("--request-rate", o->request_rate,
                  "Requests per second, Poisson arrivals; inf = all at once (default inf)");
  sub->add_option("--max-concurrency", o->max_concurrency,
                  "Most requests in flight; 0 = no limit (default 0)");
  sub->add_option("--dataset,--dataset-name", o->dataset,
                  "random or sharegpt-like (default random)");
  sub->add_option("--input-len,--random-input-len", o->input_len,
                  "Prompt tokens per request (default 128)");
  sub->add_option("--output-len,--random-output-len", o->output_len,
                  "Generated tokens per request (default 128)");
  sub->add_option("--range-ratio,--random-range-ratio", o->range_ratio,
                  "random: lengths uniform in len*(1-r)..len*(1+r) (default 0)");
  sub->add_option("--seed", o->seed, "Seed for prompts and arrivals (default 0)");
  sub->add_option("--json", o->json_path,
                  "Write the results (and per-request data) to this JSON file");
  sub->add_option("--timeout", o->timeout,
                  "Seconds a request may stall before it fails (default 600)");
  commands.push_back({sub, [o]() -> int { return bench(*o); }});
}

}  // namespace strata::app
