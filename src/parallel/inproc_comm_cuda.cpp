// Device collectives of the in-process communicator (parallel/inproc_comm.h) through the one-shot
// kernels: every rank registers a staging buffer, a flag array and its counters on its device;
// each rank then holds device tables of all ranks' buffers and flags. Compiled with CUDA only.
#if STRATA_HAS_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"
#include "core/status.h"
#include "parallel/inproc_comm.h"
#include "parallel/oneshot_rank.h"

namespace strata {

InProcessGroup* in_process_group(Communicator& c);

struct InProcessDeviceState {
  int n = 0;
  int64_t staging_bytes = 0;
  std::vector<int> device;              // per rank
  std::vector<void*> staging;           // per rank, on its device
  std::vector<uint32_t*> flags;         // per rank [n][kOneShotMaxBlocks]
  std::vector<uint32_t*> counters;      // per rank: epoch, done, error
  std::vector<void**> staging_table;    // per rank, on its device: [n] staging pointers
  std::vector<uint32_t**> flags_table;  // per rank, on its device: [n] flag pointers
};

void destroy_in_process_device(InProcessDeviceState* s) {
  if (s == nullptr) return;
  for (int r = 0; r < s->n; ++r) {
    const size_t i = static_cast<size_t>(r);
    (void)cudaSetDevice(s->device[i]);
    for (void* p :
         {s->staging[i], static_cast<void*>(s->flags[i]), static_cast<void*>(s->counters[i]),
          static_cast<void*>(s->staging_table[i]), static_cast<void*>(s->flags_table[i])}) {
      if (p != nullptr) (void)cudaFree(p);
    }
  }
  delete s;
}

Status init_in_process_device(Communicator& c, int device_index, int64_t max_bytes) {
  InProcessGroup* g = in_process_group(c);
  if (g == nullptr) {
    return Status(StatusCode::kInvalidArgument,
                  "init_in_process_device: not an in-process communicator");
  }
  if (g->n > cuda::kOneShotMaxRanks || max_bytes <= 0) {
    return errorf(StatusCode::kInvalidArgument,
                  "init_in_process_device: {} ranks (at most {}), {} bytes", g->n,
                  cuda::kOneShotMaxRanks, max_bytes);
  }
  const int rank = c.rank();
  const size_t me = static_cast<size_t>(rank);
  {
    std::lock_guard<std::mutex> lock(g->mu);
    if (g->device == nullptr) {
      g->device = new InProcessDeviceState();
      InProcessDeviceState& s = *g->device;
      s.n = g->n;
      s.staging_bytes = 2 * ((max_bytes + 255) / 256 * 256);
      const size_t n = static_cast<size_t>(g->n);
      s.device.assign(n, 0);
      s.staging.assign(n, nullptr);
      s.flags.assign(n, nullptr);
      s.counters.assign(n, nullptr);
      s.staging_table.assign(n, nullptr);
      s.flags_table.assign(n, nullptr);
    }
  }
  InProcessDeviceState& s = *g->device;
  Status st = [&]() -> Status {
    STRATA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_index));
    s.device[me] = device_index;
    const size_t flag_bytes =
        sizeof(uint32_t) * static_cast<size_t>(g->n * cuda::kOneShotMaxBlocks);
    STRATA_CUDA_RETURN_IF_ERROR(cudaMalloc(&s.staging[me], static_cast<size_t>(s.staging_bytes)));
    STRATA_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&s.flags[me]), flag_bytes));
    STRATA_CUDA_RETURN_IF_ERROR(cudaMemset(s.flags[me], 0, flag_bytes));
    STRATA_CUDA_RETURN_IF_ERROR(
        cudaMalloc(reinterpret_cast<void**>(&s.counters[me]), 3 * sizeof(uint32_t)));
    STRATA_CUDA_RETURN_IF_ERROR(cudaMemset(s.counters[me], 0, 3 * sizeof(uint32_t)));
    return cuda::oneshot_preload();
  }();
  // Every rank's buffers exist before anyone builds its tables (a failed rank still meets the
  // barriers, so the others get its error instead of a hang).
  STRATA_RETURN_IF_ERROR(g->barrier(rank));
  STRATA_RETURN_IF_ERROR(st);
  for (int q = 0; q < g->n; ++q) {
    if (s.device[static_cast<size_t>(q)] != device_index) {
      const cudaError_t e = cudaDeviceEnablePeerAccess(s.device[static_cast<size_t>(q)], 0);
      // "Already enabled" (a second communicator in this process) is fine, but it stays the
      // thread's last error: clear it, or the next kernel launch check reports it.
      if (e != cudaSuccess) (void)cudaGetLastError();
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
        st = errorf(StatusCode::kUnimplemented,
                    "in-process device collectives: GPU {} cannot read GPU {} ({})", device_index,
                    s.device[static_cast<size_t>(q)], cudaGetErrorString(e));
      }
    }
  }
  if (st.ok()) {
    st = [&]() -> Status {
      const size_t n = static_cast<size_t>(g->n);
      STRATA_CUDA_RETURN_IF_ERROR(
          cudaMalloc(reinterpret_cast<void**>(&s.staging_table[me]), n * sizeof(void*)));
      STRATA_CUDA_RETURN_IF_ERROR(
          cudaMalloc(reinterpret_cast<void**>(&s.flags_table[me]), n * sizeof(void*)));
      STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(s.staging_table[me], s.staging.data(),
                                             n * sizeof(void*), cudaMemcpyHostToDevice));
      STRATA_CUDA_RETURN_IF_ERROR(
          cudaMemcpy(s.flags_table[me], s.flags.data(), n * sizeof(void*), cudaMemcpyHostToDevice));
      // cudaMemset of device memory and copies from pageable memory may return before they land,
      // and the collectives run on non-blocking streams, which do not wait for the default
      // stream: a rank's first kernel could read a stale epoch or flag. Wait here, before the
      // barrier lets anyone launch. (EpFixedCuda.OneShotAllToAllMatchesHostTwin's timeouts, 4
      // of 15 runs on an H100, were most likely not this but the test waiting for the whole device
      // while a peer's kernel spun for it: see inproc_comm.h.)
      STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(nullptr));
      return ok_status();
    }();
  }
  STRATA_RETURN_IF_ERROR(g->barrier(rank));
  return st;
}

