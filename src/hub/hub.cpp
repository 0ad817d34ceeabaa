#include "hub/hub.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "core/mapped_file.h"
#include "core/status.h"
#include "hub/hub_http.h"

namespace strata::hub {

namespace fs = std::filesystem;

namespace {

constexpr size_t kMaxApiAnswer = size_t{32} << 20;
constexpr int kRetries = 3;  // transient failures (connection cut, 5xx) retried, resuming

const char* kOfflineHint = "offline (--offline or HF_HUB_OFFLINE=1)";

struct Cache {
  fs::path base;  // the cache folder
  fs::path root;  // <cache>/models--org--name
  fs::path locks;
  Cache(const std::string& dir, const std::string& repo)
      : base(fs::absolute(fs::path(dir)).lexically_normal()),
        root(base / repo_folder_name(repo)),
        locks(base / ".locks" / repo_folder_name(repo)) {}
  fs::path ref(const std::string& rev) const { return root / "refs" / rev; }
  fs::path snapshot(const std::string& sha) const { return root / "snapshots" / sha; }
  fs::path blob(const std::string& etag) const { return root / "blobs" / etag; }
  fs::path no_exist(const std::string& sha, const std::string& f) const {
    return root / ".no_exist" / sha / f;
  }
};

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

// The commit a ref file holds, or "" when there is none (or it is not a commit id).
std::string read_ref(const Cache& c, const std::string& rev) {
  std::error_code ec;
  const fs::path p = c.ref(rev);
  if (!fs::is_regular_file(p, ec) || fs::file_size(p, ec) > 256) return "";
  std::ifstream in(p);
  std::string sha;
  in >> sha;
  return is_commit_sha(sha) ? sha : "";
}

Status write_text_atomic(const fs::path& path, const std::string& text) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  const fs::path tmp = path.string() + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out) return errorf(StatusCode::kIoError, "{}: cannot write", tmp.string());
  }
  fs::rename(tmp, path, ec);
  if (ec) return errorf(StatusCode::kIoError, "{}: cannot write: {}", path.string(), ec.message());
  return ok_status();
}

bool path_exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);  // follows symlinks: a dangling link is missing
}

// The names in a snapshot's top folder (what select_files chooses from when offline).
std::vector<std::string> snapshot_names(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (path_exists(it->path())) names.push_back(it->path().filename().string());
  }
  return names;
}

// Where a -m hub id is served from the cache alone: the snapshot folder or file when every
// file the selection needs is there (optional ones present or marked absent in .no_exist;
// with `lenient` missing optional files are fine). Otherwise an error naming the first
// missing file.
Result<std::string> from_cache(const Cache& c, const HubId& id, const std::string& sha,
                               bool lenient) {
  const fs::path snap = c.snapshot(sha);
  const auto missing = [&](const std::string& f) {
    return errorf(StatusCode::kNotFound, "{}: {} is not in the Hugging Face cache ({})",
                  id.display(), f, (snap / f).string());
  };
  std::vector<std::string> names = snapshot_names(snap);
  if (!id.file.empty() && !path_exists(snap / id.file)) return missing(id.file);
  auto sel = select_files(names, id);
  if (!sel.ok()) {
    // A checkpoint folder without its weights, or nothing strata can open.
    if (path_exists(snap / "config.json")) return missing("model.safetensors");
    return missing("config.json");
  }
  for (const std::string& f : sel->required) {
    if (!path_exists(snap / f)) return missing(f);
  }
  if (sel->needs_index) {
    const std::string index = (snap / "model.safetensors.index.json").string();
    STRATA_ASSIGN_OR_RETURN(std::string text, read_text_file(index));
    STRATA_ASSIGN_OR_RETURN(auto shards, parse_index_shards(text, index));
    for (const std::string& s : shards) {
      if (!path_exists(snap / s)) return missing(s);
    }
  }
  for (const std::string& f : sel->optional) {
    if (!lenient && !path_exists(snap / f) && !path_exists(c.no_exist(sha, f))) return missing(f);
  }
  return (sel->entry.empty() ? snap : snap / sel->entry).string();
}

