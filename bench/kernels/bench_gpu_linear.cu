// bench_gpu_linear: the GPU linear layer's two paths, sbi_gemm (SBI-GeMM) and cublaslt_linear,
// at Llama-3-8B's shapes for decode and small-batch token counts, next to the bandwidth ceilings
// measured in the same run (a device-to-device copy and a read-only streaming kernel).
//
// Per (shape, dtype, n, path): warm-up calls, then >= --reps timed calls (CUDA events around
// each call), each on the next of several weight copies whose total exceeds 4x the L2 cache, so
// weights stream from HBM as a model's layers do; the median is reported. Data is random
// (bf16 uniform(-1, 1); int8/fp8 random codes, no NaN). Columns: time (us), weight GB/s (the
// weight bytes / time: the number SBI-GeMM is about), its fraction of the read ceiling, and
// TFLOP/s (2 n m k / time). `route` is cublaslt_linear's path: direct (cuBLASLt writes out),
// fp8-scaled (fp8 activations, both scales inside cuBLASLt), scratch (f32 scratch + epilogue;
// fp8 activations for fp8 weights) or sbi (its fallback).
//
//   bench_gpu_linear [--reps 50] [--n 1,2,4,8,16,32,64,128]
//                    [--dtypes bf16,i8,fp8,q8_0,q4_0,q4_k,q5_k,q6_k] (GGUF formats: random blocks;
//                    both paths run cuda::gguf_linear, the decode kernel or dequantized tiles)
//                    [--shapes 6144x4096,...] (m x k) [--paths sbi,lt] [--sweep-mt]
//                    [--json FILE]
// --sweep-mt adds sbi rows with the m-tiles per block forced to 1, 2 and 4 (the tuning knob of
// sbi_gemm.cu) and gated (fused gate/up + silu) rows for the gate_up shape.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/gpu_linear_internal.h"

namespace {

using strata::DType;
using strata::GpuLinearParams;
using strata::Status;
using strata::cuda::LaunchCtx;

#define CHECK_CUDA(call)                                                      \
  do {                                                                        \
    const cudaError_t e_ = (call);                                            \
    if (e_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

// ---- device helpers ------------------------------------------------------------------------

__device__ __forceinline__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// kind 0: bf16 uniform(-1, 1); 1: int8 in [-127, 127]; 2: fp8 e4m3 code, no NaN; 3: f32 scale
// in [0.5, 1.5) / 127.
__global__ void fill_kernel(void* dst, size_t n, uint64_t seed, int kind) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const uint32_t h = hash32(seed * 0x9e3779b97f4a7c15ULL + i);
    if (kind == 0) {
      const float v = static_cast<float>(h) * (2.0f / 4294967296.0f) - 1.0f;
      uint32_t u;
      u = __float_as_uint(v);
      static_cast<uint16_t*>(dst)[i] = static_cast<uint16_t>(u >> 16);
    } else if (kind == 1) {
      static_cast<int8_t*>(dst)[i] = static_cast<int8_t>(static_cast<int>(h % 255) - 127);
    } else if (kind == 2) {
      uint8_t b = static_cast<uint8_t>(h);
      if ((b & 0x7f) == 0x7f) b = 0x3f;
      static_cast<uint8_t*>(dst)[i] = b;
    } else {
      static_cast<float*>(dst)[i] = (0.5f + static_cast<float>(h) / 4294967296.0f) / 127.0f;
    }
  }
}

// Reads n16 16-byte words (4 independent loads per thread per iteration), keeps a xor so the
// loads are not dead: the read-bandwidth ceiling.
__global__ void read_kernel(const uint4* p, size_t n16, uint32_t* sink) {
  uint32_t acc = 0;
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = __ldcs(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n16; i += stride) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

void fill(void* dst, size_t n, uint64_t seed, int kind, cudaStream_t s) {
  fill_kernel<<<1024, 256, 0, s>>>(dst, n, seed, kind);
  CHECK_CUDA(cudaGetLastError());
}

// ---- timing ----------------------------------------------------------------------------------

struct Timer {
  cudaEvent_t start;
  cudaEvent_t stop;
  Timer() {
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&stop));
  }
  ~Timer() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
};

