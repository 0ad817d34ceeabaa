// MPI communicator (OpenMPI): CPU collectives for tensor parallelism across processes.
#include <mpi.h>

#include <atomic>

#include "core/status.h"
#include "parallel/comm.h"

namespace strata {

namespace {

std::atomic<int> g_live_comms{0};  // NOTE: MPI itself is process-global; count our users.

Status check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return ok_status();
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return errorf(StatusCode::kInternal, "MPI {} failed: {}", what, std::string(msg, len));
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(int rank, int size, bool owns_init)
      : rank_(rank), size_(size), owns_init_(owns_init) {}
  ~MpiCommunicator() override {
    if (--g_live_comms == 0 && owns_init_) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "mpi"; }

  Status all_reduce_sum(float* data, int64_t n) override {
    // MPI counts are int: reduce in chunks for very large buffers.
    constexpr int64_t kChunk = int64_t{1} << 30;
    for (int64_t off = 0; off < n; off += kChunk) {
      const int count = static_cast<int>(std::min(kChunk, n - off));
      STRATA_RETURN_IF_ERROR(check_mpi(
          MPI_Allreduce(MPI_IN_PLACE, data + off, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
          "all-reduce"));
    }
    return ok_status();
  }
  Status all_gather(const float* send, int64_t n, float* recv) override {
    if (n > (int64_t{1} << 30)) {
      return errorf(StatusCode::kUnimplemented, "MPI all-gather of {} floats per rank", n);
    }
    return check_mpi(MPI_Allgather(send, static_cast<int>(n), MPI_FLOAT, recv, static_cast<int>(n),
                                   MPI_FLOAT, MPI_COMM_WORLD),
                     "all-gather");
  }
  Status broadcast(void* data, int64_t bytes, int root) override {
    if (bytes > (int64_t{1} << 30)) {
      return errorf(StatusCode::kUnimplemented, "MPI broadcast of {} bytes", bytes);
    }
    return check_mpi(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD),
                     "broadcast");
  }
  Status barrier() override { return check_mpi(MPI_Barrier(MPI_COMM_WORLD), "barrier"); }

 private:
  int rank_, size_;
  bool owns_init_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> make_mpi_communicator() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  bool owns = false;
  if (!initialized) {
    int provided = 0;
    STRATA_RETURN_IF_ERROR(
        check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "init"));
    owns = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ++g_live_comms;
  return std::unique_ptr<Communicator>(new MpiCommunicator(rank, size, owns));
}

}  // namespace strata
