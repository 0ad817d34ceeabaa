// bench_linear: achieved GFLOP/s and GB/s of the CPU linear kernel (out = x @ w^T) for the
// decode (n = 1, 4) and prefill (n = 16 .. 512) token counts, at SmolLM2-135M's MLP shape
// (k 576, m 1536) and a Llama-7B-sized square (k = m = 4096), f32 and bf16 weights.
//
// Two columns per shape:
//   hot:  the same weight matrix every repetition (it may sit in the L3 cache);
//   cold: a ring of weight copies larger than 2 x 32 MiB, so every call streams its weights
//         from DRAM, as a real model's layers do.
// The header line prints the measured peaks of this machine: DRAM read bandwidth (a parallel
// sum over 512 MiB) and the FMA throughput of the best ISA, so the table reads as fractions of
// them. Times are medians of repetitions; "best" is the fastest cold repetition (on a shared
// machine, the one no other process interrupted).
//
//   bench_linear [--isa scalar|avx2|avx512] [--path auto|gemv|gemm] [--min-time 0.3]
//                [--n 1,4,16,64,512] [--shapes 576x1536,4096x4096] [--dtypes f32,bf16]
//                [--clock wall|cpu]
// Threads: OMP_NUM_THREADS (default: all cores).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "core/half.h"

