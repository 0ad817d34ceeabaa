// The in-process communicator (parallel/inproc_comm.h): host collectives by direct reads of the
// peers' buffers between two barriers; device collectives through the one-shot kernels.
#include "parallel/inproc_comm.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "core/env.h"
#include "core/status.h"
#include "parallel/comm_util.h"

namespace strata {

#if STRATA_HAS_CUDA
// inproc_comm_cuda.cpp
Status inproc_device_all_reduce(InProcessGroup& g, int rank, void* data, int64_t count, DType dt,
                                void* stream);
Status inproc_device_all_gather(InProcessGroup& g, int rank, const void* send, int64_t count,
                                DType dt, void* recv, void* stream);
Status inproc_device_all_to_all(InProcessGroup& g, int rank, const void* send, int64_t count,
                                DType dt, void* recv, void* stream);
Status inproc_device_reduce_scatter(InProcessGroup& g, int rank, const void* send, int64_t count,
                                    DType dt, void* recv, void* stream);
Status inproc_device_all_to_all_rows(InProcessGroup& g, int rank, const void* send,
                                     int64_t capacity, int64_t cols, DType dt, void* recv,
                                     const int32_t* send_rows, const int32_t* recv_rows,
                                     void* stream);
Status inproc_device_all_reduce_add_norm(InProcessGroup& g, int rank, const AllReduceAddNorm& a,
                                         void* stream);
Status inproc_device_expert_exchange(InProcessGroup& g, int rank, const ExpertExchangeParams& a,
                                     bool combine, void* stream);
void destroy_in_process_device(InProcessDeviceState* s);
Status inproc_device_health(InProcessGroup& g, int rank);
Status inproc_device_copy(void* dst, const void* src, int64_t bytes, void* stream);
Status inproc_device_sync(void* stream);
#endif

InProcessGroup::InProcessGroup(int n_ranks)
    : n(n_ranks),
      timeout(env_config().collective_timeout_s),
      present(static_cast<size_t>(n_ranks), false),
      in(static_cast<size_t>(n_ranks), nullptr),
      out(static_cast<size_t>(n_ranks), nullptr),
      counts(static_cast<size_t>(n_ranks), nullptr),
      offsets(static_cast<size_t>(n_ranks), nullptr),
      rows(static_cast<size_t>(n_ranks), nullptr),
      color(static_cast<size_t>(n_ranks), 0),
      key(static_cast<size_t>(n_ranks), 0),
      children(static_cast<size_t>(n_ranks)),
      mailbox(static_cast<size_t>(n_ranks * n_ranks)) {}

InProcessGroup::~InProcessGroup() {
#if STRATA_HAS_CUDA
  destroy_in_process_device(device);
#endif
}

Status InProcessGroup::barrier(int rank) {
  std::unique_lock<std::mutex> lock(mu);
  if (aborted) {
    return Status(StatusCode::kCancelled, "in-process collective: the group was aborted");
  }
  const uint64_t gen = generation;
  present[static_cast<size_t>(rank)] = true;
  if (++arrived == n) {
    arrived = 0;
    std::fill(present.begin(), present.end(), false);
    ++generation;
    cv.notify_all();
    return ok_status();
  }
  if (!cv.wait_for(lock, timeout, [&] { return generation != gen || aborted; })) {
    std::string missing;
    for (int r = 0; r < n; ++r) {
      if (!present[static_cast<size_t>(r)])
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    return errorf(StatusCode::kDeadlineExceeded,
                  "in-process collective: rank {} waited {} s for rank(s) {} (a rank failed or "
                  "took another path)",
                  rank, timeout.count(), missing);
  }
  if (generation == gen) {
    return Status(StatusCode::kCancelled, "in-process collective: the group was aborted");
  }
  return ok_status();
}

void InProcessGroup::abort() {
  std::vector<std::shared_ptr<InProcessGroup>> kids;
  {
    std::lock_guard<std::mutex> lock(mu);
    aborted = true;
    kids = children;
  }
  cv.notify_all();
  mail_cv.notify_all();
  for (const auto& k : kids) {
    if (k != nullptr && k.get() != this) k->abort();
  }
}

namespace {

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<InProcessGroup> g, int rank)
      : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->n; }
  const char* name() const override { return "in-process"; }
  bool supports(Device d) const override { return d.is_cpu() || g_->device != nullptr; }
  InProcessGroup& group() { return *g_; }

