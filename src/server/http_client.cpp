// HttpClient: blocking sockets, no dependencies beyond POSIX.
#include "server/http_client.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <strings.h>
#include <cctype>
#include <cerrno>
#include <cstring>

namespace strata::server {

HttpClient::~HttpClient() {
  close();
}

HttpClient::HttpClient(HttpClient&& other) noexcept
    : host_(std::move(other.host_)), fd_(other.fd_), buf_(std::move(other.buf_)) {
  other.fd_ = -1;
}

HttpClient& HttpClient::operator=(HttpClient&& other) noexcept {
  if (this != &other) {
    close();
    host_ = std::move(other.host_);
    fd_ = other.fd_;
    buf_ = std::move(other.buf_);
    other.fd_ = -1;
  }
  return *this;
}

void HttpClient::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  buf_.clear();
}

Result<HttpClient> HttpClient::connect(const std::string& host, uint16_t port,
                                       double timeout_seconds) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string port_s = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), port_s.c_str(), &hints, &res); rc != 0) {
    return Status(StatusCode::kIoError, "cannot resolve " + host + ": " + gai_strerror(rc));
  }
  int fd = -1;
  int err = 0;
  for (addrinfo* a = res; a; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    err = errno;
    ::close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0) {
    return Status(StatusCode::kIoError,
                  "cannot connect to " + host + ":" + port_s + ": " + std::strerror(err));
  }
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout_seconds);
  tv.tv_usec = static_cast<suseconds_t>((timeout_seconds - static_cast<double>(tv.tv_sec)) * 1e6);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  HttpClient c;
  c.fd_ = fd;
  c.host_ = host + ":" + port_s;
  return c;
}

Status HttpClient::send_all(const char* data, size_t n) {
  while (n > 0) {
    const ssize_t k = ::send(fd_, data, n, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR) continue;
      return Status(StatusCode::kIoError, std::string("send: ") + std::strerror(errno));
    }
    data += k;
    n -= static_cast<size_t>(k);
  }
  return ok_status();
}

Status HttpClient::send_raw(const std::string& bytes) {
  if (fd_ < 0) return Status(StatusCode::kFailedPrecondition, "not connected");
  return send_all(bytes.data(), bytes.size());
}

Result<size_t> HttpClient::recv_some() {
  char tmp[16384];
  for (;;) {
    const ssize_t k = ::recv(fd_, tmp, sizeof tmp, 0);
    if (k < 0) {
      if (errno == EINTR) continue;
      return Status(StatusCode::kIoError, std::string("recv: ") + std::strerror(errno));
    }
    buf_.append(tmp, static_cast<size_t>(k));
    return static_cast<size_t>(k);
  }
}

Result<ClientResponse> HttpClient::request(
    const std::string& method, const std::string& target, const std::string& body,
    const std::vector<std::pair<std::string, std::string>>& headers,
    const std::function<bool(std::string_view)>& on_body) {
  if (fd_ < 0) return Status(StatusCode::kFailedPrecondition, "not connected");
  std::string req = method + " " + target + " HTTP/1.1\r\nHost: " + host_ + "\r\n";
  bool has_ct = false;
  for (const auto& [k, v] : headers) {
    req += k + ": " + v + "\r\n";
    if (strcasecmp(k.c_str(), "content-type") == 0) has_ct = true;
  }
  if (!body.empty() || method == "POST") {
    if (!has_ct) req += "Content-Type: application/json\r\n";
    req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  }
  req += "\r\n";
  req += body;
  STRATA_RETURN_IF_ERROR(send_all(req.data(), req.size()));

  auto fail = [this](const std::string& what) {
    close();
    return Status(StatusCode::kIoError, what);
  };
  size_t header_end;
  while ((header_end = buf_.find("\r\n\r\n")) == std::string::npos) {
    auto n = recv_some();
    if (!n.ok()) return fail(n.status().message());
    if (*n == 0) return fail("connection closed before the response headers");
  }
  ClientResponse resp;
  const std::string head = buf_.substr(0, header_end);
  buf_.erase(0, header_end + 4);
  size_t line_end = head.find("\r\n");
  const std::string status_line = head.substr(0, line_end);
  if (status_line.size() < 12 || status_line.compare(0, 5, "HTTP/") != 0)
    return fail("bad status line: " + status_line);
  resp.status = std::atoi(status_line.c_str() + 9);
  size_t pos = line_end == std::string::npos ? head.size() : line_end + 2;
  while (pos < head.size()) {
    size_t e = head.find("\r\n", pos);
    if (e == std::string::npos) e = head.size();
    const std::string line = head.substr(pos, e - pos);
    pos = e + 2;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    size_t v = colon + 1;
    while (v < line.size() && line[v] == ' ') ++v;
    resp.headers[name] = line.substr(v);
  }
  auto deliver = [&](std::string_view piece) -> bool {
    if (on_body) return on_body(piece);
    resp.body.append(piece);
    return true;
  };
  const bool close_after = resp.headers["connection"] == "close";
  if (method == "HEAD") return resp;
  if (resp.headers["transfer-encoding"] == "chunked") {
    for (;;) {
      size_t eol;
      while ((eol = buf_.find("\r\n")) == std::string::npos) {
        auto n = recv_some();
        if (!n.ok()) return fail(n.status().message());
        if (*n == 0) return fail("connection closed inside a chunked body");
      }
      const size_t size = std::strtoull(buf_.c_str(), nullptr, 16);
      buf_.erase(0, eol + 2);
      while (buf_.size() < size + 2) {
        auto n = recv_some();
        if (!n.ok()) return fail(n.status().message());
        if (*n == 0) return fail("connection closed inside a chunk");
      }
      if (size == 0) {
        buf_.erase(0, 2);
        break;
      }
      const bool go_on = deliver(std::string_view(buf_.data(), size));
      buf_.erase(0, size + 2);
      if (!go_on) {
        close();
        return resp;
      }
    }
  } else if (auto it = resp.headers.find("content-length"); it != resp.headers.end()) {
    const size_t len = std::strtoull(it->second.c_str(), nullptr, 10);
    while (buf_.size() < len) {
      auto n = recv_some();
      if (!n.ok()) return fail(n.status().message());
      if (*n == 0) return fail("connection closed inside the body");
    }
    deliver(std::string_view(buf_.data(), len));
    buf_.erase(0, len);
  } else {
    for (;;) {  // body until EOF
      auto n = recv_some();
      if (!n.ok()) return fail(n.status().message());
      if (*n == 0) break;
    }
    deliver(buf_);
    close();
    return resp;
  }
  if (close_after) close();
  return resp;
}

void SseParser::feed(std::string_view bytes,
                     const std::function<void(const std::string&)>& on_data) {
  pending_.append(bytes);
  size_t end;
  while ((end = pending_.find("\n\n")) != std::string::npos) {
    const std::string event = pending_.substr(0, end);
    pending_.erase(0, end + 2);
    std::string data;
    size_t pos = 0;
    while (pos <= event.size()) {
      size_t e = event.find('\n', pos);
      if (e == std::string::npos) e = event.size();
      std::string_view line(event.data() + pos, e - pos);
      if (line.substr(0, 5) == "data:") {
        line.remove_prefix(5);
        if (!line.empty() && line[0] == ' ') line.remove_prefix(1);
        if (!data.empty()) data += '\n';
        data.append(line);
      }
      pos = e + 1;
    }
    if (!data.empty()) on_data(data);
  }
}

}  // namespace strata::server
