// The OpenAI-compatible API over a ServingEngine:
//   POST /v1/completions, POST /v1/chat/completions (stream or not), GET /v1/models,
//   GET /health (503 while loading), GET /metrics, POST /tokenize, POST /detokenize, GET /version.
// Errors are OpenAI error objects: {"error": {"message", "type", "param", "code"}}.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "server/http_server.h"
#include "strata/serving.h"

namespace strata::server {

struct OpenAIOptions {
  std::string api_key;  // non-empty: every route but /health and /metrics needs "Bearer <key>"
};

class OpenAIRoutes {
 public:
  explicit OpenAIRoutes(OpenAIOptions options) : options_(std::move(options)) {}

  // Until set_engine, /health and the API answer 503 (loading).
  void set_engine(std::shared_ptr<ServingEngine> engine);
  std::shared_ptr<ServingEngine> engine() const;

  // The HttpServer handler.
  void handle(HttpRequest request, std::shared_ptr<Responder> responder);

  // {"error": {...}} response for a status (used by the HTTP layer for 400/413/431).
  static HttpResponse error_response(int status, const std::string& message,
                                     const std::string& type, const std::string& param,
                                     const std::string& code);
  static HttpResponse transport_error(int status);

 private:
  OpenAIOptions options_;
  mutable std::mutex mu_;
  std::shared_ptr<ServingEngine> engine_;
};

}  // namespace strata::server