  Status all_reduce_add_norm(const AllReduceAddNorm& a, const CommStream& s) override {
#if STRATA_HAS_CUDA
    if (!s.device.is_cpu()) return inproc_device_all_reduce_add_norm(*g_, rank_, a, s.cuda_stream);
#endif
    return Communicator::all_reduce_add_norm(a, s);
  }

  Status all_reduce(void* data, int64_t count, DType dt, const CommStream& s) override {
    STRATA_RETURN_IF_ERROR(check_count("all-reduce", count, {data}));
    if (!s.device.is_cpu()) {
#if STRATA_HAS_CUDA
      return inproc_device_all_reduce(*g_, rank_, data, count, dt, s.cuda_stream);
#else
      return no_device("all-reduce");
#endif
    }
    g_->in[static_cast<size_t>(rank_)] = data;
    STRATA_RETURN_IF_ERROR(g_->barrier(rank_));
    std::vector<uint8_t> sum(static_cast<size_t>(dtype_bytes(dt, count)));
    Status st = reduce_sum_host(g_->in.data(), g_->n, count, dt, sum.data());
    STRATA_RETURN_IF_ERROR(g_->barrier(rank_));  // every rank has read every input
    STRATA_RETURN_IF_ERROR(st);
    std::memcpy(data, sum.data(), sum.size());
    return ok_status();
  }

  Status all_gather(const void* send, int64_t count, DType dt, void* recv,
                    const CommStream& s) override {
    STRATA_RETURN_IF_ERROR(check_count("all-gather", count, {send, recv}));
    if (!s.device.is_cpu()) {
#if STRATA_HAS_CUDA
      return inproc_device_all_gather(*g_, rank_, send, count, dt, recv, s.cuda_stream);
#else
      return no_device("all-gather");
#endif
    }
    const int64_t bytes = dtype_bytes(dt, count);
    g_->in[static_cast<size_t>(rank_)] = send;
    STRATA_RETURN_IF_ERROR(g_->barrier(rank_));
    for (int r = 0; r < g_->n; ++r) {
      char* dst = static_cast<char*>(recv) + bytes * r;
      if (dst == g_->in[static_cast<size_t>(r)]) continue;  // in place: this rank's own part
      std::memcpy(dst, g_->in[static_cast<size_t>(r)], static_cast<size_t>(bytes));
    }
    return g_->barrier(rank_);
  }

  Status reduce_scatter(const void* send, int64_t count, DType dt, void* recv,
                        const CommStream& s) override {
    STRATA_RETURN_IF_ERROR(check_count("reduce-scatter", count, {send, recv}));
    if (!s.device.is_cpu()) {
#if STRATA_HAS_CUDA
      return inproc_device_reduce_scatter(*g_, rank_, send, count, dt, recv, s.cuda_stream);
#else
      return no_device("reduce-scatter");
#endif
    }
    g_->in[static_cast<size_t>(rank_)] = send;
    STRATA_RETURN_IF_ERROR(g_->barrier(rank_));
    std::vector<const void*> chunks(static_cast<size_t>(g_->n));
    for (int r = 0; r < g_->n; ++r) {
      chunks[static_cast<size_t>(r)] =
          static_cast<const char*>(g_->in[static_cast<size_t>(r)]) + dtype_bytes(dt, count * rank_);
    }
    std::vector<uint8_t> sum(static_cast<size_t>(dtype_bytes(dt, count)));
    Status st = reduce_sum_host(chunks.data(), g_->n, count, dt, sum.data());
    STRATA_RETURN_IF_ERROR(g_->barrier(rank_));
    STRATA_RETURN_IF_ERROR(st);
    std::memcpy(recv, sum.data(), sum.size());
    return ok_status();
  }