namespace {

OneShotRank view(InProcessGroup& g, int rank) {
  OneShotRank v;
  if (g.device == nullptr) return v;
  const size_t me = static_cast<size_t>(rank);
  v.n_ranks = g.n;
  v.rank = rank;
  v.staging_table = g.device->staging_table[me];
  v.flags_table = g.device->flags_table[me];
  v.counters = g.device->counters[me];
  v.staging_bytes = g.device->staging_bytes;
  return v;
}

Status device_collective(InProcessGroup& g, int rank, const void* in, void* out, int64_t count,
                         DType dt, void* stream, bool gather) {
  const OneShotRank v = view(g, rank);
  if (!v.ready()) {
    return Status(StatusCode::kFailedPrecondition,
                  "in-process device collective before init_in_process_device");
  }
  return oneshot_collective(v, in, out, count, dt, stream, gather);
}

}  // namespace

Status inproc_device_all_reduce_add_norm(InProcessGroup& g, int rank, const AllReduceAddNorm& a,
                                         void* stream) {
  const OneShotRank v = view(g, rank);
  if (!v.ready()) {
    return Status(StatusCode::kFailedPrecondition,
                  "in-process device collective before init_in_process_device");
  }
  return oneshot_collective_add_norm(v, a, stream);
}

Status inproc_device_health(InProcessGroup& g, int rank) {
  if (g.device == nullptr || g.device->counters[static_cast<size_t>(rank)] == nullptr) {
    return ok_status();
  }
  OneShotRank v = view(g, rank);
  return oneshot_health(v, "in-process device collective");
}

Status inproc_device_all_reduce(InProcessGroup& g, int rank, void* data, int64_t count, DType dt,
                                void* stream) {
  return device_collective(g, rank, data, data, count, dt, stream, /*gather=*/false);
}

Status inproc_device_all_to_all(InProcessGroup& g, int rank, const void* send, int64_t count,
                                DType dt, void* recv, void* stream) {
  const OneShotRank v = view(g, rank);
  if (!v.ready()) {
    return Status(StatusCode::kFailedPrecondition,
                  "in-process device collective before init_in_process_device");
  }
  return oneshot_all_to_all(v, send, recv, count, dt, stream);
}

Status inproc_device_reduce_scatter(InProcessGroup& g, int rank, const void* send, int64_t count,
                                    DType dt, void* recv, void* stream) {
  const OneShotRank v = view(g, rank);
  if (!v.ready()) {
    return Status(StatusCode::kFailedPrecondition,
                  "in-process device collective before init_in_process_device");
  }
  return oneshot_reduce_scatter(v, send, recv, count, dt, stream);
}

Status inproc_device_all_to_all_rows(InProcessGroup& g, int rank, const void* send,
                                     int64_t capacity, int64_t cols, DType dt, void* recv,
                                     const int32_t* send_rows, const int32_t* recv_rows,
                                     void* stream) {
  const OneShotRank v = view(g, rank);
  if (!v.ready()) {
    return Status(StatusCode::kFailedPrecondition,
                  "in-process device collective before init_in_process_device");
  }
  return oneshot_all_to_all_rows(v, send, capacity, cols, dt, recv, send_rows, recv_rows, stream);
}

Status inproc_device_expert_exchange(InProcessGroup& g, int rank, const ExpertExchangeParams& a,
                                     bool combine, void* stream) {
  const OneShotRank v = view(g, rank);
  if (!v.ready()) {
    return Status(StatusCode::kUnimplemented,
                  "in-process device collective before init_in_process_device");
  }
  return oneshot_expert_exchange(v, a, combine, stream);
}

// all_to_all_v's device path (inproc_comm.cpp): a copy between two ranks' device buffers
// (cudaMemcpyDefault: one GPU, or two with peer access or staged by the driver) and the wait for
// the rank's stream (not the device: a peer sharing the GPU may be inside a device collective).
Status inproc_device_copy(void* dst, const void* src, int64_t bytes, void* stream) {
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
  return ok_status();
}

Status inproc_device_sync(void* stream) {
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  return ok_status();
}

int64_t in_process_device_max_bytes(Communicator& c) {
  InProcessGroup* g = in_process_group(c);
  if (g == nullptr || g->device == nullptr) return 0;
  return g->device->staging_bytes / 2;
}

Status inproc_device_all_gather(InProcessGroup& g, int rank, const void* send, int64_t count,
                                DType dt, void* recv, void* stream) {
  return device_collective(g, rank, send, recv, count, dt, stream, /*gather=*/true);
}

}  // namespace strata

#endif  // STRATA_HAS_CUDA
