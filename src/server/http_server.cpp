// HttpServer on Boost.Beast: the only file that includes Beast (slow to compile).
//
// Per connection (Session), all work runs on the connection's strand:
//   do_read -> on_read -> handler(request, responder) -> responder calls post bytes to the
//   write queue -> on_write ... -> the response is complete -> do_read (keep-alive) or close.
// While a response is pending, a "watch" read stays armed on the socket: EOF or a reset means the
// client went away, so the route's disconnect hook runs (the OpenAI layer cancels the request).
// Bytes the watch read receives (a pipelined next request) stay in the buffer for the next read.
#include "server/http_server.h"

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <deque>
#include <optional>
#include <thread>

namespace strata::server {

namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

constexpr size_t kMaxBufferedBytes = 1u << 20;  // pipelined bytes held while a response is pending
constexpr size_t kHeaderLimit = 64u << 10;
constexpr std::chrono::milliseconds kAcceptBackoff{50};  // after a failed accept (EMFILE, ...)

struct Shared {
  HttpServerOptions options;
  Handler handler;
  std::function<HttpResponse(int)> error_response;
  std::atomic<bool> stopping{false};
  std::atomic<int64_t> in_flight{0};
};

std::string status_line(int status) {
  auto reason = http::obsolete_reason(http::int_to_status(static_cast<unsigned>(status)));
  std::string line = "HTTP/1.1 " + std::to_string(status) + " ";
  line.append(reason.data(), reason.size());
  line += "\r\n";
  return line;
}

char hex_digit(unsigned v) {
  return "0123456789abcdef"[v & 15];
}

std::string chunk_size_line(size_t n) {
  std::string s;
  do {
    s.insert(s.begin(), hex_digit(static_cast<unsigned>(n & 15)));
    n >>= 4;
  } while (n);
  return s + "\r\n";
}

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<Shared> shared)
      : stream_(std::move(socket)), shared_(std::move(shared)) {}

  ~Session() {
    if (counted_) shared_->in_flight.fetch_sub(1);
  }

  void run() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->do_read(); });
  }

  // ---- called on the strand by RequestResponder ----
  void respond(uint64_t gen, HttpResponse r) {
    if (gen != gen_ || route_done_ || started_) return;
    started_ = true;
    std::string out = status_line(r.status);
    out += "Content-Type: " + r.content_type + "\r\n";
    out += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
    for (auto& [k, v] : r.headers) out += k + ": " + v + "\r\n";
    out += keep_alive() ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    out += r.body;
    queue(std::move(out));
    finish_route();
  }

  void start_stream(uint64_t gen, int status, const std::string& content_type) {
    if (gen != gen_ || route_done_ || started_) return;
    started_ = true;
    std::string out = status_line(status);
    out += "Content-Type: " + content_type + "\r\n";
    out += "Cache-Control: no-cache\r\n";
    if (http10_) {
      // HTTP/1.0 has no chunked encoding: the body runs until the connection closes.
      keep_alive_ = false;
      out += "Connection: close\r\n\r\n";
    } else {
      out += "Transfer-Encoding: chunked\r\n";
      out += keep_alive() ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    }
    queue(std::move(out));
  }

  void write(uint64_t gen, std::string data) {
    if (gen != gen_ || route_done_ || !started_ || data.empty()) return;
    if (http10_) {
      queue(std::move(data));
      return;
    }
    std::string out = chunk_size_line(data.size());
    out += data;
    out += "\r\n";
    queue(std::move(out));
  }

  void end(uint64_t gen) {
    if (gen != gen_ || route_done_) return;
    if (!started_) {  // a route that ends without starting: empty 200
      respond(gen, HttpResponse{});
      return;
    }
    if (http10_) {
      finish_route();
      if (!writing_ && pending_.empty()) after_response();  // nothing left to write
      return;
    }
    queue("0\r\n\r\n");
    finish_route();
  }

  void on_disconnect(uint64_t gen, std::function<void()> fn) {
    if (gen != gen_ || route_done_) return;
    if (disconnected_) {
      fn();
      return;
    }
    cancel_fn_ = std::move(fn);
  }

  std::atomic<bool> disconnected_{false};
  beast::tcp_stream stream_;

 private:
  bool keep_alive() const { return keep_alive_ && !shared_->stopping.load(); }

  void do_read() {
    if (closed_) return;
    if (closing_) {
      drain_then_close();
      return;
    }
    parser_.emplace();
    parser_->body_limit(shared_->options.max_body_bytes);
    parser_->header_limit(kHeaderLimit);
    stream_.expires_after(std::chrono::seconds(shared_->options.read_timeout_seconds));
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (closed_) return;
    if (ec == http::error::body_limit || ec == http::error::header_limit) {
      reply_error_and_close(ec == http::error::body_limit ? 413 : 431);
      return;
    }
    if (ec && ec.category() == http::make_error_code(http::error::bad_target).category() &&
        ec != http::error::end_of_stream && ec != http::error::partial_message) {
      reply_error_and_close(400);
      return;
    }
    if (ec) {
      close();
      return;
    }
    auto msg = parser_->release();
    HttpRequest req;
    req.method = std::string(msg.method_string());
    std::string target(msg.target());
    if (auto q = target.find('?'); q != std::string::npos) {
      req.query = target.substr(q + 1);
      target.resize(q);
    }
    req.target = std::move(target);
    for (const auto& field : msg) {
      std::string name(field.name_string());
      for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      // A repeated field joins the earlier one with ", " (RFC 9110 section 5.3), so a route sees
      // every value (two Authorization headers are refused instead of the last one winning).
      auto [it, inserted] = req.headers.emplace(name, std::string(field.value()));
      if (!inserted) it->second += ", " + std::string(field.value());
    }
    req.body = std::move(msg.body());
    keep_alive_ = msg.keep_alive();
    http10_ = msg.version() < 11;

    ++gen_;
    responding_ = true;
    route_done_ = false;
    started_ = false;
    counted_ = true;
    shared_->in_flight.fetch_add(1);
    stream_.expires_never();
    start_watch();
    shared_->handler(std::move(req), make_responder());
  }

  std::shared_ptr<Responder> make_responder();

  void reply_error_and_close(int status) {
    keep_alive_ = false;
    http10_ = false;
    ++gen_;
    responding_ = true;
    route_done_ = false;
    started_ = false;
    respond(gen_, shared_->error_response(status));
  }

  void start_watch() {
    if (watch_active_ || closed_ || buffer_.size() >= kMaxBufferedBytes) return;
    watch_active_ = true;
    stream_.async_read_some(
        buffer_.prepare(4096),
        [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_watch(ec, n); });
  }

  void on_watch(beast::error_code ec, size_t n) {
    watch_active_ = false;
    if (closed_) return;
    if (!ec) {
      buffer_.commit(n);
      if (!responding_) {
        do_read();
      } else {
        start_watch();
      }
      return;
    }
    if (ec == net::error::operation_aborted) {  // cancelled by us: the response is complete
      if (!responding_) do_read();
      return;
    }
    client_gone();
  }

  void client_gone() {
    if (closed_) return;
    disconnected_ = true;
    if (auto fn = std::move(cancel_fn_)) {
      cancel_fn_ = nullptr;
      fn();
    }
    close();
  }

  void finish_route() {
    route_done_ = true;
    cancel_fn_ = nullptr;
    if (counted_) {
      counted_ = false;
      shared_->in_flight.fetch_sub(1);
    }
  }

  void queue(std::string bytes) {
    if (closed_) return;
    pending_ += bytes;
    flush();
  }

  void flush() {
    if (writing_ || closed_ || pending_.empty()) return;
    writing_ = true;
    current_.swap(pending_);
    pending_.clear();
    stream_.expires_after(std::chrono::seconds(shared_->options.write_timeout_seconds));
    net::async_write(
        stream_, net::buffer(current_),
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
  }

  void on_write(beast::error_code ec) {
    writing_ = false;
    current_.clear();
    if (closed_) return;
    if (ec) {
      client_gone();
      return;
    }
    if (!pending_.empty()) {
      flush();
      return;
    }
    after_response();
  }

  // Every queued byte is written: if the response is complete, read the next request or close.
  void after_response() {
    if (closed_) return;
    stream_.expires_never();
    if (!route_done_) return;  // streaming: wait for more chunks
    responding_ = false;
    if (!keep_alive()) {
      // Half-close, then read and drop what the client still sends (e.g. the rest of a body
      // too large to accept) so that closing does not reset the connection before the client
      // has read the answer.
      closing_ = true;
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    }
    if (watch_active_) {
      beast::error_code ignored;
      stream_.socket().cancel(ignored);  // on_watch sees operation_aborted and reads on
    } else {
      do_read();
    }
  }

  void drain_then_close() {
    if (!drain_started_) stream_.expires_after(std::chrono::seconds(2));  // one deadline in all
    drain_started_ = true;
    stream_.async_read_some(net::buffer(drain_),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec || self->closed_) {
                                self->close();
                              } else {
                                self->drain_then_close();
                              }
                            });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    pending_.clear();
    beast::error_code ignored;
    stream_.socket().close(ignored);
  }

  std::shared_ptr<Shared> shared_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  uint64_t gen_ = 0;
  bool keep_alive_ = true;
  bool http10_ = false;      // an HTTP/1.0 request: streamed bodies are delimited by closing
  bool responding_ = false;  // a request is being answered (until its last byte is written)
  bool route_done_ = false;  // the route has completed its response
  bool started_ = false;     // status line queued
  bool counted_ = false;     // counted in Shared::in_flight
  bool watch_active_ = false;
  bool writing_ = false;
  bool closed_ = false;
  bool closing_ = false;
  bool drain_started_ = false;  // answered with Connection: close; draining input before closing
  char drain_[4096];
  std::string pending_, current_;
  std::function<void()> cancel_fn_;
};

