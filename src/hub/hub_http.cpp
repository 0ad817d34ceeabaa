#include "hub/hub_http.h"

#include <curl/curl.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>

#include "core/status.h"

namespace strata::hub {

namespace {

namespace fs = std::filesystem;

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct CurlDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};
using CurlPtr = std::unique_ptr<CURL, CurlDeleter>;
using SlistPtr = std::unique_ptr<curl_slist, SlistDeleter>;

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

// One transfer's state, shared with the callbacks.
struct Transfer {
  CURL* curl = nullptr;
  HttpResponse* response = nullptr;
  size_t max_body = 0;
  bool body_truncated = false;
  // Downloads only.
  std::string path;
  int64_t existing = 0;  // bytes of `path` before the request
  std::FILE* file = nullptr;
  bool file_checked = false;
  std::string file_error;
  const std::function<void(int64_t, int64_t)>* progress = nullptr;
};

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::string line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) {
    t->response->hops.emplace_back();  // a new response (a redirect hop, or 100 Continue)
  } else if (const size_t colon = line.find(':'); colon != std::string::npos) {
    if (t->response->hops.empty()) t->response->hops.emplace_back();
    t->response->hops.back()[lower(trim(line.substr(0, colon)))] = trim(line.substr(colon + 1));
  }
  return size * n;
}

size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t bytes = size * n;
  if (t->path.empty()) {
    if (t->response->body.size() + bytes > t->max_body) {
      t->body_truncated = true;
      return 0;  // aborts the transfer
    }
    t->response->body.append(data, bytes);
    return bytes;
  }
  if (!t->file_checked) {
    t->file_checked = true;
    long code = 0;
    curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &code);
    if (code == 206 || code == 200) {
      // 206: the rest of the file after `existing` bytes (the server honoured the Range);
      // 200: the whole file (no Range sent, or the server ignored it).
      const bool append = code == 206;
      if (append) {
        // "Content-Range: bytes START-END/TOTAL" must start where the partial file ends.
        const std::string cr =
            t->response->hops.empty() ? "" : t->response->hops.back()["content-range"];
        const std::string want = "bytes " + std::to_string(t->existing) + "-";
        if (cr.rfind(want, 0) != 0) {
          t->file_error = t->path + ": the server resumed at the wrong offset (Content-Range '" +
                          cr + "', expected " + want + "...)";
          return 0;
        }
      }
      t->response->offset = append ? t->existing : 0;
      t->file = std::fopen(t->path.c_str(), append ? "ab" : "wb");
      if (t->file == nullptr) {
        t->file_error = t->path + ": cannot open for writing";
        return 0;
      }
    }
  }
  if (t->file == nullptr) {  // an error answer: keep a little of its body for the message
    if (t->response->body.size() < 4096)
      t->response->body.append(data, std::min<size_t>(bytes, 4096));
    return bytes;
  }
  if (std::fwrite(data, 1, bytes, t->file) != bytes) {
    t->file_error = t->path + ": write failed (disk full?)";
    return 0;
  }
  return bytes;
}

int on_progress(void* user, curl_off_t total, curl_off_t now, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  if (t->progress != nullptr && *t->progress && t->file != nullptr) {
    const int64_t base = t->response->offset;
    (*t->progress)(base + static_cast<int64_t>(now),
                   total > 0 ? base + static_cast<int64_t>(total) : 0);
  }
  return 0;
}

}  // namespace

std::string HttpResponse::header(const std::string& name) const {
  for (const auto& hop : hops) {
    if (const auto it = hop.find(name); it != hop.end() && !it->second.empty()) return it->second;
  }
  return "";
}

std::string url_encode(const std::string& s, bool keep_slash) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out += c;
    } else {
      out += '%';
      out += kHex[u >> 4];
      out += kHex[u & 15];
    }
  }
  return out;
}

HttpClient::HttpClient(HttpOptions options) : options_(std::move(options)) {
  global_init();
}

namespace {

Result<HttpResponse> perform(const HttpOptions& opt, const std::string& url, Transfer& t,
                             HttpResponse& r, const std::string& range, bool head) {
  CurlPtr curl(curl_easy_init());
  if (!curl) return errorf(StatusCode::kInternal, "GET {}: curl_easy_init failed", url);
  t.curl = curl.get();
  t.response = &r;
  char errbuf[CURL_ERROR_SIZE] = {0};
  SlistPtr headers;
  curl_slist* list = nullptr;
  if (!opt.token.empty()) {
    // curl does not send a custom Authorization header to another host after a redirect.
    list = curl_slist_append(list, ("Authorization: Bearer " + opt.token).c_str());
  }
  headers.reset(list);
  CURL* c = curl.get();
  const long timeout = std::max(1L, static_cast<long>(opt.timeout_s + 0.5));
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, timeout);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, timeout);
  curl_easy_setopt(c, CURLOPT_USERAGENT, opt.user_agent.c_str());
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, &t);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  if (headers) curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
  if (!range.empty()) curl_easy_setopt(c, CURLOPT_RANGE, range.c_str());
  if (head) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  const CURLcode rc = curl_easy_perform(c);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
  if (t.file != nullptr) {
    if (std::fclose(t.file) != 0 && t.file_error.empty()) t.file_error = t.path + ": write failed";
    t.file = nullptr;
  }
  if (!t.file_error.empty()) return Status(StatusCode::kIoError, t.file_error);
  if (t.body_truncated) {
    return errorf(StatusCode::kDataLoss, "GET {}: answer larger than {} bytes", url, t.max_body);
  }
  if (rc != CURLE_OK) {
    const std::string why = errbuf[0] != '\0' ? errbuf : curl_easy_strerror(rc);
    const StatusCode code =
        rc == CURLE_OPERATION_TIMEDOUT ? StatusCode::kDeadlineExceeded : StatusCode::kIoError;
    return errorf(code, "GET {}: {}", url, why);
  }
  return std::move(r);
}

}  // namespace

Result<HttpResponse> HttpClient::get(const std::string& url, size_t max_body) const {
  HttpResponse r;
  Transfer t;
  t.max_body = max_body;
  return perform(options_, url, t, r, "", false);
}

Result<HttpResponse> HttpClient::head(const std::string& url) const {
  HttpResponse r;
  Transfer t;
  t.max_body = 0;
  return perform(options_, url, t, r, "", true);
}

Result<HttpResponse> HttpClient::download(
    const std::string& url, const std::string& path,
    const std::function<void(int64_t, int64_t)>& progress) const {
  HttpResponse r;
  Transfer t;
  t.path = path;
  t.progress = &progress;
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  t.existing = ec ? 0 : static_cast<int64_t>(size);
  const std::string range = t.existing > 0 ? std::to_string(t.existing) + "-" : "";
  auto result = perform(options_, url, t, r, range, false);
  if (result.ok() && result->status == 200 && !t.file_checked) {
    // An empty file: no body arrived to create it.
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) return Status(StatusCode::kIoError, path + ": cannot open for writing");
    std::fclose(f);
  }
  return result;
}

}  // namespace strata::hub
