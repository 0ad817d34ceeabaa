// A minimal blocking HTTP/1.1 client on POSIX sockets, for `strata bench-serve` and the tests:
// one connection, keep-alive, Content-Length and chunked bodies delivered as they arrive, and an
// SSE splitter for `data: ...` events.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "strata/status.h"

namespace strata::server {

struct ClientResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;                            // empty when an on_body callback took it
};

class HttpClient {
 public:
  HttpClient() = default;
  ~HttpClient();
  HttpClient(HttpClient&& other) noexcept;
  HttpClient& operator=(HttpClient&& other) noexcept;
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // `timeout_seconds` bounds each blocking receive or send.
  static Result<HttpClient> connect(const std::string& host, uint16_t port,
                                    double timeout_seconds = 60);

  // Send one request and read the answer. `on_body` (optional) receives body bytes as they arrive
  // (chunked framing removed); returning false closes the connection at once (a client that goes
  // away mid-response).
  Result<ClientResponse> request(
      const std::string& method, const std::string& target, const std::string& body = "",
      const std::vector<std::pair<std::string, std::string>>& headers = {},
      const std::function<bool(std::string_view)>& on_body = {});
  // Send raw bytes (for malformed-request tests).
  Status send_raw(const std::string& bytes);
  bool connected() const { return fd_ >= 0; }
  void close();

 private:
  Status send_all(const char* data, size_t n);
  Result<size_t> recv_some();  // appends to buf_; 0 = EOF
  std::string host_;
  int fd_ = -1;
  std::string buf_;
};

// Splits an SSE byte stream into the payloads of its `data:` lines (one call per event).
class SseParser {
 public:
  void feed(std::string_view bytes, const std::function<void(const std::string& data)>& on_data);

 private:
  std::string pending_;
};

}  // namespace strata::server
