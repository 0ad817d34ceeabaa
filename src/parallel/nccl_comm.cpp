// NCCL communicator: device collectives through NCCL, one GPU per rank. NCCL is loaded at run
// time (dlopen of libnccl.so.2, or STRATA_NCCL_LIBRARY), so a strata binary starts on machines
// without it and says what is missing only when a run asks for NCCL. Host memory, barriers, the
// bootstrap (rank 0's unique id) and split() go through the host communicator it wraps: MPI when
// ranks are processes, the in-process communicator when they are threads. When that host
// communicator also takes device memory (the in-process one-shot kernels), all-reduces and
// all-gathers of up to `oneshot_max_bytes` go to it and larger ones to NCCL.
//
// NVLink SHARP / multicast stays off: NCCL_NVLS_ENABLE=0 is set before the first communicator.
#if STRATA_HAS_CUDA && STRATA_HAS_NCCL

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "parallel/comm.h"
#include "parallel/comm_util.h"

namespace strata {

namespace {

// The NCCL entry points strata calls, resolved from the shared library.
struct NcclApi {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclCommGetAsyncError) async_error = nullptr;
  int version = 0;
};

template <typename F>
bool resolve(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  return fn != nullptr;
}

Result<const NcclApi*> nccl_api() {
  static std::once_flag once;
  static NcclApi api;
  static Status error;
  std::call_once(once, [] {
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);
    std::vector<std::string> names;
    if (!env_config().nccl_library.empty()) {
      names.push_back(env_config().nccl_library);
    } else {
      names = {"libnccl.so.2", "libnccl.so"};
    }
    void* lib = nullptr;
    std::string why;
    for (const std::string& n : names) {
      lib = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) break;
      const char* e = dlerror();
      why = e != nullptr ? e : n;
    }
    if (lib == nullptr) {
      error = errorf(StatusCode::kUnimplemented,
                     "NCCL could not be loaded ({}); put libnccl.so.2 on LD_LIBRARY_PATH or set "
                     "STRATA_NCCL_LIBRARY to its path",
                     why);
      return;
    }
    const bool ok = resolve(lib, "ncclGetVersion", api.get_version) &&
                    resolve(lib, "ncclGetUniqueId", api.get_unique_id) &&
                    resolve(lib, "ncclCommInitRank", api.comm_init_rank) &&
                    resolve(lib, "ncclCommDestroy", api.comm_destroy) &&
                    resolve(lib, "ncclCommAbort", api.comm_abort) &&
                    resolve(lib, "ncclGetErrorString", api.error_string) &&
                    resolve(lib, "ncclAllReduce", api.all_reduce) &&
                    resolve(lib, "ncclAllGather", api.all_gather) &&
                    resolve(lib, "ncclReduceScatter", api.reduce_scatter) &&
                    resolve(lib, "ncclBroadcast", api.broadcast) &&
                    resolve(lib, "ncclSend", api.send) && resolve(lib, "ncclRecv", api.recv) &&
                    resolve(lib, "ncclGroupStart", api.group_start) &&
                    resolve(lib, "ncclGroupEnd", api.group_end) &&
                    resolve(lib, "ncclCommGetAsyncError", api.async_error);
    if (!ok) {
      error = Status(StatusCode::kUnimplemented,
                     "the NCCL library lacks an entry point strata needs (NCCL >= 2.19)");
      return;
    }
    api.get_version(&api.version);
  });
  if (!error.ok()) return error;
  return &api;
}

