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
      return ok_status();
    }();
  }
  STRATA_RETURN_IF_ERROR(g->barrier(rank));
  return st;
}

namespace {

Status device_collective(InProcessGroup& g, int rank, const void* in, void* out, int64_t count,
                         DType dt, void* stream, bool gather) {
  if (g.device == nullptr || g.device->staging_table[static_cast<size_t>(rank)] == nullptr) {
    return Status(StatusCode::kFailedPrecondition,
                  "in-process device collective before init_in_process_device");
  }
  InProcessDeviceState& s = *g.device;
  const size_t me = static_cast<size_t>(rank);
  cuda::LaunchCtx ctx;
  ctx.stream = static_cast<cudaStream_t>(stream);
  cuda::OneShotParams p;
  p.n_ranks = g.n;
  p.rank = rank;
  p.staging = s.staging_table[me];
  p.staging_bytes = s.staging_bytes;
  p.flags = s.flags_table[me];
  p.epoch = s.counters[me];
  p.done = s.counters[me] + 1;
  p.error = s.counters[me] + 2;
  p.dtype = dt;
  // Messages larger than half the staging buffer go in pieces, each its own epoch.
  const int64_t elem = dtype_bytes(dt, 1);
  const int64_t piece = std::max<int64_t>(1, s.staging_bytes / 2 / elem);
  for (int64_t off = 0; off < count || (count == 0 && off == 0); off += piece) {
    const int64_t n = std::min(piece, count - off);
    if (n <= 0) break;
    p.in = static_cast<const char*>(in) + off * elem;
    p.count = n;
    if (gather && n != count) {
      return Status(StatusCode::kUnimplemented,
                    "in-process device all-gather larger than the staging buffer");
    }
    p.out = static_cast<char*>(out) + (gather ? 0 : off * elem);
    STRATA_RETURN_IF_ERROR(cuda::oneshot(ctx, p, gather));
  }
  return ok_status();
}

}  // namespace

Status inproc_device_all_reduce_add_norm(InProcessGroup& g, int rank, const AllReduceAddNorm& a,
                                         void* stream) {
  if (g.device == nullptr || g.device->staging_table[static_cast<size_t>(rank)] == nullptr) {
    return Status(StatusCode::kFailedPrecondition,
                  "in-process device collective before init_in_process_device");
  }
  InProcessDeviceState& s = *g.device;
  // Decode-sized batches only: one block per row keeps prefill's many rows on a few blocks,
  // slower than the all-reduce kernel and a separate norm (the caller composes those).
  if (a.rows > cuda::kOneShotMaxBlocks) {
    return Status(StatusCode::kUnimplemented, "fused all-reduce + norm above 32 rows");
  }
  if (dtype_bytes(DType::kF32, a.rows * a.cols) > s.staging_bytes / 2) {
    return Status(StatusCode::kUnimplemented, "fused all-reduce larger than the staging buffer");
  }
  const size_t me = static_cast<size_t>(rank);
  cuda::LaunchCtx ctx;
  ctx.stream = static_cast<cudaStream_t>(stream);
  cuda::OneShotParams p;
  p.n_ranks = g.n;
  p.rank = rank;
  p.staging = s.staging_table[me];
  p.staging_bytes = s.staging_bytes;
  p.flags = s.flags_table[me];
  p.epoch = s.counters[me];
  p.done = s.counters[me] + 1;
  p.error = s.counters[me] + 2;
  p.dtype = DType::kF32;
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

Status inproc_device_health(InProcessGroup& g, int rank) {
  if (g.device == nullptr || g.device->counters[static_cast<size_t>(rank)] == nullptr) {
    return ok_status();
  }
  uint32_t error = 0;
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(&error, g.device->counters[static_cast<size_t>(rank)] + 2,
                                         sizeof(error), cudaMemcpyDeviceToHost));
  if (error != 0) {
    return errorf(StatusCode::kDeadlineExceeded,
                  "in-process device collective on rank {}: a peer did not arrive within ~10 s "
                  "(the results of that step are invalid)",
                  rank);
  }
  return ok_status();
}

Status inproc_device_all_reduce(InProcessGroup& g, int rank, void* data, int64_t count, DType dt,
                                void* stream) {
  return device_collective(g, rank, data, data, count, dt, stream, /*gather=*/false);
}

Status inproc_device_all_gather(InProcessGroup& g, int rank, const void* send, int64_t count,
                                DType dt, void* recv, void* stream) {
  return device_collective(g, rank, send, recv, count, dt, stream, /*gather=*/true);
}

}  // namespace strata

#endif  // STRATA_HAS_CUDA
