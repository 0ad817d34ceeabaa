// GET /metrics: gauges, counters and histograms named like vLLM's (vllm:* -> strata:*), so
// existing dashboards need only the prefix changed.
#include "server/metrics.h"

#include <cstdio>
#include <vector>

namespace strata::server {

namespace {

std::string escape_label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string fmt_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

class Writer {
 public:
  explicit Writer(const std::string& model)
      : labels_("model_name=\"" + escape_label(model) + "\"") {}

  void scalar(const char* name, const char* type, const char* help, double value) {
    header(name, type, help);
    out_ += std::string("strata:") + name + "{" + labels_ + "} " + fmt_double(value) + "\n";
  }

  void histogram(const char* name, const char* help, const std::vector<double>& bounds,
                 const std::vector<int64_t>& buckets, double sum, int64_t count) {
    header(name, "histogram", help);
    const std::string base = std::string("strata:") + name;
    for (size_t i = 0; i < bounds.size() && i < buckets.size(); ++i) {
      out_ += base + "_bucket{" + labels_ + ",le=\"" + fmt_double(bounds[i]) + "\"} " +
              std::to_string(buckets[i]) + "\n";
    }
    out_ += base + "_bucket{" + labels_ + ",le=\"+Inf\"} " + std::to_string(count) + "\n";
    out_ += base + "_sum{" + labels_ + "} " + fmt_double(sum) + "\n";
    out_ += base + "_count{" + labels_ + "} " + std::to_string(count) + "\n";
  }

  std::string take() { return std::move(out_); }

 private:
  void header(const char* name, const char* type, const char* help) {
    out_ += std::string("# HELP strata:") + name + " " + help + "\n";
    out_ += std::string("# TYPE strata:") + name + " " + type + "\n";
  }

  std::string labels_;
  std::string out_;
};

}  // namespace

std::string render_metrics(const ServingMetrics& m, const std::string& model_name) {
  Writer w(model_name);
  w.scalar("num_requests_running", "gauge", "Number of requests in model execution batches.",
           static_cast<double>(m.running));
  w.scalar("num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
           static_cast<double>(m.waiting));
  w.scalar("num_requests_swapped", "gauge", "Number of requests swapped to host memory.",
           static_cast<double>(m.swapped));
  const double usage = m.kv_blocks_total > 0 ? static_cast<double>(m.kv_blocks_used) /
                                                   static_cast<double>(m.kv_blocks_total)
                                             : 0.0;
  w.scalar("kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", usage);
  w.scalar("kv_cache_blocks_used", "gauge", "KV-cache blocks in use.",
           static_cast<double>(m.kv_blocks_used));
  w.scalar("kv_cache_blocks_total", "gauge", "KV-cache blocks in all.",
           static_cast<double>(m.kv_blocks_total));
  w.scalar("prompt_tokens_total", "counter", "Number of prefill tokens processed.",
           static_cast<double>(m.prompt_tokens_total));
  w.scalar("generation_tokens_total", "counter", "Number of generation tokens processed.",
           static_cast<double>(m.generation_tokens_total));
  w.scalar("request_success_total", "counter",
           "Number of requests finished by stop or length (not aborted or failed).",
           static_cast<double>(m.requests_finished_total));
  w.scalar("num_preemptions_total", "counter", "Cumulative number of preemptions.",
           static_cast<double>(m.preemptions_total));
  w.scalar("prefix_cache_queries_total", "counter", "Prefix cache queries, in tokens.",
           static_cast<double>(m.prefix_cache_queries_total));
  w.scalar("prefix_cache_hits_total", "counter", "Prefix cache hits, in tokens.",
           static_cast<double>(m.prefix_cache_hits_total));
  w.histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
              m.bucket_bounds, m.ttft_buckets, m.ttft_sum, m.ttft_count);
  w.histogram("time_per_output_token_seconds", "Histogram of time per output token in seconds.",
              m.bucket_bounds, m.tpot_buckets, m.tpot_sum, m.tpot_count);
  w.histogram("e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.",
              m.bucket_bounds, m.e2e_buckets, m.e2e_sum, m.e2e_count);
  return w.take();
}

}  // namespace strata::server
