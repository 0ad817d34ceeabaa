// Linear layer on the CPU: out[n, m] = x[n, k] @ w[m, k]^T (+ bias), f32 accumulation.
//
// This file is the driver: it checks the weight dtype, picks the SIMD variant (AVX-512, AVX2,
// else the portable scalar loop), and runs one of the two paths of linear_impl.h:
//   GEMV for a few tokens: OpenMP over contiguous ranges of weight rows, each row read once.
//   GEMM for more: OpenMP over blocks of nc weight rows; per k-block, x is packed once into
//     MR-token panels shared by all threads, each thread packs its weight block (converted to
//     f32) and runs the micro-kernel over every (token panel, output panel) pair, adding into
//     out, which was first set to the bias (or zero).
// The scalar variant is deliberately plain (one dot product per output) and serves as the
// cross-check for the SIMD ones.
//
// NOTE: block-quantized weights (GGUF) plug in at the dtype switch in linear_with_isa: a
// quantized dtype gets its own GEMV (per-block dot products against x) and a pack_w that
// dequantizes a k-block (kc is a multiple of 256, so blocks never straddle a k-block).
// NOTE: the packing buffers are grow-only memory owned by the calling thread, so steady-state
// calls do not allocate.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/linear_impl.h"
#include "core/half.h"
#include "core/status.h"

namespace strata::cpu {
namespace {

using linear_detail::GemmKernel;
using linear_detail::IsaKernels;

constexpr int64_t kGemvRowsPerTask = 16;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
int64_t round_up(int64_t a, int64_t b) {
  return ceil_div(a, b) * b;
}

// Grow-only, 64-byte aligned scratch owned by the calling thread; nullptr when out of memory.
float* thread_scratch(size_t floats) {
  struct Deleter {
    void operator()(float* q) const { std::free(q); }
  };
  thread_local std::unique_ptr<float, Deleter> buf;
  thread_local size_t capacity = 0;
  if (floats > capacity) {
    const size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
    buf.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
    capacity = buf ? floats : 0;
  }
  return buf.get();
}

float bias_at(const LinearParams& p, int64_t j) {
  return p.bias ? load_as_f32(p.bias, p.bias_dtype, j) : 0.0f;
}

template <DType DT>
float weight_at(const void* w, int64_t i) {
  if constexpr (DT == DType::kF32) {
    return static_cast<const float*>(w)[i];
  } else if constexpr (DT == DType::kF16) {
    return f16_to_f32(static_cast<const uint16_t*>(w)[i]);
  } else {
    return bf16_to_f32(static_cast<const uint16_t*>(w)[i]);
  }
}

template <DType DT>
Status linear_scalar(const LinearParams& p) {
  const int64_t elem = dtype_bytes(DT, 1);
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < p.out_features; ++j) {
    const void* w = static_cast<const char*>(p.w) + j * p.w_stride * elem;
    const float b = bias_at(p, j);
    for (int64_t i = 0; i < p.n_tokens; ++i) {
      const float* x = p.x + i * p.x_stride;
      float acc = 0.0f;
      for (int64_t kk = 0; kk < p.in_features; ++kk) acc += x[kk] * weight_at<DT>(w, kk);
      p.out[i * p.out_stride + j] = acc + b;
    }
  }
  return ok_status();
}

Status run_gemv(const LinearParams& p, const IsaKernels& isa) {
  const int64_t tasks = ceil_div(p.out_features, kGemvRowsPerTask);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < tasks; ++b) {
    const int64_t j0 = b * kGemvRowsPerTask;
    const int64_t j1 = std::min(p.out_features, j0 + kGemvRowsPerTask);
    isa.gemv(p, j0, j1);
    if (p.bias) {
      for (int64_t i = 0; i < p.n_tokens; ++i) {
        float* out = p.out + i * p.out_stride;
        for (int64_t j = j0; j < j1; ++j) out[j] += bias_at(p, j);
      }
    }
  }
  return ok_status();
}

