// The one-shot collectives of one rank (parallel/oneshot_rank.h), and the CUDA IPC communicator
// that sets them up between processes. Compiled with CUDA only.
#if STRATA_HAS_CUDA

#include "parallel/oneshot_rank.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"
#include "core/status.h"
#include "parallel/comm_util.h"

namespace strata {

namespace {

cuda::OneShotParams params(const OneShotRank& v, DType dt) {
  cuda::OneShotParams p;
  p.n_ranks = v.n_ranks;
  p.rank = v.rank;
  p.staging = v.staging_table;
  p.staging_bytes = v.staging_bytes;
  p.flags = v.flags_table;
  p.epoch = v.counters;
  p.done = v.counters + 1;
  p.error = v.counters + 2;
  p.dtype = dt;
  return p;
}

}  // namespace

Status oneshot_collective(const OneShotRank& v, const void* in, void* out, int64_t count, DType dt,
                          void* stream, bool gather) {
  cuda::LaunchCtx ctx;
  ctx.stream = static_cast<cudaStream_t>(stream);
  cuda::OneShotParams p = params(v, dt);
  // Messages larger than half the staging buffer go in pieces, each its own epoch.
  const int64_t elem = dtype_bytes(dt, 1);
  const int64_t piece = std::max<int64_t>(1, v.staging_bytes / 2 / elem);
  for (int64_t off = 0; off < count; off += piece) {
    const int64_t n = std::min(piece, count - off);
    if (gather && n != count) {
      return Status(StatusCode::kUnimplemented,
                    "one-shot device all-gather larger than the staging buffer");
    }
    p.in = static_cast<const char*>(in) + off * elem;
    p.count = n;
    p.out = static_cast<char*>(out) + (gather ? 0 : off * elem);
    STRATA_RETURN_IF_ERROR(cuda::oneshot(ctx, p, gather));
  }
  return ok_status();
}

Status oneshot_reduce_scatter(const OneShotRank& v, const void* send, void* recv, int64_t count,
                              DType dt, void* stream) {
  const int64_t bytes = dtype_bytes(dt, count) * v.n_ranks;
  if (bytes > v.staging_bytes / 2) {
    return errorf(StatusCode::kUnimplemented,
                  "one-shot device reduce-scatter of {} bytes over {} ranks: above half the "
                  "{}-byte staging buffer",
                  bytes, v.n_ranks, v.staging_bytes);
  }
  cuda::LaunchCtx ctx;
  ctx.stream = static_cast<cudaStream_t>(stream);
  cuda::OneShotParams p = params(v, dt);
  p.in = send;
  p.out = recv;
  p.count = count;
  return cuda::oneshot_reduce_scatter(ctx, p);
}

Status oneshot_all_to_all(const OneShotRank& v, const void* send, void* recv, int64_t count,
                          DType dt, void* stream) {
  const int64_t bytes = dtype_bytes(dt, count);
  if (bytes * v.n_ranks > v.staging_bytes / 2 || bytes % 4 != 0) {
    return errorf(StatusCode::kUnimplemented,
                  "one-shot device all-to-all of {} bytes per rank over {} ranks: above half the "
                  "{}-byte staging buffer, or not whole 4-byte words",
                  bytes, v.n_ranks, v.staging_bytes);
  }
  cuda::LaunchCtx ctx;
  ctx.stream = static_cast<cudaStream_t>(stream);
  cuda::OneShotParams p = params(v, dt);
  p.in = send;
  p.out = recv;
  return cuda::oneshot_all_to_all(ctx, p, bytes);
}

Status oneshot_all_to_all_rows(const OneShotRank& v, const void* send, int64_t capacity,
                               int64_t cols, DType dt, void* recv, const int32_t* send_rows,
                               const int32_t* recv_rows, void* stream) {
  const int64_t row = dtype_bytes(dt, cols);
  if (row * capacity * v.n_ranks > v.staging_bytes / 2 || row % 4 != 0) {
    return errorf(StatusCode::kUnimplemented,
                  "one-shot device all-to-all of {} rows of {} bytes per rank over {} ranks: "
                  "above half the {}-byte staging buffer, or rows not whole 4-byte words",
                  capacity, row, v.n_ranks, v.staging_bytes);
  }
  cuda::LaunchCtx ctx;
  ctx.stream = static_cast<cudaStream_t>(stream);
  cuda::OneShotParams p = params(v, dt);
  p.in = send;
  p.out = recv;
  cuda::OneShotRowsParams r;
  r.row_bytes = row;
  r.capacity = capacity;
  r.send_rows = send_rows;
  r.recv_rows = recv_rows;
  return cuda::oneshot_all_to_all_rows(ctx, p, r);
}

Status oneshot_expert_exchange(const OneShotRank& v, const ExpertExchangeParams& a, bool combine,
                               void* stream) {
  cuda::LaunchCtx ctx;
  ctx.stream = static_cast<cudaStream_t>(stream);
  const cuda::OneShotParams p = params(v, DType::kU8);
  return combine ? cuda::oneshot_expert_combine(ctx, p, a)
                 : cuda::oneshot_expert_dispatch(ctx, p, a);
}

Status oneshot_collective_add_norm(const OneShotRank& v, const AllReduceAddNorm& a, void* stream) {
  // Decode-sized batches only: one block per row keeps prefill's many rows on a few blocks,
  // slower than the all-reduce kernel and a separate norm (the caller composes those).
  if (a.rows > cuda::kOneShotMaxBlocks) {
    return Status(StatusCode::kUnimplemented, "fused all-reduce + norm above 32 rows");
  }
  if (dtype_bytes(DType::kF32, a.rows * a.cols) > v.staging_bytes / 2) {
    return Status(StatusCode::kUnimplemented, "fused all-reduce larger than the staging buffer");
  }
  cuda::LaunchCtx ctx;
  ctx.stream = static_cast<cudaStream_t>(stream);
  cuda::OneShotParams p = params(v, DType::kF32);
  p.in = a.y;
  p.count = a.rows * a.cols;
  cuda::OneShotAddNormParams f;
  f.bias = a.bias;
  f.bias_dtype = a.bias_dtype;
  f.x = a.x;
  f.weight = a.weight;
  f.weight_dtype = a.weight_dtype;
  f.weight_offset = a.weight_offset;
  f.eps = a.eps;
  f.h = a.h;
  f.rows = a.rows;
  f.cols = a.cols;
  return cuda::oneshot_add_norm(ctx, p, f);
}

Status oneshot_health(const OneShotRank& v, const char* who) {
  if (v.counters == nullptr) return ok_status();
  // Read on this thread's own default stream, never with cudaMemcpy: that runs on the legacy
  // default stream, which waits for every blocking stream of the device. On a GPU shared by
  // ranks that includes a peer's one-shot kernel spinning for this rank's next collective, and
  // the peer's next launch queued behind the copy: TP = 2 x EP = 2 on one H100 stalled until the
  // ~10 s deadline in ~1% of test runs, two ranks in this cudaMemcpy, a third in cuLaunchKernel of
  // its LM head's all-gather (bench/results/2026-11-27-h100-s8/stall/). The callers have
  // synchronized the rank's stream, so the counters are final.
  uint32_t error = 0;
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&error, v.counters + 2, sizeof(error),
                                              cudaMemcpyDeviceToHost, cudaStreamPerThread));
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamPerThread));
  if (error != 0) {
    return errorf(StatusCode::kDeadlineExceeded,
                  "{} on rank {}: a peer did not arrive within ~10 s (the results of that step "
                  "are invalid)",
                  who, v.rank);
  }
  return ok_status();
}