// An exclusive flock on the blob's lock file (huggingface_hub's filelock takes the same one).
class BlobLock {
 public:
  static Result<BlobLock> take(const fs::path& path, const std::string& what) {
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
      return errorf(StatusCode::kIoError, "{}: cannot create the lock file", path.string());
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      std::fprintf(stderr, "strata: waiting for another process downloading %s\n", what.c_str());
      if (::flock(fd, LOCK_EX) != 0) {
        ::close(fd);
        return errorf(StatusCode::kIoError, "{}: cannot lock", path.string());
      }
    }
    return BlobLock(fd);
  }
  BlobLock(BlobLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  BlobLock& operator=(BlobLock&&) = delete;
  ~BlobLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }

 private:
  explicit BlobLock(int fd) : fd_(fd) {}
  int fd_;
};

// The hex digest of a file: sha256 (an LFS etag) or git's blob sha1 ("blob SIZE\0" + content,
// a regular file's etag).
Result<std::string> file_digest(const fs::path& path, bool git_blob) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return errorf(StatusCode::kIoError, "{}: cannot open", path.string());
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), git_blob ? EVP_sha1() : EVP_sha256(), nullptr) != 1)
    return errorf(StatusCode::kInternal, "{}: OpenSSL digest init failed", path.string());
  if (git_blob) {
    std::error_code ec;
    const std::string head = "blob " + std::to_string(fs::file_size(path, ec));
    EVP_DigestUpdate(ctx.get(), head.c_str(), head.size() + 1);  // with the NUL
  }
  std::vector<char> buf(size_t{1} << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (in.gcount() > 0) EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) return errorf(StatusCode::kIoError, "{}: read failed", path.string());
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &n);
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < n; ++i) {
    hex += kHex[md[i] >> 4];
    hex += kHex[md[i] & 15];
  }
  return hex;
}

// A progress bar on stderr: redrawn in place on a terminal, one line per file otherwise.
class Progress {
 public:
  Progress(bool enabled, std::string label)
      : enabled_(enabled), tty_(::isatty(2) != 0), label_(std::move(label)) {}
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress() {
    if (open_line_) std::fputc('\n', stderr);  // a failed download: end the bar's line
  }
  void update(int64_t done, int64_t total) {
    done_ = done;
    total_ = total;
    if (!enabled_ || !tty_) return;
    const auto now = Clock::now();
    if (now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    draw('\r');
  }
  void resumed(int64_t at) {
    resumed_at_ = at;
    if (enabled_) {
      if (open_line_) std::fputc('\n', stderr);
      open_line_ = false;
      std::fprintf(stderr, "strata: resuming %s at %s\n", label_.c_str(),
                   human_bytes(static_cast<double>(at)).c_str());
    }
  }
  void finish() {
    if (!enabled_) return;
    draw(tty_ ? '\r' : '\0');
    std::fputc('\n', stderr);
    std::fflush(stderr);
    open_line_ = false;
  }

 private:
  using Clock = std::chrono::steady_clock;
  void draw(char lead) {
    const double secs = std::chrono::duration<double>(Clock::now() - start_).count();
    const double speed = secs > 0 ? static_cast<double>(done_ - resumed_at_) / secs : 0;
    const int pct = total_ > 0 ? static_cast<int>(100 * done_ / total_) : 0;
    if (lead != '\0') std::fputc(lead, stderr);
    std::fprintf(stderr, "strata: downloading %s: %3d%% %s / %s, %s/s   ", label_.c_str(), pct,
                 human_bytes(static_cast<double>(done_)).c_str(),
                 total_ > 0 ? human_bytes(static_cast<double>(total_)).c_str() : "?",
                 human_bytes(speed).c_str());
    std::fflush(stderr);
    open_line_ = true;
  }
  bool enabled_, tty_;
  bool open_line_ = false;  // a bar is drawn and its line not ended
  std::string label_;
  Clock::time_point start_ = Clock::now(), last_{};
  int64_t done_ = 0, total_ = 0, resumed_at_ = 0;
};

class Resolver {
 public:
  Resolver(const HubId& id, const HubOptions& opt)
      : id_(id),
        opt_(opt),
        cache_(opt.cache_dir, id.repo),
        http_(HttpOptions{opt.token, opt.timeout_s}) {
    endpoint_ = opt.endpoint;
    while (!endpoint_.empty() && endpoint_.back() == '/') endpoint_.pop_back();
  }

