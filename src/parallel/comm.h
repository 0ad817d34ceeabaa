// Communicator: the collectives parallel inference needs, behind one interface, typed (f32, bf16,
// f16, i32, i8/u8 bytes), stream-aware (host memory, or device memory enqueued on a CUDA stream,
// capturable in CUDA graphs where the implementation says so) and group-based (split a world
// into tensor-, pipeline-, expert- and data-parallel groups). Implementations:
//   single      - one rank: every collective is the identity (or a copy)
//   mpi         - ranks are processes (mpirun), host memory (parallel/mpi_comm.cpp)
//   in-process  - ranks are threads of one process sharing buffers: host memory, or device memory
//                 through the one-shot kernels (peers' buffers read directly, flags in device
//                 memory, graph-capturable); how tensor parallelism is tested on ONE GPU
//                 (parallel/inproc_comm.cpp)
//   nccl        - one process per GPU, device memory on a stream (parallel/nccl_comm.cpp)
// Every collective is an explicit call in a layer program; nothing communicates behind the
// caller's back.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/moe_params.h"
#include "core/device.h"
#include "strata/status.h"
#include "strata/types.h"

namespace strata {

// Where a collective's buffers live and what it is ordered with: host memory (synchronous), or
// device memory on a CUDA stream (cudaStream_t, type-erased so this header needs no CUDA).
struct CommStream {
  Device device = Device::cpu();
  void* cuda_stream = nullptr;
  static CommStream host() { return {}; }
};

// The all-reduce of a row-parallel layer fused with the residual add and the next RMSNorm
// (ops::all_reduce_add_norm): y = all_reduce(y) (+ bias); x += y; h = bf16(rms_norm(x) *
// (weight + weight_offset)). y, x f32 and h bf16, all [rows, cols] contiguous on the device.
struct AllReduceAddNorm {
  float* y = nullptr;
  const void* bias = nullptr;  // [cols] or null
  DType bias_dtype = DType::kF32;
  float* x = nullptr;
  const void* weight = nullptr;  // [cols]
  DType weight_dtype = DType::kF32;
  float weight_offset = 0.0f;
  float eps = 1e-6f;
  uint16_t* h = nullptr;
  int64_t rows = 0, cols = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;  // "single", "mpi", "in-process", "nccl"
  // Whether collectives take buffers on `device` (host memory: Device::cpu()).
  virtual bool supports(Device device) const = 0;

  // data[0..count) = the sum over ranks, in place. Ranks get bit-identical results.
  virtual Status all_reduce(void* data, int64_t count, DType dt, const CommStream& s) = 0;
  // recv[r * count + i] = rank r's send[i]; recv holds size() * count elements.
  virtual Status all_gather(const void* send, int64_t count, DType dt, void* recv,
                            const CommStream& s) = 0;
  // recv[0..count) = chunk rank() of the sum over ranks of send[0..size() * count).
  virtual Status reduce_scatter(const void* send, int64_t count, DType dt, void* recv,
                                const CommStream& s) = 0;
  // Chunk r of send (count elements each) goes to rank r; recv chunk r comes from rank r.
  virtual Status all_to_all(const void* send, int64_t count, DType dt, void* recv,
                            const CommStream& s) = 0;
  // Variable splits: send_counts[r] elements at send_offsets[r] go to rank r; recv_counts[r]
  // from rank r land at recv_offsets[r] (host arrays of size() entries; counts may be 0).
  virtual Status all_to_all_v(const void* send, const int64_t* send_counts,
                              const int64_t* send_offsets, void* recv, const int64_t* recv_counts,
                              const int64_t* recv_offsets, DType dt, const CommStream& s) = 0;
  // The rows of a fixed-capacity exchange (model/moe_ep.h): send and recv are size() blocks of
  // `capacity` rows of `cols` elements each; the first send_rows[r] rows of send block r go to
  // rank r and land as the first rows of recv block rank(), where rank r's recv_rows[rank()]
  // must equal this rank's send_rows[r] (both i32 [size()], each in [0, capacity], in the
  // memory of the buffers: on a device stream they are read on the device when the collective
  // runs, so a captured graph replays with new counts at fixed addresses and launch shapes).
  // Rows of recv past recv_rows[q] in block q are unspecified (left alone, or copies of the
  // sender's padding). The default moves every block whole (the counts unread: all_to_all);
  // the in-process communicator (host memory, and device memory through the one-shot kernel)
  // moves only the counted rows. NCCL keeps the default: its grouped send/recv takes sizes on
  // the host, which a graph cannot read at replay.
  virtual Status all_to_all_rows(const void* send, int64_t capacity, int64_t cols, DType dt,
                                 void* recv, const int32_t* send_rows, const int32_t* recv_rows,
                                 const CommStream& s) {
    (void)send_rows;
    (void)recv_rows;
    return all_to_all(send, capacity * cols, dt, recv, s);
  }
  // The expert exchange in one kernel each way (ExpertExchangeParams), where the communicator has
  // one: the in-process communicator's device path. kUnimplemented elsewhere (and on the host),
  // where the caller composes plans and all_to_all_rows (model/moe_ep.cpp, the same layout).
  virtual Status expert_dispatch(const ExpertExchangeParams& a, const CommStream& s) {
    (void)a;
    (void)s;
    return Status(StatusCode::kUnimplemented, "no fused expert dispatch");
  }
  virtual Status expert_combine(const ExpertExchangeParams& a, const CommStream& s) {
    (void)a;
    (void)s;
    return Status(StatusCode::kUnimplemented, "no fused expert combine");
  }
  // Point to point (pipeline stages): blocking on the host for host memory.
  virtual Status send(const void* data, int64_t count, DType dt, int peer, const CommStream& s) = 0;
  virtual Status recv(void* data, int64_t count, DType dt, int peer, const CommStream& s) = 0;
  virtual Status broadcast(void* data, int64_t count, DType dt, int root, const CommStream& s) = 0;
  virtual Status barrier() = 0;
  // An error a device collective left behind once its stream has been synchronized (a one-shot
  // kernel that gave up waiting for a peer, NCCL's asynchronous errors); ok for the rest.
  virtual Status health() { return ok_status(); }
  // Makes collectives blocked on peers return an error, from any thread (a rank failed or a step
  // ran past its deadline): NCCL's ncclCommAbort, which stops its kernels; the in-process
  // barriers wake with kCancelled. The communicator is unusable afterwards. No-op by default.
  virtual void abort() {}
  // AllReduceAddNorm in one kernel where the communicator has one (the one-shot kernels);
  // kUnimplemented elsewhere, and the caller composes all_reduce, the bias add and the norm.
  virtual Status all_reduce_add_norm(const AllReduceAddNorm& a, const CommStream& s) {
    (void)a;
    (void)s;
    return Status(StatusCode::kUnimplemented, "no fused all-reduce + norm");
  }
  // Subgroups: the ranks that pass the same color form one communicator, ordered by key (as
  // MPI_Comm_split). Every rank must call it.
  virtual Result<std::unique_ptr<Communicator>> split(int color, int key) = 0;