Result<ncclDataType_t> nccl_type(DType dt) {
  switch (dt) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI8:
      return ncclInt8;
    case DType::kU8:
      return ncclUint8;
    default:
      return errorf(StatusCode::kInvalidArgument, "NCCL collectives do not take {}",
                    dtype_name(dt));
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const NcclApi* api, std::unique_ptr<Communicator> host, ncclComm_t comm,
                   int device, int64_t oneshot_max_bytes)
      : api_(api),
        host_(std::move(host)),
        comm_(comm),
        device_(device),
        oneshot_max_bytes_(oneshot_max_bytes) {}
  ~NcclCommunicator() override {
    if (comm_ != nullptr && !aborted_.load()) {
      (void)cudaSetDevice(device_);
      (void)api_->comm_destroy(comm_);
    }
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const char* name() const override { return "nccl"; }
  bool supports(Device d) const override { return d.is_cpu() || d.is_cuda(); }

  Status all_reduce(void* data, int64_t count, DType dt, const CommStream& s) override {
    STRATA_RETURN_IF_ERROR(check_count("all-reduce", count, {data}));
    if (to_host(s, dtype_bytes(dt, count))) return host_->all_reduce(data, count, dt, s);
    STRATA_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_type(dt));
    STRATA_RETURN_IF_ERROR(alive());
    return check(
        api_->all_reduce(data, data, static_cast<size_t>(count), t, ncclSum, comm_, stream(s)),
        "all-reduce");
  }
  Status all_reduce_add_norm(const AllReduceAddNorm& a, const CommStream& s) override {
    // Fused only where the one-shot kernels take the message; NCCL sizes compose.
    if (!s.device.is_cpu() && to_host(s, dtype_bytes(DType::kF32, a.rows * a.cols))) {
      return host_->all_reduce_add_norm(a, s);
    }
    return Communicator::all_reduce_add_norm(a, s);
  }
  Status all_gather(const void* send, int64_t count, DType dt, void* recv,
                    const CommStream& s) override {
    STRATA_RETURN_IF_ERROR(check_count("all-gather", count, {send, recv}));
    if (to_host(s, dtype_bytes(dt, count))) return host_->all_gather(send, count, dt, recv, s);
    STRATA_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_type(dt));
    STRATA_RETURN_IF_ERROR(alive());
    return check(api_->all_gather(send, recv, static_cast<size_t>(count), t, comm_, stream(s)),
                 "all-gather");
  }
  Status reduce_scatter(const void* send, int64_t count, DType dt, void* recv,
                        const CommStream& s) override {
    STRATA_RETURN_IF_ERROR(check_count("reduce-scatter", count, {send, recv}));
    if (s.device.is_cpu()) return host_->reduce_scatter(send, count, dt, recv, s);
    STRATA_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_type(dt));
    STRATA_RETURN_IF_ERROR(alive());
    return check(
        api_->reduce_scatter(send, recv, static_cast<size_t>(count), t, ncclSum, comm_, stream(s)),
        "reduce-scatter");
  }
  Status all_to_all(const void* send, int64_t count, DType dt, void* recv,
                    const CommStream& s) override {
    STRATA_RETURN_IF_ERROR(check_count("all-to-all", count, {send, recv}));
    // Small device messages through the host communicator's one-shot kernels (in-process ranks:
    // the fixed-capacity expert exchange of a decode step, 1-4 tokens per GPU, is faster there).
    if (to_host(s, dtype_bytes(dt, count) * size())) {
      return host_->all_to_all(send, count, dt, recv, s);
    }
    std::vector<int64_t> counts(static_cast<size_t>(size()), count), offsets(counts.size());
    for (size_t r = 0; r < offsets.size(); ++r) offsets[r] = static_cast<int64_t>(r) * count;
    return exchange(send, counts.data(), offsets.data(), recv, counts.data(), offsets.data(), dt,
                    s);
  }
  // Device memory: the fixed path (every block whole, the counts unread). Grouped send/recv
  // takes its sizes on the host at enqueue time, so it cannot follow device counts that change
  // between replays of a captured graph; a counted NCCL exchange would need a host read of the
  // counts (the variable-split path) or a device-initiated transport.
  Status all_to_all_rows(const void* send, int64_t capacity, int64_t cols, DType dt, void* recv,
                         const int32_t* send_rows, const int32_t* recv_rows,
                         const CommStream& s) override {
    if (s.device.is_cpu()) {
      return host_->all_to_all_rows(send, capacity, cols, dt, recv, send_rows, recv_rows, s);
    }
    return Communicator::all_to_all_rows(send, capacity, cols, dt, recv, send_rows, recv_rows, s);
  }
  // The fused expert exchange: the host communicator's (the in-process one-shot kernels write
  // the rows over NVLink, counts read on the device) where it takes device memory; NCCL has
  // none (the caller composes the exchange).
  Status expert_dispatch(const ExpertExchangeParams& a, const CommStream& s) override {
    if (!s.device.is_cpu() && host_->supports(s.device)) return host_->expert_dispatch(a, s);
    return Communicator::expert_dispatch(a, s);
  }
  Status expert_combine(const ExpertExchangeParams& a, const CommStream& s) override {
    if (!s.device.is_cpu() && host_->supports(s.device)) return host_->expert_combine(a, s);
    return Communicator::expert_combine(a, s);
  }
  Status all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_offsets,
                      void* recv, const int64_t* recv_counts, const int64_t* recv_offsets, DType dt,
                      const CommStream& s) override {
    if (s.device.is_cpu()) {
      return host_->all_to_all_v(send, send_counts, send_offsets, recv, recv_counts, recv_offsets,
                                 dt, s);
    }
    return exchange(send, send_counts, send_offsets, recv, recv_counts, recv_offsets, dt, s);
  }
  Status send(const void* data, int64_t count, DType dt, int peer, const CommStream& s) override {
    if (s.device.is_cpu()) return host_->send(data, count, dt, peer, s);
    STRATA_RETURN_IF_ERROR(check_peer("send", peer));
    STRATA_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_type(dt));
    STRATA_RETURN_IF_ERROR(alive());
    return check(api_->send(data, static_cast<size_t>(count), t, peer, comm_, stream(s)), "send");
  }
  Status recv(void* data, int64_t count, DType dt, int peer, const CommStream& s) override {
    if (s.device.is_cpu()) return host_->recv(data, count, dt, peer, s);
    STRATA_RETURN_IF_ERROR(check_peer("recv", peer));
    STRATA_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_type(dt));
    STRATA_RETURN_IF_ERROR(alive());
    return check(api_->recv(data, static_cast<size_t>(count), t, peer, comm_, stream(s)), "recv");
  }
  Status broadcast(void* data, int64_t count, DType dt, int root, const CommStream& s) override {
    if (s.device.is_cpu()) return host_->broadcast(data, count, dt, root, s);
    STRATA_RETURN_IF_ERROR(check_peer("broadcast", root));
    STRATA_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_type(dt));
    STRATA_RETURN_IF_ERROR(alive());
    return check(api_->broadcast(data, data, static_cast<size_t>(count), t, root, comm_, stream(s)),
                 "broadcast");
  }
  Status barrier() override { return host_->barrier(); }
  void abort() override {
    if (!aborted_.exchange(true)) {
      // ncclCommAbort stops this rank's kernels still waiting for peers and frees the
      // communicator; calls after it fail below instead of touching it.
      (void)cudaSetDevice(device_);
      (void)api_->comm_abort(comm_);
    }
    host_->abort();
  }
  Status health() override {
    STRATA_RETURN_IF_ERROR(alive());
    ncclResult_t async = ncclSuccess;
    STRATA_RETURN_IF_ERROR(check(api_->async_error(comm_, &async), "async error query"));
    STRATA_RETURN_IF_ERROR(check(async, "collective"));
    return host_->health();
  }
  Result<std::unique_ptr<Communicator>> split(int color, int key) override {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> sub, host_->split(color, key));
    return make_nccl_communicator(std::move(sub), device_, oneshot_max_bytes_);
  }

 private:
  // Host memory, and device messages small enough for a host communicator that takes device
  // memory (the in-process one-shot kernels), go to host_.
  bool to_host(const CommStream& s, int64_t bytes) const {
    return s.device.is_cpu() || (bytes <= oneshot_max_bytes_ && host_->supports(s.device));
  }
  static cudaStream_t stream(const CommStream& s) {
    return static_cast<cudaStream_t>(s.cuda_stream);
  }
  // Every NCCL call is made only while the communicator has not been aborted.
  Status alive() const {
    if (!aborted_.load()) return ok_status();
    return errorf(StatusCode::kCancelled,
                  "NCCL rank {}: the communicator was aborted (a peer rank failed or timed out)",
                  rank());
  }
  Status check(ncclResult_t r, const char* op) const {
    if (r == ncclSuccess) return ok_status();
    return errorf(StatusCode::kInternal, "NCCL {} failed on rank {}: {}", op, rank(),
                  api_->error_string(r));
  }
  Status check_peer(const char* op, int peer) const {
    if (peer < 0 || peer >= size()) {
      return errorf(StatusCode::kInvalidArgument, "NCCL {}: rank {} of {}", op, peer, size());
    }
    return ok_status();
  }
  Status exchange(const void* send, const int64_t* send_counts, const int64_t* send_offsets,
                  void* recv, const int64_t* recv_counts, const int64_t* recv_offsets, DType dt,
                  const CommStream& s) {
    STRATA_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_type(dt));
    STRATA_RETURN_IF_ERROR(alive());
    const int64_t elem = dtype_bytes(dt, 1);
    STRATA_RETURN_IF_ERROR(check(api_->group_start(), "group start"));
    Status st = ok_status();
    for (int r = 0; r < size() && st.ok(); ++r) {
      const size_t i = static_cast<size_t>(r);
      if (send_counts[i] < 0 || recv_counts[i] < 0) {
        st = Status(StatusCode::kInvalidArgument, "NCCL all-to-all: negative count");
        break;
      }
      if (send_counts[i] > 0) {
        st = check(api_->send(static_cast<const char*>(send) + send_offsets[i] * elem,
                              static_cast<size_t>(send_counts[i]), t, r, comm_, stream(s)),
                   "all-to-all send");
      }
      if (st.ok() && recv_counts[i] > 0) {
        st = check(api_->recv(static_cast<char*>(recv) + recv_offsets[i] * elem,
                              static_cast<size_t>(recv_counts[i]), t, r, comm_, stream(s)),
                   "all-to-all recv");
      }
    }
    const Status end = check(api_->group_end(), "group end");
    return st.ok() ? end : st;
  }

  const NcclApi* api_;
  std::unique_ptr<Communicator> host_;
  ncclComm_t comm_;
  int device_;
  int64_t oneshot_max_bytes_;
  std::atomic<bool> aborted_{false};
};

}  // namespace

