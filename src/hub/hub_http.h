// HTTP for the hub downloader, over libcurl: GET with a bounded body, and a download into a
// file that resumes a partial one with a Range request. Redirects are followed (the hub sends
// large files to its CDN); every transfer has a connect timeout and a stall timeout.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "strata/status.h"

namespace strata::hub {

struct HttpOptions {
  std::string token;      // sent as "Authorization: Bearer TOKEN" (not to other hosts)
  double timeout_s = 10;  // connect timeout, and the longest time without a byte received
  std::string user_agent = "strata/0.1.0";
};

struct HttpResponse {
  long status = 0;
  // Headers of each response in the redirect chain, names lowercased, first hop first.
  std::vector<std::map<std::string, std::string>> hops;
  std::string body;    // GET: the body (bounded); download: the body of an error answer
  int64_t offset = 0;  // download: where the body started in the file (0 unless resumed)
  // The first hop's value of `name` (lowercase) that is set, else "".
  std::string header(const std::string& name) const;
};

// Transport failures (refused, reset, timed out, body cut short) are kIoError or
// kDeadlineExceeded statuses naming the URL; an HTTP error status is a response, not an error.
class HttpClient {
 public:
  explicit HttpClient(HttpOptions options);
  Result<HttpResponse> get(const std::string& url, size_t max_body) const;
  Result<HttpResponse> head(const std::string& url) const;
  // Writes the body of a 200 to `path` (truncating it), or of a 206 after the `path`'s current
  // bytes when `path` is non-empty (a Range request is sent then). `progress(done, total)` is
  // called as bytes arrive (total 0 when unknown).
  Result<HttpResponse> download(const std::string& url, const std::string& path,
                                const std::function<void(int64_t, int64_t)>& progress) const;

 private:
  HttpOptions options_;
};

// "https://host/a%20b": each byte outside the unreserved set percent-encoded; '/' kept when
// keep_slash.
std::string url_encode(const std::string& s, bool keep_slash);

}  // namespace strata::hub
