// All-reduce latency and bus bandwidth, one-shot kernels against NCCL, eager and replayed from
// CUDA graphs: N in-process ranks (threads), rank r on GPU r (or every rank on GPU 0 with
// --one-gpu, where NCCL cannot run and only the one-shot rows appear). Sizes double from --min to
// --max bytes of bf16. Each row: the median over --iters of one all-reduce, timed with CUDA
// events on rank 0 after a barrier, and the bus bandwidth 2 (n-1)/n x bytes / time (NCCL's
// definition). The one-shot rows stop where its staging buffer ends (--oneshot-max).
//
//   bench_allreduce --ranks 2 --min 1024 --max 268435456
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/cuda_device.h"
#include "parallel/comm.h"
#include "parallel/inproc_comm.h"

namespace strata {
namespace {

struct Options {
  int ranks = 2;
  int64_t min_bytes = 1024, max_bytes = int64_t{256} << 20;
  int64_t oneshot_max = int64_t{16} << 20;
  int iters = 50;
  bool one_gpu = false;
};

// Rank 0's median time (ms) of fn over iters launches, eager or from one graph of those launches.
double time_ms(cudaStream_t stream, Communicator& barrier, const std::function<Status()>& fn,
               int iters, bool graph, Status* st) {
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    cudaGraph_t g = nullptr;
    cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    *st = fn();
    cudaStreamEndCapture(stream, &g);
    if (!st->ok() || g == nullptr) return 0;
    cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
  }
  auto once = [&] { return graph ? (cudaGraphLaunch(exec, stream), ok_status()) : fn(); };
  for (int i = 0; i < 3 && st->ok(); ++i) *st = once();  // warm-up
  cudaStreamSynchronize(stream);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int i = 0; i < iters && st->ok(); ++i) {
    *st = barrier.barrier();
    cudaEventRecord(e0, stream);
    if (st->ok()) *st = once();
    cudaEventRecord(e1, stream);
    cudaEventSynchronize(e1);
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (ms.empty()) return 0;
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int run(const Options& o) {
  const int gpus = cuda::cuda_device_count();
  if (gpus < 1) {
    std::fprintf(stderr, "bench_allreduce: no CUDA device\n");
    return 1;
  }
  const bool one_gpu = o.one_gpu || gpus < o.ranks;
  auto oneshot = make_in_process_communicators(o.ranks);
  auto host = make_in_process_communicators(o.ranks);  // NCCL's bootstrap and barriers
  std::vector<std::unique_ptr<Communicator>> nccl(static_cast<size_t>(o.ranks));
  std::vector<std::string> err(static_cast<size_t>(o.ranks));
  struct Row {
    int64_t bytes;
    double ms[4];  // one-shot eager, one-shot graph, NCCL eager, NCCL graph (0: not run)
  };
  std::vector<Row> rows;
  for (int64_t b = o.min_bytes; b <= o.max_bytes; b *= 2) rows.push_back({b, {0, 0, 0, 0}});
  std::vector<std::thread> threads;
  for (int r = 0; r < o.ranks; ++r) {
    threads.emplace_back([&, r] {
      const int dev = one_gpu ? 0 : r;
      auto fail = [&](const Status& s) { err[static_cast<size_t>(r)] = s.to_string(); };
      auto device = cuda::CudaDevice::create(dev);
      if (!device.ok()) return fail(device.status());
      cudaStream_t stream = (*device)->launch_ctx().stream;
      Communicator& os = *oneshot[static_cast<size_t>(r)];
      Status st = init_in_process_device(os, dev, o.oneshot_max);
      if (!st.ok()) return fail(st);
      if (!one_gpu) {
        auto c = make_nccl_communicator(std::move(host[static_cast<size_t>(r)]), dev, 0);
        if (!c.ok()) return fail(c.status());
        nccl[static_cast<size_t>(r)] = std::move(*c);
      }
      void* buf = nullptr;
      if (cudaMalloc(&buf, static_cast<size_t>(o.max_bytes)) != cudaSuccess) {
        return fail(Status(StatusCode::kOutOfMemory, "cudaMalloc"));
      }
      cudaMemset(buf, 0, static_cast<size_t>(o.max_bytes));
      st = os.barrier();
      CommStream s;
      s.device = Device::cuda(dev);
      s.cuda_stream = stream;
      for (Row& row : rows) {
        const int64_t count = row.bytes / 2;
        for (int k = 0; k < 4 && st.ok(); ++k) {
          const bool use_nccl = k >= 2;
          if (use_nccl && one_gpu) continue;
          if (!use_nccl && row.bytes > o.oneshot_max) continue;
          Communicator& c = use_nccl ? *nccl[static_cast<size_t>(r)] : os;
          const double t = time_ms(
              stream, os, [&] { return c.all_reduce(buf, count, DType::kBF16, s); }, o.iters,
              k % 2 == 1, &st);
          if (r == 0) row.ms[k] = t;
          if (st.ok()) st = os.barrier();
        }
      }
      if (!st.ok()) fail(st);
      cudaFree(buf);
    });
  }
  for (auto& t : threads) t.join();
  for (const std::string& e : err) {
    if (!e.empty()) {
      std::fprintf(stderr, "bench_allreduce: %s\n", e.c_str());
      return 1;
    }
  }
  std::printf("# all-reduce, bf16, %d ranks on %s; NCCL %s; median of %d; us (bus GB/s)\n", o.ranks,
              one_gpu ? "ONE GPU (one-shot only)" : "one GPU each",
              one_gpu ? "-" : nccl_version().c_str(), o.iters);
  std::printf("%12s %20s %20s %20s %20s\n", "bytes", "oneshot eager", "oneshot graph", "nccl eager",
              "nccl graph");
  const double bus = 2.0 * (o.ranks - 1) / o.ranks;
  for (const Row& row : rows) {
    std::printf("%12lld", static_cast<long long>(row.bytes));
    for (double ms : row.ms) {
      if (ms <= 0) {
        std::printf(" %20s", "-");
      } else {
        char cell[64];
        std::snprintf(cell, sizeof(cell), "%.1f (%.1f)", ms * 1e3,
                      bus * static_cast<double>(row.bytes) / (ms * 1e-3) / 1e9);
        std::printf(" %20s", cell);
      }
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);  // ranks sharing a GPU (see tp_executor.cpp)
  strata::Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_allreduce: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--ranks") {
      o.ranks = std::atoi(next());
    } else if (a == "--min") {
      o.min_bytes = std::atoll(next());
    } else if (a == "--max") {
      o.max_bytes = std::atoll(next());
    } else if (a == "--oneshot-max") {
      o.oneshot_max = std::atoll(next());
    } else if (a == "--iters") {
      o.iters = std::atoi(next());
    } else if (a == "--one-gpu") {
      o.one_gpu = true;
    } else {
      std::fprintf(stderr,
                   "usage: bench_allreduce [--ranks N] [--min BYTES] [--max BYTES] "
                   "[--oneshot-max BYTES] [--iters N] [--one-gpu]\n");
      return 2;
    }
  }
  if (o.ranks < 2 || o.ranks > 8 || o.min_bytes < 2 || o.max_bytes < o.min_bytes || o.iters < 1) {
    std::fprintf(stderr, "bench_allreduce: need 2..8 ranks, 2 <= min <= max, iters >= 1\n");
    return 2;
  }
  return strata::run(o);
}
