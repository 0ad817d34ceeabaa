#include "runtime/weight_streamer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "core/log.h"
#include "core/status.h"

namespace strata {

namespace {

constexpr size_t kDirectAlign = 4096;

}  // namespace

// One rank's share of a partitioned fetch: ceil(bytes / n) rounded up to 256 bytes (aligned
// parts for the copies and the all-gather; the last part may be shorter, or empty).
size_t part_bytes(size_t bytes, int n) {
  const size_t k = static_cast<size_t>(std::max(1, n));
  return ((bytes + k - 1) / k + 255) / 256 * 256;
}

std::vector<FetchPiece> fetch_pieces(size_t bytes, int n, int pieces) {
  const size_t k = static_cast<size_t>(std::max(1, n));
  const int p = std::max(1, pieces);
  if (bytes == 0) return {FetchPiece{}};  // one empty piece, as the whole-layer fetch had
  // Full pieces of k x q bytes while more than one is left, then the rest, split over k ranks.
  // The offsets stay multiples of k x 256, so the last piece ends at bytes rounded up to k x 256.
  const size_t q = part_bytes(bytes, n * p), extent = k * q;
  std::vector<FetchPiece> out;
  size_t offset = 0;
  while (bytes - offset > extent) {
    out.push_back({offset, q});
    offset += extent;
  }
  out.push_back({offset, part_bytes(bytes - offset, n)});
  return out;
}

ByteRange fetch_piece_range(const FetchPiece& piece, size_t bytes, int rank) {
  const size_t r = static_cast<size_t>(std::max(0, rank));
  ByteRange b;
  b.begin = std::min(bytes, piece.offset + r * piece.part);
  b.end = std::min(bytes, b.begin + piece.part);
  return b;
}

int resolve_fetch_pieces(int requested) {
  if (requested > 0) return requested;
  if (const char* e = std::getenv("STRATA_FETCH_PIECES"); e != nullptr && *e != '\0') {
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    if (end != e && *end == '\0' && v > 0 && v <= 1024) return static_cast<int>(v);
    log_warn("STRATA_FETCH_PIECES={} is not a count in 1..1024; using {}", e, kDefaultFetchPieces);
  }
  return kDefaultFetchPieces;
}

namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

}  // namespace

Result<std::unique_ptr<WeightStreamer>> WeightStreamer::create(
    std::shared_ptr<StreamedWeights> weights, DeviceRuntime& runtime, bool prefetch,
    Communicator* fetch_group, int pieces) {
  std::unique_ptr<WeightStreamer> s(new WeightStreamer());
  s->w_ = std::move(weights);
  s->prefetch_ = prefetch;
  if (fetch_group != nullptr && fetch_group->size() > 1) {
    s->group_ = fetch_group;
    s->pieces_ = resolve_fetch_pieces(pieces);
    const size_t n = static_cast<size_t>(fetch_group->size());
    for (const StreamedLayer& l : s->w_->layers) {
      const FetchPiece last = fetch_pieces(l.bytes, fetch_group->size(), s->pieces_).back();
      if (last.offset + n * last.part > s->w_->slot_bytes) {
        return errorf(StatusCode::kInternal,
                      "partitioned fetch: {} parts of layer {} ({} bytes) overflow the {}-byte "
                      "slots (ResidencyOptions::fetch_parts not set?)",
                      n, l.layer, l.bytes, s->w_->slot_bytes);
      }
    }
  }
  s->K_ = static_cast<int64_t>(s->w_->layers.size());
  s->S_ = static_cast<int>(s->w_->slots.size());
  if (s->K_ == 0 || s->S_ == 0) {
    return Status(StatusCode::kInternal, "weight streaming without streamed layers or slots");
  }
  s->slot_owner_.assign(static_cast<size_t>(s->S_), -1);
  const bool disk = s->w_->tier == LayerTier::kDisk;
  STRATA_ASSIGN_OR_RETURN(s->copier_, runtime.make_weight_copier(s->S_, disk ? kStaging : 0));
  if (disk) {
    for (int i = 0; i < kStaging; ++i) {
      Result<Buffer> b = runtime.allocate_staging(s->w_->slot_bytes);
      if (!b.ok()) return b.status().with_context("weight streaming staging buffer");
      s->staging_.push_back(std::move(b).value());
    }
    STRATA_RETURN_IF_ERROR(s->start_readers());
  }
  return s;
}

WeightStreamer::~WeightStreamer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : readers_) t.join();
  if (copier_) (void)copier_->synchronize();
  for (int fd : fds_) {
    if (fd >= 0) ::close(fd);
  }
}

StreamStats WeightStreamer::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  StreamStats s = stats_;
  s.disk_bytes = disk_bytes_;
  s.direct_io = direct_;
  s.bytes_per_pass = static_cast<int64_t>(w_->bytes_per_pass());
  s.fetch_parts = group_ != nullptr ? group_->size() : 1;
  s.fetch_pieces = group_ != nullptr ? pieces_ : 1;
  s.slot_bytes = static_cast<int64_t>(w_->slot_bytes * w_->slots.size());
  return s;
}

