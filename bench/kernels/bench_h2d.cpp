// Host-to-device copy bandwidth per GPU link, for partitioned weight fetch (issue 13 item 4):
// from pinned host memory (cudaHostAllocPortable, as the streamed layers are) into each GPU,
// first each GPU alone, then all GPUs at once (one host thread and copy stream each, started
// together), from one buffer per GPU and from one shared buffer (each GPU its own part, as the
// replicas read the one host copy of a layer). Prints a table and, with --json FILE, the numbers.
//
//   bench_h2d [--gpus N] [--mib 1024] [--iters 10] [--json out.json]
#include <cuda_runtime.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Options {
  int gpus = 0;  // 0: every visible GPU
  size_t bytes = size_t{1} << 30;
  int iters = 10;
  std::string json;
};

#define CHECK(x)                                                               \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      std::fprintf(stderr, "bench_h2d: %s: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

struct Gpu {
  int index = 0;
  void* dev = nullptr;
  void* host = nullptr;  // its own pinned buffer
  cudaStream_t stream = nullptr;
};

// GB/s of `iters` copies of `bytes` from src into g's device buffer (after one warm-up copy).
double copy_gbps(Gpu& g, const void* src, size_t bytes, int iters) {
  CHECK(cudaSetDevice(g.index));
  CHECK(cudaMemcpyAsync(g.dev, src, bytes, cudaMemcpyHostToDevice, g.stream));
  CHECK(cudaStreamSynchronize(g.stream));
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    CHECK(cudaMemcpyAsync(g.dev, src, bytes, cudaMemcpyHostToDevice, g.stream));
  }
  CHECK(cudaStreamSynchronize(g.stream));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(bytes) * iters / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--gpus") {
      o.gpus = std::atoi(next().c_str());
    } else if (a == "--mib") {
      o.bytes = static_cast<size_t>(std::atoll(next().c_str())) << 20;
    } else if (a == "--iters") {
      o.iters = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--json") {
      o.json = next();
    } else {
      std::fprintf(stderr, "usage: bench_h2d [--gpus N] [--mib 1024] [--iters 10] [--json F]\n");
      return 2;
    }
  }
  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  const int n = o.gpus > 0 ? std::min(o.gpus, count) : count;
  if (n < 1 || o.bytes == 0) {
    std::fprintf(stderr, "bench_h2d: no GPU\n");
    return 1;
  }
  std::vector<Gpu> gpus(static_cast<size_t>(n));
  void* shared = nullptr;
  CHECK(cudaHostAlloc(&shared, o.bytes, cudaHostAllocPortable));
  std::memset(shared, 1, o.bytes);
  for (int g = 0; g < n; ++g) {
    Gpu& x = gpus[static_cast<size_t>(g)];
    x.index = g;
    CHECK(cudaSetDevice(g));
    CHECK(cudaMalloc(&x.dev, o.bytes));
    CHECK(cudaHostAlloc(&x.host, o.bytes, cudaHostAllocPortable));
    std::memset(x.host, 1, o.bytes);
    CHECK(cudaStreamCreateWithFlags(&x.stream, cudaStreamNonBlocking));
  }
  std::vector<double> alone(static_cast<size_t>(n)), together(static_cast<size_t>(n)),
      parts(static_cast<size_t>(n));
  for (int g = 0; g < n; ++g) {
    Gpu& x = gpus[static_cast<size_t>(g)];
    alone[static_cast<size_t>(g)] = copy_gbps(x, x.host, o.bytes, o.iters);
  }
  // All at once: whole buffers from each GPU's own host buffer, then each GPU's 1/n part of the
  // shared buffer (the partitioned fetch's traffic), wall time over all of them.
  auto all_at_once = [&](bool part, std::vector<double>& per) {
    std::barrier start(n);
    std::vector<std::thread> threads;
    const size_t chunk = part ? o.bytes / static_cast<size_t>(n) : o.bytes;
    const auto t0 = std::chrono::steady_clock::now();
    for (int g = 0; g < n; ++g) {
      threads.emplace_back([&, g] {
        Gpu& x = gpus[static_cast<size_t>(g)];
        const void* src =
            part ? static_cast<const char*>(shared) + chunk * static_cast<size_t>(g) : x.host;
        CHECK(cudaSetDevice(x.index));
        start.arrive_and_wait();
        per[static_cast<size_t>(g)] = copy_gbps(x, src, chunk, o.iters);
      });
    }
    for (std::thread& t : threads) t.join();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  all_at_once(false, together);
  all_at_once(true, parts);
  double sum_alone = 0, sum_together = 0, sum_parts = 0;
  std::printf(
      "| gpu | alone GB/s | all at once GB/s | 1/%d of a shared buffer, all at once GB/s |\n", n);
  std::printf("|----:|-----------:|-----------------:|--------------------------------------:|\n");
  for (int g = 0; g < n; ++g) {
    const auto i = static_cast<size_t>(g);
    std::printf("| %3d | %10.1f | %16.1f | %38.1f |\n", g, alone[i], together[i], parts[i]);
    sum_alone += alone[i];
    sum_together += together[i];
    sum_parts += parts[i];
  }
  std::printf("| sum | %10.1f | %16.1f | %38.1f |\n", sum_alone, sum_together, sum_parts);
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    auto list = [&](const std::vector<double>& v) {
      std::string s = "[";
      for (size_t i = 0; i < v.size(); ++i) {
        s += (i ? ", " : "") + std::to_string(v[i]);
      }
      return s + "]";
    };
    f << "{\"gpus\": " << n << ", \"bytes\": " << o.bytes << ", \"iters\": " << o.iters
      << ", \"alone_GBps\": " << list(alone) << ", \"together_GBps\": " << list(together)
      << ", \"shared_parts_together_GBps\": " << list(parts)
      << ", \"sum_together_GBps\": " << sum_together << ", \"sum_shared_parts_GBps\": " << sum_parts
      << "}\n";
  }
  for (Gpu& x : gpus) {
    CHECK(cudaSetDevice(x.index));
    CHECK(cudaStreamDestroy(x.stream));
    CHECK(cudaFree(x.dev));
    CHECK(cudaFreeHost(x.host));
  }
  CHECK(cudaFreeHost(shared));
  return 0;
}
