// All-reduce latency and bus bandwidth, one-shot kernels against NCCL, eager and replayed from
// CUDA graphs: N in-process ranks (threads), rank r on GPU r (or every rank on GPU 0 with
// --one-gpu, where NCCL cannot run and only the one-shot rows appear). Sizes double from --min to
// --max bytes of bf16. Each row: the median over --iters of one all-reduce, timed with CUDA
// events on rank 0 after a barrier, and the bus bandwidth 2 (n-1)/n x bytes / time (NCCL's
// definition). The one-shot rows stop where its staging buffer ends (--oneshot-max). "graph" is
// one all-reduce per graph launch (the launch's latency included); "in graph xK" is the time per
// all-reduce of a graph of K back-to-back all-reduces (--per-graph K, default 16), as a decode
// step's graph runs them. A second table times the one-shot all-reduce fused with the residual
// add and RMSNorm (Communicator::all_reduce_add_norm: f32 partial sums [rows, --cols], the
// engine's decode shape) beside the plain all-reduce of the same f32 bytes. A third table (GPUs
// of their own only) times point-to-point copies from rank 1 to rank 0 at the same sizes: NCCL
// send/recv (what pipeline stages use) and cudaMemcpyPeerAsync (the link's own rate), both timed
// on the receiving rank 0. --json FILE writes the three tables.
//
//   bench_allreduce --ranks 2 --min 1024 --max 268435456 [--json out.json]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
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
  int per_graph = 16;
  int64_t cols = 8192;  // the fused rows' hidden size (Llama-3-70B)
  bool one_gpu = false;
  std::string json;
};