class RequestResponder : public Responder {
 public:
  RequestResponder(std::shared_ptr<Session> s, uint64_t gen) : s_(std::move(s)), gen_(gen) {}

  void respond(HttpResponse response) override {
    net::post(s_->stream_.get_executor(), [s = s_, g = gen_, r = std::move(response)]() mutable {
      s->respond(g, std::move(r));
    });
  }
  void start_stream(int status, const std::string& content_type) override {
    net::post(s_->stream_.get_executor(),
              [s = s_, g = gen_, status, ct = content_type] { s->start_stream(g, status, ct); });
  }
  void write(std::string data) override {
    net::post(s_->stream_.get_executor(),
              [s = s_, g = gen_, d = std::move(data)]() mutable { s->write(g, std::move(d)); });
  }
  void end() override {
    net::post(s_->stream_.get_executor(), [s = s_, g = gen_] { s->end(g); });
  }
  void on_disconnect(std::function<void()> fn) override {
    net::post(s_->stream_.get_executor(), [s = s_, g = gen_, fn = std::move(fn)]() mutable {
      s->on_disconnect(g, std::move(fn));
    });
  }
  bool disconnected() const override { return s_->disconnected_.load(); }

 private:
  std::shared_ptr<Session> s_;
  uint64_t gen_;
};

