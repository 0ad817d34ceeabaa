// The collective suite (collective_suite.h) on the MPI communicator, every rank of this mpirun.
#include <gtest/gtest.h>

#include "collective_suite.h"
#include "parallel/comm.h"

namespace strata {
extern Communicator* g_comm;
namespace {

TEST(MpiCollectives, Suite) {
  const std::string err = testing::run_collective_suite(*g_comm);
  EXPECT_EQ(err, "");
}

TEST(MpiCollectives, DeviceBuffersAreRefused) {
  float x = 1.0f;
  CommStream s;
  s.device = Device::cuda(0);
  const Status st = g_comm->all_reduce(&x, 1, DType::kF32, s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
}

}  // namespace
}  // namespace strata
