// Linear layer on the CPU: out[n, m] = x[n, k] @ w[m, k]^T (+ bias), f32 accumulation.
//
// This file is the driver: it checks the weight dtype, picks the SIMD variant (AVX-512, AVX2,
// else the portable scalar loop), and runs one of the two paths of linear_impl.h:
//   GEMV for few tokens: one contiguous range of weight rows per OpenMP thread.
//   GEMM for more: x (a chunk of up to kMaxPackedXFloats) is packed once by all threads, then
//     each thread takes a contiguous range of weight blocks and, per block, sets its part of
//     out to the bias, then per k-block packs the weights and runs the micro-kernel over every
//     (token panel, output panel) pair, adding into out.
// The scalar variant is deliberately plain (one dot product per output) and serves as the
// cross-check for the SIMD ones.
//
// NOTE: block-quantized weights (GGUF) plug in at the dtype switch in linear_with_isa: route
// the quantized dtypes to their kernels (int8-activation per-block dot products for few
// tokens); for prefill a pack_w that dequantizes k-blocks also fits the GEMM path as is (kc
// is a multiple of 256, so quantization blocks never straddle a k-block).
// NOTE: the packing buffers are grow-only memory owned by the calling thread, so steady-state
// calls do not allocate.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/linear_impl.h"
#include "backends/cpu/quant.h"
#include "backends/cpu/quant_impl.h"
#include "core/status.h"