// Rank 0's median time (ms) of fn over iters launches, eager or from one graph of `per_graph`
// back-to-back calls of fn (the time divided by per_graph).
double time_ms(cudaStream_t stream, Communicator& barrier, const std::function<Status()>& fn,
               int iters, bool graph, Status* st, int per_graph = 1) {
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    cudaGraph_t g = nullptr;
    cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    for (int k = 0; k < per_graph && st->ok(); ++k) *st = fn();
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
  return ms[ms.size() / 2] / (graph ? per_graph : 1);
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
  // Per row: one-shot eager, graph, in graph xK; NCCL eager, graph, in graph xK (0: not run).
  constexpr int kCols = 6;
  struct Row {
    int64_t bytes;
    double ms[kCols];
  };
  std::vector<Row> rows;
  for (int64_t b = o.min_bytes; b <= o.max_bytes; b *= 2) rows.push_back({b, {0, 0, 0, 0, 0, 0}});
  // Fused all-reduce + residual add + RMSNorm at decode rows: fused eager, graph, in graph xK;
  // the plain one-shot all-reduce of the same f32 partial sums, eager, graph, in graph xK.
  struct FusedRow {
    int64_t rows;
    double ms[kCols];
  };
  std::vector<FusedRow> fused;
  for (int64_t n : {1, 4, 16}) {
    if (n * o.cols * 4 <= o.oneshot_max) fused.push_back({n, {0, 0, 0, 0, 0, 0}});
  }
  // Rank 1 -> rank 0: NCCL send/recv, cudaMemcpyPeerAsync (us); GPUs of their own only.
  struct P2pRow {
    int64_t bytes;
    double ms[2];
  };
  std::vector<P2pRow> p2p;
  if (!one_gpu) {
    for (const Row& row : rows) p2p.push_back({row.bytes, {0, 0}});
  }
  std::vector<void*> bufs(static_cast<size_t>(o.ranks), nullptr);
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
      bufs[static_cast<size_t>(r)] = buf;
      st = os.barrier();
      CommStream s;
      s.device = Device::cuda(dev);
      s.cuda_stream = stream;
      for (Row& row : rows) {
        const int64_t count = row.bytes / 2;
        for (int k = 0; k < kCols && st.ok(); ++k) {
          const bool use_nccl = k >= 3;
          if (use_nccl && one_gpu) continue;
          if (!use_nccl && row.bytes > o.oneshot_max) continue;
          Communicator& c = use_nccl ? *nccl[static_cast<size_t>(r)] : os;
          const double t = time_ms(
              stream, os, [&] { return c.all_reduce(buf, count, DType::kBF16, s); }, o.iters,
              k % 3 != 0, &st, k % 3 == 2 ? o.per_graph : 1);
          if (r == 0) row.ms[k] = t;
          if (st.ok()) st = os.barrier();
        }
      }
      // The fused rows: y (f32 partial sums) in buf, x (f32 residual) and h (bf16) after it.
      const int64_t max_rows = fused.empty() ? 0 : fused.back().rows;
      void* extra = nullptr;
      const size_t extra_bytes = static_cast<size_t>(max_rows * o.cols * 6 + o.cols * 4);
      if (st.ok() && max_rows > 0) {
        if (cudaMalloc(&extra, extra_bytes) != cudaSuccess) {
          return fail(Status(StatusCode::kOutOfMemory, "cudaMalloc"));
        }
        cudaMemset(extra, 0, extra_bytes);
      }
      for (FusedRow& row : fused) {
        AllReduceAddNorm a;
        a.y = static_cast<float*>(buf);
        a.x = static_cast<float*>(extra);
        a.weight = static_cast<float*>(extra) + max_rows * o.cols;
        a.h = reinterpret_cast<uint16_t*>(static_cast<float*>(extra) + max_rows * o.cols + o.cols);
        a.rows = row.rows;
        a.cols = o.cols;
        for (int k = 0; k < kCols && st.ok(); ++k) {
          auto fn = [&]() -> Status {
            return k < 3 ? os.all_reduce_add_norm(a, s)
                         : os.all_reduce(buf, row.rows * o.cols, DType::kF32, s);
          };
          const double t =
              time_ms(stream, os, fn, o.iters, k % 3 != 0, &st, k % 3 == 2 ? o.per_graph : 1);
          if (r == 0) row.ms[k] = t;
          if (st.ok()) st = os.barrier();
        }
      }
      // Point to point, rank 1 -> rank 0 (peer access is on: init_in_process_device); the other
      // ranks only keep the barriers.
      for (P2pRow& row : p2p) {
        const int64_t count = row.bytes / 2;
        for (int k = 0; k < 2 && st.ok(); ++k) {
          std::function<Status()> fn = [] { return ok_status(); };
          if (k == 0 && r == 0) {
            fn = [&] { return nccl[0]->recv(buf, count, DType::kBF16, 1, s); };
          } else if (k == 0 && r == 1) {
            fn = [&] { return nccl[1]->send(buf, count, DType::kBF16, 0, s); };
          } else if (k == 1 && r == 0) {
            fn = [&]() -> Status {
              if (cudaMemcpyPeerAsync(buf, 0, bufs[1], 1, static_cast<size_t>(row.bytes), stream) !=
                  cudaSuccess) {
                return Status(StatusCode::kInternal, "cudaMemcpyPeerAsync failed");
              }
              return ok_status();
            };
          }
          const double t = time_ms(stream, os, fn, o.iters, false, &st);
          if (r == 0) row.ms[k] = t;
          if (st.ok()) st = os.barrier();
        }
      }
      if (st.ok()) st = os.barrier();  // no rank frees its buffer while a peer copy may read it
      if (!st.ok()) fail(st);
      cudaFree(buf);
      if (extra != nullptr) cudaFree(extra);
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
  const std::string in_graph = "in graph x" + std::to_string(o.per_graph);
  std::printf("%12s %20s %20s %20s %20s %20s %20s\n", "bytes", "oneshot eager", "oneshot graph",
              ("oneshot " + in_graph).c_str(), "nccl eager", "nccl graph",
              ("nccl " + in_graph).c_str());
  const double bus = 2.0 * (o.ranks - 1) / o.ranks;
  auto cell = [&](double ms, int64_t bytes) {
    if (ms <= 0) {
      std::printf(" %20s", "-");
      return;
    }
    char c[64];
    std::snprintf(c, sizeof(c), "%.1f (%.1f)", ms * 1e3,
                  bus * static_cast<double>(bytes) / (ms * 1e-3) / 1e9);
    std::printf(" %20s", c);
  };
  for (const Row& row : rows) {
    std::printf("%12lld", static_cast<long long>(row.bytes));
    for (double ms : row.ms) cell(ms, row.bytes);
    std::printf("\n");
  }
  if (!fused.empty()) {
    std::printf(
        "# one-shot all-reduce fused with the residual add and RMSNorm (f32 partial sums [rows, "
        "%lld], bf16 h out) vs the plain one-shot all-reduce of the same f32 bytes; us (bus "
        "GB/s)\n",
        static_cast<long long>(o.cols));
    std::printf("%6s %12s %20s %20s %20s %20s %20s %20s\n", "rows", "f32 bytes", "fused eager",
                "fused graph", ("fused " + in_graph).c_str(), "plain eager", "plain graph",
                ("plain " + in_graph).c_str());
    for (const FusedRow& row : fused) {
      const int64_t bytes = row.rows * o.cols * 4;
      std::printf("%6lld %12lld", static_cast<long long>(row.rows), static_cast<long long>(bytes));
      for (double ms : row.ms) cell(ms, bytes);
      std::printf("\n");
    }
  }
  if (!p2p.empty()) {
    std::printf("# point to point, rank 1 -> rank 0, timed on rank 0, eager; us (GB/s)\n");
    std::printf("%12s %20s %20s\n", "bytes", "nccl send/recv", "cudaMemcpyPeer");
    for (const P2pRow& row : p2p) {
      std::printf("%12lld", static_cast<long long>(row.bytes));
      for (double ms : row.ms) {
        char c[64];
        std::snprintf(c, sizeof(c), "%.1f (%.1f)", ms * 1e3,
                      ms > 0 ? static_cast<double>(row.bytes) / (ms * 1e-3) / 1e9 : 0.0);
        std::printf(" %20s", ms > 0 ? c : "-");
      }
      std::printf("\n");
    }
  }
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    auto us = [](double ms) { return ms > 0 ? std::to_string(ms * 1e3) : std::string("null"); };
    f << "{\"bench\": \"bench_allreduce\", \"ranks\": " << o.ranks
      << ", \"one_gpu\": " << (one_gpu ? "true" : "false") << ", \"nccl\": \""
      << (one_gpu ? "-" : nccl_version()) << "\", \"iters\": " << o.iters
      << ", \"per_graph\": " << o.per_graph
      << ",\n \"columns_us\": [\"oneshot_eager\", \"oneshot_graph\", \"oneshot_in_graph\", "
         "\"nccl_eager\", \"nccl_graph\", \"nccl_in_graph\"],\n \"all_reduce_bf16\": [";
    for (size_t i = 0; i < rows.size(); ++i) {
      f << (i ? ",\n  " : "\n  ") << "{\"bytes\": " << rows[i].bytes << ", \"us\": [";
      for (int k = 0; k < kCols; ++k) f << (k ? ", " : "") << us(rows[i].ms[k]);
      f << "]}";
    }
    f << "],\n \"fused_add_norm_f32\": [";
    for (size_t i = 0; i < fused.size(); ++i) {
      f << (i ? ",\n  " : "\n  ") << "{\"rows\": " << fused[i].rows << ", \"cols\": " << o.cols
        << ", \"us\": [";
      for (int k = 0; k < kCols; ++k) f << (k ? ", " : "") << us(fused[i].ms[k]);
      f << "]}";
    }
    f << "],\n \"p2p_columns_us\": [\"nccl_send_recv\", \"cuda_memcpy_peer\"],\n \"p2p\": [";
    for (size_t i = 0; i < p2p.size(); ++i) {
      f << (i ? ",\n  " : "\n  ") << "{\"bytes\": " << p2p[i].bytes << ", \"us\": ["
        << us(p2p[i].ms[0]) << ", " << us(p2p[i].ms[1]) << "]}";
    }
    f << "]}\n";
    if (!f) {
      std::fprintf(stderr, "bench_allreduce: cannot write %s\n", o.json.c_str());
      return 1;
    }
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
    } else if (a == "--per-graph") {
      o.per_graph = std::atoi(next());
    } else if (a == "--cols") {
      o.cols = std::atoll(next());
    } else if (a == "--one-gpu") {
      o.one_gpu = true;
    } else if (a == "--json") {
      o.json = next();
    } else {
      std::fprintf(
          stderr,
          "usage: bench_allreduce [--ranks N] [--min BYTES] [--max BYTES] "
          "[--oneshot-max BYTES] [--iters N] [--per-graph K] [--cols N] [--one-gpu] [--json F]\n");
      return 2;
    }
  }
  if (o.ranks < 2 || o.ranks > 8 || o.min_bytes < 2 || o.max_bytes < o.min_bytes || o.iters < 1 ||
      o.per_graph < 1 || o.cols < 1) {
    std::fprintf(stderr,
                 "bench_allreduce: need 2..8 ranks, 2 <= min <= max, iters >= 1, per-graph >= 1, "
                 "cols >= 1\n");
    return 2;
  }
  return strata::run(o);
}
