// A small asynchronous HTTP/1.1 server (Boost.Beast + Asio, kept inside http_server.cpp).
//
// One io_context served by N threads; each connection runs on its own strand. Features: keep-alive,
// a request body limit (413), read/write timeouts, chunked streaming responses (SSE;
// to an HTTP/1.0 client the stream ends by closing the connection instead), and client
// disconnect detection while a response is pending (the route's cancel hook runs once).
//
// Routes see only HttpRequest and Responder: no Beast types leak out of this layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "strata/status.h"

namespace strata::server {

struct HttpRequest {
  std::string method;                          // "GET", "POST", ...
  std::string target;                          // path without the query string
  std::string query;                           // after '?', may be empty
  std::map<std::string, std::string> headers;  // field names lower-cased
  std::string body;

  // Header value or "" when absent; `name` lower-case.
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
};

// How a route answers. Every method is thread-safe and may be called from any thread (an engine
// callback, for instance): work is handed to the connection's strand. A route must eventually
// call either respond() once, or start_stream() then any number of write() and one end().
class Responder {
 public:
  virtual ~Responder() = default;
  virtual void respond(HttpResponse response) = 0;
  // Send the status line and headers of a chunked response (Transfer-Encoding: chunked).
  virtual void start_stream(int status, const std::string& content_type) = 0;
  virtual void write(std::string data) = 0;  // one chunk; empty data is ignored
  virtual void end() = 0;                    // the terminating zero-length chunk
  // Runs at most once, on the connection's strand, if the client disconnects (or a write times
  // out) before the response has been completed. Set it before starting work that can be
  // cancelled; if the client is already gone, `fn` runs right away.
  virtual void on_disconnect(std::function<void()> fn) = 0;
  virtual bool disconnected() const = 0;
};

using Handler = std::function<void(HttpRequest request, std::shared_ptr<Responder> responder)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;              // 0: any free port (see HttpServer::port())
  int threads = 4;                   // io_context threads
  size_t max_body_bytes = 8u << 20;  // larger bodies get 413
  int read_timeout_seconds = 60;     // receiving one request, and idle keep-alive connections
  int write_timeout_seconds = 60;    // one write to a slow client
};

class HttpServer {
 public:
  // Binds and listens; serving starts with start(). `on_too_large` builds the 413 answer (and
  // `on_bad_request` the 400 for unparsable HTTP), so the route layer owns the error format.
  static Result<std::unique_ptr<HttpServer>> create(
      const HttpServerOptions& options, Handler handler,
      std::function<HttpResponse(int status)> error_response);
  virtual ~HttpServer() = default;

  virtual uint16_t port() const = 0;  // the bound port
  virtual void start() = 0;           // run the io_context threads; returns at once
  // Stop accepting connections; keep-alive connections close after their current response.
  virtual void stop_accepting() = 0;
  // Responses started but not finished.
  virtual int64_t in_flight() const = 0;
  // Stop the io_context and join its threads (pending connections are dropped).
  virtual void stop() = 0;
};

}  // namespace strata::server
