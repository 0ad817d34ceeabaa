// CPU kernels for ggml's block-quantized weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
// Q6_K): dequantization, and the quantized matrix-vector products a linear layer runs on.
//
// Two product paths (QuantLinearParams::f32_activations picks one):
//
// f32 activations (the default; exact): the activation stays f32 and each weight block is
// dequantized in registers inside the dot loop (no whole-row expansion), with the block's
// offset / min folded into precomputed per-32 activation block sums sx (block_sums32, once per
// activation row, reused by every weight row):
//   Q8_0: d sum(q x);  Q4_0/Q5_0: d sum(q x) - 8 d sx / - 16 d sx;  Q4_1/Q5_1: d sum(q x) + m sx
//   Q4_K/Q5_K sub-block j: d sc_j sum(q x) - dmin m_j sx;  Q6_K: d sc per 16 values, q - 32
// Results equal the dequantized-weight f32 product up to f32 rounding (tests: relative 1e-5 of
// sum|w||x|), i.e. what a reference that dequantizes the GGUF computes.
//
// int8 activations (f32_activations = false; faster, approximate): the f32 activation row is
// quantized once per linear call to int8 blocks of 32 (Q8Act: per-block scale d = max|x| / 127 and
// the scaled block sum s = d * sum(q)); each weight block then meets the matching activation block
// in an integer dot product (u8 x i8 -> i16 pairs -> i32 with AVX2 maddubs/madd), scaled once
// per block in f32. Offsets and mins fold into the block sums:
//   Q4_1/Q5_1 block: sum((d_w q_w + m_w) * d_a q_a) = d_w d_a sum(q_w q_a) + m_w s_a
//   Q4_0/Q5_0 block: the -8/-16 offset is the same term with m_w = -8 d_w / -16 d_w
//   Q4_K/Q5_K sub-block j of 32: d sc_j d_a sum(q_w q_a) - dmin m_j s_a
//   Q6_K: 16-value scales applied in the integer domain, -32 offset subtracted there too.
// The activation's per-32 scales line up with every type's block or sub-block, so K-quants need
// no separate super-block activation format.
//
// Accuracy: the int8 activation costs at most max|x_block| / 254 per element, so
// |q8 dot - f32 dot| <= sum_blocks (max|x_block| / 254) * sum|w_block| (tests check this bound).
//
// NOTE: AVX2 kernels are compiled with __attribute__((target("avx2,fma,f16c"))) and chosen at
// run time (__builtin_cpu_supports); the scalar kernels compute the same formulas, are the
// readable reference, and run everywhere else.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backends/kernel_params.h"
#include "strata/status.h"
#include "strata/types.h"

namespace strata::cpu {

constexpr int64_t kQ8ActBlock = 32;

// One activation row quantized to int8 blocks of 32 values.
struct Q8Act {
  const int8_t* qs = nullptr;  // [n]
  const float* d = nullptr;    // [n / 32] block scales
  const float* s = nullptr;    // [n / 32] d * sum(qs over the block)
};

// Which kernels to run; kBest resolves to the best this CPU supports.
enum class QuantIsa { kBest, kScalar, kAvx2 };

// The ISA kBest resolves to on this machine (kScalar or kAvx2).
QuantIsa quant_best_isa();
const char* quant_isa_name(QuantIsa isa);

// True for the block-quantized types these kernels handle.
bool quant_supported(DType dt);

// dst[0, n) = the values of a row of dtype dt: block-quantized (n a multiple of the block
// size), or f32 / f16 / bf16. Bit-exact with ggml's (and gguf-py's) dequantization.
Status dequantize_row(DType dt, const void* src, float* dst, int64_t n);

// Quantize x[0, n) (n a multiple of 32) into qs[n], d[n/32], s[n/32]: d = max|x| / 127,
// q = round-to-nearest-even(x / d), s = d * sum(q). Scalar and AVX2 give identical bits.
void quantize_row_q8(const float* x, int64_t n, int8_t* qs, float* d, float* s,
                     QuantIsa isa = QuantIsa::kBest);

// dot(weight row of n values of dtype dt, quantized activation row).
float vec_dot_q8(DType dt, const void* w, const Q8Act& a, int64_t n,
                 QuantIsa isa = QuantIsa::kBest);

// xsum[j] = sum of x[32 j, 32 j + 32) for j < n / 32 (n a multiple of 32).
void block_sums32(const float* x, int64_t n, float* xsum);

// dot(weight row of n values of dtype dt, f32 activation row x), dequantizing block by block;
// equal to the dequantize_row + f32 dot product up to f32 rounding.
float vec_dot_f32(DType dt, const void* w, const float* x, int64_t n,
                  QuantIsa isa = QuantIsa::kBest);

// Scratch quant_linear needs for the prepared activations of x (either path) (64-byte aligned
// inside).
size_t quant_linear_scratch_bytes(int64_t n_tokens, int64_t in_features);

// out[n_tokens, out_features] = x[n_tokens, in_features] @ W[out_features, in_features]^T
// (+ bias) for a block-quantized W; see QuantLinearParams. OpenMP: the activation rows are
// prepared once (block sums, or the int8 quantization; in parallel over tokens), then threads
// split the weight rows into
// contiguous slabs. One token: 4 weight rows per kernel pass share each activation block.
// Several tokens: each weight block is unpacked once for up to 4 tokens.
Status quant_linear(const QuantLinearParams& p);

}  // namespace strata::cpu
