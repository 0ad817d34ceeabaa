#include <cstring>

#include "core/env.h"
#include "core/status.h"
#include "parallel/comm.h"
#include "parallel/comm_util.h"

namespace strata {

namespace {

// One rank: reductions are the identity; gathers and all-to-alls copy send into recv (host
// memory; device memory through the copy function the device registered, see comm_util.h).
class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* name() const override { return "single"; }
  bool supports(Device) const override { return true; }
  Status all_reduce(void*, int64_t, DType, const CommStream&) override { return ok_status(); }
  Status all_gather(const void* send, int64_t count, DType dt, void* recv,
                    const CommStream& s) override {
    return comm_copy(recv, send, dtype_bytes(dt, count), s);
  }
  Status reduce_scatter(const void* send, int64_t count, DType dt, void* recv,
                        const CommStream& s) override {
    return comm_copy(recv, send, dtype_bytes(dt, count), s);
  }
  Status all_to_all(const void* send, int64_t count, DType dt, void* recv,
                    const CommStream& s) override {
    return comm_copy(recv, send, dtype_bytes(dt, count), s);
  }
  Status all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_offsets,
                      void* recv, const int64_t* recv_counts, const int64_t* recv_offsets, DType dt,
                      const CommStream& s) override {
    if (send_counts[0] != recv_counts[0]) {
      return Status(StatusCode::kInvalidArgument, "all_to_all_v: send and recv counts differ");
    }
    return comm_copy(static_cast<char*>(recv) + dtype_bytes(dt, recv_offsets[0]),
                     static_cast<const char*>(send) + dtype_bytes(dt, send_offsets[0]),
                     dtype_bytes(dt, send_counts[0]), s);
  }
  Status send(const void*, int64_t, DType, int peer, const CommStream&) override {
    return errorf(StatusCode::kInvalidArgument, "send to rank {} of a single-rank group", peer);
  }
  Status recv(void*, int64_t, DType, int peer, const CommStream&) override {
    return errorf(StatusCode::kInvalidArgument, "recv from rank {} of a single-rank group", peer);
  }
  Status broadcast(void*, int64_t, DType, int, const CommStream&) override { return ok_status(); }
  Status barrier() override { return ok_status(); }
  Result<std::unique_ptr<Communicator>> split(int, int) override {
    return std::unique_ptr<Communicator>(new SingleRankCommunicator());
  }
};

}  // namespace

std::unique_ptr<Communicator> make_single_rank_communicator() {
  return std::make_unique<SingleRankCommunicator>();
}

bool launched_under_mpi() {
  return env_config().launcher_size > 1;
}

#ifndef STRATA_HAS_MPI
Result<std::unique_ptr<Communicator>> make_mpi_communicator() {
  return errorf(StatusCode::kUnimplemented,
                "tensor parallelism on the CPU needs MPI, but strata was built without it "
                "(install libopenmpi-dev and rebuild)");
}
#endif

}  // namespace strata
