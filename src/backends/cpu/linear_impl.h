// Internal to the CPU linear kernel: what each SIMD variant (linear_avx2.cpp,
// linear_avx512.cpp) provides to the shared driver in linear.cpp.
//
// Two paths, chosen by the number of tokens:
//   GEMV (few tokens, decode): weight rows are read straight from the checkpoint layout,
//     converted to f32 in registers and dotted with every token's x row (k-vectorized dot
//     products, one horizontal sum per output and k-chunk). Each thread streams one contiguous
//     range of rows and prefetches the tile it reads next into L2, so n = 1 runs at DRAM
//     bandwidth; tiles of several tokens x several rows reuse each loaded weight across tokens.
//   GEMM (prefill): BLIS-style. x is packed into MR-token panels ([kc][MR]) once per call, and
//     each thread packs its weight blocks into NR-row panels ([kc][NR], converted to f32 and
//     transposed) while prefetching the block it packs next; the register-blocked micro-kernel
//     (MR tokens x NR outputs, broadcast x, vector w) reuses every loaded weight MR times and
//     every x value NR times.
#pragma once

#include <cstdint>

#include "backends/kernel_params.h"
#include "core/half.h"

namespace strata::cpu::linear_detail {

// Helpers for the plain weight dtypes the SIMD variants read natively (f32, f16, bf16).
template <DType DT>
constexpr int64_t elem_bytes() {
  return DT == DType::kF32 ? 4 : 2;
}

// Start of weight row j.
template <DType DT>
const char* row_ptr(const LinearParams& p, int64_t j) {
  return static_cast<const char*>(p.w) + j * p.w_stride * elem_bytes<DT>();
}

// Weight i of a row as f32.
template <DType DT>
inline float load1(const void* w, int64_t i) {
  if constexpr (DT == DType::kF32) {
    return static_cast<const float*>(w)[i];
  } else if constexpr (DT == DType::kF16) {
    return f16_to_f32(static_cast<const uint16_t*>(w)[i]);
  } else {
    return bf16_to_f32(static_cast<const uint16_t*>(w)[i]);
  }
}

// out[:, j0:j1] = x @ w[j0:j1]^T for all tokens, reading w rows j0..j1 directly (the driver
// adds the bias).
using GemvFn = void (*)(const LinearParams& p, int64_t j0, int64_t j1);

// k-block and weight rows per packed block. Two settings: while the packed x is small it stays
// in L2 and the weight block can be a single NR panel with a long k-block (weights are read in
// long runs, which DRAM streams well); a large packed x is re-read once per weight block, so
// then the blocks are wider (fewer passes over x) with a shorter k-block (the block still fits
// L2).
struct GemmBlocking {
  int64_t kc;      // a multiple of 256 so block-quantized rows split on block bounds
  int64_t nc_max;  // a multiple of nr
};

struct GemmKernel {
  int64_t mr;  // tokens per micro-tile
  int64_t nr;  // outputs per micro-tile
  GemmBlocking small_x;
  GemmBlocking large_x;
  // dst[ceil(ni / mr)][kc][mr] = x[i0 + r, k0 + kk], zero rows past ni.
  void (*pack_x)(const LinearParams& p, int64_t i0, int64_t ni, int64_t k0, int64_t kc, float* dst);
  // dst[ceil(nj / nr)][kc][nr] = f32(w[j0 + c, k0 + kk]), zero columns past nj.
  // (next_j0, next_k0) is the block this thread packs next (none when next_j0 < 0), which the
  // packer prefetches into L2 while it reads this one.
  void (*pack_w)(const LinearParams& p, int64_t j0, int64_t nj, int64_t k0, int64_t kc, float* dst,
                 int64_t next_j0, int64_t next_k0);
  // c[r, col] += sum_kk xp[kk][r] * wp[kk][col] for r < mr_valid, col < nr_valid; c's rows are
  // ldc floats apart.
  void (*micro)(int64_t kc, const float* xp, const float* wp, float* c, int64_t ldc,
                int64_t mr_valid, int64_t nr_valid);
};

struct IsaKernels {
  GemvFn gemv;
  // The GEMV path serves n_tokens up to these (measured crossovers: converting 16-bit weights
  // on the fly is cheap next to packing them, so 16-bit weights stay on GEMV longer).
  int64_t gemv_max_tokens_f32;
  int64_t gemv_max_tokens_16bit;
  GemmKernel gemm;
};

const IsaKernels& avx2_kernels();
const IsaKernels& avx512_kernels();

}  // namespace strata::cpu::linear_detail