namespace {

using strata::DType;
using strata::LinearParams;
using strata::cpu::CpuIsa;
using strata::cpu::LinearPath;

// Wall time, or with --clock cpu the CPU time this process used (with OMP_NUM_THREADS=1 on a
// shared machine that leaves out the time other processes held the core).
bool g_cpu_clock = false;

double now_s() {
  if (g_cpu_clock) {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Sum of n floats (n a multiple of 256) read as four interleaved streams (as the GEMV reads
// four weight rows), eight independent accumulators, so the loads set the speed.
__attribute__((target("avx2"))) float sum_avx2(const float* p, size_t n) {
  __m256 acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
  const size_t q = n / 4;
  for (size_t i = 0; i < q; i += 16) {
    for (int s = 0; s < 4; ++s) {
      acc[2 * s] = _mm256_add_ps(acc[2 * s], _mm256_loadu_ps(p + s * q + i));
      acc[2 * s + 1] = _mm256_add_ps(acc[2 * s + 1], _mm256_loadu_ps(p + s * q + i + 8));
    }
  }
  for (int i = 1; i < 8; ++i) acc[0] = _mm256_add_ps(acc[0], acc[i]);
  float out[8];
  _mm256_storeu_ps(out, acc[0]);
  return out[0];
}

// DRAM read bandwidth: every thread sums its share of a 512 MiB buffer.
double measure_read_gbps() {
  const size_t n = (size_t{512} << 20) / sizeof(float);
  const size_t chunk = 1 << 16;
  std::vector<float> buf(n, 1.0f);
  const bool avx2 = strata::cpu::cpu_supports(CpuIsa::kAvx2);
  double best = 0.0;
  for (int rep = 0; rep < 5; ++rep) {
    double total = 0.0;
    const double t0 = now_s();
#pragma omp parallel for reduction(+ : total) schedule(static)
    for (size_t i = 0; i < n; i += chunk) {
      float s = 0.0f;
      if (avx2) {
        s = sum_avx2(buf.data() + i, chunk);
      } else {
        for (size_t j = 0; j < chunk; ++j) s += buf[i + j];
      }
      total += s;
    }
    const double dt = now_s() - t0;
    if (total < 0) std::printf("?");
    best = std::max(best, static_cast<double>(n * sizeof(float)) / dt / 1e9);
  }
  return best;
}

// Peak FMA throughput: independent accumulator chains (acc += a * b) in registers, all threads.
constexpr int kChains512 = 28;
constexpr int kChains256 = 14;

__attribute__((target("avx512f"))) double fma_chain_avx512(int64_t iters) {
  __m512 a[kChains512];
  for (int i = 0; i < kChains512; ++i) a[i] = _mm512_set1_ps(1.0f + i * 1e-3f);
  const __m512 m = _mm512_set1_ps(0.999999f);
  const __m512 c = _mm512_set1_ps(1e-6f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < kChains512; ++i) a[i] = _mm512_fmadd_ps(m, c, a[i]);
  }
  float out[16];
  __m512 s = a[0];
  for (int i = 1; i < kChains512; ++i) s = _mm512_add_ps(s, a[i]);
  _mm512_storeu_ps(out, s);
  return out[0];
}

__attribute__((target("avx2,fma"))) double fma_chain_avx2(int64_t iters) {
  __m256 a[kChains256];
  for (int i = 0; i < kChains256; ++i) a[i] = _mm256_set1_ps(1.0f + i * 1e-3f);
  const __m256 m = _mm256_set1_ps(0.999999f);
  const __m256 c = _mm256_set1_ps(1e-6f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < kChains256; ++i) a[i] = _mm256_fmadd_ps(m, c, a[i]);
  }
  float out[8];
  __m256 s = a[0];
  for (int i = 1; i < kChains256; ++i) s = _mm256_add_ps(s, a[i]);
  _mm256_storeu_ps(out, s);
  return out[0];
}

double measure_peak_gflops(CpuIsa isa) {
  if (isa == CpuIsa::kScalar) return 0.0;
  // Short runs, best of many: on a shared machine a long run is always interrupted.
  const int64_t iters = 50'000;
  const int lanes = isa == CpuIsa::kAvx512 ? 16 : 8;
  const int chains = isa == CpuIsa::kAvx512 ? kChains512 : kChains256;
  double best = 0.0;
  for (int rep = 0; rep < 200; ++rep) {
    double sink = 0.0;
    const double t0 = now_s();
#pragma omp parallel reduction(+ : sink)
    sink += isa == CpuIsa::kAvx512 ? fma_chain_avx512(iters) : fma_chain_avx2(iters);
    const double dt = now_s() - t0;
    if (sink == 12345.0) std::printf("?");
    const double flops = 2.0 * chains * lanes * static_cast<double>(iters) * omp_get_max_threads();
    best = std::max(best, flops / dt / 1e9);
  }
  return best;
}

struct Timing {
  double median_s = 0.0;
  double best_s = 0.0;
};

// Runs `fn` until min_time has passed (at least 3 times, after one warm-up).
template <class Fn>
Timing time_it(Fn&& fn, double min_time) {
  fn(0);
  std::vector<double> times;
  const double start = now_s();
  for (int rep = 1; times.size() < 3 || now_s() - start < min_time; ++rep) {
    const double t0 = now_s();
    fn(rep);
    times.push_back(now_s() - t0);
  }
  std::sort(times.begin(), times.end());
  return {times[times.size() / 2], times.front()};
}

// Splits "1,4,16" (or "576x1536,4096x4096" with seps ",x") into numbers.
std::vector<int64_t> parse_ints(const std::string& s, const char* seps = ",") {
  std::vector<int64_t> v;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t end = s.find_first_of(seps, pos);
    v.push_back(std::stoll(s.substr(pos, end - pos)));
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return v;
}

std::vector<DType> parse_dtypes(const std::string& s) {
  std::vector<DType> v;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t end = s.find(',', pos);
    DType dt;
    if (strata::parse_dtype(s.substr(pos, end - pos), &dt)) v.push_back(dt);
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  CpuIsa isa = strata::cpu::best_cpu_isa();
  double min_time = 0.3;
  LinearPath path = LinearPath::kAuto;
  std::vector<int64_t> ns = {1, 4, 16, 64, 512};
  std::vector<int64_t> shapes = {576, 1536, 4096, 4096};
  std::vector<DType> dtypes = {DType::kF32, DType::kBF16};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string val = argv[i + 1];
    if (flag == "--isa") {
      isa = val == "scalar" ? CpuIsa::kScalar : val == "avx2" ? CpuIsa::kAvx2 : CpuIsa::kAvx512;
    } else if (flag == "--clock") {
      g_cpu_clock = val == "cpu";
    } else if (flag == "--min-time") {
      min_time = std::stod(val);
    } else if (flag == "--path") {
      path = val == "gemv"   ? LinearPath::kGemv
             : val == "gemm" ? LinearPath::kGemm
                             : LinearPath::kAuto;
    } else if (flag == "--n") {
      ns = parse_ints(val);
    } else if (flag == "--shapes") {
      shapes = parse_ints(val, ",x");
    } else if (flag == "--dtypes") {
      dtypes = parse_dtypes(val);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (!strata::cpu::cpu_supports(isa)) {
    std::fprintf(stderr, "this CPU cannot run %s\n", strata::cpu::cpu_isa_name(isa));
    return 2;
  }

  std::printf("bench_linear: isa %s, %d threads; peaks: DRAM read %.1f GB/s, FMA %.0f GFLOP/s\n",
              strata::cpu::cpu_isa_name(isa), omp_get_max_threads(), measure_read_gbps(),
              measure_peak_gflops(isa));
  std::printf("%-6s %5s %5s %4s | %8s %8s %7s | %8s %8s %7s | %8s %8s %7s\n", "dtype", "k", "m",
              "n", "hot ms", "GFLOP/s", "GB/s", "cold ms", "GFLOP/s", "GB/s", "best ms", "GFLOP/s",
              "GB/s");

  struct Shape {
    int64_t k, m;
  };
  std::vector<Shape> shape_list;
  for (size_t i = 0; i + 1 < shapes.size(); i += 2)
    shape_list.push_back({shapes[i], shapes[i + 1]});
  std::mt19937 gen(42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (const Shape& s : shape_list) {
    for (DType dt : dtypes) {
      const int64_t elem = strata::dtype_bytes(dt, 1);
      const int64_t w_bytes = s.m * s.k * elem;
      const int64_t copies = std::max<int64_t>(2, (int64_t{64} << 20) / w_bytes + 1);
      std::vector<uint8_t> w(static_cast<size_t>(w_bytes * copies));
      for (int64_t i = 0; i < s.m * s.k * copies; ++i) {
        const float v = dist(gen) * 0.05f;
        if (dt == DType::kF32) {
          std::memcpy(w.data() + i * 4, &v, 4);
        } else {
          const uint16_t h = dt == DType::kF16 ? strata::f32_to_f16(v) : strata::f32_to_bf16(v);
          std::memcpy(w.data() + i * 2, &h, 2);
        }
      }
      for (int64_t n : ns) {
        std::vector<float> x(static_cast<size_t>(n * s.k));
        for (float& v : x) v = dist(gen);
        std::vector<float> out(static_cast<size_t>(n * s.m));
        LinearParams p{.x = x.data(),
                       .x_stride = s.k,
                       .w = w.data(),
                       .w_dtype = dt,
                       .w_stride = s.k,
                       .out = out.data(),
                       .out_stride = s.m,
                       .n_tokens = n,
                       .in_features = s.k,
                       .out_features = s.m};
        const auto run = [&](int64_t copy) {
          p.w = w.data() + (copy % copies) * w_bytes;
          if (!strata::cpu::linear_with_isa(p, isa, path).ok()) std::abort();
        };
        const Timing hot = time_it([&](int) { run(0); }, min_time);
        const Timing cold = time_it([&](int rep) { run(rep); }, min_time);
        const double flops = 2.0 * static_cast<double>(n * s.m * s.k);
        const double bytes = static_cast<double>(w_bytes + (n * s.k + n * s.m) * 4);
        std::printf(
            "%-6s %5ld %5ld %4ld | %8.3f %8.1f %7.1f | %8.3f %8.1f %7.1f | %8.3f %8.1f %7.1f\n",
            std::string(strata::dtype_name(dt)).c_str(), static_cast<long>(s.k),
            static_cast<long>(s.m), static_cast<long>(n), hot.median_s * 1e3,
            flops / hot.median_s / 1e9, bytes / hot.median_s / 1e9, cold.median_s * 1e3,
            flops / cold.median_s / 1e9, bytes / cold.median_s / 1e9, cold.best_s * 1e3,
            flops / cold.best_s / 1e9, bytes / cold.best_s / 1e9);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