  Result<std::string> run() {
    const std::string& rev = id_.rev();
    std::string sha = is_commit_sha(rev) ? rev : read_ref(cache_, rev);
    if (!sha.empty()) {
      auto local = from_cache(cache_, id_, sha, /*lenient=*/opt_.offline);
      if (local.ok() || !opt_.offline) {
        if (local.ok()) return local;
      } else {
        return Status(local.status().code(), local.status().message() + "; " + kOfflineHint);
      }
    }
    if (opt_.offline) {
      return errorf(StatusCode::kNotFound,
                    "{}: revision '{}' is not in the Hugging Face cache (no {}) and {}; run once "
                    "online to download it",
                    id_.display(), rev, cache_.ref(rev).string(), kOfflineHint);
    }
    return download();
  }

 private:
  std::string api_url() const {
    return endpoint_ + "/api/models/" + id_.repo + "/revision/" + url_encode(id_.rev(), false) +
           "?blobs=true";
  }
  std::string file_url(const std::string& sha, const std::string& file) const {
    return endpoint_ + "/" + id_.repo + "/resolve/" + sha + "/" + url_encode(file, true);
  }

  // An HTTP error answer as one line: what failed, and what to do for 401/403/404.
  Status http_error(const HttpResponse& r, const std::string& url, const std::string& what) const {
    const std::string code = r.header("x-error-code");
    std::string msg = fmt::format("{}: {}: HTTP {}{} from {}", id_.display(), what, r.status,
                                  code.empty() ? "" : " (" + code + ")", url);
    if (r.status == 401 || r.status == 403) {
      msg += opt_.token.empty()
                 ? ": the repository is gated or private: set HF_TOKEN to a Hugging Face access "
                   "token that can read it"
                 : ": HF_TOKEN does not give access to this repository (request access on its "
                   "page, or check the token)";
      return Status(StatusCode::kFailedPrecondition, msg);
    }
    if (r.status == 404) {
      msg += code == "RevisionNotFound" ? ": no revision '" + id_.rev() + "'"
             : code == "EntryNotFound"  ? ": no such file in the repository"
                                        : ": no such repository (or a private one: set HF_TOKEN)";
      return Status(StatusCode::kNotFound, msg);
    }
    return Status(StatusCode::kIoError, msg);
  }

