// Expert-parallel dispatch + combine: the all-to-alls of one sparse layer (model/moe.cpp,
// experts_parallel) over the ranks of an mpirun, for 1..128 tokens per rank at DeepSeek-V3's
// shape (hidden 7168, top-8 of 256 experts) by default. Per step and per rank: the per-expert
// counts (all_to_all of E / ep i32 to each rank), the rows to the experts' owners (all_to_all_v,
// bf16 [tokens * k, hidden] split by owner) and the expert outputs back (all_to_all_v, f32, the
// same splits reversed). Routing is uniform at random from a fixed seed, the same on every run.
// Host memory, as the expert-parallel group's collectives are today (MPI on the CPU; staged
// through pinned host memory on GPUs). Each row: the median over --iters of a step (after a
// barrier) on rank 0, and the bytes it sent per second (dispatch + combine, rows to itself
// included).
//
//   mpirun -np 4 bench_moe_all_to_all [--hidden 7168] [--experts 256] [--top-k 8] [--iters 20]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "parallel/comm.h"

namespace strata {
namespace {

struct Options {
  int64_t hidden = 7168, experts = 256, top_k = 8;
  int iters = 20;
};

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
    // Routing: k distinct experts per token, uniform, seeded by (rank, tokens).
    std::mt19937 rng(static_cast<uint32_t>(me * 1000003 + tokens));
    std::vector<int64_t> per_expert(static_cast<size_t>(o.experts), 0);
    std::vector<int32_t> pick(static_cast<size_t>(o.experts));
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t e = 0; e < o.experts; ++e)
        pick[static_cast<size_t>(e)] = static_cast<int32_t>(e);
      for (int64_t j = 0; j < k; ++j) {
        std::uniform_int_distribution<int64_t> d(j, o.experts - 1);
        std::swap(pick[static_cast<size_t>(j)], pick[static_cast<size_t>(d(rng))]);
        ++per_expert[static_cast<size_t>(pick[static_cast<size_t>(j)])];
      }
    }
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
  strata::Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const long long v = std::atoll(argv[i + 1]);
    if (a == "--hidden") {
      o.hidden = v;
    } else if (a == "--experts") {
      o.experts = v;
    } else if (a == "--top-k") {
      o.top_k = v;
    } else if (a == "--iters") {
      o.iters = static_cast<int>(v);
    } else {
      std::fprintf(stderr, "bench_moe_all_to_all: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (o.hidden < 1 || o.experts < 1 || o.top_k < 1 || o.iters < 1) {
    std::fprintf(stderr, "bench_moe_all_to_all: sizes and --iters must be >= 1\n");
    return 2;
  }
  return strata::run(o);
}
