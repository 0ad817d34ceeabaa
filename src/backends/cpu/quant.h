// CPU kernels for ggml's block-quantized weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
// Q6_K): dequantization, and the quantized matrix-vector products a linear layer runs on.
//
// How the products work (the scheme fast CPU engines use): the f32 activation row is quantized
// once per linear call to int8 blocks of 32 (Q8Act: per-block scale d = max|x| / 127 and the
// scaled block sum s = d * sum(q)); each weight block then meets the matching activation block
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
// NOTE: AVX2 kernels are compiled with __attribute__((target("avx2,fma,f16c"))), the AVX-512
// ones (quant_avx512.cpp: 512-bit, and a second copy with AVX512-VNNI's vpdpbusd) with their
// own target attributes, and chosen at run time (cpu_features.cpp); the scalar kernels compute
// the same formulas, are the readable reference, and run everywhere else.
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

// Which kernels to run (backends/kernel_params.h); kBest resolves to the best this CPU supports.
using ::strata::QuantIsa;

// The ISA kBest resolves to on this machine (kScalar, kAvx2, kAvx512 or kAvx512Vnni).
QuantIsa quant_best_isa();
// Whether `isa` runs as asked here (kBest and kScalar always do).
bool quant_isa_supported(QuantIsa isa);
const char* quant_isa_name(QuantIsa isa);

// True for the block-quantized types these kernels handle.
bool quant_supported(DType dt);

// dst[0, n) = the values of a row of dtype dt: block-quantized (n a multiple of the block
// size), or f32 / f16 / bf16. Bit-exact with ggml's (and gguf-py's) dequantization.
Status dequantize_row(DType dt, const void* src, float* dst, int64_t n);

// Quantize x[0, n) (n a multiple of 32) into qs[n], d[n/32], s[n/32]: d = max|x| / 127,
// q = round-to-nearest-even(x / d), s = d * sum(q). Every ISA gives identical bits.
void quantize_row_q8(const float* x, int64_t n, int8_t* qs, float* d, float* s,
                     QuantIsa isa = QuantIsa::kBest);

// dot(weight row of n values of dtype dt, quantized activation row).
float vec_dot_q8(DType dt, const void* w, const Q8Act& a, int64_t n,
                 QuantIsa isa = QuantIsa::kBest);

// Scratch quant_linear needs for the quantized activations of x (64-byte aligned inside).
size_t quant_linear_scratch_bytes(int64_t n_tokens, int64_t in_features);

// out[n_tokens, out_features] = x[n_tokens, in_features] @ W[out_features, in_features]^T
// (+ bias) for a block-quantized W; see QuantLinearParams. OpenMP: the activation rows are
// quantized once (in parallel over tokens), then threads split the weight rows into
// contiguous slabs. One token: 4 weight rows per kernel pass share each activation block.
// Several tokens: each weight block is unpacked once for up to 4 tokens.
Status quant_linear(const QuantLinearParams& p);
// The f32-activation path of quant_linear (p.f32_activations), after its checks.
// One token through several block-quantized weights that share x (q/k/v, gate/up): x is
// quantized once (to int16, or to int8 when quant_decode_int8()) and every part's 4-row tiles
// run in one OpenMP region, with the decode kernels quant_linear uses for one token, so each
// part's result is bit-identical to quant_linear on it alone (f32 activations, default ISA).
// With accumulate, out += the result (the residual), as adding quant_linear's output to out
// would. Returns false, having written nothing, where those kernels do not serve every part (a
// K-quant type with int16, no AVX2): the caller then runs the parts one by one.
struct DecodePart {
  const void* weight = nullptr;  // rows x in_features of weight_dtype, row_bytes apart
  DType weight_dtype = DType::kQ8_0;
  int64_t row_bytes = 0;
  int64_t rows = 0;
  const void* bias = nullptr;  // [rows] of bias_dtype (any float dtype), or null
  DType bias_dtype = DType::kF32;
  float* out = nullptr;  // [rows], not overlapping x
};
bool quant_decode_parts(const float* x, int64_t in_features, const DecodePart* parts, int n_parts,
                        bool accumulate);

// One token's gated MLP with its input norm and residual in one OpenMP region: h = norm(x),
// act = act(h Wg^T + bg) * (h Wu^T + bu), x += act Wd^T + bd. Each thread normalizes x and
// quantizes h itself (no serial step, no region between), takes its 8-row tiles of gate and up
// and applies the activation to them, then, after one barrier, quantizes act and takes its
// 4-row tiles of down. Bit-identical to norm, quant_decode_parts on [gate; up], gated_act and
// quant_decode_parts on down with accumulate (the same kernels, lanes and rounding). h and act
// are written as those would write them. Returns false, having written nothing, where that
// composition would not run every part through the int16 decode kernels (int8 decode, other
// block types, no AVX2, hidden % 4 or ffn_dim % 8 != 0): the caller composes the ops.
struct FfnDecodeArgs {
  float* x = nullptr;  // [hidden] f32, += the MLP's output
  int64_t hidden = 0;
  RmsNormParams norm;         // its weight, eps, offset (x / out / sizes are set here)
  float* h = nullptr;         // [hidden] norm(x)
  DecodePart gate, up, down;  // out ignored; gate / up [ffn_dim, hidden], down [hidden, ffn_dim]
  Activation act = Activation::kSilu;
  float* act_out = nullptr;  // [ffn_dim]
  int64_t ffn_dim = 0;
};
bool quant_ffn_decode(const FfnDecodeArgs& f);