  // Host f32 / byte shorthands.
  Status all_reduce_sum(float* data, int64_t n) {
    return all_reduce(data, n, DType::kF32, CommStream::host());
  }
  Status all_gather(const float* send, int64_t n_per_rank, float* recv) {
    return all_gather(send, n_per_rank, DType::kF32, recv, CommStream::host());
  }
  Status broadcast(void* data, int64_t bytes, int root) {
    return broadcast(data, bytes, DType::kU8, root, CommStream::host());
  }
};

// One rank: every collective is the identity.
std::unique_ptr<Communicator> make_single_rank_communicator();

// All ranks of MPI_COMM_WORLD (initializes MPI if needed; finalizes when the last MPI
// communicator is destroyed). Unimplemented when strata was built without MPI.
Result<std::unique_ptr<Communicator>> make_mpi_communicator();

// True when this process was started by an MPI launcher with more than one rank.
bool launched_under_mpi();

// n ranks as n threads of this process: communicator r belongs to the thread that runs rank r,
// and every rank must make the same collective calls in the same order (each blocks until all
// ranks have arrived). Host buffers, and device buffers of one process (same GPU, or GPUs with
// peer access) through the one-shot kernels when built with CUDA; device collectives need
// init_device() on every rank first (buffers registered once, so calls can be graph-captured).
std::vector<std::unique_ptr<Communicator>> make_in_process_communicators(int n);

// NCCL over `host` (which it owns): one GPU per rank (device_index, set current on the calling
// thread), device collectives through NCCL on the caller's stream (graph-capturable), host memory,
// barrier and split through host. When host also takes device memory (in-process ranks after
// init_in_process_device: the one-shot kernels), device all-reduces and all-gathers of at most
// oneshot_max_bytes go to host instead of NCCL. Every rank of host must call it at once.
// libnccl.so.2 is loaded at run time (STRATA_NCCL_LIBRARY names another path); kUnimplemented
// when it cannot be loaded or strata was built without CUDA.
Result<std::unique_ptr<Communicator>> make_nccl_communicator(std::unique_ptr<Communicator> host,
                                                             int device_index,
                                                             int64_t oneshot_max_bytes = 0);
// One-shot device collectives between processes (mpirun ranks) over CUDA IPC: every rank
// allocates a staging buffer and flags on `device_index`, the IPC handles travel over `host`
// (which the result owns and uses for host memory, barriers and split), and each rank maps its
// peers' buffers once. Device all-reduces / all-gathers of up to max_bytes (and the fused add +
// norm) are then the one-shot kernels of the in-process communicator, capturable in CUDA graphs;
// larger device messages and other device collectives are kUnimplemented (wrap it in NCCL:
// make_nccl_communicator sends what is above its oneshot_max_bytes to NCCL). Ranks may share a
// GPU. Every rank of host must call it at once. kUnimplemented without CUDA.
Result<std::unique_ptr<Communicator>> make_ipc_oneshot_communicator(
    std::unique_ptr<Communicator> host, int device_index, int64_t max_bytes);

// "2.28.9", or empty when NCCL cannot be loaded.
std::string nccl_version();

// Reduction arithmetic shared by the host implementations and the one-shot kernels' CPU twin:
// out[i] = sum over r of ins[r][i], summed in rank order 0..n-1 in f32 (bf16 / f16 inputs
// widened, the sum rounded once), i32 exactly. out may be one of the inputs.
Status reduce_sum_host(const void* const* ins, int n, int64_t count, DType dt, void* out);

}  // namespace strata