std::shared_ptr<Responder> Session::make_responder() {
  return std::make_shared<RequestResponder>(shared_from_this(), gen_);
}

class BeastServer : public HttpServer {
 public:
  BeastServer(std::shared_ptr<Shared> shared)
      : shared_(std::move(shared)),
        accept_strand_(net::make_strand(ioc_)),
        acceptor_(accept_strand_),
        accept_timer_(accept_strand_) {}

  ~BeastServer() override { stop(); }

  Status listen() {
    const auto& o = shared_->options;
    beast::error_code ec;
    tcp::resolver resolver(ioc_);
    auto results = resolver.resolve(o.host, std::to_string(o.port), ec);
    if (ec || results.empty()) {
      return Status(StatusCode::kInvalidArgument,
                    "cannot resolve host '" + o.host + "': " + ec.message());
    }
    tcp::endpoint ep = results.begin()->endpoint();
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      return Status(StatusCode::kIoError, "cannot listen on " + o.host + ":" +
                                              std::to_string(o.port) + ": " + ec.message());
    }
    port_ = acceptor_.local_endpoint().port();
    return ok_status();
  }

  uint16_t port() const override { return port_; }

  void start() override {
    do_accept();
    const int n = std::max(1, shared_->options.threads);
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { ioc_.run(); });
  }

  void stop_accepting() override {
    shared_->stopping = true;
    net::post(accept_strand_, [this] {
      beast::error_code ignored;
      acceptor_.close(ignored);
      accept_timer_.cancel();
    });
  }

  int64_t in_flight() const override { return shared_->in_flight.load(); }

  void stop() override {
    shared_->stopping = true;
    ioc_.stop();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
    threads_.clear();
  }

 private:
  void do_accept() {
    acceptor_.async_accept(net::make_strand(ioc_),
                           [this](beast::error_code ec, tcp::socket socket) {
                             if (ec) {
                               if (!acceptor_.is_open() || shared_->stopping) return;
                               // Out of file descriptors (EMFILE, ENFILE) or memory: the
                               // connection stays in the backlog and accepting again at once
                               // fails again at once, spinning a core. Retry after a pause;
                               // open connections keep being served meanwhile.
                               accept_timer_.expires_after(kAcceptBackoff);
                               accept_timer_.async_wait([this](beast::error_code wait_ec) {
                                 if (wait_ec || !acceptor_.is_open() || shared_->stopping) return;
                                 do_accept();
                               });
                               return;
                             }
                             beast::error_code ignored;
                             socket.set_option(tcp::no_delay(true), ignored);
                             std::make_shared<Session>(std::move(socket), shared_)->run();
                             do_accept();
                           });
  }

  std::shared_ptr<Shared> shared_;
  net::io_context ioc_;
  // The acceptor, its retry timer and stop_accepting's close run on one strand.
  net::strand<net::io_context::executor_type> accept_strand_;
  tcp::acceptor acceptor_;
  net::steady_timer accept_timer_;  // the pause after a failed accept
  std::vector<std::thread> threads_;
  uint16_t port_ = 0;
};

}  // namespace

Result<std::unique_ptr<HttpServer>> HttpServer::create(
    const HttpServerOptions& options, Handler handler,
    std::function<HttpResponse(int)> error_response) {
  auto shared = std::make_shared<Shared>();
  shared->options = options;
  shared->handler = std::move(handler);
  shared->error_response = std::move(error_response);
  auto server = std::make_unique<BeastServer>(shared);
  STRATA_RETURN_IF_ERROR(server->listen());
  return std::unique_ptr<HttpServer>(std::move(server));
}

}  // namespace strata::server