Status run_gemm(const LinearParams& p, const GemmKernel& g) {
  const int64_t n = p.n_tokens;
  const int64_t m = p.out_features;
  const int64_t k = p.in_features;
  const int nthreads = omp_get_max_threads();
  const int64_t n_panels = ceil_div(n, g.mr);
  // Enough weight blocks (about four per thread) for dynamic scheduling to balance them.
  const int64_t nc = std::clamp(round_up(ceil_div(m, 4 * nthreads), g.nr), g.nr, g.nc_max);
  const int64_t n_blocks = ceil_div(m, nc);
  const size_t xp_floats = static_cast<size_t>(n_panels * g.mr * g.kc);
  const size_t wp_floats = static_cast<size_t>(nc * g.kc);
  float* const scratch = thread_scratch(xp_floats + static_cast<size_t>(nthreads) * wp_floats);
  if (!scratch) {
    return errorf(StatusCode::kOutOfMemory, "linear: no memory for {} packing floats",
                  xp_floats + static_cast<size_t>(nthreads) * wp_floats);
  }
  float* const xp = scratch;

#pragma omp parallel num_threads(nthreads)
  {
    float* const wp = scratch + xp_floats + static_cast<size_t>(omp_get_thread_num()) * wp_floats;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      float* out = p.out + i * p.out_stride;
      for (int64_t j = 0; j < m; ++j) out[j] = bias_at(p, j);
    }
    for (int64_t k0 = 0; k0 < k; k0 += g.kc) {
      const int64_t kc = std::min(g.kc, k - k0);
#pragma omp for schedule(static)
      for (int64_t q = 0; q < n_panels; ++q) {
        g.pack_x(p, q * g.mr, std::min(g.mr, n - q * g.mr), k0, kc, xp + q * g.mr * kc);
      }
#pragma omp for schedule(dynamic, 1)
      for (int64_t b = 0; b < n_blocks; ++b) {
        const int64_t j0 = b * nc;
        const int64_t nj = std::min(nc, m - j0);
        g.pack_w(p, j0, nj, k0, kc, wp);
        for (int64_t jr = 0; jr < nj; jr += g.nr) {
          const float* wpanel = wp + jr * kc;
          for (int64_t q = 0; q < n_panels; ++q) {
            g.micro(kc, xp + q * g.mr * kc, wpanel, p.out + q * g.mr * p.out_stride + j0 + jr,
                    p.out_stride, std::min(g.mr, n - q * g.mr), std::min(g.nr, nj - jr));
          }
        }
      }
    }
  }
  return ok_status();
}

Status run_isa(const LinearParams& p, const IsaKernels& isa) {
  if (p.n_tokens <= isa.gemv_max_tokens) return run_gemv(p, isa);
  return run_gemm(p, isa.gemm);
}

template <DType DT>
Status run(const LinearParams& p, CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return linear_scalar<DT>(p);
    case CpuIsa::kAvx2:
      return run_isa(p, linear_detail::avx2_kernels());
    case CpuIsa::kAvx512:
      return run_isa(p, linear_detail::avx512_kernels());
  }
  return ok_status();
}

}  // namespace

Status linear_with_isa(const LinearParams& p, CpuIsa isa) {
  if (!cpu_supports(isa)) {
    return errorf(StatusCode::kFailedPrecondition, "linear: this CPU cannot run the {} variant",
                  cpu_isa_name(isa));
  }
  if (p.n_tokens == 0 || p.out_features == 0) return ok_status();
  switch (p.w_dtype) {
    case DType::kF32:
      return run<DType::kF32>(p, isa);
    case DType::kF16:
      return run<DType::kF16>(p, isa);
    case DType::kBF16:
      return run<DType::kBF16>(p, isa);
    case DType::kI8:
    case DType::kFP8E4M3:
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      break;
  }
  return errorf(StatusCode::kUnimplemented, "linear: weight dtype {} is not supported on the CPU",
                dtype_name(p.w_dtype));
}

Status linear(const LinearParams& p) {
  return linear_with_isa(p, best_cpu_isa());
}

}  // namespace strata::cpu
