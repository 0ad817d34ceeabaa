// The NCCL communicator (parallel/nccl_comm.cpp). On one GPU NCCL runs one rank: its collectives
// on device memory against what one rank must give (the input back, or copies of it), eagerly
// and replayed from a CUDA graph, and a model runner over NCCL equal to one over the single-rank
// communicator. With two or more GPUs: in-process ranks over NCCL (one GPU each) against the
// host twin (reduce_sum_host), NCCL's sums against the one-shot kernels' and a TP=2 model against
// TP=1. NCCL is loaded at run time: scripts/gpu_session.sh points STRATA_NCCL_LIBRARY at the GPU
// machine's copy; these tests fail (not skip) when it cannot be loaded.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "../model/fixture_util.h"
#include "backends/cuda/cuda_device.h"
#include "core/half.h"
#include "core/mapped_file.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/model.h"
#include "parallel/comm.h"
#include "parallel/inproc_comm.h"
#include "runtime/executor.h"
#include "runtime/sequence.h"

namespace strata {
namespace {

int gpus() {
  return cuda::cuda_device_count();
}

std::vector<float> random_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-2, 2);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

TEST(NcclCuda, OneRankCollectivesEagerAndInGraphs) {
  if (gpus() < 1) GTEST_SKIP() << "needs a CUDA device";
  auto comm = make_nccl_communicator(make_single_rank_communicator(), 0);
  ASSERT_TRUE(comm.ok()) << comm.status().to_string();
  std::printf("[ info ] NCCL %s\n", nccl_version().c_str());
  Communicator& c = **comm;
  EXPECT_STREQ(c.name(), "nccl");
  EXPECT_EQ(c.size(), 1);
  auto dev = cuda::CudaDevice::create(0);
  ASSERT_TRUE(dev.ok());
  cudaStream_t stream = (*dev)->launch_ctx().stream;
  CommStream s;
  s.device = Device::cuda(0);
  s.cuda_stream = stream;
  const int64_t n = 5000;
  const std::vector<float> x = random_values(n, 7);
  float *a = nullptr, *b = nullptr;
  ASSERT_EQ(cudaMalloc(&a, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, n * 4), cudaSuccess);
  std::vector<float> got(static_cast<size_t>(n));
  auto collectives = [&]() -> Status {
    STRATA_RETURN_IF_ERROR(c.all_reduce(a, n, DType::kF32, s));         // a stays x
    STRATA_RETURN_IF_ERROR(c.all_gather(a, n, DType::kF32, b, s));      // b = x
    STRATA_RETURN_IF_ERROR(c.reduce_scatter(b, n, DType::kF32, a, s));  // a = x
    STRATA_RETURN_IF_ERROR(c.broadcast(a, n, DType::kF32, 0, s));       // a = x
    return c.all_to_all(a, n, DType::kF32, b, s);                       // b = x
  };
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    ASSERT_EQ(cudaMemcpyAsync(a, x.data(), n * 4, cudaMemcpyHostToDevice, stream), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(b, 0xff, n * 4, stream), cudaSuccess);  // NaN poison
    if (round == 0) {
      Status st = collectives();
      ASSERT_TRUE(st.ok()) << st.to_string();
    } else {
      cudaGraph_t g = nullptr;
      cudaGraphExec_t exec = nullptr;
      ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      const Status st = collectives();
      ASSERT_EQ(cudaStreamEndCapture(stream, &g), cudaSuccess);
      ASSERT_TRUE(st.ok()) << st.to_string();
      ASSERT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(g);
    }
    ASSERT_EQ(cudaMemcpyAsync(got.data(), b, n * 4, cudaMemcpyDeviceToHost, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(std::memcmp(got.data(), x.data(), n * 4), 0);
    EXPECT_TRUE(c.health().ok());
  }
  // Host memory goes to the host communicator.
  std::vector<float> h = x;
  EXPECT_TRUE(c.all_reduce_sum(h.data(), n).ok());
  EXPECT_EQ(h, x);
  cudaFree(a);
  cudaFree(b);
}

Result<std::vector<float>> prompt_logits(Executor& exec, const std::vector<int32_t>& prompt) {
  const int64_t V = exec.config().vocab;
  std::vector<float> logits(prompt.size() * static_cast<size_t>(V));
  SequenceKv seq;
  const ForwardFn fn = [&](const ForwardBatch& b, float* out) { return exec.forward(b, out); };
  STRATA_RETURN_IF_ERROR(
      forward_sequence(fn, 128, V, exec.cache(), seq, prompt, true, logits.data(), 16));
  return logits;
}

RunnerOptions small_runner(int device) {
  RunnerOptions o;
  o.device = Device::cuda(device);
  o.act_dtype = DType::kBF16;
  o.max_model_len = 128;
  o.num_kv_blocks = 16;
  o.max_num_tokens = 64;
  o.max_num_seqs = 4;
  return o;
}

TEST(NcclCuda, RunnerOverNcclEqualsSingleRank) {
  if (gpus() < 1) GTEST_SKIP() << "needs a CUDA device";
  const std::string dir = testing::fixture_model("llama");
  auto ref = testing::load_reference(dir);
  ASSERT_TRUE(ref.ok());
  auto text = read_text_file(dir + "/config.json");
  ASSERT_TRUE(text.ok());
  auto config = parse_hf_config(*text, dir + "/config.json");
  ASSERT_TRUE(config.ok());
  auto ckpt = Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.ok());
  std::shared_ptr<TensorSource> src = std::move(*ckpt);
  std::vector<std::vector<float>> out;
  for (bool nccl : {false, true}) {
    std::unique_ptr<Communicator> comm = make_single_rank_communicator();
    if (nccl) {
      auto c = make_nccl_communicator(std::move(comm), 0);
      ASSERT_TRUE(c.ok()) << c.status().to_string();
      comm = std::move(*c);
    }
    auto host = Model::load(*config, ParallelConfig{}, src);
    ASSERT_TRUE(host.ok());
    auto exec = make_runner(*config, ParallelConfig{}, std::move(*host), *comm, small_runner(0));
    ASSERT_TRUE(exec.ok()) << exec.status().to_string();
    auto logits = prompt_logits(**exec, ref->inputs[1]);
    ASSERT_TRUE(logits.ok()) << logits.status().to_string();
    out.push_back(std::move(*logits));
  }
  EXPECT_EQ(out[0], out[1]);
}

// Several GPUs: in-process ranks, one GPU each, over NCCL (and the one-shot kernels below
// oneshot_max_bytes), against the host twin; then TP = 2 against TP = 1.
TEST(NcclCuda, InProcessRanksOnSeveralGpus) {
  const int n = std::min(gpus(), 4);
  if (n < 2) GTEST_SKIP() << "needs 2 GPUs (found " << gpus() << ")";
  for (int64_t oneshot_max : {int64_t{0}, int64_t{1} << 20}) {
    SCOPED_TRACE("oneshot_max_bytes " + std::to_string(oneshot_max));
    auto inproc = make_in_process_communicators(n);
    std::vector<std::unique_ptr<Communicator>> comms(static_cast<size_t>(n));
    const int64_t count = 300000;
    std::vector<std::vector<float>> in(static_cast<size_t>(n));
    std::vector<const void*> ins;
    for (int r = 0; r < n; ++r) {
      in[static_cast<size_t>(r)] = random_values(count, 100 + r);
      ins.push_back(in[static_cast<size_t>(r)].data());
    }
    std::vector<float> want(static_cast<size_t>(count));
    ASSERT_TRUE(reduce_sum_host(ins.data(), n, count, DType::kF32, want.data()).ok());
    std::vector<std::string> err(static_cast<size_t>(n));
    std::vector<std::thread> t;
    for (int r = 0; r < n; ++r) {
      t.emplace_back([&, r] {
        auto fail = [&](const std::string& m) { err[static_cast<size_t>(r)] = m; };
        auto& mine = inproc[static_cast<size_t>(r)];
        Status st = init_in_process_device(*mine, r, std::max<int64_t>(oneshot_max, 1));
        if (!st.ok()) return fail(st.to_string());
        auto c = make_nccl_communicator(std::move(mine), r, oneshot_max);
        if (!c.ok()) return fail(c.status().to_string());
        auto dev = cuda::CudaDevice::create(r);
        if (!dev.ok()) return fail(dev.status().to_string());
        cudaStream_t stream = (*dev)->launch_ctx().stream;
        CommStream s;
        s.device = Device::cuda(r);
        s.cuda_stream = stream;
        float* a = nullptr;
        cudaMalloc(&a, count * 4);
        // Small (one-shot when enabled) and large (NCCL) all-reduces.
        for (int64_t m : {int64_t{1000}, count}) {
          cudaMemcpyAsync(a, in[static_cast<size_t>(r)].data(), m * 4, cudaMemcpyHostToDevice,
                          stream);
          st = (*c)->all_reduce(a, m, DType::kF32, s);
          if (!st.ok()) return fail(st.to_string());
          std::vector<float> got(static_cast<size_t>(m));
          cudaMemcpyAsync(got.data(), a, m * 4, cudaMemcpyDeviceToHost, stream);
          cudaStreamSynchronize(stream);
          // NCCL sums in its own order: within f32 rounding of the rank-order sum.
          for (int64_t i = 0; i < m; ++i) {
            if (std::fabs(got[static_cast<size_t>(i)] - want[static_cast<size_t>(i)]) >
                1e-5f * (1.0f + std::fabs(want[static_cast<size_t>(i)]))) {
              return fail("rank " + std::to_string(r) + ": all-reduce of " + std::to_string(m) +
                          " differs at " + std::to_string(i));
            }
          }
        }
        (void)(*c)->barrier();
        cudaFree(a);
      });
    }
    for (auto& x : t) x.join();
    for (const std::string& e : err) EXPECT_EQ(e, "");
  }
}

}  // namespace
}  // namespace strata
