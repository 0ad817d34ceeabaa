// The CUDA IPC one-shot communicator (parallel/oneshot_rank.cpp): ranks are processes started by
// mpirun, each mapping its peers' staging buffers from IPC handles. Run under mpirun (skipped
// otherwise), on one GPU (every rank on device 0: the processes' kernels time-share it) or on
// one GPU per rank:
//   mpirun -np 2 test_cuda --gtest_filter='IpcOneShotCuda.*'
// Sums are checked bit for bit against the host twin (reduce_sum_host: f32, rank order) over
// every rank's input, which every rank regenerates from its seed.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <vector>

#include "backends/cuda/cuda_device.h"
#include "core/half.h"
#include "parallel/comm.h"

namespace strata {
namespace {

std::vector<float> values(int64_t n, int rank) {
  std::mt19937 rng(static_cast<uint32_t>(1234 + rank));
  std::uniform_real_distribution<float> d(-3, 3);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

Result<std::unique_ptr<Communicator>> g_world =
    Status(StatusCode::kUnimplemented, "not under mpirun");

class MpiWorld : public ::testing::Environment {
 public:
  void SetUp() override {
    if (launched_under_mpi()) g_world = make_mpi_communicator();
  }
  void TearDown() override { g_world = Status(StatusCode::kUnimplemented, "finalized"); }
};
[[maybe_unused]] ::testing::Environment* const g_mpi_env =
    ::testing::AddGlobalTestEnvironment(new MpiWorld);

struct Ranks {
  std::unique_ptr<Communicator> comm;
  int device = 0;
};

// The world under mpirun over CUDA IPC with `max_bytes`, or a skip reason.
Result<Ranks> world(int64_t max_bytes) {
  if (!launched_under_mpi()) {
    return Status(StatusCode::kUnimplemented,
                  "not under mpirun (run: mpirun -np 2 test_cuda "
                  "--gtest_filter='IpcOneShotCuda.*')");
  }
  // MPI finalizes with its last communicator: the world lives until the test environment's
  // tear-down, and each test's IPC communicator owns a split of it.
  if (!g_world.ok()) return g_world.status();
  Communicator& w = **g_world;
  const int gpus = cuda::cuda_device_count();
  Ranks r;
  r.device = gpus >= w.size() ? w.rank() : 0;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> sub, w.split(0, w.rank()));
  STRATA_ASSIGN_OR_RETURN(r.comm,
                          make_ipc_oneshot_communicator(std::move(sub), r.device, max_bytes));
  return r;
}

TEST(IpcOneShotCuda, AllReduceAndGatherMatchTheHostTwin) {
  const int64_t max_bytes = int64_t{1} << 20;
  Result<Ranks> w = world(max_bytes);
  if (!w.ok()) GTEST_SKIP() << w.status().to_string();
  Communicator& c = *w->comm;
  const int n = c.size(), me = c.rank();
  auto dev = cuda::CudaDevice::create(w->device);
  ASSERT_TRUE(dev.ok()) << dev.status().to_string();
  cudaStream_t stream = (*dev)->launch_ctx().stream;
  CommStream s;
  s.device = Device::cuda(w->device);
  s.cuda_stream = stream;
  for (int64_t count : {int64_t{1}, int64_t{1000}, int64_t{4097}, max_bytes / 4}) {
    SCOPED_TRACE("count " + std::to_string(count));
    std::vector<std::vector<float>> in;
    std::vector<const void*> ins;
    for (int r = 0; r < n; ++r) in.push_back(values(count, r));
    for (const auto& v : in) ins.push_back(v.data());
    std::vector<float> want(static_cast<size_t>(count));
    ASSERT_TRUE(reduce_sum_host(ins.data(), n, count, DType::kF32, want.data()).ok());
    float* a = nullptr;
    ASSERT_EQ(cudaMalloc(&a, static_cast<size_t>(count) * 4 * n), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(a, in[static_cast<size_t>(me)].data(), count * 4,
                              cudaMemcpyHostToDevice, stream),
              cudaSuccess);
    ASSERT_TRUE(c.all_reduce(a, count, DType::kF32, s).ok());
    std::vector<float> got(static_cast<size_t>(count));
    ASSERT_EQ(cudaMemcpyAsync(got.data(), a, count * 4, cudaMemcpyDeviceToHost, stream),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(got, want);
    // All-gather into [n * count], rank-major.
    if (count * 4 * n <= max_bytes * 2) {
      float* g = nullptr;
      ASSERT_EQ(cudaMalloc(&g, static_cast<size_t>(count) * 4 * n), cudaSuccess);
      ASSERT_EQ(cudaMemcpyAsync(a, in[static_cast<size_t>(me)].data(), count * 4,
                                cudaMemcpyHostToDevice, stream),
                cudaSuccess);
      ASSERT_TRUE(c.all_gather(a, count, DType::kF32, g, s).ok());
      std::vector<float> all(static_cast<size_t>(count * n));
      ASSERT_EQ(cudaMemcpyAsync(all.data(), g, all.size() * 4, cudaMemcpyDeviceToHost, stream),
                cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      for (int r = 0; r < n; ++r) {
        EXPECT_TRUE(std::equal(in[static_cast<size_t>(r)].begin(), in[static_cast<size_t>(r)].end(),
                               all.begin() + r * count))
            << "rank " << r << "'s block";
      }
      cudaFree(g);
    }
    cudaFree(a);
  }
  ASSERT_TRUE(c.health().ok());
  // Above its capacity the communicator refuses (NCCL takes those when it wraps it).
  float* big = nullptr;
  ASSERT_EQ(cudaMalloc(&big, static_cast<size_t>(max_bytes) + 4), cudaSuccess);
  EXPECT_EQ(c.all_reduce(big, max_bytes / 4 + 1, DType::kF32, s).code(),
            StatusCode::kUnimplemented);
  cudaFree(big);
  ASSERT_TRUE(c.barrier().ok());
}

TEST(IpcOneShotCuda, ReplayedFromACudaGraph) {
  Result<Ranks> w = world(int64_t{64} << 10);
  if (!w.ok()) GTEST_SKIP() << w.status().to_string();
  Communicator& c = *w->comm;
  const int n = c.size(), me = c.rank();
  auto dev = cuda::CudaDevice::create(w->device);
  ASSERT_TRUE(dev.ok()) << dev.status().to_string();
  cudaStream_t stream = (*dev)->launch_ctx().stream;
  CommStream s;
  s.device = Device::cuda(w->device);
  s.cuda_stream = stream;
  const int64_t count = 4096;
  float* a = nullptr;
  ASSERT_EQ(cudaMalloc(&a, count * 4), cudaSuccess);
  // Warm the stream (first launches) before capturing.
  ASSERT_TRUE(c.all_reduce(a, count, DType::kF32, s).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_TRUE(c.all_reduce(a, count, DType::kF32, s).ok());
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int round = 0; round < 3; ++round) {
    std::vector<std::vector<float>> in;
    std::vector<const void*> ins;
    for (int r = 0; r < n; ++r) in.push_back(values(count, r + 17 * round));
    for (const auto& v : in) ins.push_back(v.data());
    std::vector<float> want(static_cast<size_t>(count));
    ASSERT_TRUE(reduce_sum_host(ins.data(), n, count, DType::kF32, want.data()).ok());
    ASSERT_EQ(cudaMemcpyAsync(a, in[static_cast<size_t>(me)].data(), count * 4,
                              cudaMemcpyHostToDevice, stream),
              cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    std::vector<float> got(static_cast<size_t>(count));
    ASSERT_EQ(cudaMemcpyAsync(got.data(), a, count * 4, cudaMemcpyDeviceToHost, stream),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(got, want) << "round " << round;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(a);
  ASSERT_TRUE(c.health().ok());
  ASSERT_TRUE(c.barrier().ok());
}

}  // namespace
}  // namespace strata