namespace strata::cpu {
namespace {

using linear_detail::GemmBlocking;
using linear_detail::GemmKernel;
using linear_detail::IsaKernels;

// Packed x above this (2 MiB) takes GemmKernel::large_x blocking.
constexpr int64_t kLargeXFloats = int64_t{512} << 10;
// Cap on the packed x of one token chunk (8 MiB); longer prompts are processed in chunks.
constexpr int64_t kMaxPackedXFloats = int64_t{2} << 20;

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
Status linear_scalar(const LinearParams& p) {
  const int64_t elem = dtype_bytes(DT, 1);
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < p.out_features; ++j) {
    const void* w = static_cast<const char*>(p.w) + j * p.w_stride * elem;
    const float b = bias_at(p, j);
    for (int64_t i = 0; i < p.n_tokens; ++i) {
      const float* x = p.x + i * p.x_stride;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (int64_t kk = 0; kk < p.in_features; ++kk) acc += x[kk] * linear_detail::load1<DT>(w, kk);
      p.out[i * p.out_stride + j] = acc + b;
    }
  }
  return ok_status();
}

Status run_gemv(const LinearParams& p, const IsaKernels& isa) {
#pragma omp parallel
  {
    // One contiguous range of weight rows per thread (multiples of 4 rows), so each thread
    // streams its part of w front to back.
    const int64_t groups = ceil_div(p.out_features, 4);
    const int tid = omp_get_thread_num();
    const int nt = omp_get_num_threads();
    const int64_t j0 = std::min(p.out_features, tid * groups / nt * 4);
    const int64_t j1 = std::min(p.out_features, (tid + 1) * groups / nt * 4);
    if (j0 < j1) {
      isa.gemv(p, j0, j1);
      if (p.bias) {
        for (int64_t i = 0; i < p.n_tokens; ++i) {
          float* out = p.out + i * p.out_stride;
          for (int64_t j = j0; j < j1; ++j) out[j] += bias_at(p, j);
        }
      }
    }
  }
  return ok_status();
}

// Block-quantized weights in the GEMM: the packer dequantizes the k-block of each NR-row panel
// into a per-thread buffer (row after row, kc a multiple of every block size) and packs that
// with the ISA's f32 packer, so every weight is unpacked once per call.
struct QuantPack {
  quant_detail::DequantFn dequant;
  int64_t row_bytes;    // bytes per weight row
  int64_t block_size;   // values per block
  int64_t block_bytes;  // bytes per block
};

void pack_w_quant(const LinearParams& p, const GemmKernel& g, const QuantPack& qp, int64_t j0,
                  int64_t nj, int64_t k0, int64_t kc, float* dst, float* tmp) {
  const auto* w = static_cast<const uint8_t*>(p.w);
  const int64_t k_byte = k0 / qp.block_size * qp.block_bytes;
  for (int64_t q0 = 0; q0 < nj; q0 += g.nr) {
    const int64_t rows = std::min(g.nr, nj - q0);
    for (int64_t r = 0; r < rows; ++r) {
      qp.dequant(w + (j0 + q0 + r) * qp.row_bytes + k_byte, tmp + r * kc, kc);
    }
    const LinearParams t{
        .w = tmp, .w_dtype = DType::kF32, .w_stride = kc, .in_features = kc, .out_features = rows};
    g.pack_w(t, 0, rows, 0, kc, dst + q0 * kc, -1, 0);
  }
}

Status run_gemm(const LinearParams& p, const GemmKernel& g, const QuantPack* qp = nullptr) {
  const int64_t n = p.n_tokens;
  const int64_t m = p.out_features;
  const int64_t k = p.in_features;
  const int nthreads = omp_get_max_threads();
  const GemmBlocking blocking = n * k > kLargeXFloats ? g.large_x : g.small_x;
  const int64_t kc_max = blocking.kc;
  const int64_t n_kblocks = ceil_div(k, kc_max);
  // Tokens per chunk: all of them unless their packed x would pass kMaxPackedXFloats.
  const int64_t mc =
      std::clamp(kMaxPackedXFloats / std::max<int64_t>(1, n_kblocks * kc_max) / g.mr * g.mr, g.mr,
                 round_up(n, g.mr));
  // Weight blocks: the same number per thread, each at most nc_max rows.
  const int64_t blocks_per_thread = ceil_div(m, nthreads * blocking.nc_max);
  const int64_t nc = round_up(ceil_div(m, nthreads * blocks_per_thread), g.nr);
  const int64_t n_blocks = ceil_div(m, nc);
  const size_t xp_floats = static_cast<size_t>(mc * n_kblocks * kc_max);
  // With quantized weights each thread's area also holds one dequantized NR-row panel.
  const size_t wp_floats = static_cast<size_t>(nc * kc_max + (qp ? g.nr * kc_max : 0));
  const size_t total = xp_floats + static_cast<size_t>(nthreads) * wp_floats;
  float* const scratch = thread_scratch(total);
  if (!scratch) {
    return errorf(StatusCode::kOutOfMemory, "linear: no memory for {} packing floats", total);
  }
  float* const xp = scratch;

#pragma omp parallel num_threads(nthreads)
  {
    const int tid = omp_get_thread_num();
    const int nt = omp_get_num_threads();
    float* const wp = scratch + xp_floats + static_cast<size_t>(tid) * wp_floats;
    // Contiguous blocks per thread, so each thread knows which block it packs next.
    const int64_t b_begin = tid * n_blocks / nt;
    const int64_t b_end = (tid + 1) * n_blocks / nt;
    for (int64_t i0 = 0; i0 < n; i0 += mc) {
      const int64_t ni = std::min(mc, n - i0);
      const int64_t n_panels = ceil_div(ni, g.mr);
      const auto kc_of = [&](int64_t kb) { return std::min(kc_max, k - kb * kc_max); };
      // x block kb lives at xp + kb * kc * mc, its panel q at + q * mr * kc_of(kb).
#pragma omp for collapse(2) schedule(static)
      for (int64_t kb = 0; kb < n_kblocks; ++kb) {
        for (int64_t q = 0; q < n_panels; ++q) {
          g.pack_x(p, i0 + q * g.mr, std::min(g.mr, ni - q * g.mr), kb * kc_max, kc_of(kb),
                   xp + kb * kc_max * mc + q * g.mr * kc_of(kb));
        }
      }
      for (int64_t b = b_begin; b < b_end; ++b) {
        const int64_t j0 = b * nc;
        const int64_t nj = std::min(nc, m - j0);
        for (int64_t i = i0; i < i0 + ni; ++i) {
          float* out = p.out + i * p.out_stride;
          for (int64_t j = j0; j < j0 + nj; ++j) out[j] = bias_at(p, j);
        }
        for (int64_t kb = 0; kb < n_kblocks; ++kb) {
          const int64_t kc = kc_of(kb);
          // Prefetch what this thread packs next: the next k-block, else the next row block.
          const bool last_kb = kb + 1 == n_kblocks;
          const int64_t next_j0 = !last_kb ? j0 : b + 1 < b_end ? j0 + nc : -1;
          const int64_t next_k0 = !last_kb ? (kb + 1) * kc_max : 0;
          if (qp) {
            pack_w_quant(p, g, *qp, j0, nj, kb * kc_max, kc, wp, wp + nc * kc_max);
          } else {
            g.pack_w(p, j0, nj, kb * kc_max, kc, wp, next_j0, next_k0);
          }
          const float* xblock = xp + kb * kc_max * mc;
          for (int64_t jr = 0; jr < nj; jr += g.nr) {
            for (int64_t q = 0; q < n_panels; ++q) {
              g.micro(kc, xblock + q * g.mr * kc, wp + jr * kc,
                      p.out + (i0 + q * g.mr) * p.out_stride + j0 + jr, p.out_stride,
                      std::min(g.mr, ni - q * g.mr), std::min(g.nr, nj - jr));
            }
          }
        }
      }
#pragma omp barrier
    }
  }
  return ok_status();
}

Status run_isa(const LinearParams& p, const IsaKernels& isa, LinearPath path) {
  switch (path) {
    case LinearPath::kAuto:
      break;
    case LinearPath::kGemv:
      return run_gemv(p, isa);
    case LinearPath::kGemm:
      return run_gemm(p, isa.gemm);
  }
  const int64_t gemv_max =
      p.w_dtype == DType::kF32 ? isa.gemv_max_tokens_f32 : isa.gemv_max_tokens_16bit;
  if (p.n_tokens <= gemv_max) return run_gemv(p, isa);
  return run_gemm(p, isa.gemm);
}

template <DType DT>
Status run(const LinearParams& p, CpuIsa isa, LinearPath path) {
  switch (isa) {
    case CpuIsa::kScalar:
      return linear_scalar<DT>(p);
    case CpuIsa::kAvx2:
      return run_isa(p, linear_detail::avx2_kernels(), path);
    case CpuIsa::kAvx512:
      return run_isa(p, linear_detail::avx512_kernels(), path);
  }
  return ok_status();
}

}  // namespace

