// Internal to the CPU linear kernel: what each SIMD variant (linear_avx2.cpp,
// linear_avx512.cpp) provides to the shared driver in linear.cpp.
//
// Two paths, chosen by the number of tokens:
//   GEMV (few tokens, decode): every weight row is read once, straight from the checkpoint
//     layout, converted to f32 in registers, and dotted with all tokens' x rows (k-vectorized
//     dot products, one horizontal sum per output). Memory-bound: it should run at DRAM
//     bandwidth.
//   GEMM (prefill): BLIS-style. A k-block of x is packed into MR-row panels ([kc][MR]) and a
//     block of weight rows into NR-row panels ([kc][NR], converted to f32 and transposed), so
//     the register-blocked micro-kernel (MR tokens x NR outputs, broadcast x, vector w) reuses
//     every loaded weight MR times and every x value NR times.
#pragma once

#include <cstdint>

#include "backends/kernel_params.h"

namespace strata::cpu::linear_detail {

// out[:, j0:j1] for all tokens (bias included), reading w rows j0..j1 directly.
using GemvFn = void (*)(const LinearParams& p, int64_t j0, int64_t j1);

struct GemmKernel {
  int64_t mr;      // tokens per micro-tile
  int64_t nr;      // outputs per micro-tile
  int64_t kc;      // k-block (a multiple of 256 so block-quantized rows split on block bounds)
  int64_t nc_max;  // weight rows per packed block (a multiple of nr)
  // dst[ceil(ni / mr)][kc][mr] = x[i0 + r, k0 + kk], zero rows past ni.
  void (*pack_x)(const LinearParams& p, int64_t i0, int64_t ni, int64_t k0, int64_t kc, float* dst);
  // dst[ceil(nj / nr)][kc][nr] = f32(w[j0 + c, k0 + kk]), zero columns past nj.
  void (*pack_w)(const LinearParams& p, int64_t j0, int64_t nj, int64_t k0, int64_t kc, float* dst);
  // c[r, col] += sum_kk xp[kk][r] * wp[kk][col] for r < mr_valid, col < nr_valid; c's rows are
  // ldc floats apart.
  void (*micro)(int64_t kc, const float* xp, const float* wp, float* c, int64_t ldc,
                int64_t mr_valid, int64_t nr_valid);
};

struct IsaKernels {
  GemvFn gemv;
  int64_t gemv_max_tokens;  // the GEMV path serves n_tokens <= this
  GemmKernel gemm;
};

const IsaKernels& avx2_kernels();
const IsaKernels& avx512_kernels();

}  // namespace strata::cpu::linear_detail
