// The in-process communicator (ranks = threads) passes the same collective suite as MPI
// (tests/parallel/collective_suite.h), for 1 to 4 ranks; a rank that never arrives gives
// kDeadlineExceeded naming it instead of a hang.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "../parallel/collective_suite.h"
#include "parallel/comm.h"
#include "parallel/inproc_comm.h"

namespace strata {
namespace {

TEST(InProcessComm, CollectiveSuite) {
  for (int n : {1, 2, 3, 4}) {
    std::vector<std::unique_ptr<Communicator>> comms = make_in_process_communicators(n);
    ASSERT_EQ(static_cast<int>(comms.size()), n);
    std::vector<std::string> errors(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        errors[static_cast<size_t>(r)] =
            testing::run_collective_suite(*comms[static_cast<size_t>(r)]);
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << n << " ranks";
  }
}

TEST(InProcessComm, MissingRankTimesOut) {
  std::vector<std::unique_ptr<Communicator>> comms = make_in_process_communicators(3);
  in_process_group(*comms[0])->timeout = std::chrono::seconds(1);
  float a = 1.0f, b = 2.0f;
  Status s0, s1;
  std::thread t0([&] { s0 = comms[0]->all_reduce(&a, 1, DType::kF32, CommStream::host()); });
  std::thread t1([&] { s1 = comms[1]->all_reduce(&b, 1, DType::kF32, CommStream::host()); });
  t0.join();
  t1.join();
  for (const Status* s : {&s0, &s1}) {
    EXPECT_EQ(s->code(), StatusCode::kDeadlineExceeded) << s->message();
    EXPECT_NE(s->message().find("rank(s) 2"), std::string::npos) << s->message();
  }
}

TEST(InProcessComm, AbortWakesRanksWaitingForAPeer) {
  // Rank 2 never arrives (it failed); aborting its communicator must release ranks 0 and 1 long
  // before the group's timeout, with kCancelled, and later calls fail at once.
  std::vector<std::unique_ptr<Communicator>> comms = make_in_process_communicators(3);
  in_process_group(*comms[0])->timeout = std::chrono::seconds(120);
  float a = 1.0f, b = 2.0f;
  Status s0, s1;
  const auto t_start = std::chrono::steady_clock::now();
  std::thread t0([&] { s0 = comms[0]->all_reduce(&a, 1, DType::kF32, CommStream::host()); });
  std::thread t1([&] { s1 = comms[1]->all_reduce(&b, 1, DType::kF32, CommStream::host()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  comms[2]->abort();
  t0.join();
  t1.join();
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  EXPECT_LT(waited, 60.0);
  for (const Status* s : {&s0, &s1}) EXPECT_EQ(s->code(), StatusCode::kCancelled) << s->message();
  float c = 3.0f;
  EXPECT_EQ(comms[0]->all_reduce(&c, 1, DType::kF32, CommStream::host()).code(),
            StatusCode::kCancelled);
  std::vector<uint8_t> byte(1);
  EXPECT_EQ(comms[1]->recv(byte.data(), 1, DType::kU8, 0, CommStream::host()).code(),
            StatusCode::kCancelled);
}

TEST(InProcessComm, DeviceCollectivesNeedRegistration) {
  std::vector<std::unique_ptr<Communicator>> comms = make_in_process_communicators(1);
  EXPECT_FALSE(comms[0]->supports(Device::cuda(0)));
}

}  // namespace
}  // namespace strata