Status linear_with_isa(const LinearParams& p, CpuIsa isa, LinearPath path) {
  if (!cpu_supports(isa)) {
    return errorf(StatusCode::kFailedPrecondition, "linear: this CPU cannot run the {} variant",
                  cpu_isa_name(isa));
  }
  if (p.n_tokens == 0 || p.out_features == 0) return ok_status();
  switch (p.w_dtype) {
    case DType::kF32:
      return run<DType::kF32>(p, isa, path);
    case DType::kF16:
      return run<DType::kF16>(p, isa, path);
    case DType::kBF16:
      return run<DType::kBF16>(p, isa, path);
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

Status linear_quant_gemm(const LinearParams& p, CpuIsa isa) {
  const DTypeInfo& info = dtype_info(p.w_dtype);
  quant_detail::DequantFn dequant = nullptr;
#if defined(STRATA_QUANT_HAVE_AVX2)
  if (isa != CpuIsa::kScalar && cpu_supports(isa)) dequant = quant_detail::dequant_avx2(p.w_dtype);
#endif
  if (dequant == nullptr || !info.is_quantized || p.w_stride % info.block_size != 0) {
    return errorf(StatusCode::kFailedPrecondition,
                  "linear_quant_gemm: no {} kernels for {} weights (row stride {})",
                  cpu_isa_name(isa), info.name, p.w_stride);
  }
  if (p.n_tokens == 0 || p.out_features == 0) return ok_status();
  const QuantPack qp{.dequant = dequant,
                     .row_bytes = p.w_stride / info.block_size * info.block_bytes,
                     .block_size = info.block_size,
                     .block_bytes = info.block_bytes};
  const IsaKernels& k =
      isa == CpuIsa::kAvx512 ? linear_detail::avx512_kernels() : linear_detail::avx2_kernels();
  return run_gemm(p, k.gemm, &qp);
}

Status linear(const LinearParams& p) {
  if (dtype_info(p.w_dtype).is_quantized) {
    // GGUF block-quantized weights: the int8-activation kernels of quant.cpp.
    const int64_t block = dtype_info(p.w_dtype).block_size;
    if (p.w_stride % block != 0) {
      return errorf(StatusCode::kInvalidArgument,
                    "linear: {} weight row stride {} is not a multiple of its block size {}",
                    dtype_name(p.w_dtype), p.w_stride, block);
    }
    const bool f32_bias = p.bias && p.bias_dtype == DType::kF32;
    STRATA_RETURN_IF_ERROR(
        quant_linear({.x = p.x,
                      .weight = p.w,
                      .weight_dtype = p.w_dtype,
                      .bias = f32_bias ? static_cast<const float*>(p.bias) : nullptr,
                      .out = p.out,
                      .n_tokens = p.n_tokens,
                      .in_features = p.in_features,
                      .out_features = p.out_features,
                      .x_stride = p.x_stride,
                      .out_stride = p.out_stride,
                      .weight_row_blocks = p.w_stride / block}));
    if (p.bias && !f32_bias) {
      return add_bias({.x = p.out,
                       .stride = p.out_stride,
                       .bias = p.bias,
                       .bias_dtype = p.bias_dtype,
                       .rows = p.n_tokens,
                       .cols = p.out_features});
    }
    return ok_status();
  }
  return linear_with_isa(p, best_cpu_isa());
}

}  // namespace strata::cpu