  static bool transient(const Status& s) {
    return s.code() == StatusCode::kIoError || s.code() == StatusCode::kDeadlineExceeded;
  }
  static void backoff(int attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250 << attempt));
  }

  Result<RepoInfo> fetch_info() {
    const std::string url = api_url();
    for (int attempt = 0;; ++attempt) {
      auto r = http_.get(url, kMaxApiAnswer);
      if (!r.ok()) {
        if (transient(r.status()) && attempt < kRetries) {
          backoff(attempt);
          continue;
        }
        return r.status().with_context(id_.display());
      }
      if (r->status >= 500 && attempt < kRetries) {
        backoff(attempt);
        continue;
      }
      if (r->status != 200) return http_error(*r, url, "listing the files");
      return parse_repo_info(r->body, url);
    }
  }

  Result<std::string> download() {
    STRATA_ASSIGN_OR_RETURN(info_, fetch_info());
    const std::string& rev = id_.rev();
    if (rev != info_.sha) {
      STRATA_RETURN_IF_ERROR(write_text_atomic(cache_.ref(rev), info_.sha));
    }
    std::vector<std::string> names;
    for (const RepoFile& f : info_.files) names.push_back(f.name);
    if (!id_.file.empty() && info_.find(id_.file) == nullptr) {
      return errorf(StatusCode::kNotFound, "{}: the repository has no file {} at {}", id_.display(),
                    id_.file, info_.sha);
    }
    STRATA_ASSIGN_OR_RETURN(FileSelection sel, select_files(names, id_));
    for (const std::string& f : sel.required) STRATA_RETURN_IF_ERROR(ensure(f));
    const fs::path snap = cache_.snapshot(info_.sha);
    if (sel.needs_index) {
      const std::string index = (snap / "model.safetensors.index.json").string();
      STRATA_ASSIGN_OR_RETURN(std::string text, read_text_file(index));
      STRATA_ASSIGN_OR_RETURN(auto shards, parse_index_shards(text, index));
      for (const std::string& s : shards) {
        if (info_.find(s) == nullptr) {
          return errorf(StatusCode::kNotFound, "{}: {} names shard {}, which the repository lacks",
                        id_.display(), "model.safetensors.index.json", s);
        }
        STRATA_RETURN_IF_ERROR(ensure(s));
      }
    }
    for (const std::string& f : sel.optional) {
      if (info_.find(f) != nullptr) {
        STRATA_RETURN_IF_ERROR(ensure(f));
      } else {
        STRATA_RETURN_IF_ERROR(write_text_atomic(cache_.no_exist(info_.sha, f), ""));
      }
    }
    return (sel.entry.empty() ? snap : snap / sel.entry).string();
  }

  // snapshots/SHA/FILE present, downloading its blob first when needed.
  Status ensure(const std::string& file) {
    const fs::path dst = cache_.snapshot(info_.sha) / file;
    if (path_exists(dst)) return ok_status();
    const RepoFile& meta = *info_.find(file);
    const std::string url = file_url(info_.sha, file);
    std::string etag = meta.etag();
    if (etag.empty()) {
      STRATA_ASSIGN_OR_RETURN(etag, head_etag(url, file));
    }
    const fs::path blob = cache_.blob(etag);
    if (!path_exists(blob)) {
      STRATA_ASSIGN_OR_RETURN(
          BlobLock lock, BlobLock::take(cache_.locks / (etag + ".lock"), id_.repo + " " + file));
      if (!path_exists(blob))
        STRATA_RETURN_IF_ERROR(download_blob(url, file, meta.size, etag, blob));
    }
    return link(blob, dst);
  }

  // The ETag of a file the API answer gave no blob id for (a HEAD of its resolve URL).
  Result<std::string> head_etag(const std::string& url, const std::string& file) {
    STRATA_ASSIGN_OR_RETURN(HttpResponse r, http_.head(url));
    if (r.status != 200) return http_error(r, url, file);
    std::string etag = r.header("x-linked-etag");
    if (etag.empty()) etag = r.header("etag");
    if (etag.rfind("W/", 0) == 0) etag = etag.substr(2);
    etag.erase(std::remove(etag.begin(), etag.end(), '"'), etag.end());
    if (!is_hex(etag, 64) && !is_hex(etag, 40)) {
      return errorf(StatusCode::kDataLoss, "{}: {}: no usable ETag from {} ('{}')", id_.display(),
                    file, url, etag.substr(0, 80));
    }
    return etag;
  }

  Status download_blob(const std::string& url, const std::string& file, int64_t size,
                       const std::string& etag, const fs::path& blob) {
    std::error_code ec;
    fs::create_directories(blob.parent_path(), ec);
    const fs::path part = blob.string() + ".incomplete";
    Progress progress(opt_.progress, id_.repo + " " + file);
    const std::string kept = "; the partial download is kept: run again to resume";
    for (int attempt = 0;; ++attempt) {
      const auto have = fs::file_size(part, ec);
      const int64_t existing = ec ? 0 : static_cast<int64_t>(have);
      if (existing > 0) progress.resumed(existing);
      auto r =
          http_.download(url, part.string(), [&](int64_t d, int64_t t) { progress.update(d, t); });
      if (!r.ok()) {
        if (transient(r.status()) && attempt < kRetries) {
          backoff(attempt);
          continue;
        }
        return Status(r.status().code(),
                      id_.display() + ": " + file + ": " + r.status().message() + kept);
      }
      if (r->status == 416 && existing > 0) {
        // The partial file is not shorter than the file: complete, or not ours. The check below
        // decides; a wrong one is deleted.
      } else if (r->status >= 500 && attempt < kRetries) {
        backoff(attempt);
        continue;
      } else if (r->status != 200 && r->status != 206) {
        return http_error(*r, url, file);
      }
      const std::string commit = r->header("x-repo-commit");
      if (!commit.empty() && commit != info_.sha) {
        return errorf(StatusCode::kDataLoss, "{}: {}: the hub answered commit {} for {}",
                      id_.display(), file, commit, info_.sha);
      }
      const auto got = fs::file_size(part, ec);
      if (!ec && size >= 0 && static_cast<int64_t>(got) < size && attempt < kRetries) {
        backoff(attempt);  // the connection ended early without an error: resume
        continue;
      }
      break;
    }
    progress.finish();
    const bool sha256 = is_hex(etag, 64), git_blob = is_hex(etag, 40);
    const auto got_size = fs::file_size(part, ec);
    if (size >= 0 && !ec && static_cast<int64_t>(got_size) != size) {
      fs::remove(part, ec);
      return errorf(StatusCode::kDataLoss,
                    "{}: {}: downloaded {} bytes, the hub lists {}; the download was deleted",
                    id_.display(), file, got_size, size);
    }
    if (sha256 || git_blob) {
      STRATA_ASSIGN_OR_RETURN(std::string digest, file_digest(part, git_blob));
      if (digest != etag) {
        fs::remove(part, ec);
        return errorf(StatusCode::kDataLoss,
                      "{}: {}: {} mismatch (expected {}, got {}); the download was deleted",
                      id_.display(), file, sha256 ? "sha256" : "git blob sha1", etag, digest);
      }
    }
    fs::rename(part, blob, ec);
    if (ec)
      return errorf(StatusCode::kIoError, "{}: cannot rename: {}", part.string(), ec.message());
    return ok_status();
  }

  // snapshots/SHA/FILE -> ../../blobs/ETAG (relative, as huggingface_hub links); a copy where
  // the file system has no symlinks.
  Status link(const fs::path& blob, const fs::path& dst) {
    std::error_code ec;
    fs::create_directories(dst.parent_path(), ec);
    // Made under a temporary name and renamed over `dst`: another process linking the same file
    // at the same time makes the same link, and neither fails.
    const fs::path tmp = dst.string() + ".strata-tmp" + std::to_string(::getpid());
    fs::remove(tmp, ec);
    fs::create_symlink(blob.lexically_relative(dst.parent_path()), tmp, ec);
    if (ec) fs::copy_file(blob, tmp, fs::copy_options::overwrite_existing, ec);
    if (!ec) fs::rename(tmp, dst, ec);
    if (ec) {
      fs::remove(tmp, ec);
      if (path_exists(dst)) return ok_status();
      return errorf(StatusCode::kIoError, "{}: cannot create: {}", dst.string(), ec.message());
    }
    return ok_status();
  }

  HubId id_;
  HubOptions opt_;
  Cache cache_;
  HttpClient http_;
  std::string endpoint_;
  RepoInfo info_;
};

}  // namespace

std::string repo_folder_name(const std::string& repo) {
  std::string out = "models--";
  for (char c : repo) {
    if (c == '/') {
      out += "--";
    } else {
      out += c;
    }
  }
  return out;
}

Result<std::string> resolve(const HubId& id, const HubOptions& options) {
  if (options.cache_dir.empty()) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: no Hugging Face cache folder (set HF_HUB_CACHE)", id.display());
  }
  return Resolver(id, options).run();
}

}  // namespace strata::hub