  Status all_to_all(const void* send, int64_t count, DType dt, void* recv,
                    const CommStream& s) override {
    STRATA_RETURN_IF_ERROR(check_count("all-to-all", count, {send, recv}));
    if (!s.device.is_cpu()) {
#if STRATA_HAS_CUDA
      return inproc_device_all_to_all(*g_, rank_, send, count, dt, recv, s.cuda_stream);
#else
      return no_device("all-to-all");
#endif
    }
    const int64_t bytes = dtype_bytes(dt, count);
    g_->in[static_cast<size_t>(rank_)] = send;
    STRATA_RETURN_IF_ERROR(g_->barrier(rank_));
    for (int r = 0; r < g_->n; ++r) {
      std::memcpy(static_cast<char*>(recv) + bytes * r,
                  static_cast<const char*>(g_->in[static_cast<size_t>(r)]) + bytes * rank_,
                  static_cast<size_t>(bytes));
    }
    return g_->barrier(rank_);
  }

  // Device memory only (host ranks compose the exchange from all_to_all_rows).
  Status expert_dispatch(const ExpertExchangeParams& a, const CommStream& s) override {
    return expert_exchange(a, false, s);
  }
  Status expert_combine(const ExpertExchangeParams& a, const CommStream& s) override {
    return expert_exchange(a, true, s);
  }
  Status expert_exchange(const ExpertExchangeParams& a, bool combine, const CommStream& s) {
#if STRATA_HAS_CUDA
    if (!s.device.is_cpu()) {
      return inproc_device_expert_exchange(*g_, rank_, a, combine, s.cuda_stream);
    }
#endif
    (void)a;
    (void)combine;
    (void)s;
    return Status(StatusCode::kUnimplemented, "no fused expert exchange in host memory");
  }

  // Host memory: the first recv_rows[q] rows of every peer's block rank() (checked against the
  // peer's send_rows[rank()]); the rest of recv is left alone.
  Status all_to_all_rows(const void* send, int64_t capacity, int64_t cols, DType dt, void* recv,
                         const int32_t* send_rows, const int32_t* recv_rows,
                         const CommStream& s) override {
    STRATA_RETURN_IF_ERROR(
        check_count("all-to-all-rows", capacity * cols, {send, recv, send_rows, recv_rows}));
    if (!s.device.is_cpu()) {
#if STRATA_HAS_CUDA
      return inproc_device_all_to_all_rows(*g_, rank_, send, capacity, cols, dt, recv, send_rows,
                                           recv_rows, s.cuda_stream);
#else
      return no_device("all-to-all-rows");
#endif
    }
    if (capacity < 0 || cols < 0) {
      return Status(StatusCode::kInvalidArgument, "all-to-all-rows: negative capacity or cols");
    }
    const size_t me = static_cast<size_t>(rank_);
    const int64_t row = dtype_bytes(dt, cols), block = row * capacity;
    g_->in[me] = send;
    g_->rows[me] = send_rows;
    STRATA_RETURN_IF_ERROR(g_->barrier(rank_));
    Status st = ok_status();
    for (int q = 0; q < g_->n && capacity * cols > 0; ++q) {
      const size_t p = static_cast<size_t>(q);
      const int64_t n = recv_rows[p];
      if (n != g_->rows[p][me] || n < 0 || n > capacity) {
        st = errorf(StatusCode::kInvalidArgument,
                    "all-to-all-rows: rank {} sends {} rows to rank {}, which expects {} "
                    "(capacity {})",
                    q, g_->rows[p][me], rank_, n, capacity);
        break;
      }
      std::memcpy(static_cast<char*>(recv) + block * q,
                  static_cast<const char*>(g_->in[p]) + block * rank_,
                  static_cast<size_t>(row * n));
    }
    STRATA_RETURN_IF_ERROR(g_->barrier(rank_));
    return st;
  }