namespace {

// What every rank publishes: its device and the IPC handles of its staging buffer and flags.
struct IpcRecord {
  int32_t ok = 0;
  int32_t device = 0;
  cudaIpcMemHandle_t staging{};
  cudaIpcMemHandle_t flags{};
};

class IpcOneShotCommunicator final : public Communicator {
 public:
  IpcOneShotCommunicator(std::unique_ptr<Communicator> host, int device, int64_t max_bytes)
      : host_(std::move(host)), device_(device), max_bytes_(max_bytes) {}
  ~IpcOneShotCommunicator() override {
    (void)cudaSetDevice(device_);
    // Peers' mappings first; every rank closes before anyone frees what the others mapped.
    for (void* p : opened_) (void)cudaIpcCloseMemHandle(p);
    if (host_ != nullptr && set_up_) (void)host_->barrier();
    for (void* p : owned_) {
      if (p != nullptr) (void)cudaFree(p);
    }
  }

  // Collective: allocate, exchange handles, open the peers', build the device tables.
  Status init() {
    const int n = host_->size(), me = host_->rank();
    if (n > cuda::kOneShotMaxRanks || max_bytes_ <= 0) {
      return errorf(StatusCode::kInvalidArgument,
                    "CUDA IPC one-shot collectives: {} ranks (at most {}), {} bytes", n,
                    cuda::kOneShotMaxRanks, max_bytes_);
    }
    v_.n_ranks = n;
    v_.rank = me;
    v_.staging_bytes = 2 * ((max_bytes_ + 255) / 256 * 256);
    IpcRecord mine;
    Status st = [&]() -> Status {
      STRATA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
      void* staging = nullptr;
      void* flags = nullptr;
      void* counters = nullptr;
      const size_t flag_bytes = sizeof(uint32_t) * static_cast<size_t>(n * cuda::kOneShotMaxBlocks);
      STRATA_CUDA_RETURN_IF_ERROR(cudaMalloc(&staging, static_cast<size_t>(v_.staging_bytes)));
      owned_.push_back(staging);
      STRATA_CUDA_RETURN_IF_ERROR(cudaMalloc(&flags, flag_bytes));
      owned_.push_back(flags);
      STRATA_CUDA_RETURN_IF_ERROR(cudaMemset(flags, 0, flag_bytes));
      STRATA_CUDA_RETURN_IF_ERROR(cudaMalloc(&counters, 3 * sizeof(uint32_t)));
      owned_.push_back(counters);
      STRATA_CUDA_RETURN_IF_ERROR(cudaMemset(counters, 0, 3 * sizeof(uint32_t)));
      v_.counters = static_cast<uint32_t*>(counters);
      staging_.assign(static_cast<size_t>(n), nullptr);
      flags_.assign(static_cast<size_t>(n), nullptr);
      staging_[static_cast<size_t>(me)] = staging;
      flags_[static_cast<size_t>(me)] = static_cast<uint32_t*>(flags);
      STRATA_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&mine.staging, staging));
      STRATA_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&mine.flags, flags));
      STRATA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());  // the zeroed flags are visible
      return cuda::oneshot_preload();
    }();
    mine.ok = st.ok() ? 1 : 0;
    mine.device = device_;
    // Every rank learns every rank's state before anyone opens a handle (a failed rank still
    // takes part, so the others get an error instead of a hang).
    std::vector<IpcRecord> all(static_cast<size_t>(n));
    STRATA_RETURN_IF_ERROR(host_->all_gather(&mine, static_cast<int64_t>(sizeof(IpcRecord)),
                                             DType::kU8, all.data(), CommStream::host()));
    STRATA_RETURN_IF_ERROR(st);
    for (int q = 0; q < n; ++q) {
      if (all[static_cast<size_t>(q)].ok == 0) {
        return errorf(StatusCode::kInternal,
                      "CUDA IPC one-shot collectives: rank {} could not register its buffers", q);
      }
    }
    st = [&]() -> Status {
      for (int q = 0; q < n; ++q) {
        if (q == me) continue;
        const IpcRecord& r = all[static_cast<size_t>(q)];
        void* p = nullptr;
        cudaError_t e = cudaIpcOpenMemHandle(&p, r.staging, cudaIpcMemLazyEnablePeerAccess);
        if (e == cudaSuccess) {
          opened_.push_back(p);
          staging_[static_cast<size_t>(q)] = p;
          e = cudaIpcOpenMemHandle(&p, r.flags, cudaIpcMemLazyEnablePeerAccess);
          if (e == cudaSuccess) {
            opened_.push_back(p);
            flags_[static_cast<size_t>(q)] = static_cast<uint32_t*>(p);
          }
        }
        if (e != cudaSuccess) {
          (void)cudaGetLastError();
          return errorf(StatusCode::kUnimplemented,
                        "CUDA IPC one-shot collectives: rank {} (GPU {}) cannot map rank {}'s "
                        "buffers on GPU {} ({})",
                        me, device_, q, r.device, cudaGetErrorString(e));
        }
      }
      void* t = nullptr;
      STRATA_CUDA_RETURN_IF_ERROR(cudaMalloc(&t, static_cast<size_t>(n) * sizeof(void*)));
      owned_.push_back(t);
      v_.staging_table = static_cast<void**>(t);
      STRATA_CUDA_RETURN_IF_ERROR(cudaMalloc(&t, static_cast<size_t>(n) * sizeof(void*)));
      owned_.push_back(t);
      v_.flags_table = static_cast<uint32_t**>(t);
      STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(v_.staging_table, staging_.data(),
                                             static_cast<size_t>(n) * sizeof(void*),
                                             cudaMemcpyHostToDevice));
      STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(v_.flags_table, flags_.data(),
                                             static_cast<size_t>(n) * sizeof(void*),
                                             cudaMemcpyHostToDevice));
      // A copy from pageable memory may return before it lands, and the collectives run on
      // non-blocking streams, which do not wait for the default stream: wait here.
      STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(nullptr));
      return ok_status();
    }();
    // Everyone has mapped everything before the first collective.
    int32_t failed = st.ok() ? 0 : 1;
    STRATA_RETURN_IF_ERROR(host_->all_reduce(&failed, 1, DType::kI32, CommStream::host()));
    STRATA_RETURN_IF_ERROR(st);
    if (failed != 0) {
      return errorf(StatusCode::kInternal,
                    "CUDA IPC one-shot collectives: {} rank(s) could not map their peers", failed);
    }
    set_up_ = true;
    return ok_status();
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const char* name() const override { return "cuda-ipc"; }
  bool supports(Device d) const override { return d.is_cpu() || d.is_cuda(); }

  Status all_reduce(void* data, int64_t count, DType dt, const CommStream& s) override {
    STRATA_RETURN_IF_ERROR(check_count("all-reduce", count, {data}));
    if (s.device.is_cpu()) return host_->all_reduce(data, count, dt, s);
    STRATA_RETURN_IF_ERROR(fits("all-reduce", dtype_bytes(dt, count)));
    return oneshot_collective(v_, data, data, count, dt, s.cuda_stream, /*gather=*/false);
  }
  Status all_gather(const void* send, int64_t count, DType dt, void* recv,
                    const CommStream& s) override {
    STRATA_RETURN_IF_ERROR(check_count("all-gather", count, {send, recv}));
    if (s.device.is_cpu()) return host_->all_gather(send, count, dt, recv, s);
    STRATA_RETURN_IF_ERROR(fits("all-gather", dtype_bytes(dt, count)));
    return oneshot_collective(v_, send, recv, count, dt, s.cuda_stream, /*gather=*/true);
  }
  Status all_reduce_add_norm(const AllReduceAddNorm& a, const CommStream& s) override {
    if (s.device.is_cpu()) return Communicator::all_reduce_add_norm(a, s);
    return oneshot_collective_add_norm(v_, a, s.cuda_stream);
  }
  Status reduce_scatter(const void* send, int64_t count, DType dt, void* recv,
                        const CommStream& s) override {
    if (!s.device.is_cpu()) return device_unsupported("reduce-scatter");
    return host_->reduce_scatter(send, count, dt, recv, s);
  }
  Status all_to_all(const void* send, int64_t count, DType dt, void* recv,
                    const CommStream& s) override {
    STRATA_RETURN_IF_ERROR(check_count("all-to-all", count, {send, recv}));
    if (s.device.is_cpu()) return host_->all_to_all(send, count, dt, recv, s);
    STRATA_RETURN_IF_ERROR(fits("all-to-all", dtype_bytes(dt, count) * size()));
    return oneshot_all_to_all(v_, send, recv, count, dt, s.cuda_stream);
  }
  Status all_to_all_rows(const void* send, int64_t capacity, int64_t cols, DType dt, void* recv,
                         const int32_t* send_rows, const int32_t* recv_rows,
                         const CommStream& s) override {
    STRATA_RETURN_IF_ERROR(
        check_count("all-to-all-rows", capacity * cols, {send, recv, send_rows, recv_rows}));
    if (s.device.is_cpu()) {
      return host_->all_to_all_rows(send, capacity, cols, dt, recv, send_rows, recv_rows, s);
    }
    STRATA_RETURN_IF_ERROR(fits("all-to-all", dtype_bytes(dt, capacity * cols) * size()));
    return oneshot_all_to_all_rows(v_, send, capacity, cols, dt, recv, send_rows, recv_rows,
                                   s.cuda_stream);
  }
  Status all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_offsets,
                      void* recv, const int64_t* recv_counts, const int64_t* recv_offsets, DType dt,
                      const CommStream& s) override {
    if (!s.device.is_cpu()) return device_unsupported("all-to-all");
    return host_->all_to_all_v(send, send_counts, send_offsets, recv, recv_counts, recv_offsets, dt,
                               s);
  }
  Status send(const void* data, int64_t count, DType dt, int peer, const CommStream& s) override {
    if (!s.device.is_cpu()) return device_unsupported("send");
    return host_->send(data, count, dt, peer, s);
  }
  Status recv(void* data, int64_t count, DType dt, int peer, const CommStream& s) override {
    if (!s.device.is_cpu()) return device_unsupported("recv");
    return host_->recv(data, count, dt, peer, s);
  }
  Status broadcast(void* data, int64_t count, DType dt, int root, const CommStream& s) override {
    if (!s.device.is_cpu()) return device_unsupported("broadcast");
    return host_->broadcast(data, count, dt, root, s);
  }
  Status barrier() override { return host_->barrier(); }
  Status health() override {
    STRATA_RETURN_IF_ERROR(oneshot_health(v_, "CUDA IPC one-shot collective"));
    return host_->health();
  }
  void abort() override { host_->abort(); }
  Result<std::unique_ptr<Communicator>> split(int color, int key) override {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> sub, host_->split(color, key));
    return make_ipc_oneshot_communicator(std::move(sub), device_, max_bytes_);
  }

 private:
  Status fits(const char* op, int64_t bytes) const {
    if (bytes <= max_bytes_) return ok_status();
    return errorf(StatusCode::kUnimplemented,
                  "CUDA IPC one-shot {} of {} bytes: above its {} bytes (NCCL takes larger "
                  "messages)",
                  op, bytes, max_bytes_);
  }
  static Status device_unsupported(const char* op) {
    return errorf(StatusCode::kUnimplemented,
                  "CUDA IPC one-shot collectives have no device {} (NCCL does)", op);
  }

  std::unique_ptr<Communicator> host_;
  int device_;
  int64_t max_bytes_;
  OneShotRank v_;
  std::vector<void*> staging_;
  std::vector<uint32_t*> flags_;
  std::vector<void*> owned_;   // this rank's allocations
  std::vector<void*> opened_;  // peers' buffers mapped here
  bool set_up_ = false;
};

}  // namespace

Result<std::unique_ptr<Communicator>> make_ipc_oneshot_communicator(
    std::unique_ptr<Communicator> host, int device_index, int64_t max_bytes) {
  if (host == nullptr) {
    return Status(StatusCode::kInvalidArgument, "CUDA IPC one-shot: no host communicator");
  }
  auto c = std::make_unique<IpcOneShotCommunicator>(std::move(host), device_index, max_bytes);
  STRATA_RETURN_IF_ERROR(c->init());
  return std::unique_ptr<Communicator>(std::move(c));
}

}  // namespace strata

#else  // no CUDA

#include "core/status.h"
#include "parallel/comm.h"

namespace strata {

Result<std::unique_ptr<Communicator>> make_ipc_oneshot_communicator(std::unique_ptr<Communicator>,
                                                                    int, int64_t) {
  return Status(StatusCode::kUnimplemented, "CUDA IPC one-shot collectives need a build with CUDA");
}

}  // namespace strata

#endif  // STRATA_HAS_CUDA
