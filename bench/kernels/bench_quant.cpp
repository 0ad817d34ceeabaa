// Micro-benchmark of strata::cpu::quant_linear at decode shapes (n_tokens = 1 by default):
// achieved GB/s of weight bytes read, with the weights hot in cache (one matrix, reused) and
// cold (a ring of copies larger than the last-level cache, as in a decode step that streams
// the whole model), next to a plain read-bandwidth probe on the same threads.
//
//   ninja -C build bench_quant
//   OMP_NUM_THREADS=2 ./build/bench/bench_quant [n_tokens] [i16|f32|i8]   (activations)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/quant.h"
#include "core/half.h"

namespace {

using Clock = std::chrono::steady_clock;
using strata::DType;

constexpr size_t kColdBytes = size_t{256} << 20;  // ring of weight copies > L3

// Random blocks with sane f16 scales so the math stays finite.
std::vector<uint8_t> random_weights(DType dt, int64_t rows, int64_t cols, uint32_t seed) {
  const auto& info = strata::dtype_info(dt);
  const int64_t nb = rows * cols / info.block_size;
  std::vector<uint8_t> w(static_cast<size_t>(nb * info.block_bytes));
  std::mt19937 rng(seed);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  const uint16_t scale = strata::f32_to_f16(0.01f);
  for (int64_t j = 0; j < nb; ++j) {
    uint8_t* b = w.data() + j * info.block_bytes;
    const size_t d_at = dt == DType::kQ6_K ? 208 : 0;
    std::memcpy(b + d_at, &scale, 2);
    if (dt == DType::kQ4_1 || dt == DType::kQ5_1 || dt == DType::kQ4_K || dt == DType::kQ5_K) {
      std::memcpy(b + 2, &scale, 2);
    }
  }
  return w;
}

// The machines this runs on are shared, so report the best run: the kernel's own speed,
// free of time slices lost to other processes.
double best(const std::vector<double>& v) {
  return *std::min_element(v.begin(), v.end());
}

// Seconds per quant_linear call; `copies` weight matrices are used round-robin.
// argv[2]: "i16" (default: int16 activations in the decode kernels of 32-value types), "f32"
// (f32 activations everywhere) or "i8" (the int8-activation kernels).
std::string g_act = "i16";

double time_linear(DType dt, int64_t m, int64_t k, int64_t n, int copies, int iters) {
  const auto& info = strata::dtype_info(dt);
  const size_t bytes = static_cast<size_t>(m * k / info.block_size * info.block_bytes);
  std::vector<uint8_t> w(bytes * static_cast<size_t>(copies));
  const std::vector<uint8_t> one = random_weights(dt, m, k, 1);
  for (int c = 0; c < copies; ++c) std::memcpy(w.data() + c * bytes, one.data(), bytes);
  std::vector<float> x(static_cast<size_t>(n * k)), out(static_cast<size_t>(n * m));
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  for (float& v : x) v = nd(rng);
  std::vector<uint8_t> scratch(strata::cpu::quant_linear_scratch_bytes(n, k));
  strata::QuantLinearParams p;
  p.x = x.data();
  p.weight_dtype = dt;
  p.out = out.data();
  p.n_tokens = n;
  p.in_features = k;
  p.out_features = m;
  p.scratch = scratch.data();
  p.scratch_bytes = scratch.size();
  p.f32_activations = g_act != "i8";
  p.int16_decode = g_act == "i16";
  std::vector<double> times;
  for (int it = -copies; it < iters; ++it) {  // first pass over the ring is warm-up
    p.weight = w.data() + static_cast<size_t>((it + copies) % copies) * bytes;
    const auto t0 = Clock::now();
    if (!strata::cpu::quant_linear(p).ok()) std::abort();
    const auto t1 = Clock::now();
    if (it >= 0) times.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  return best(times);
}

// GB/s of summing a buffer larger than the LLC with OpenMP threads (a read-bandwidth probe).
double read_bandwidth() {
  std::vector<uint64_t> buf(kColdBytes / 8, 1);
  std::vector<double> times;
  uint64_t sink = 0;
  for (int it = 0; it < 6; ++it) {
    const auto t0 = Clock::now();
    uint64_t s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static)
    for (size_t i = 0; i < buf.size(); ++i) s += buf[i];
    const auto t1 = Clock::now();
    sink += s;
    if (it > 0) times.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  if (sink == 42) std::puts("");
  return static_cast<double>(kColdBytes) / best(times) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 1;
  if (argc > 2) g_act = argv[2];
  if (g_act != "i16" && g_act != "f32" && g_act != "i8") {
    std::fprintf(stderr, "bench_quant: activations must be i16, f32 or i8, not %s\n", argv[2]);
    return 2;
  }
  std::printf("quant_linear, %d threads, isa %s, n_tokens %ld, %s activations\n",
              omp_get_max_threads(), strata::cpu::quant_isa_name(strata::cpu::quant_best_isa()),
              static_cast<long>(n), g_act.c_str());
  std::printf("read bandwidth probe (%zu MiB buffer): %.1f GB/s\n", kColdBytes >> 20,
              read_bandwidth());
  struct Shape {
    DType dt;
    int64_t m, k;
    const char* what;
  };
  const Shape shapes[] = {
      {DType::kQ4_1, 576, 1536, "ffn_down"},  {DType::kQ4_1, 1536, 576, "ffn_gate/up"},
      {DType::kQ4_1, 576, 576, "attn_q/o"},   {DType::kQ8_0, 49152, 576, "lm_head (q8_0)"},
      {DType::kQ4_1, 49152, 576, "big q4_1"}, {DType::kQ4_0, 1536, 576, "q4_0"},
      {DType::kQ5_1, 1536, 576, "q5_1"},      {DType::kQ4_K, 1536, 1024, "q4_k"},
      {DType::kQ6_K, 1536, 1024, "q6_k"},
  };
  std::printf("%-16s %-6s %6s %6s %10s %9s %10s %9s\n", "what", "type", "m", "k", "hot us",
              "hot GB/s", "cold us", "cold GB/s");
  for (const Shape& s : shapes) {
    const auto& info = strata::dtype_info(s.dt);
    const double bytes = static_cast<double>(s.m * s.k / info.block_size * info.block_bytes);
    const int copies = static_cast<int>(std::max<double>(2.0, kColdBytes / bytes));
    const double hot = time_linear(s.dt, s.m, s.k, n, 1, 2000);
    const double cold = time_linear(s.dt, s.m, s.k, n, copies, std::max(4 * copies, 200));
    std::printf("%-16s %-6s %6ld %6ld %10.1f %9.1f %10.1f %9.1f\n", s.what,
                std::string(info.name).c_str(), static_cast<long>(s.m), static_cast<long>(s.k),
                hot * 1e6, bytes / hot / 1e9, cold * 1e6, bytes / cold / 1e9);
  }
  return 0;
}