Result<std::unique_ptr<Communicator>> make_nccl_communicator(std::unique_ptr<Communicator> host,
                                                             int device_index,
                                                             int64_t oneshot_max_bytes) {
  if (host == nullptr) return Status(StatusCode::kInvalidArgument, "NCCL: no host communicator");
  // Every rank learns whether NCCL loaded before anyone blocks in ncclCommInitRank.
  Result<const NcclApi*> api = nccl_api();
  int32_t failed = api.ok() ? 0 : 1;
  STRATA_RETURN_IF_ERROR(host->all_reduce(&failed, 1, DType::kI32, CommStream::host()));
  if (!api.ok()) return api.status();
  if (failed != 0) {
    return errorf(StatusCode::kUnimplemented, "NCCL could not be loaded on {} of {} ranks", failed,
                  host->size());
  }
  struct {
    int32_t result = ncclSuccess;
    ncclUniqueId id{};
  } boot;
  if (host->rank() == 0) boot.result = (*api)->get_unique_id(&boot.id);
  STRATA_RETURN_IF_ERROR(host->broadcast(&boot, static_cast<int64_t>(sizeof(boot)), 0));
  if (boot.result != ncclSuccess) {
    return errorf(StatusCode::kInternal, "NCCL unique id on rank 0: {}",
                  (*api)->error_string(static_cast<ncclResult_t>(boot.result)));
  }
  const ncclUniqueId& id = boot.id;
  if (cudaSetDevice(device_index) != cudaSuccess) {
    (void)cudaGetLastError();
    return errorf(StatusCode::kInvalidArgument, "NCCL: CUDA device {} is not available",
                  device_index);
  }
  ncclComm_t comm = nullptr;
  const ncclResult_t r = (*api)->comm_init_rank(&comm, host->size(), id, host->rank());
  if (r != ncclSuccess) {
    return errorf(StatusCode::kInternal, "NCCL communicator init failed on rank {} (GPU {}): {}",
                  host->rank(), device_index, (*api)->error_string(r));
  }
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(
      *api, std::move(host), comm, device_index, oneshot_max_bytes));
}

std::string nccl_version() {
  Result<const NcclApi*> api = nccl_api();
  if (!api.ok()) return std::string();
  const int v = (*api)->version;
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

}  // namespace strata

#else  // no CUDA or no nccl.h at build time

#include "core/status.h"
#include "parallel/comm.h"

namespace strata {

Result<std::unique_ptr<Communicator>> make_nccl_communicator(std::unique_ptr<Communicator>, int,
                                                             int64_t) {
  return Status(StatusCode::kUnimplemented,
                "NCCL communicators need a strata build with CUDA and nccl.h");
}

std::string nccl_version() {
  return std::string();
}

}  // namespace strata

#endif