  Status all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_offsets,
                      void* recv, const int64_t* recv_counts, const int64_t* recv_offsets, DType dt,
                      const CommStream& s) override {
    // Device buffers (one address space): each rank pulls its blocks from the peers' send
    // buffers with copies on its stream. Its stream is drained before the first barrier (the
    // peers read its send buffer from theirs) and after its copies (after the second barrier a
    // peer may overwrite its send buffer). No staging through host memory, no registration.
    const bool device = !s.device.is_cpu();
#if !STRATA_HAS_CUDA
    if (device) return no_device("all-to-all-v");
#endif
    const size_t me = static_cast<size_t>(rank_);
    Status st = ok_status();
#if STRATA_HAS_CUDA
    if (device) st = inproc_device_sync(s.cuda_stream);
#endif
    g_->in[me] = send;
    g_->counts[me] = send_counts;
    g_->offsets[me] = send_offsets;
    STRATA_RETURN_IF_ERROR(g_->barrier(rank_));
    for (int r = 0; r < g_->n && st.ok(); ++r) {
      const size_t p = static_cast<size_t>(r);
      const int64_t n = g_->counts[p][me];
      if (n != recv_counts[p]) {
        st = errorf(StatusCode::kInvalidArgument,
                    "all-to-all-v: rank {} sends {} elements to rank {}, which expects {}", r, n,
                    rank_, recv_counts[p]);
        break;
      }
      char* dst = static_cast<char*>(recv) + dtype_bytes(dt, recv_offsets[p]);
      const char* src = static_cast<const char*>(g_->in[p]) + dtype_bytes(dt, g_->offsets[p][me]);
      if (n == 0) continue;
#if STRATA_HAS_CUDA
      if (device) {
        st = inproc_device_copy(dst, src, dtype_bytes(dt, n), s.cuda_stream);
        continue;
      }
#endif
      std::memcpy(dst, src, static_cast<size_t>(dtype_bytes(dt, n)));
    }
#if STRATA_HAS_CUDA
    if (device && st.ok()) st = inproc_device_sync(s.cuda_stream);
#endif
    STRATA_RETURN_IF_ERROR(g_->barrier(rank_));
    return st;
  }

  Status send(const void* data, int64_t count, DType dt, int peer, const CommStream& s) override {
    if (!s.device.is_cpu()) return no_device("send");
    STRATA_RETURN_IF_ERROR(check_peer(peer));
    const auto* p = static_cast<const uint8_t*>(data);
    std::lock_guard<std::mutex> lock(g_->mu);
    g_->mailbox[static_cast<size_t>(rank_ * g_->n + peer)].emplace_back(p,
                                                                        p + dtype_bytes(dt, count));
    g_->mail_cv.notify_all();
    return ok_status();
  }

  Status recv(void* data, int64_t count, DType dt, int peer, const CommStream& s) override {
    if (!s.device.is_cpu()) return no_device("recv");
    STRATA_RETURN_IF_ERROR(check_peer(peer));
    std::unique_lock<std::mutex> lock(g_->mu);
    auto& box = g_->mailbox[static_cast<size_t>(peer * g_->n + rank_)];
    if (!g_->mail_cv.wait_for(lock, g_->timeout, [&] { return !box.empty() || g_->aborted; })) {
      return errorf(StatusCode::kDeadlineExceeded,
                    "in-process recv: rank {} waited {} s for rank {}", rank_, g_->timeout.count(),
                    peer);
    }
    if (box.empty())
      return Status(StatusCode::kCancelled, "in-process recv: the group was aborted");
    std::vector<uint8_t> msg = std::move(box.front());
    box.pop_front();
    if (static_cast<int64_t>(msg.size()) != dtype_bytes(dt, count)) {
      return errorf(StatusCode::kDataLoss, "in-process recv from rank {}: {} bytes, expected {}",
                    peer, msg.size(), dtype_bytes(dt, count));
    }
    std::memcpy(data, msg.data(), msg.size());
    return ok_status();
  }

  Status broadcast(void* data, int64_t count, DType dt, int root, const CommStream& s) override {
    if (!s.device.is_cpu()) return no_device("broadcast");
    if (root < 0 || root >= g_->n) {
      return errorf(StatusCode::kInvalidArgument, "broadcast: root {} of {}", root, g_->n);
    }
    g_->in[static_cast<size_t>(rank_)] = data;
    STRATA_RETURN_IF_ERROR(g_->barrier(rank_));
    if (rank_ != root) {
      std::memcpy(data, g_->in[static_cast<size_t>(root)],
                  static_cast<size_t>(dtype_bytes(dt, count)));
    }
    return g_->barrier(rank_);
  }

  Status barrier() override {
    return g_->barrier(rank_);
  }

  void abort() override {
    g_->abort();
  }
  Status health() override {
#if STRATA_HAS_CUDA
    return inproc_device_health(*g_, rank_);
#else
    return ok_status();
#endif
  }

  Result<std::unique_ptr<Communicator>> split(int color, int key) override {
    const size_t me = static_cast<size_t>(rank_);
    g_->color[me] = color;
    g_->key[me] = key;
    STRATA_RETURN_IF_ERROR(g_->barrier(rank_));
    // The members of my color ordered by (key, rank); the first one creates the group.
    std::vector<std::pair<int, int>> members;  // (key, rank)
    for (int r = 0; r < g_->n; ++r) {
      if (g_->color[static_cast<size_t>(r)] == color)
        members.emplace_back(g_->key[static_cast<size_t>(r)], r);
    }
    std::sort(members.begin(), members.end());
    const int leader = members.front().second;
    int sub_rank = 0;
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i].second == rank_) sub_rank = static_cast<int>(i);
    }
    if (rank_ == leader) {
      g_->children[me] = std::make_shared<InProcessGroup>(static_cast<int>(members.size()));
      g_->children[me]->timeout = g_->timeout;
    }
    STRATA_RETURN_IF_ERROR(g_->barrier(rank_));
    std::shared_ptr<InProcessGroup> child = g_->children[static_cast<size_t>(leader)];
    STRATA_RETURN_IF_ERROR(g_->barrier(rank_));
    if (rank_ == leader) g_->children[me].reset();
    return std::unique_ptr<Communicator>(new InProcessCommunicator(std::move(child), sub_rank));
  }

 private:
  Status no_device(const char* op) const {
    return errorf(StatusCode::kUnimplemented,
                  "in-process {} on device memory is not available (all-reduce, all-gather, "
                  "reduce-scatter and all-to-all are, after init_in_process_device)",
                  op);
  }
  Status check_peer(int peer) const {
    if (peer < 0 || peer >= g_->n || peer == rank_) {
      return errorf(StatusCode::kInvalidArgument, "peer rank {} of {} (this is {})", peer, g_->n,
                    rank_);
    }
    return ok_status();
  }

  std::shared_ptr<InProcessGroup> g_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_in_process_communicators(int n) {
  std::vector<std::unique_ptr<Communicator>> out;
  if (n < 1) return out;
  auto g = std::make_shared<InProcessGroup>(n);
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<InProcessCommunicator>(g, r));
  return out;
}

InProcessGroup* in_process_group(Communicator& c) {
  auto* ip = dynamic_cast<InProcessCommunicator*>(&c);
  return ip != nullptr ? &ip->group() : nullptr;
}

#if !STRATA_HAS_CUDA
Status init_in_process_device(Communicator&, int, int64_t) {
  return Status(StatusCode::kUnimplemented, "device collectives need a CUDA build");
}
int64_t in_process_device_max_bytes(Communicator&) {
  return 0;
}
#endif

}  // namespace strata
