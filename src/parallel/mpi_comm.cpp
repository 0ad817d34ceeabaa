// MPI communicator (OpenMPI): host-memory collectives across processes (tensor parallelism on
// the CPU, the control plane of GPU runs). Typed: float sums (f32, bf16, f16) gather every rank's
// buffer and add in rank order (reduce_sum_host), so every rank's result is bit-identical and
// equal to the other communicators' (MPI's own reduction order depends on the rank count); i32
// goes to MPI_Allreduce (exact).
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <vector>

#include "core/status.h"
#include "parallel/comm.h"
#include "parallel/comm_util.h"

namespace strata {

namespace {

std::atomic<int> g_live_comms{0};  // NOTE: MPI itself is process-global; count our users.
bool g_owns_init = false;

Status check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return ok_status();
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return errorf(StatusCode::kInternal, "MPI {} failed: {}", what, std::string(msg, len));
}

// Counts travel as int: larger transfers go as bytes in chunks where the collective allows.
Status fits_int(const char* op, int64_t n) {
  if (n > INT_MAX) {
    return errorf(StatusCode::kUnimplemented, "MPI {} of {} elements (more than 2^31)", op, n);
  }
  return ok_status();
}

Status host_only(const char* op, const CommStream& s) {
  if (!s.device.is_cpu()) {
    return errorf(StatusCode::kInvalidArgument,
                  "MPI {}: the MPI communicator takes host memory (device buffers need NCCL)", op);
  }
  return ok_status();
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, bool world) : comm_(comm), world_(world) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    ++g_live_comms;
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!world_ && !finalized) MPI_Comm_free(&comm_);
    if (--g_live_comms == 0 && g_owns_init && !finalized) MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "mpi"; }
  bool supports(Device d) const override { return d.is_cpu(); }

  Status all_reduce(void* data, int64_t count, DType dt, const CommStream& s) override {
    STRATA_RETURN_IF_ERROR(host_only("all-reduce", s));
    STRATA_RETURN_IF_ERROR(check_count("all-reduce", count, {data}));
    if (dt == DType::kI32) {
      const MPI_Datatype t = MPI_INT;
      constexpr int64_t kChunk = int64_t{1} << 30;
      for (int64_t off = 0; off < count; off += kChunk) {
        const int n = static_cast<int>(std::min(kChunk, count - off));
        char* p = static_cast<char*>(data) + dtype_bytes(dt, off);
        STRATA_RETURN_IF_ERROR(
            check_mpi(MPI_Allreduce(MPI_IN_PLACE, p, n, t, MPI_SUM, comm_), "all-reduce"));
      }
      return ok_status();
    }
    // Floating point: gather all and sum in rank order, so that every communicator (MPI,
    // in-process, the one-shot kernels) gives the same bits as reduce_sum_host.
    std::vector<uint8_t> all(static_cast<size_t>(dtype_bytes(dt, count) * size_));
    STRATA_RETURN_IF_ERROR(all_gather(data, count, dt, all.data(), s));
    std::vector<const void*> ins(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r)
      ins[static_cast<size_t>(r)] = all.data() + dtype_bytes(dt, count) * r;
    return reduce_sum_host(ins.data(), size_, count, dt, data);
  }

  Status all_gather(const void* send, int64_t count, DType dt, void* recv,
                    const CommStream& s) override {
    STRATA_RETURN_IF_ERROR(host_only("all-gather", s));
    STRATA_RETURN_IF_ERROR(check_count("all-gather", count, {send, recv}));
    const int64_t bytes = dtype_bytes(dt, count);
    STRATA_RETURN_IF_ERROR(fits_int("all-gather", bytes));
    return check_mpi(MPI_Allgather(send, static_cast<int>(bytes), MPI_BYTE, recv,
                                   static_cast<int>(bytes), MPI_BYTE, comm_),
                     "all-gather");
  }

  Status reduce_scatter(const void* send, int64_t count, DType dt, void* recv,
                        const CommStream& s) override {
    STRATA_RETURN_IF_ERROR(host_only("reduce-scatter", s));
    STRATA_RETURN_IF_ERROR(check_count("reduce-scatter", count, {send, recv}));
    // Through the all-reduce (rank-order sums for every dtype), then this rank's chunk.
    std::vector<uint8_t> full(static_cast<size_t>(dtype_bytes(dt, count * size_)));
    std::copy_n(static_cast<const uint8_t*>(send), full.size(), full.data());
    STRATA_RETURN_IF_ERROR(all_reduce(full.data(), count * size_, dt, s));
    std::copy_n(full.data() + dtype_bytes(dt, count * rank_), dtype_bytes(dt, count),
                static_cast<uint8_t*>(recv));
    return ok_status();
  }

  Status all_to_all(const void* send, int64_t count, DType dt, void* recv,
                    const CommStream& s) override {
    STRATA_RETURN_IF_ERROR(host_only("all-to-all", s));
    STRATA_RETURN_IF_ERROR(check_count("all-to-all", count, {send, recv}));
    const int64_t bytes = dtype_bytes(dt, count);
    STRATA_RETURN_IF_ERROR(fits_int("all-to-all", bytes));
    return check_mpi(MPI_Alltoall(send, static_cast<int>(bytes), MPI_BYTE, recv,
                                  static_cast<int>(bytes), MPI_BYTE, comm_),
                     "all-to-all");
  }

  Status all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_offsets,
                      void* recv, const int64_t* recv_counts, const int64_t* recv_offsets, DType dt,
                      const CommStream& s) override {
    STRATA_RETURN_IF_ERROR(host_only("all-to-all-v", s));
    std::vector<int> sc(static_cast<size_t>(size_)), so(sc.size()), rc(sc.size()), ro(sc.size());
    for (int r = 0; r < size_; ++r) {
      const size_t i = static_cast<size_t>(r);
      const int64_t v[4] = {dtype_bytes(dt, send_counts[i]), dtype_bytes(dt, send_offsets[i]),
                            dtype_bytes(dt, recv_counts[i]), dtype_bytes(dt, recv_offsets[i])};
      for (int64_t x : v) {
        if (x < 0) return Status(StatusCode::kInvalidArgument, "all-to-all-v: negative count");
        STRATA_RETURN_IF_ERROR(fits_int("all-to-all-v", x));
      }
      sc[i] = static_cast<int>(v[0]);
      so[i] = static_cast<int>(v[1]);
      rc[i] = static_cast<int>(v[2]);
      ro[i] = static_cast<int>(v[3]);
    }
    return check_mpi(MPI_Alltoallv(send, sc.data(), so.data(), MPI_BYTE, recv, rc.data(), ro.data(),
                                   MPI_BYTE, comm_),
                     "all-to-all-v");
  }

  Status send(const void* data, int64_t count, DType dt, int peer, const CommStream& s) override {
    STRATA_RETURN_IF_ERROR(host_only("send", s));
    STRATA_RETURN_IF_ERROR(check_peer(peer));
    const int64_t bytes = dtype_bytes(dt, count);
    STRATA_RETURN_IF_ERROR(fits_int("send", bytes));
    return check_mpi(MPI_Send(data, static_cast<int>(bytes), MPI_BYTE, peer, 0, comm_), "send");
  }

  Status recv(void* data, int64_t count, DType dt, int peer, const CommStream& s) override {
    STRATA_RETURN_IF_ERROR(host_only("recv", s));
    STRATA_RETURN_IF_ERROR(check_peer(peer));
    const int64_t bytes = dtype_bytes(dt, count);
    STRATA_RETURN_IF_ERROR(fits_int("recv", bytes));
    MPI_Status st;
    STRATA_RETURN_IF_ERROR(
        check_mpi(MPI_Recv(data, static_cast<int>(bytes), MPI_BYTE, peer, 0, comm_, &st), "recv"));
    int got = 0;
    MPI_Get_count(&st, MPI_BYTE, &got);
    if (got != bytes) {
      return errorf(StatusCode::kDataLoss, "MPI recv from rank {}: {} bytes, expected {}", peer,
                    got, bytes);
    }
    return ok_status();
  }

  Status broadcast(void* data, int64_t count, DType dt, int root, const CommStream& s) override {
    STRATA_RETURN_IF_ERROR(host_only("broadcast", s));
    if (root < 0 || root >= size_) {
      return errorf(StatusCode::kInvalidArgument, "MPI broadcast: root {} of {}", root, size_);
    }
    const int64_t bytes = dtype_bytes(dt, count);
    STRATA_RETURN_IF_ERROR(fits_int("broadcast", bytes));
    return check_mpi(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_), "broadcast");
  }

  Status barrier() override { return check_mpi(MPI_Barrier(comm_), "barrier"); }

  Result<std::unique_ptr<Communicator>> split(int color, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    STRATA_RETURN_IF_ERROR(check_mpi(MPI_Comm_split(comm_, color, key, &sub), "comm split"));
    MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
    return std::unique_ptr<Communicator>(new MpiCommunicator(sub, false));
  }

 private:
  Status check_peer(int peer) const {
    if (peer < 0 || peer >= size_ || peer == rank_) {
      return errorf(StatusCode::kInvalidArgument, "MPI: peer rank {} of {} (this is {})", peer,
                    size_, rank_);
    }
    return ok_status();
  }

  MPI_Comm comm_;
  bool world_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

Result<std::unique_ptr<Communicator>> make_mpi_communicator() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    STRATA_RETURN_IF_ERROR(
        check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "init"));
    g_owns_init = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return std::unique_ptr<Communicator>(new MpiCommunicator(MPI_COMM_WORLD, true));
}

}  // namespace strata