Status WeightStreamer::begin_pass(int64_t, int64_t) {
  ++stats_.passes;
  return prefetch_ ? pump() : ok_status();
}

Status WeightStreamer::before_layer(int64_t layer) {
  const int idx = w_->index_of_layer[static_cast<size_t>(layer)];
  if (idx < 0) return ok_status();
  if (consumed_ % K_ != idx) {
    return errorf(StatusCode::kInternal,
                  "weight streaming: layer {} runs out of order (streamed layer {} expected)",
                  layer, w_->layers[static_cast<size_t>(consumed_ % K_)].layer);
  }
  if (issued_ <= consumed_) {
    // Not prefetched: its slot's previous item has run (items run in order). With prefetch off
    // the copy also waits for all compute issued so far (the slot marked free here), so copies
    // and compute never overlap: the A/B baseline. Before, the host ran ahead of the GPU and the
    // copy into the other slot still overlapped the previous layer's kernels.
    if (!prefetch_) {
      STRATA_RETURN_IF_ERROR(copier_->mark_free(w_->layers[static_cast<size_t>(idx)].slot));
    }
    STRATA_RETURN_IF_ERROR(issue(consumed_));
  }
  return copier_->wait_ready(w_->layers[static_cast<size_t>(idx)].slot);
}

Status WeightStreamer::after_layer(int64_t layer) {
  const int idx = w_->index_of_layer[static_cast<size_t>(layer)];
  if (idx < 0) return ok_status();
  STRATA_RETURN_IF_ERROR(copier_->mark_free(w_->layers[static_cast<size_t>(idx)].slot));
  ++consumed_;
  return prefetch_ ? pump() : ok_status();
}

// Issues items ahead while their slot's previous item has run, at most S_ ahead.
Status WeightStreamer::pump() {
  while (issued_ < consumed_ + S_) {
    const StreamedLayer& l = w_->layers[static_cast<size_t>(issued_ % K_)];
    if (slot_owner_[static_cast<size_t>(l.slot)] >= consumed_) break;  // still to run
    STRATA_RETURN_IF_ERROR(issue(issued_));
  }
  return ok_status();
}

Status WeightStreamer::issue(int64_t item) {
  if (item != issued_) return Status(StatusCode::kInternal, "weight streaming: items out of order");
  const StreamedLayer& l = w_->layers[static_cast<size_t>(item % K_)];
  void* dst = w_->slots[static_cast<size_t>(l.slot)];
  auto* dst8 = static_cast<uint8_t*>(dst);
  // The blob's source: pinned host memory, or the staging buffer its reader packed it into.
  const uint8_t* src = static_cast<const uint8_t*>(l.host.data());
  int b = -1;
  if (w_->tier != LayerTier::kHost) {
    b = static_cast<int>(item % kStaging);
    const auto t0 = std::chrono::steady_clock::now();
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return ready_[static_cast<size_t>(b)] == item || !reader_error_.ok(); });
      if (!reader_error_.ok()) return reader_error_;
    }
    stats_.disk_wait_s +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    src = static_cast<const uint8_t*>(staging_[static_cast<size_t>(b)].data());
  }
  size_t copied = 0;
  if (group_ == nullptr) {
    STRATA_RETURN_IF_ERROR(copier_->copy(l.slot, dst8, src, l.bytes, b));
    copied = l.bytes;
  } else {
    // This rank's part of each piece, then the piece's all-gather (after that copy, on the
    // copier's gather stream) while the next piece's copy runs; the slot is ready after the last
    // piece's all-gather.
    for (const FetchPiece& p : fetch_pieces(l.bytes, group_->size(), pieces_)) {
      const ByteRange r = fetch_piece_range(p, l.bytes, group_->rank());
      STRATA_RETURN_IF_ERROR(
          copier_->copy(l.slot, dst8 + r.begin, src + r.begin, r.end - r.begin, b));
      STRATA_RETURN_IF_ERROR(copier_->gather(l.slot, dst8 + p.offset, p.part, *group_));
      copied += r.end - r.begin;
      ++stats_.gathers;
    }
    stats_.gathered_bytes += static_cast<int64_t>(l.bytes - copied);
  }
  if (b >= 0) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_ = item + 1;
    }
    cv_.notify_all();
  }
  slot_owner_[static_cast<size_t>(l.slot)] = item;
  ++issued_;
  ++stats_.layers;
  stats_.bytes += static_cast<int64_t>(copied);
  return ok_status();
}

// ---- the disk tier ----------------------------------------------------------------------------

