// Expert-parallel dispatch + combine: the all-to-alls of one sparse layer (model/moe.cpp,
// experts_parallel) for 1..128 tokens per rank at DeepSeek-V3's shape (hidden 7168, top-8 of 256
// experts) by default. Routing is uniform at random from a fixed seed, the same on every run.
//
// Host memory over the ranks of an mpirun (the default): per step and per rank, the per-expert
// counts (all_to_all of E / ep i32 to each rank), the rows to the experts' owners (all_to_all_v,
// bf16 [tokens * k, hidden] split by owner) and the expert outputs back (all_to_all_v, f32, the
// same splits reversed). Each row: the median over --iters of a step (after a barrier) on rank
// 0, and the bytes it sent per second (dispatch + combine, rows to itself included).
//
//   mpirun -np 4 bench_moe_all_to_all [--hidden 7168] [--experts 256] [--top-k 8] [--iters 20]
//
// GPUs (--device cuda): --ranks in-process ranks (threads; default the GPUs present, at least
// 2), one GPU each, or all on GPU 0 when there are fewer GPUs. Per row, rank 0's median wall
// time (after a barrier, to the end of its stream) of one layer's dispatch + combine:
//   variable   the variable-split exchange as the model runs it for prefill: the permuted
//              rows' offsets read on the host, the counts exchanged on the host, the rows sent
//              with all_to_all_v (in-process: staged through host memory; nccl: on the device)
//   fixed      the fixed-capacity exchange (model/moe_ep.h: device plans, fixed-size device
//              all-to-alls of C = tokens min(k, E / ranks) rows per rank), eager
//   graph      the same, replayed from a CUDA graph (what a decode step runs)
// and the bytes the fixed exchange sends per rank (bf16 out, f32 back, padding included).
// --transport oneshot (default: the one-shot all-to-all kernel, whole C-row blocks), counted
// (the same kernel moving only the rows really routed: Communicator::all_to_all_rows, the
// counts read on the device; fixed_MB_sent is then the routed rows' bytes) or nccl (grouped
// send/recv, whole blocks; one GPU per rank).
//
// --transport fused: the counted exchange as the communicator's two fused kernels
// (Communicator::expert_dispatch / expert_combine: rows written straight into the peers'
// grouped rows and outputs; the model's default for in-process ranks).
//
//   bench_moe_all_to_all --device cuda [--ranks 2] [--transport oneshot|counted|fused|nccl]
//                        [--iters 50] [--combine-dtype f32|bf16]
// --combine-dtype bf16: the expert outputs go back as bf16 rows (the engine sends f32; this
// measures what bf16 outputs would save).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "parallel/comm.h"

#if STRATA_HAS_CUDA
#include <cuda_runtime.h>

#include <functional>
#include <thread>

#include "backends/cuda/cuda_device.h"
#include "model/moe_ep.h"
#include "ops/ops.h"
#include "parallel/inproc_comm.h"
#endif

namespace strata {
namespace {

struct Options {
  int64_t hidden = 7168, experts = 256, top_k = 8;
  int iters = 20;
  bool cuda = false;
  int ranks = 0;  // GPU mode: 0 = the GPUs present, at least 2
  bool nccl = false;
  bool counted = false;  // --transport counted: the one-shot counted all-to-all
  bool fused = false;    // --transport fused: the fused dispatch and combine kernels
  // --combine-dtype bf16 (GPU only): the expert outputs travel back as bf16 rows instead of the
  // engine's f32 (what bf16 outputs would save; the engine's combine reads f32 today).
  DType combine_dtype = DType::kF32;
};

// Each token's k distinct experts, uniform, seeded by (rank, tokens).
std::vector<int32_t> route(int rank, int64_t tokens, int64_t experts, int64_t k) {
  std::mt19937 rng(static_cast<uint32_t>(rank * 1000003 + tokens));
  std::vector<int32_t> pick(static_cast<size_t>(experts)), ids;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t e = 0; e < experts; ++e) pick[static_cast<size_t>(e)] = static_cast<int32_t>(e);
    for (int64_t j = 0; j < k; ++j) {
      std::uniform_int_distribution<int64_t> d(j, experts - 1);
      std::swap(pick[static_cast<size_t>(j)], pick[static_cast<size_t>(d(rng))]);
      ids.push_back(pick[static_cast<size_t>(j)]);
    }
  }
  return ids;
}

