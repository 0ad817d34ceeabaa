// Internal plumbing of the GPU linear layer (cuda::linear, sbi_gemm, cublaslt_linear), shared by
// kernels/sbi_gemm*.cu, kernels/linear_epilogue.cu, linear.cpp, the CUDA tests and the
// benchmark. Not part of the backend's API (cuda_kernels.h is).
#pragma once

#include <cstdint>

#include "backends/cuda/launch_ctx.h"
#include "backends/kernel_params.h"
#include "strata/status.h"

namespace strata::cuda {

// The argument checks every GPU linear entry point runs before touching the GPU: dtypes
// (kUnimplemented), sizes, strides, null pointers, in_features a multiple of 8, x and weight
// rows 16-byte aligned, w_scale present exactly for int8/fp8, accumulate only into f32 out
// (kInvalidArgument naming `op` and the argument). GGUF block formats: in_features a multiple
// of 256, dense rows (w_stride == in_features), no w_scale, weights 2-byte aligned.
Status check_gpu_linear(const char* op, const GpuLinearParams& p);

namespace sbi {

// SBI-GeMM crossover: linear() runs SBI-GeMM up to this many tokens, cuBLASLt above.
// Retune from bench_gpu_linear (the n where cublaslt_linear's time drops below sbi_gemm's).
constexpr int64_t kMaxTokensDefault = 16;
// Tokens one SBI launch handles (8 n-tiles of 8); sbi_gemm runs larger batches in slices.
constexpr int kMaxLaunchTokens = 64;
// m-tiles per block shrink until the grid has at least this many blocks per SM (so that every
// SM streams weights); more m-tiles per block means fewer re-reads of x.
constexpr int kMinBlocksPerSm = 2;

// One launch, after the checks: at most kMaxLaunchTokens tokens, byte strides for the weights.
// Loop iterations of weights an SBI block prefetches into L2 before its PDL wait. 0: measured on
// H100 (Llama-3-8B decode, batch 1 / 16): depth 0 5.81 / 6.63 ms, 1 5.86 / 6.67, 2 5.91 / 6.81,
// 4 6.22 / 7.07 -- the decode step is bandwidth-bound throughout, so prefetching during the
// previous kernel only takes bandwidth from it. PDL alone (no prefetch) gave 5.81 vs 5.86 ms.
constexpr int kDefaultPrefetch = 0;

struct Args {
  const uint16_t* x = nullptr;  // bf16 [n_tokens, k], row stride x_stride elements
  int64_t x_stride = 0;
  const uint8_t* w = nullptr;  // [rows, k] weights, row stride w_stride_bytes
  int64_t w_stride_bytes = 0;
  const float* w_scale = nullptr;  // per weight row, or null (bf16)
  const float* bias = nullptr;     // per weight row, or null
  void* out = nullptr;             // [n_tokens, m] f32 or bf16, row stride out_stride elements
  int64_t out_stride = 0;
  bool out_bf16 = false;
  bool accumulate = false;
  bool gated = false;  // weight rows [0, m) gate, [m, 2m) up
  int n_tokens = 0;
  int k = 0;
  int m = 0;  // output features
  // Loop iterations of weights each block prefetches into L2 before waiting for the upstream
  // kernel (PDL); 0 = none. STRATA_SBI_PREFETCH overrides the default (sbi_gemm.cu).
  int prefetch = 0;
};

// Block shape: `tiles` 16-row weight tiles (gate and up tiles both count when gated) and
// `n_tiles` 8-token tiles per block.
struct Config {
  int tiles = 1;
  int n_tiles = 1;
};

// Per weight format (kernels/sbi_gemm_{bf16,i8,fp8}.cu). kInvalidArgument for a Config without
// a compiled kernel.
Status launch_bf16(const LaunchCtx& ctx, const Args& a, Config c);
Status launch_i8(const LaunchCtx& ctx, const Args& a, Config c);
Status launch_fp8(const LaunchCtx& ctx, const Args& a, Config c);

// sbi_gemm with the m-tiles per block forced to m_tiles (1, 2 or 4; 0 = automatic), for the
// benchmark's sweep. kInvalidArgument when no kernel of that shape exists for the token count.
Status sbi_gemm_with_m_tiles(const LaunchCtx& ctx, const GpuLinearParams& p, int m_tiles);

}  // namespace sbi

// GGUF block formats (gguf_linear.cpp; kernels/gguf_gemv.cuh, one .cu per format).
namespace gguf {
// The decode kernel: at most 16 tokens, 16-byte aligned rows of a.w_stride_bytes, k a multiple
// of 256, w_scale null.
Status gemv_q8_0(const LaunchCtx& ctx, const sbi::Args& a);
Status gemv_q4_0(const LaunchCtx& ctx, const sbi::Args& a);
Status gemv_q4_k(const LaunchCtx& ctx, const sbi::Args& a);
Status gemv_q5_k(const LaunchCtx& ctx, const sbi::Args& a);
Status gemv_q6_k(const LaunchCtx& ctx, const sbi::Args& a);
// The dequantizer: out[r, :] (bf16, row stride out_stride, even) = the bf16 weights of rows
// [0, rows) at w + r * row_bytes (any 2-byte alignment), k a multiple of 256.
Status dequant_q8_0(const LaunchCtx& ctx, const uint8_t* w, int64_t row_bytes, int64_t rows,
                    int64_t k, uint16_t* out, int64_t out_stride);
Status dequant_q4_0(const LaunchCtx& ctx, const uint8_t* w, int64_t row_bytes, int64_t rows,
                    int64_t k, uint16_t* out, int64_t out_stride);
Status dequant_q4_k(const LaunchCtx& ctx, const uint8_t* w, int64_t row_bytes, int64_t rows,
                    int64_t k, uint16_t* out, int64_t out_stride);
Status dequant_q5_k(const LaunchCtx& ctx, const uint8_t* w, int64_t row_bytes, int64_t rows,
                    int64_t k, uint16_t* out, int64_t out_stride);
Status dequant_q6_k(const LaunchCtx& ctx, const uint8_t* w, int64_t row_bytes, int64_t rows,
                    int64_t k, uint16_t* out, int64_t out_stride);
// Dispatch by dtype (kUnimplemented for a format without kernels).
Status dequant(const LaunchCtx& ctx, DType dt, const uint8_t* w, int64_t row_bytes, int64_t rows,
               int64_t k, uint16_t* out, int64_t out_stride);
// Rows of the dequantized bf16 tile the prefill path processes at once (a multiple of 16).
int64_t tile_rows(int64_t m, int64_t k, bool gated);
// Whether the decode kernel takes these params (else the dequantizer + bf16 GEMM).
bool gemv_eligible(const GpuLinearParams& p);
}  // namespace gguf

// gguf_linear.cpp: the GPU linear layer for GGUF block-format weights (w_dtype q8_0, q4_0, q4_k,
// q5_k, q6_k; dense rows, no w_scale). Up to 64 tokens (sbi::kMaxLaunchTokens) with 16-byte
// aligned rows: the decode kernel (weights read once, dequantized in registers). Otherwise tiles of
// rows are dequantized to bf16 into a stream-ordered scratch (cudaMallocAsync) and run through the
// bf16 linear (SBI-GeMM or cuBLASLt), gate and up tiles side by side when gated. Both paths
// multiply the same bf16 weights (gguf_fragments.h); twin: cpu::gpu_linear.
Status gguf_linear(const LaunchCtx& ctx, const GpuLinearParams& p);

// linear.cpp: which path cublaslt_linear takes for these params (cuBLASLt writing out directly;
// fp8 weights without a bias: fp8 activations and cuBLASLt applying both scales and writing out
// itself; cuBLASLt into the f32 / int32 scratch + linear_epilogue, which for int8 weights is the
// A8W8 GEMM with int8 activations and for fp8 weights the fp8 GEMM with fp8 activations; or
// SBI-GeMM slices for shapes cuBLASLt has no algorithm for, int8 shapes that are not
// a8w8_eligible, and int8 under STRATA_NO_I8_GEMM), without launching anything; for tests and
// the benchmark.
enum class LtRoute { kDirect, kFp8Scaled, kScratch, kSbi };
Status cublaslt_route(const LaunchCtx& ctx, const GpuLinearParams& p, LtRoute* route);

// kernels/linear_epilogue.cu, for cublaslt_linear's paths that let cuBLASLt write an f32 (or,
// for the int8 GEMM, int32) scratch D[n_tokens, out_features] (row stride d_stride) first:
//   out[t, m] = fma(f32(D[t, m]) * (x_scale ? x_scale[t] : 1), (w_scale ? w_scale[m] : 1),
//                   (bias ? bias[m] : 0)) (+ out[t, m] if accumulate), stored as f32 or bf16
// (one rounding). D may alias out (f32 out, no accumulate): each element is read, then written,
// by the same thread.
struct LinearEpilogueArgs {
  const float* d = nullptr;        // f32 D, or null when d_i32 is set
  const int32_t* d_i32 = nullptr;  // int32 D (the int8 x int8 GEMM), or null
  int64_t d_stride = 0;
  const float* x_scale = nullptr;  // per token, or null
  const float* w_scale = nullptr;  // per output feature, or null
  const float* bias = nullptr;     // per output feature, or null
  void* out = nullptr;
  int64_t out_stride = 0;
  bool out_bf16 = false;
  bool accumulate = false;
  int64_t n_tokens = 0;
  int64_t m = 0;
};
Status linear_epilogue(const LaunchCtx& ctx, const LinearEpilogueArgs& a);

// kernels/linear_epilogue.cu: per-token fp8 e4m3 quantization of bf16 activations for the fp8
// cuBLASLt GEMM: x_scale[t] = max|x[t, :]| / 448 (1 for an all-zero row),
// q[t, i] = fp8(x[t, i] / x_scale[t]) (round to nearest even, saturating), row stride q_stride.
Status quantize_activations_fp8(const LaunchCtx& ctx, const uint16_t* x, int64_t x_stride,
                                int64_t n_tokens, int64_t k, uint8_t* q, int64_t q_stride,
                                float* x_scale);

// kernels/linear_epilogue.cu: per-token int8 quantization of bf16 activations for the int8
// cuBLASLt GEMM (the A8W8 path): x_scale[t] = max|x[t, :]| / 127 (1 for an all-zero row),
// q[t, i] = round-to-nearest-even(x[t, i] / x_scale[t]) clamped to [-127, 127], row stride
// q_stride. Twin: cpu::quantize_activations_i8 (the same bytes and scales).
Status quantize_activations_i8(const LaunchCtx& ctx, const uint16_t* x, int64_t x_stride,
                               int64_t n_tokens, int64_t k, int8_t* q, int64_t q_stride,
                               float* x_scale);

}  // namespace strata::cuda