Status WeightStreamer::start_readers() {
  direct_ = true;
  for (const std::string& path : w_->files) {
    int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0 && errno == EINVAL) {
      // The file system has no O_DIRECT (tmpfs, some overlays): buffered reads.
      direct_ = false;
      fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    }
    if (fd < 0) {
      return errorf(StatusCode::kIoError, "--offload-weights disk: cannot open {}: {}", path,
                    std::strerror(errno));
    }
    fds_.push_back(fd);
  }
  if (direct_ && !w_->layers.empty() && !w_->layers[0].ranges.empty()) {
    // Some file systems open with O_DIRECT but refuse the reads (EINVAL): probe one block.
    const DiskRange& r = w_->layers[0].ranges[0];
    void* p = nullptr;
    if (posix_memalign(&p, kDirectAlign, kDirectAlign) == 0) {
      std::unique_ptr<void, FreeDeleter> probe(p);
      const ssize_t n = ::pread(fds_[static_cast<size_t>(r.file)], probe.get(), kDirectAlign,
                                static_cast<off_t>(r.offset));
      if (n < 0 && errno == EINVAL) direct_ = false;
    }
  }
  if (!direct_) {
    // Every file buffered if one is: simpler to reason about.
    for (size_t i = 0; i < fds_.size(); ++i) {
      ::close(fds_[i]);
      fds_[i] = ::open(w_->files[i].c_str(), O_RDONLY | O_CLOEXEC);
      if (fds_[i] < 0) {
        return errorf(StatusCode::kIoError, "--offload-weights disk: cannot open {}: {}",
                      w_->files[i], std::strerror(errno));
      }
    }
    log_info("weight streaming: {} does not take O_DIRECT; reading through the page cache",
             w_->files.empty() ? std::string("the checkpoint") : w_->files[0]);
  }
  ready_.assign(kStaging, -1);
  for (int i = 0; i < kReaders; ++i) readers_.emplace_back([this] { reader_loop(); });
  return ok_status();
}

void WeightStreamer::reader_loop() {
  size_t raw_bytes = kDirectAlign;
  for (const StreamedLayer& l : w_->layers) raw_bytes = std::max(raw_bytes, l.read_bytes);
  void* p = nullptr;
  if (posix_memalign(&p, kDirectAlign, raw_bytes) != 0) {
    std::lock_guard<std::mutex> lock(mu_);
    reader_error_ = errorf(StatusCode::kOutOfMemory,
                           "weight streaming: no memory for a {}-byte read buffer", raw_bytes);
    cv_.notify_all();
    return;
  }
  std::unique_ptr<void, FreeDeleter> raw(p);
  for (;;) {
    int64_t item = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Item n goes into staging n % kStaging once item n - kStaging has been taken by its copy.
      cv_.wait(lock,
               [&] { return stop_ || !reader_error_.ok() || next_read_ < released_ + kStaging; });
      if (stop_ || !reader_error_.ok()) return;
      item = next_read_++;
    }
    const int b = static_cast<int>(item % kStaging);
    Status st = copier_->wait_staging(b);  // the copy out of it has finished
    if (st.ok()) {
      st = read_item(item, static_cast<uint8_t*>(raw.get()),
                     static_cast<uint8_t*>(staging_[static_cast<size_t>(b)].data()));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!st.ok()) {
        reader_error_ = st;
      } else {
        ready_[static_cast<size_t>(b)] = item;
      }
    }
    cv_.notify_all();
    if (!st.ok()) return;
  }
}

Status WeightStreamer::read_item(int64_t item, uint8_t* raw, uint8_t* blob) {
  const StreamedLayer& l = w_->layers[static_cast<size_t>(item % K_)];
  int64_t bytes = 0;
  for (const DiskRange& r : l.ranges) {
    uint64_t done = 0;
    while (done < r.bytes) {
      const ssize_t n = ::pread(fds_[static_cast<size_t>(r.file)], raw + r.buf_offset + done,
                                r.bytes - done, static_cast<off_t>(r.offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        return errorf(StatusCode::kIoError,
                      "--offload-weights disk: reading {} bytes at {} of {} (layer {}): {}",
                      r.bytes - done, r.offset + done, w_->files[static_cast<size_t>(r.file)],
                      l.layer, std::strerror(errno));
      }
      if (n == 0) break;  // end of file (inside the last aligned block)
      done += static_cast<uint64_t>(n);
    }
    if (done < r.needed) {
      return errorf(StatusCode::kDataLoss,
                    "--offload-weights disk: {} ends after {} of the {} bytes at {} (layer {})",
                    w_->files[static_cast<size_t>(r.file)], done, r.needed, r.offset, l.layer);
    }
    bytes += static_cast<int64_t>(done);
  }
  STRATA_RETURN_IF_ERROR(l.pack(raw, blob));
  std::lock_guard<std::mutex> lock(mu_);
  disk_bytes_ += bytes;
  return ok_status();
}

}  // namespace strata