// One token's attention block in one parallel region (attn_block.cpp): h = norm(x); the qkv row
// = h [Wq; Wk; Wv]^T (+ b); q = rope(q_norm(q heads)) into q, k = rope(k_norm(k heads)) in place
// in the qkv row, k and v appended to the token's cache slot; attn = attention(q, cache);
// x += attn Wo^T (+ bo). Bit-identical to rms_norm, quant_decode_parts, rope_kv_append's f32
// path, attention and quant_decode_parts with accumulate (the same tiles, row functions and
// attention items), and h, the qkv row, q, the cache slot and attn are written as those write
// them. *done false, nothing written, where the composition would not run every linear through
// the int16 decode kernels (int8 decode, other block types, no AVX2, hidden or n_heads x
// head_dim not whole blocks of 32); an error, nothing written, for a cache slot the
// composition would refuse.
struct AttnDecodeArgs {
  float* x = nullptr;  // [hidden] f32, += the block's output
  int64_t hidden = 0;
  RmsNormParams norm;  // its weight, eps, offset (x / out / sizes are set here)
  float* h = nullptr;  // [hidden] norm(x)
  DecodePart qkv[3];   // 1-3 parts, (n_heads + 2 n_heads_kv) head_dim rows in all, whose out
  int n_qkv = 0;       // pointers cover rope_kv.qkv in order
  RopeKvAppendF32Params rope_kv;  // one token: the qkv row, q_out, rope, q / k norms, cache
  AttentionKernelParams attn;     // one token: out, token_seq / pos, n_heads, cache, scale, ...;
                                  // its q is rope_kv.q_out
  DecodePart o;                   // [hidden, n_heads x head_dim]; out ignored (x)
};
Status quant_attn_decode(const AttnDecodeArgs& a, bool* done);

Status quant_linear_f32(const QuantLinearParams& p, int64_t x_stride, int64_t out_stride,
                        int64_t row_bytes);

// The int8-activation GEMM (quant_gemm_i8.cpp): prefill and batches of >= 16 tokens with int8
// activations (quant_linear runs it when quant_prefill_int8 says so), after quant_linear's
// checks. kFailedPrecondition where the type has none on `isa` (gemm_i8_micro is nullptr).
Status quant_gemm_i8(const QuantLinearParams& p, int64_t x_stride, int64_t out_stride,
                     int64_t row_bytes, QuantIsa isa);
// Whether quant_linear's prefill of p takes int8 activations (p.f32_activations false,
// p.prefill, STRATA_CPU_PREFILL, else the CPU's default), the type permitting.
bool quant_prefill_int8(const QuantLinearParams& p, QuantIsa isa);
// Sets the process-wide prefill choice that QuantPrefill::kAuto calls follow (before
// STRATA_CPU_PREFILL and the CPU's default); kAuto removes it. For tests that compare whole
// models against f32 references, and A/B runs in one process.
void set_quant_prefill(QuantPrefill mode);
// The path prefill takes by default on this CPU, for the `cpu kernels` line: "int8 avx512-vnni",
// "f32 avx2", ...
const char* quant_prefill_path();

// How quant_linear runs decode (n_tokens < 16) when f32_activations is set: kAuto follows
// STRATA_CPU_DECODE (int16 unless it says int8), kInt16 rounds x to int16 per 32 values (the
// int16 kernels where the type has them, else f32), kInt8 rounds x to int8 per 32 values and
// runs the int8 kernels, as f32_activations = false does.
enum class QuantDecode { kAuto, kInt16, kInt8 };
// Sets the process-wide decode choice that f32-activation calls follow (before
// STRATA_CPU_DECODE); kAuto removes it. For tests and A/B runs in one process.
void set_quant_decode(QuantDecode mode);
// Whether decode-sized calls with f32_activations take int8 activations (set_quant_decode,
// else STRATA_CPU_DECODE).
bool quant_decode_int8();
// The path decode takes on this CPU, for the `cpu kernels` line: "int16 avx2", "int8 avx512-vnni".
const char* quant_decode_path();
// Whether the int8 GEMM (prefill) of the AVX512-VNNI variant runs its micro-kernel on AMX tiles:
// STRATA_CPU_AMX=1, the CPU has AMX-INT8 and Linux granted the tile state.
bool quant_gemm_amx();

}  // namespace strata::cpu
