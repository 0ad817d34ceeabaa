#include <cstring>

#include "core/env.h"
#include "core/status.h"
#include "parallel/comm.h"

namespace strata {

namespace {

class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* name() const override { return "single"; }
  Status all_reduce_sum(float*, int64_t) override { return ok_status(); }
  Status all_gather(const float* send, int64_t n, float* recv) override {
    if (send != recv) std::memmove(recv, send, static_cast<size_t>(n) * sizeof(float));
    return ok_status();
  }
  Status broadcast(void*, int64_t, int) override { return ok_status(); }
  Status barrier() override { return ok_status(); }
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