#if STRATA_HAS_CUDA
// Rank 0's median wall time (us) of fn over iters runs, each after a barrier of ctl and to the end
// of the stream; eager, or replayed from one captured graph of fn.
double time_us(cudaStream_t stream, Communicator& ctl, const std::function<Status()>& fn, int iters,
               bool graph, Status* st) {
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    cudaGraph_t g = nullptr;
    cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    *st = fn();
    const cudaError_t e = cudaStreamEndCapture(stream, &g);
    if (st->ok() && (e != cudaSuccess || g == nullptr)) {
      *st = Status(StatusCode::kInternal, std::string("graph capture: ") + cudaGetErrorString(e));
    }
    if (st->ok() && cudaGraphInstantiate(&exec, g, 0) != cudaSuccess) {
      *st = Status(StatusCode::kInternal, "graph instantiation failed");
    }
    if (g != nullptr) cudaGraphDestroy(g);
    // Every rank has instantiated (allocations) before anyone launches: on one GPU an allocation
    // can wait for a peer's one-shot kernel, which waits for this rank.
    const Status b = ctl.barrier();
    if (st->ok()) *st = b;
  }
  auto once = [&]() -> Status {
    if (!graph) return fn();
    return cudaGraphLaunch(exec, stream) == cudaSuccess
               ? ok_status()
               : Status(StatusCode::kInternal, "graph launch failed");
  };
  std::vector<double> us;
  for (int i = 0; i < iters + 3 && st->ok(); ++i) {
    *st = ctl.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    if (st->ok()) *st = once();
    cudaStreamSynchronize(stream);
    const double dt =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (i >= 3) us.push_back(dt);  // three warm-up runs
  }
  cudaStreamSynchronize(stream);
  const Status b = ctl.barrier();
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (st->ok()) *st = b;
  if (us.empty()) return 0;
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// The variable-split exchange of moe.cpp: the counts read on the host, rows by all_to_all_v on
// the device (NCCL) or staged through host memory (in-process, as the model does).
Status variable_exchange(ops::Context& ctx, Communicator& g, bool on_device, const Tensor& offsets,
                         int64_t El, const Tensor& x_perm, Tensor& recv_x, Tensor& recv_y,
                         Tensor& y_back) {
  const int n = g.size();
  const int64_t E = El * n;
  std::vector<int32_t> off(static_cast<size_t>(E + 1)), sc(static_cast<size_t>(E)),
      rc(static_cast<size_t>(E));
  STRATA_RETURN_IF_ERROR(ops::download(ctx, offsets, off.data()));
  STRATA_RETURN_IF_ERROR(ops::synchronize(ctx));
  for (size_t e = 0; e < sc.size(); ++e) sc[e] = off[e + 1] - off[e];
  STRATA_RETURN_IF_ERROR(g.all_to_all(sc.data(), El, DType::kI32, rc.data(), CommStream::host()));
  std::vector<int64_t> s_rows(static_cast<size_t>(n)), r_rows(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const auto ri = static_cast<size_t>(r);
    s_rows[ri] = off[static_cast<size_t>((r + 1) * El)] - off[static_cast<size_t>(r * El)];
    for (int64_t e = 0; e < El; ++e) r_rows[ri] += rc[static_cast<size_t>(r * El + e)];
  }
  auto exchange = [&](const Tensor& send, const int64_t* sr, Tensor& recv,
                      const int64_t* rr) -> Status {
    if (on_device) return ops::all_to_all_v(ctx, g, send, sr, recv, rr);
    const int64_t row = dtype_bytes(send.dtype, send.cols());
    std::vector<int64_t> c(static_cast<size_t>(n)), o(c.size()), c2(c.size()), o2(c.size());
    int64_t st = 0, rt = 0;
    for (size_t r = 0; r < c.size(); ++r) {
      o[r] = st * row;
      c[r] = sr[r] * row;
      o2[r] = rt * row;
      c2[r] = rr[r] * row;
      st += sr[r];
      rt += rr[r];
    }
    std::vector<uint8_t> hs(static_cast<size_t>(std::max<int64_t>(1, st * row))),
        hr(static_cast<size_t>(std::max<int64_t>(1, rt * row)));
    if (st > 0) STRATA_RETURN_IF_ERROR(ops::download(ctx, send.slice_rows(0, st), hs.data()));
    STRATA_RETURN_IF_ERROR(ops::synchronize(ctx));
    STRATA_RETURN_IF_ERROR(g.all_to_all_v(hs.data(), c.data(), o.data(), hr.data(), c2.data(),
                                          o2.data(), DType::kU8, CommStream::host()));
    if (rt > 0) {
      Tensor dst = recv.slice_rows(0, rt);
      STRATA_RETURN_IF_ERROR(ops::upload(ctx, hr.data(), dst));
    }
    return ops::synchronize(ctx);
  };
  STRATA_RETURN_IF_ERROR(exchange(x_perm, s_rows.data(), recv_x, r_rows.data()));
  return exchange(recv_y, r_rows.data(), y_back, s_rows.data());
}