// Median time in microseconds of reps calls of fn(rep), each bracketed by events.
template <class Fn>
double median_us(cudaStream_t s, int warmup, int reps, Fn&& fn) {
  Timer t;
  for (int i = 0; i < warmup; ++i) fn(i);
  CHECK_CUDA(cudaStreamSynchronize(s));
  std::vector<double> us;
  us.reserve(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    CHECK_CUDA(cudaEventRecord(t.start, s));
    fn(warmup + i);
    CHECK_CUDA(cudaEventRecord(t.stop, s));
    CHECK_CUDA(cudaEventSynchronize(t.stop));
    float ms = 0.0f;
    CHECK_CUDA(cudaEventElapsedTime(&ms, t.start, t.stop));
    us.push_back(1000.0 * ms);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// ---- options ---------------------------------------------------------------------------------

struct ShapeSpec {
  int64_t m;
  int64_t k;
  const char* name;
};

struct Options {
  int reps = 50;
  std::vector<int64_t> n = {1, 2, 4, 8, 16, 32, 64, 128};
  std::vector<DType> dtypes = {DType::kBF16, DType::kI8, DType::kFP8E4M3};
  std::vector<ShapeSpec> shapes = {{6144, 4096, "qkv"},
                                   {4096, 4096, "o"},
                                   {28672, 4096, "gate_up"},
                                   {4096, 14336, "down"},
                                   {128256, 4096, "lm_head"}};
  bool sbi = true;
  bool lt = true;
  bool sweep_mt = false;
  std::string json;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= s.size()) {
    const size_t j = std::min(s.find(',', i), s.size());
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "bench_gpu_linear: %s\nusage: bench_gpu_linear [--reps 50] [--n 1,2,...] "
               "[--dtypes bf16,i8,fp8] [--shapes MxK,...] [--paths sbi,lt] [--sweep-mt] "
               "[--json FILE]\n",
               msg);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--reps") {
      o.reps = std::max(1, std::atoi(value().c_str()));
    } else if (a == "--n") {
      o.n.clear();
      for (const std::string& v : split(value())) o.n.push_back(std::atoll(v.c_str()));
    } else if (a == "--dtypes") {
      o.dtypes.clear();
      for (const std::string& v : split(value())) {
        if (v == "bf16") {
          o.dtypes.push_back(DType::kBF16);
        } else if (v == "i8" || v == "int8") {
          o.dtypes.push_back(DType::kI8);
        } else if (v == "fp8") {
          o.dtypes.push_back(DType::kFP8E4M3);
        } else if (v == "q8_0" || v == "q4_0" || v == "q4_k" || v == "q5_k" || v == "q6_k") {
          o.dtypes.push_back(v == "q8_0"   ? DType::kQ8_0
                             : v == "q4_0" ? DType::kQ4_0
                             : v == "q4_k" ? DType::kQ4_K
                             : v == "q5_k" ? DType::kQ5_K
                                           : DType::kQ6_K);
        } else {
          usage(("unknown dtype " + v).c_str());
        }
      }
    } else if (a == "--shapes") {
      o.shapes.clear();
      for (const std::string& v : split(value())) {
        const size_t x = v.find('x');
        if (x == std::string::npos) usage(("bad shape " + v).c_str());
        o.shapes.push_back(
            {std::atoll(v.substr(0, x).c_str()), std::atoll(v.substr(x + 1).c_str()), "custom"});
      }
    } else if (a == "--paths") {
      o.sbi = o.lt = false;
      for (const std::string& v : split(value())) {
        if (v == "sbi") {
          o.sbi = true;
        } else if (v == "lt") {
          o.lt = true;
        } else {
          usage(("unknown path " + v).c_str());
        }
      }
    } else if (a == "--sweep-mt") {
      o.sweep_mt = true;
    } else if (a == "--json") {
      o.json = value();
    } else {
      usage(("unknown flag " + a).c_str());
    }
  }
  return o;
}

// ---- the benchmark ---------------------------------------------------------------------------

struct Row {
  std::string shape;
  int64_t m;
  int64_t k;
  int64_t n;
  std::string dtype;
  std::string path;
  std::string route;
  double us;
  double weight_gbps;
  double tflops;
};

const char* route_name(strata::cuda::LtRoute r) {
  switch (r) {
    case strata::cuda::LtRoute::kDirect:
      return "direct";
    case strata::cuda::LtRoute::kFp8Scaled:
      return "fp8-scaled";
    case strata::cuda::LtRoute::kScratch:
      return "scratch";
    case strata::cuda::LtRoute::kSbi:
      return "sbi";
  }
  return "?";
}