int run_cuda(const Options& o) {
  const int gpus = cuda::cuda_device_count();
  if (gpus < 1) {
    std::fprintf(stderr, "bench_moe_all_to_all: no CUDA device\n");
    return 1;
  }
  const int n = o.ranks > 0 ? o.ranks : std::max(2, gpus);
  const bool one_gpu = gpus < n;
  if (o.experts % n != 0 || o.top_k > o.experts || (o.nccl && one_gpu)) {
    std::fprintf(stderr, "bench_moe_all_to_all: %lld experts over %d ranks, top-%lld%s\n",
                 static_cast<long long>(o.experts), n, static_cast<long long>(o.top_k),
                 o.nccl && one_gpu ? ", NCCL needs one GPU per rank" : "");
    return 1;
  }
  const int64_t El = o.experts / n, E = o.experts, H = o.hidden, k = o.top_k;
  const std::vector<int64_t> sizes{1, 2, 4, 8, 16, 32, 64, 128};
  const int64_t Tmax = sizes.back(), Cmax = Tmax * std::min(k, El);
  auto groups = make_in_process_communicators(n);
  auto ctl = make_in_process_communicators(n);  // barriers
  struct Row {
    double us[3] = {0, 0, 0};  // variable, fixed eager, fixed graph
  };
  std::vector<Row> rows(sizes.size());
  std::vector<std::string> err(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      const int dev = one_gpu ? 0 : r;
      auto fail = [&](const Status& s) { err[static_cast<size_t>(r)] = s.to_string(); };
      auto device = cuda::CudaDevice::create(dev);
      if (!device.ok()) return fail(device.status());
      const cuda::LaunchCtx& lc = (*device)->launch_ctx();
      ops::Context ctx{Device::cuda(dev), &lc};
      Communicator& c = *ctl[static_cast<size_t>(r)];
      std::unique_ptr<Communicator> g = std::move(groups[static_cast<size_t>(r)]);
      Status st = ok_status();
      if (o.nccl) {
        auto made = make_nccl_communicator(std::move(g), dev, 0);
        if (!made.ok()) return fail(made.status());
        g = std::move(*made);
      } else {
        st = init_in_process_device(*g, dev, n * Cmax * H * 4);
        if (!st.ok()) return fail(st);
      }
      // Every buffer, for the largest size, before the first collective.
      std::vector<void*> mem;
      auto alloc = [&](DType dt, int64_t rows_, int64_t cols) {
        void* p = nullptr;
        const auto bytes = static_cast<size_t>(dtype_bytes(dt, std::max<int64_t>(rows_, 1) * cols));
        if (cudaMalloc(&p, bytes) != cudaSuccess) return Tensor{};
        cudaMemset(p, 0, bytes);
        mem.push_back(p);
        return Tensor::make(p, dt, {rows_, cols}, Device::cuda(dev));
      };
      Tensor x = alloc(DType::kBF16, Tmax, H), ids = alloc(DType::kI32, Tmax, k);
      Tensor offsets = alloc(DType::kI32, 1, E + 1), x_perm = alloc(DType::kBF16, Tmax * k, H);
      Tensor perm = alloc(DType::kI32, 1, Tmax * k), y_perm = alloc(o.combine_dtype, Tmax * k, H);
      Tensor send_x = alloc(DType::kBF16, n * Cmax, H), recv_x = alloc(DType::kBF16, n * Cmax, H);
      Tensor y = alloc(o.combine_dtype, n * Cmax, H), recv_y = alloc(o.combine_dtype, n * Cmax, H);
      Tensor roff = alloc(DType::kI32, 1, El + 1);
      Tensor index = alloc(DType::kI32, 1, ep_index_entries(n, El, Cmax, Tmax * k));
      Tensor v_recv_x = alloc(DType::kBF16, n * Tmax * k, H);
      Tensor v_recv_y = alloc(o.combine_dtype, n * Tmax * k, H);
      for (const Tensor* t : {&x, &ids, &offsets, &x_perm, &perm, &y_perm, &send_x, &recv_x, &y,
                              &recv_y, &roff, &index, &v_recv_x, &v_recv_y}) {
        if (!t->defined()) st = Status(StatusCode::kOutOfMemory, "cudaMalloc");
      }
      std::vector<uint16_t> ones(static_cast<size_t>(Tmax * H), 0x3f80);
      if (st.ok()) st = ops::upload(ctx, ones.data(), x);
      if (st.ok()) st = ops::synchronize(ctx);
      const Status met = c.barrier();
      if (st.ok()) st = met;
      for (size_t si = 0; si < sizes.size() && st.ok(); ++si) {
        const int64_t T = sizes[si], C = T * std::min(k, El);
        const std::vector<int32_t> rid = route(r, T, E, k);
        Tensor xs = x.slice_rows(0, T),
               is = Tensor::make(ids.data, DType::kI32, {T, k}, ctx.device);
        Tensor xp = Tensor::make(x_perm.data, DType::kBF16, {T * k, H}, ctx.device);
        Tensor pm = Tensor::make(perm.data, DType::kI32, {1, T * k}, ctx.device);
        Tensor yp = Tensor::make(y_perm.data, o.combine_dtype, {T * k, H}, ctx.device);
        st = ops::upload(ctx, rid.data(), is);
        if (st.ok()) st = ops::moe_offsets(ctx, is, E, offsets);
        if (st.ok()) st = ops::moe_permute(ctx, xs, is, offsets, xp, pm);
        if (st.ok()) st = ops::synchronize(ctx);
        EpExchange ex;
        ex.ep = n;
        ex.experts_per_rank = El;
        ex.capacity = C;
        ex.counted = o.counted || o.fused;
        ex.fused = o.fused;
        ex.y_back = yp;
        ex.send_x = Tensor::make(send_x.data, DType::kBF16, {n * C, H}, ctx.device);
        ex.recv_x = Tensor::make(recv_x.data, DType::kBF16, {n * C, H}, ctx.device);
        ex.offsets = roff;
        ex.y = Tensor::make(y.data, o.combine_dtype, {n * C, H}, ctx.device);
        ex.recv_y = Tensor::make(recv_y.data, o.combine_dtype, {n * C, H}, ctx.device);
        carve_ep_index(ex, static_cast<int32_t*>(index.data), T * k, ctx.device);
        const std::function<Status()> fixed = [&]() -> Status {
          STRATA_RETURN_IF_ERROR(ep_dispatch(ctx, *g, xp, offsets, ex));
          return ep_combine(ctx, *g, ex, yp);
        };
        const std::function<Status()> variable = [&]() -> Status {
          return variable_exchange(ctx, *g, o.nccl, offsets, El, xp, v_recv_x, v_recv_y, yp);
        };
        double t[3] = {0, 0, 0};
        if (st.ok()) t[0] = time_us(lc.stream, c, variable, o.iters, false, &st);
        if (st.ok()) t[1] = time_us(lc.stream, c, fixed, o.iters, false, &st);
        if (st.ok()) t[2] = time_us(lc.stream, c, fixed, o.iters, true, &st);
        if (r == 0) {
          for (int i = 0; i < 3; ++i) rows[si].us[i] = t[i];
        }
      }
      if (st.ok()) st = g->health();
      if (!st.ok()) fail(st);
      cudaDeviceSynchronize();
      (void)c.barrier();
      for (void* p : mem) cudaFree(p);
    });
  }
  for (auto& t : threads) t.join();
  for (const std::string& e : err) {
    if (!e.empty()) {
      std::fprintf(stderr, "bench_moe_all_to_all: %s\n", e.c_str());
      return 1;
    }
  }
  std::printf(
      "# %d ranks on %s, hidden %lld, %lld experts (%lld per rank), top-%lld, %s; dispatch + "
      "combine (outputs back in %s), rank 0's median of %d, us\n",
      n, one_gpu ? "ONE GPU" : "one GPU each", static_cast<long long>(H), static_cast<long long>(E),
      static_cast<long long>(El), static_cast<long long>(k),
      o.nccl      ? ("NCCL " + nccl_version()).c_str()
      : o.fused   ? "fused dispatch and combine kernels (routed rows only)"
      : o.counted ? "one-shot counted all-to-all (routed rows only)"
                  : "one-shot all-to-all",
      o.combine_dtype == DType::kBF16 ? "bf16" : "f32", o.iters);
  std::printf("%8s %10s %8s %12s %12s %12s %14s\n", "tokens", "rows_out", "C", "variable", "fixed",
              "fixed_graph", "fixed_MB_sent");
  for (size_t si = 0; si < sizes.size(); ++si) {
    const int64_t T = sizes[si], C = T * std::min(k, El);
    // Counted: the rows really routed (T k of them out, as many back).
    const int64_t sent = o.counted || o.fused ? T * k : n * C;
    const double mb =
        static_cast<double>(sent * H * 2 + dtype_bytes(o.combine_dtype, sent * H) + n * El * 4) /
        1e6;
    std::printf("%8lld %10lld %8lld %12.1f %12.1f %12.1f %14.3f\n", static_cast<long long>(T),
                static_cast<long long>(T * k), static_cast<long long>(C), rows[si].us[0],
                rows[si].us[1], rows[si].us[2], mb);
  }
  return 0;
}
#endif