void check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.to_string().c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  auto dev = strata::cuda::CudaDevice::create(0);
  check(dev.ok() ? strata::ok_status() : dev.status(), "CudaDevice::create");
  const LaunchCtx& ctx = (*dev)->launch_ctx();
  const cudaStream_t s = ctx.stream;
  const int warmup = 5;

  // Ceilings: 1 GiB copied device to device (read + write bytes / time) and read.
  const size_t ceil_bytes = size_t{1} << 30;
  void* a = nullptr;
  void* b = nullptr;
  uint32_t* sink = nullptr;
  CHECK_CUDA(cudaMalloc(&a, ceil_bytes));
  CHECK_CUDA(cudaMalloc(&b, ceil_bytes));
  CHECK_CUDA(cudaMalloc(&sink, sizeof(uint32_t)));
  fill(a, ceil_bytes / 2, 1, 0, s);
  const double copy_us = median_us(s, 2, 20, [&](int) {
    CHECK_CUDA(cudaMemcpyAsync(b, a, ceil_bytes, cudaMemcpyDeviceToDevice, s));
  });
  const double read_us = median_us(s, 2, 20, [&](int) {
    read_kernel<<<ctx.sm_count * 8, 256, 0, s>>>(static_cast<const uint4*>(a), ceil_bytes / 16,
                                                 sink);
  });
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  const double copy_gbps = 2.0 * ceil_bytes / copy_us * 1e-3;
  const double read_gbps = ceil_bytes / read_us * 1e-3;
  std::printf("device: %s, %d SMs, L2 %.0f MB\n", (*dev)->name().c_str(), ctx.sm_count,
              ctx.l2_bytes / 1e6);
  std::printf("ceilings: copy %.0f GB/s (read + write), read %.0f GB/s; sbi crossover %lld\n\n",
              copy_gbps, read_gbps, static_cast<long long>(strata::cuda::sbi_max_tokens()));
  std::printf("%-8s %14s %4s %5s %-9s %-7s %10s %10s %7s %8s\n", "shape", "m x k", "n", "dtype",
              "path", "route", "us", "weight GB/s", "% read", "TFLOP/s");

  const int64_t n_max = *std::max_element(opt.n.begin(), opt.n.end());
  std::vector<Row> rows;
  for (const ShapeSpec& sh : opt.shapes) {
    for (DType dt : opt.dtypes) {
      const bool gguf = dtype_info(dt).is_quantized;  // GGUF blocks: random rows, no scales
      const bool q8 = dt != DType::kBF16 && !gguf;
      const bool gate_up = sh.m == 28672 && sh.k == 4096;
      const size_t w_bytes = static_cast<size_t>(dtype_bytes(dt, sh.m * sh.k));
      std::vector<uint8_t> host_blocks;
      if (gguf) {
        const int64_t rb = dtype_bytes(dt, sh.k);
        host_blocks.resize(w_bytes);
        for (int64_t r = 0; r < sh.m; ++r) {
          strata::cpu::gguf_fill_random_row(dt, 100, r, 0.03f, sh.k, host_blocks.data() + r * rb);
        }
      }
      const size_t copies = std::max<size_t>(
          2, (4 * std::max<size_t>(ctx.l2_bytes, 50u << 20) + w_bytes - 1) / w_bytes);
      std::vector<void*> w(copies);
      std::vector<float*> scale(copies, nullptr);
      for (size_t c = 0; c < copies; ++c) {
        CHECK_CUDA(cudaMalloc(&w[c], w_bytes));
        if (gguf) {
          CHECK_CUDA(cudaMemcpy(w[c], host_blocks.data(), w_bytes, cudaMemcpyHostToDevice));
          continue;
        }
        fill(w[c], static_cast<size_t>(sh.m * sh.k), 100 + c,
             dt == DType::kBF16 ? 0
             : dt == DType::kI8 ? 1
                                : 2,
             s);
        if (q8) {
          CHECK_CUDA(cudaMalloc(&scale[c], static_cast<size_t>(sh.m) * sizeof(float)));
          fill(scale[c], static_cast<size_t>(sh.m), 200 + c, 3, s);
        }
      }
      void* x = nullptr;
      void* out = nullptr;
      CHECK_CUDA(cudaMalloc(&x, static_cast<size_t>(n_max * sh.k * 2)));
      CHECK_CUDA(cudaMalloc(&out, static_cast<size_t>(n_max * sh.m * 4)));
      fill(x, static_cast<size_t>(n_max * sh.k), 7, 0, s);
      CHECK_CUDA(cudaStreamSynchronize(s));

      const std::string dname_s = dt == DType::kBF16      ? "bf16"
                                  : dt == DType::kI8      ? "i8"
                                  : dt == DType::kFP8E4M3 ? "fp8"
                                                          : std::string(dtype_name(dt));
      const char* dname = dname_s.c_str();
      for (int64_t n : opt.n) {
        const auto params = [&](int rep, bool gated) {
          const size_t c = static_cast<size_t>(rep) % copies;
          return GpuLinearParams{.x = static_cast<const uint16_t*>(x),
                                 .x_stride = sh.k,
                                 .w = w[c],
                                 .w_dtype = dt,
                                 .w_stride = sh.k,
                                 .w_scale = scale[c],
                                 .out = out,
                                 .out_dtype = DType::kF32,
                                 .out_stride = gated ? sh.m / 2 : sh.m,
                                 .n_tokens = n,
                                 .in_features = sh.k,
                                 .out_features = gated ? sh.m / 2 : sh.m,
                                 .gated_silu = gated};
        };
        const auto record = [&](const std::string& path, const std::string& route, double us) {
          Row r{sh.name,
                sh.m,
                sh.k,
                n,
                dname,
                path,
                route,
                us,
                static_cast<double>(w_bytes) / us * 1e-3,
                2.0 * static_cast<double>(n) * sh.m * sh.k / us * 1e-6};
          std::printf("%-8s %6lld x %-6lld %4lld %5s %-9s %-7s %10.1f %10.0f %7.1f %8.1f\n",
                      r.shape.c_str(), static_cast<long long>(r.m), static_cast<long long>(r.k),
                      static_cast<long long>(n), dname, path.c_str(), route.c_str(), us,
                      r.weight_gbps, 100.0 * r.weight_gbps / read_gbps, r.tflops);
          std::fflush(stdout);
          rows.push_back(r);
        };
        if (opt.sbi) {
          record("sbi", "", median_us(s, warmup, opt.reps, [&](int rep) {
                   check(strata::cuda::sbi_gemm(ctx, params(rep, false)), "sbi_gemm");
                 }));
          if (opt.sweep_mt) {
            for (int mt : {1, 2, 4}) {
              if (!strata::cuda::sbi::sbi_gemm_with_m_tiles(ctx, params(0, false), mt).ok()) {
                continue;  // no kernel of that shape for this n
              }
              record("sbi-mt" + std::to_string(mt), "",
                     median_us(s, warmup, opt.reps, [&](int rep) {
                       check(strata::cuda::sbi::sbi_gemm_with_m_tiles(ctx, params(rep, false), mt),
                             "sbi_gemm");
                     }));
            }
            if (gate_up && n <= 64) {
              record("sbi-gated", "", median_us(s, warmup, opt.reps, [&](int rep) {
                       check(strata::cuda::sbi_gemm(ctx, params(rep, true)), "sbi_gemm gated");
                     }));
            }
          }
        }
        if (opt.lt) {
          strata::cuda::LtRoute route = strata::cuda::LtRoute::kSbi;
          check(strata::cuda::cublaslt_route(ctx, params(0, false), &route), "cublaslt_route");
          record("cublaslt", route_name(route), median_us(s, warmup, opt.reps, [&](int rep) {
                   check(strata::cuda::cublaslt_linear(ctx, params(rep, false)), "cublaslt_linear");
                 }));
        }
      }
      CHECK_CUDA(cudaStreamSynchronize(s));
      for (size_t c = 0; c < copies; ++c) {
        CHECK_CUDA(cudaFree(w[c]));
        if (scale[c]) CHECK_CUDA(cudaFree(scale[c]));
      }
      CHECK_CUDA(cudaFree(x));
      CHECK_CUDA(cudaFree(out));
    }
  }
  CHECK_CUDA(cudaFree(sink));

  if (!opt.json.empty()) {
    FILE* f = std::fopen(opt.json.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", opt.json.c_str());
      return 1;
    }
    std::fprintf(f, "{\n \"device\": \"%s\",\n \"sm_count\": %d,\n \"reps\": %d,\n",
                 (*dev)->name().c_str(), ctx.sm_count, opt.reps);
    std::fprintf(f, " \"sbi_max_tokens\": %lld,\n",
                 static_cast<long long>(strata::cuda::sbi_max_tokens()));
    std::fprintf(f, " \"ceilings\": {\"copy_gbps\": %.1f, \"read_gbps\": %.1f},\n \"rows\": [\n",
                 copy_gbps, read_gbps);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::fprintf(
          f,
          "  {\"shape\": \"%s\", \"m\": %lld, \"k\": %lld, \"n\": %lld, \"dtype\": \"%s\", "
          "\"path\": \"%s\", \"route\": \"%s\", \"us\": %.2f, \"weight_gbps\": %.1f, "
          "\"tflops\": %.2f}%s\n",
          r.shape.c_str(), static_cast<long long>(r.m), static_cast<long long>(r.k),
          static_cast<long long>(r.n), r.dtype.c_str(), r.path.c_str(), r.route.c_str(), r.us,
          r.weight_gbps, r.tflops, i + 1 < rows.size() ? "," : "");
    }
    std::fprintf(f, " ]\n}\n");
    std::fclose(f);
  }
  return 0;
}