int run(const Options& o) {
  Result<std::unique_ptr<Communicator>> made = make_mpi_communicator();
  if (!made.ok()) {
    std::fprintf(stderr, "bench_moe_all_to_all: %s\n", made.status().to_string().c_str());
    return 1;
  }
  Communicator& c = **made;
  const int n = c.size(), me = c.rank();
  if (o.experts % n != 0 || o.top_k > o.experts) {
    if (me == 0) {
      std::fprintf(stderr, "bench_moe_all_to_all: %lld experts over %d ranks, top-%lld\n",
                   static_cast<long long>(o.experts), n, static_cast<long long>(o.top_k));
    }
    return 1;
  }
  const int64_t El = o.experts / n, H = o.hidden, k = o.top_k;
  const CommStream host = CommStream::host();
  if (me == 0) {
    std::printf(
        "# %d ranks, hidden %lld, %lld experts (%lld per rank), top-%lld, host memory (%s)\n", n,
        static_cast<long long>(H), static_cast<long long>(o.experts), static_cast<long long>(El),
        static_cast<long long>(k), c.name());
    std::printf("%8s %10s %12s %12s %10s\n", "tokens", "rows_out", "median_us", "MB_sent", "GB/s");
  }
  for (int64_t tokens : {1, 2, 4, 8, 16, 32, 64, 128}) {
    std::vector<int64_t> per_expert(static_cast<size_t>(o.experts), 0);
    for (int32_t e : route(me, tokens, o.experts, k)) ++per_expert[static_cast<size_t>(e)];
    std::vector<int32_t> send_counts(static_cast<size_t>(o.experts)),
        recv_counts(static_cast<size_t>(o.experts));
    for (int64_t e = 0; e < o.experts; ++e) {
      send_counts[static_cast<size_t>(e)] =
          static_cast<int32_t>(per_expert[static_cast<size_t>(e)]);
    }
    const int64_t rows_out = tokens * k;
    std::vector<uint16_t> x_send(static_cast<size_t>(rows_out * H), 0x3f80), x_recv;
    std::vector<float> y_send, y_recv(static_cast<size_t>(rows_out * H));
    std::vector<double> us;
    double sent_bytes = 0;
    Status st = ok_status();
    for (int it = 0; it < o.iters + 2 && st.ok(); ++it) {
      st = c.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      // The counts, then the splits they imply.
      if (st.ok()) {
        st = c.all_to_all(send_counts.data(), El, DType::kI32, recv_counts.data(), host);
      }
      std::vector<int64_t> sc(static_cast<size_t>(n)), so(sc.size()), rc(sc.size()), ro(sc.size());
      int64_t s_rows = 0, r_rows = 0;
      for (int r = 0; r < n; ++r) {
        const auto ri = static_cast<size_t>(r);
        int64_t out = 0, in = 0;
        for (int64_t e = 0; e < El; ++e) {
          out += send_counts[static_cast<size_t>(r * El + e)];
          in += recv_counts[static_cast<size_t>(r * El + e)];
        }
        so[ri] = s_rows * H;
        sc[ri] = out * H;
        ro[ri] = r_rows * H;
        rc[ri] = in * H;
        s_rows += out;
        r_rows += in;
      }
      x_recv.resize(static_cast<size_t>(std::max<int64_t>(1, r_rows * H)));
      y_send.assign(static_cast<size_t>(std::max<int64_t>(1, r_rows * H)), 1.0f);
      // Dispatch (bf16 rows), then combine (f32 expert outputs back along the same splits).
      if (st.ok()) {
        st = c.all_to_all_v(x_send.data(), sc.data(), so.data(), x_recv.data(), rc.data(),
                            ro.data(), DType::kBF16, host);
      }
      if (st.ok()) {
        st = c.all_to_all_v(y_send.data(), rc.data(), ro.data(), y_recv.data(), sc.data(),
                            so.data(), DType::kF32, host);
      }
      const double dt =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (it >= 2) us.push_back(dt);  // two warm-up steps
      sent_bytes = static_cast<double>(s_rows * H * 2 + r_rows * H * 4 + El * n * 4);
    }
    if (!st.ok()) {
      std::fprintf(stderr, "bench_moe_all_to_all: rank %d: %s\n", me, st.to_string().c_str());
      return 1;
    }
    std::sort(us.begin(), us.end());
    const double med = us[us.size() / 2];
    if (me == 0) {
      std::printf("%8lld %10lld %12.1f %12.3f %10.2f\n", static_cast<long long>(tokens),
                  static_cast<long long>(rows_out), med, sent_bytes / 1e6,
                  sent_bytes / (med * 1e-6) / 1e9);
    }
  }
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);  // ranks sharing a GPU (see tp_executor.cpp)
  strata::Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const long long v = std::atoll(argv[i + 1]);
    if (a == "--device") {
      o.cuda = std::string(argv[i + 1]) == "cuda";
    } else if (a == "--transport") {
      const std::string t = argv[i + 1];
      if (t != "oneshot" && t != "counted" && t != "fused" && t != "nccl") {
        std::fprintf(stderr, "bench_moe_all_to_all: --transport oneshot, counted, fused or nccl\n");
        return 2;
      }
      o.nccl = t == "nccl";
      o.counted = t == "counted";
      o.fused = t == "fused";
    } else if (a == "--ranks") {
      o.ranks = static_cast<int>(v);
    } else if (a == "--hidden") {
      o.hidden = v;
    } else if (a == "--experts") {
      o.experts = v;
    } else if (a == "--top-k") {
      o.top_k = v;
    } else if (a == "--iters") {
      o.iters = static_cast<int>(v);
    } else if (a == "--combine-dtype") {
      const std::string t = argv[i + 1];
      if (t != "f32" && t != "bf16") {
        std::fprintf(stderr, "bench_moe_all_to_all: --combine-dtype f32 or bf16\n");
        return 2;
      }
      o.combine_dtype = t == "bf16" ? strata::DType::kBF16 : strata::DType::kF32;
    } else {
      std::fprintf(stderr, "bench_moe_all_to_all: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (o.hidden < 1 || o.experts < 1 || o.top_k < 1 || o.iters < 1) {
    std::fprintf(stderr, "bench_moe_all_to_all: sizes and --iters must be >= 1\n");
    return 2;
  }
  if (o.cuda) {
#if STRATA_HAS_CUDA
    return strata::run_cuda(o);
#else
    std::fprintf(stderr, "bench_moe_all_to_all: --device cuda needs a build with CUDA\n");
    return 2;
#endif
  }
  return strata::run(o);
}
