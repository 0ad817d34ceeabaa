// Parameter structs shared by a kernel's CPU twin (strata::cpu::<op>) and its CUDA version
// (strata::cuda::<op>). Raw pointers plus sizes: backends know nothing of Tensor or models.
// Shape comments name the dimensions (docs/glossary.md). Strides count elements.
//
// NOTE: the rope and attention structs are called RopeKernelParams / AttentionKernelParams
// because strata::ops already has RopeParams / AttentionParams (the op-level arguments); two
// structs of one name in strata and strata::ops would be a trap for code that sees both.
#pragma once

#include <cstddef>
#include <cstdint>

#include "strata/types.h"

namespace strata {

// Which normalization a norm kernel computes (model configs name theirs with the same enum).
enum class NormKind {
  kRms,    // x * rsqrt(mean(x^2) + eps) * (weight + weight_offset)
  kLayer,  // (x - mean) * rsqrt(var + eps) * weight + bias   (biased variance)
};

// Element-wise activation functions. Declared here (not in ops) because kernels take it as a
// parameter; strata::ops re-exports it as ops::Activation.
enum class Activation {
  kSilu,      // x * sigmoid(x)
  kGeluTanh,  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))  (HF "gelu_pytorch_tanh")
  kGeluErf,   // 0.5 x (1 + erf(x / sqrt(2)))                       (HF "gelu")
  kRelu,
};

// out[r, :] = table[ids[r] - vocab_offset, :] if that row is in this shard, else 0.
// An id outside [0, vocab) is an error (kOutOfRange naming the token index and the id).
struct EmbeddingParams {
  const void* table = nullptr;  // [vocab_shard, hidden], dtype table_dtype, row stride table_stride
  DType table_dtype = DType::kF32;
  int64_t table_stride = 0;
  const int32_t* ids = nullptr;  // [n_tokens]
  float* out = nullptr;          // [n_tokens, hidden], row stride out_stride
  int64_t out_stride = 0;
  int64_t n_tokens = 0;
  int64_t hidden = 0;
  int64_t vocab_offset = 0;  // first vocab id this shard holds
  int64_t vocab_shard = 0;   // rows in this shard
  int64_t vocab = 0;         // full vocabulary size
  float scale = 1.0f;        // out = scale * row (Gemma's sqrt(hidden) embedding scale)
  bool accumulate = false;   // out += scale * row (learned position embeddings added to x)
};

// out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * (weight[:] + weight_offset)
struct RmsNormParams {
  const float* x = nullptr;      // [n_tokens, hidden], row stride x_stride
  const void* weight = nullptr;  // [hidden], dtype weight_dtype
  DType weight_dtype = DType::kF32;
  float* out = nullptr;  // [n_tokens, hidden], row stride out_stride (may alias x)
  int64_t n_tokens = 0;
  int64_t hidden = 0;
  int64_t x_stride = 0;
  int64_t out_stride = 0;
  float eps = 1e-6f;
  float weight_offset = 0.0f;
};

// out[r, :] = (x[r, :] - mean) * rsqrt(var + eps) * weight[:] + bias[:]  (biased variance)
struct LayerNormParams {
  const float* x = nullptr;      // [n_tokens, hidden], row stride x_stride
  const void* weight = nullptr;  // [hidden], dtype weight_dtype
  DType weight_dtype = DType::kF32;
  const void* bias = nullptr;  // [hidden], dtype bias_dtype; nullptr = no bias
  DType bias_dtype = DType::kF32;
  float* out = nullptr;  // [n_tokens, hidden], row stride out_stride (may alias x)
  int64_t n_tokens = 0;
  int64_t hidden = 0;
  int64_t x_stride = 0;
  int64_t out_stride = 0;
  float eps = 1e-5f;
};

// out[n, m] = x[n, k] @ w[m, k]^T (+ bias[m]), with n = n_tokens, k = in_features,
// m = out_features. f32 accumulation. w's rows are w_stride elements apart (a column slice of
// a bigger matrix has w_stride > in_features); the columns of a row are contiguous.
struct LinearParams {
  const float* x = nullptr;  // [n_tokens, in_features], row stride x_stride
  int64_t x_stride = 0;
  const void* w = nullptr;  // [out_features, in_features], dtype w_dtype, row stride w_stride
  DType w_dtype = DType::kF32;
  int64_t w_stride = 0;
  const void* bias = nullptr;  // [out_features], dtype bias_dtype; nullptr = no bias
  DType bias_dtype = DType::kF32;
  float* out = nullptr;  // [n_tokens, out_features], row stride out_stride; not aliasing x
  int64_t out_stride = 0;
  int64_t n_tokens = 0;
  int64_t in_features = 0;
  int64_t out_features = 0;
};

// Rotary embedding in place on x: [n_tokens, n_heads, head_dim] for the first rotary_dim dims
// of each head. angle(t, i) = positions[t] * inv_freq[i]; cos/sin are multiplied by
// attention_factor. neox_style pairs (i, i + rotary_dim/2), else (2i, 2i + 1).
struct RopeKernelParams {
  float* x = nullptr;  // [n_tokens, n_heads, head_dim], strides token_stride, head_stride, 1
  int64_t token_stride = 0;
  int64_t head_stride = 0;
  int64_t n_tokens = 0;
  int64_t n_heads = 0;
  int64_t head_dim = 0;
  const int32_t* positions = nullptr;  // [n_tokens]
  const float* inv_freq = nullptr;     // [rotary_dim / 2]
  int64_t rotary_dim = 0;              // even, <= head_dim
  bool neox_style = true;
  float attention_factor = 1.0f;
};

// One layer's paged KV cache: position p of sequence s lives in block
// block_tables[s * max_blocks_per_seq + p / block_size], slot p % block_size.
struct PagedKvParams {
  float* k_cache = nullptr;  // [n_blocks, block_size, n_heads_kv, head_dim], contiguous
  float* v_cache = nullptr;  // [n_blocks, block_size, n_heads_kv, head_dim], contiguous
  const int32_t* block_tables = nullptr;  // [n_seqs, max_blocks_per_seq]
  int64_t max_blocks_per_seq = 0;
  int64_t n_seqs = 0;
  int64_t n_blocks = 0;
  int64_t block_size = 0;
  int64_t n_heads_kv = 0;
  int64_t head_dim = 0;
};

// Token t (sequence token_seq[t], position token_pos[t]) writes k[t], v[t] into its cache slot.
// A sequence outside [0, n_seqs), a position past the block table or a block id outside
// [0, n_blocks) is kOutOfRange.
struct KvAppendParams {
  const float* k = nullptr;  // [n_tokens, n_heads_kv, head_dim], token stride k_stride
  int64_t k_stride = 0;
  const float* v = nullptr;  // [n_tokens, n_heads_kv, head_dim], token stride v_stride
  int64_t v_stride = 0;
  const int32_t* token_seq = nullptr;  // [n_tokens]
  const int32_t* token_pos = nullptr;  // [n_tokens]
  int64_t n_tokens = 0;
  PagedKvParams cache;
};

// Causal attention of each token over its sequence's cached positions
// [max(0, p - sliding_window + 1), p] (sliding_window 0 = unlimited). Query head h reads KV
// head h / (n_heads / n_heads_kv). Scores: s = scale * q.k, then softcap * tanh(s / softcap)
// when logit_softcap > 0; softmax in f32 with a running max (online softmax).
struct AttentionKernelParams {
  const float* q = nullptr;  // [n_tokens, n_heads, head_dim], token stride q_stride
  int64_t q_stride = 0;
  float* out = nullptr;  // [n_tokens, n_heads, head_dim], token stride out_stride
  int64_t out_stride = 0;
  const int32_t* token_seq = nullptr;  // [n_tokens]
  const int32_t* token_pos = nullptr;  // [n_tokens]
  int64_t n_tokens = 0;
  int64_t n_heads = 0;
  PagedKvParams cache;  // k_cache / v_cache are only read
  float scale = 1.0f;
  int64_t sliding_window = 0;
  float logit_softcap = 0.0f;
};

// out[r, c] = act(gate[r, c]) * up[r, c]
struct GatedActParams {
  const float* gate = nullptr;  // [n_tokens, ffn_dim], row stride gate_stride
  int64_t gate_stride = 0;
  const float* up = nullptr;  // [n_tokens, ffn_dim], row stride up_stride
  int64_t up_stride = 0;
  float* out = nullptr;  // [n_tokens, ffn_dim], row stride out_stride
  int64_t out_stride = 0;
  int64_t n_tokens = 0;
  int64_t ffn_dim = 0;
  Activation act = Activation::kSilu;
};

// x = act(x) on an f32 matrix [rows, cols] with row stride `stride`.
struct ActParams {
  float* x = nullptr;  // [rows, cols], row stride `stride`
  int64_t stride = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  Activation act = Activation::kSilu;
};

// out = a + b (out may alias a or b)
struct AddParams {
  const float* a = nullptr;  // [rows, cols], row stride a_stride
  int64_t a_stride = 0;
  const float* b = nullptr;  // [rows, cols], row stride b_stride
  int64_t b_stride = 0;
  float* out = nullptr;  // [rows, cols], row stride out_stride
  int64_t out_stride = 0;
  int64_t rows = 0;
  int64_t cols = 0;
};

// x[r, :] += bias[:]
struct AddBiasParams {
  float* x = nullptr;  // [rows, cols], row stride `stride`
  int64_t stride = 0;
  const void* bias = nullptr;  // [cols], dtype bias_dtype
  DType bias_dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
};

// x *= s
struct ScaleParams {
  float* x = nullptr;  // [rows, cols], row stride `stride`
  int64_t stride = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  float s = 1.0f;
};

// x = cap * tanh(x / cap)  (Gemma final-logit soft-capping); cap > 0
struct SoftcapParams {
  float* x = nullptr;  // [rows, cols], row stride `stride`
  int64_t stride = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  float cap = 0.0f;
};

// x[r, :] = softmax(x[r, :]) (max-subtracted, f32 with a double sum)
struct SoftmaxParams {
  float* x = nullptr;  // [rows, cols], row stride `stride`
  int64_t stride = 0;
  int64_t rows = 0;
  int64_t cols = 0;
};

// out[r] = index of the largest x[r, :] (the first one on ties; NaN never wins)
struct ArgmaxParams {
  const float* x = nullptr;  // [rows, cols], row stride stride
  int64_t stride = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  int32_t* out = nullptr;  // [rows]
};

// dst[r, 0:row_bytes] = src[r, 0:row_bytes] for r < rows (strided row copy on one device).
struct CopyRowsParams {
  const void* src = nullptr;  // [rows, row_bytes], rows src_stride bytes apart
  int64_t src_stride = 0;
  void* dst = nullptr;  // [rows, row_bytes], rows dst_stride bytes apart; not overlapping src
  int64_t dst_stride = 0;
  int64_t row_bytes = 0;
  int64_t rows = 0;
};

// Which CPU kernels the block-quantized products run (strata::cpu::quant_linear and friends),
// best last: kBest resolves to the best this CPU supports; a variant the CPU lacks falls back to
// the best one below it (quant_isa_supported says which run as asked). kAvx512 is AVX-512
// F/BW/DQ/VL; kAvx512Vnni adds AVX512-VNNI (vpdpbusd for the int8 products).
enum class QuantIsa { kBest, kScalar, kAvx2, kAvx512, kAvx512Vnni };

// How quant_linear runs prefill (n_tokens >= 16) when f32_activations is set: kAuto takes the
// int8-activation GEMM where it is the default (AVX2 and AVX512-VNNI; STRATA_CPU_PREFILL=f32
// or int8 overrides that), kF32 the f32 GEMM over dequantized panels (exact up to f32
// summation order), kInt8 the int8 GEMM (activations rounded to int8 blocks of 32 first).
enum class QuantPrefill { kAuto, kF32, kInt8 };

// out[t, r] = sum_i x[t, i] * W[r, i] (+ bias[r]) for a block-quantized weight W
// (strata::cpu::quant_linear). Weight rows are `weight_row_blocks` blocks apart (0: contiguous
// rows of in_features / block_size blocks), so a column slice of a larger matrix works too.
struct QuantLinearParams {
  const float* x = nullptr;      // [n_tokens, in_features], row stride x_stride
  const void* weight = nullptr;  // [out_features, in_features] of weight_dtype, blocks along i
  DType weight_dtype = DType::kQ4_1;
  const float* bias = nullptr;  // [out_features] or null
  float* out = nullptr;         // [n_tokens, out_features], row stride out_stride; not x
  int64_t n_tokens = 0;
  int64_t in_features = 0;  // multiple of the weight type's block size
  int64_t out_features = 0;
  int64_t x_stride = 0;           // elements; 0 means in_features
  int64_t out_stride = 0;         // elements; 0 means out_features
  int64_t weight_row_blocks = 0;  // blocks between weight rows; 0 means in_features / block
  // quant_linear_scratch_bytes(n_tokens, in_features) bytes for the quantized activations;
  // null (or too small) makes the call allocate its own (for tests; not in a decode step).
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  bool force_scalar = false;  // run the scalar kernels even where AVX2 exists (tests)
  // The kernels to run at most (tests and A/B runs); force_scalar overrides it.
  QuantIsa isa = QuantIsa::kBest;
  // true: activations stay f32 and each weight block is dequantized in registers (exact up to
  // f32 summation order). false: activations are rounded to int8 blocks first (llama.cpp's
  // scheme; faster, but moves logits by ~1e-1 on real models).
  bool f32_activations = true;
  // With f32_activations, the decode kernels (n_tokens < 16) of the 32-value block types
  // (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) on AVX2 round x to int16 per 32 values first: each element
  // moves by at most max|x_blk| / 65534 (256x less than int8), at about the int8 kernels'
  // speed. false: those kernels too keep x in f32.
  bool int16_decode = true;
  // Prefill (n_tokens >= 16) with f32_activations: see QuantPrefill. Weight types without an
  // int8 GEMM (Q6_K; Q8_0 without VNNI) keep the f32 GEMM.
  QuantPrefill prefill = QuantPrefill::kAuto;
};

// ---- GPU executor kernels (bf16 activations into GEMMs, bf16 paged KV cache) ----------------
// The CUDA model executor keeps the residual stream in f32 and feeds every GEMM bf16
// activations; the KV cache is bf16. bf16 values travel as uint16_t bit patterns so this header
// needs no CUDA types. Each struct has a CPU twin in strata::cpu (a plain loop), which the CUDA
// tests compare against and which is itself tested against the f32 reference ops above.

// out = x[n, K] @ W[M, K]^T  (* w_scale[m]) (+ bias[m]) (+ out if accumulate), f32 accumulation.
// W is row-major [out_features, in_features] with row stride w_stride (the HF layout, shared with
// cuBLASLt): bf16, or int8 / fp8-e4m3 with one f32 scale per output row (weight-only
// quantization: w[m, k] = w_scale[m] * q[m, k]). out is f32 or bf16.
// gated_silu: W holds [gate; up] = 2 * out_features rows (gate rows first, up rows starting at
// row out_features), and out[n, m] = silu(gate[n, m]) * up[n, m] (bias, if any, has 2*M entries
// and is added to gate/up before the activation). accumulate is for f32 out only (the residual
// add fused into the o_proj / down_proj epilogue: x += attn @ Wo^T).
struct GpuLinearParams {
  const uint16_t* x = nullptr;  // bf16 [n_tokens, in_features], row stride x_stride
  int64_t x_stride = 0;
  const void* w = nullptr;       // [out_features (x2 when gated_silu), in_features], w_dtype
  DType w_dtype = DType::kBF16;  // kBF16, kI8, kFP8E4M3
  int64_t w_stride = 0;
  const float* w_scale = nullptr;  // [rows of w] per-row scale; required for kI8 / kFP8E4M3
  const float* bias = nullptr;     // f32 [rows of w] or null
  void* out = nullptr;             // [n_tokens, out_features], out_dtype, row stride out_stride
  DType out_dtype = DType::kF32;   // kF32 or kBF16
  int64_t out_stride = 0;
  int64_t n_tokens = 0;
  int64_t in_features = 0;
  int64_t out_features = 0;
  bool accumulate = false;  // out += result (f32 out)
  bool gated_silu = false;
};

// Whether the GPU linear layer may run these params, above the SBI-GeMM crossover, as the A8W8
// GEMM (cuda/linear.cpp: x quantized per token to int8, cuBLASLt int8 x int8 -> int32 on the
// tensor cores, the scales applied in an epilogue; twin cpu::gpu_linear_a8w8): int8 weights, no
// gated_silu, and out_features and in_features multiples of 4 (cuBLASLt's IMMA kernels in the
// regular layout want m and k multiples of 4). Callers also honour STRATA_NO_I8_GEMM
// (EnvConfig::no_i8_gemm). cuBLASLt may still lack an algorithm for an eligible shape; the GPU
// then runs SBI-GeMM slices.
inline bool a8w8_eligible(const GpuLinearParams& p) {
  return p.w_dtype == DType::kI8 && !p.gated_silu && p.out_features % 4 == 0 &&
         p.in_features % 4 == 0;
}

// out_bf16[r, :] = norm(x[r, :]) rounded to bf16 once, where norm is RMSNorm
// (x * rsqrt(mean(x^2) + eps) * (weight + weight_offset)) or LayerNorm
// ((x - mean) * rsqrt(var + eps) * weight + bias, biased variance; weight_offset unused) per
// `kind`; with `residual` set, first x[r, :] += residual[r, :] (written back to x, f32), then the
// norm of the sum (the residual add fused with the next layer's norm).
struct NormBf16Params {
  NormKind kind = NormKind::kRms;
  float* x = nullptr;  // f32 [n_tokens, hidden], row stride x_stride
  int64_t x_stride = 0;
  const float* residual = nullptr;  // f32 [n_tokens, hidden], row stride residual_stride, or null
  int64_t residual_stride = 0;
  const void* weight = nullptr;  // [hidden], weight_dtype (f32, f16, bf16)
  DType weight_dtype = DType::kF32;
  const void* bias = nullptr;  // [hidden], bias_dtype; LayerNorm only, null = no bias
  DType bias_dtype = DType::kF32;
  uint16_t* out = nullptr;  // bf16 [n_tokens, hidden], row stride out_stride
  int64_t out_stride = 0;
  int64_t n_tokens = 0;
  int64_t hidden = 0;
  float eps = 1e-6f;
  float weight_offset = 0.0f;
};

// out_bf16[r, c] = act(gate[r, c]) * up[r, c] where gate = in[r, 0:ffn], up = in[r, ffn:2ffn]
// (the fused gate/up GEMM output, f32). With gated = false (plain MLPs: GPT-2, NeoX), in is
// [n_tokens, ffn_dim] and out_bf16[r, c] = act(in[r, c]).
struct GatedActBf16Params {
  bool gated = true;
  const float* in = nullptr;  // f32 [n_tokens, 2 * ffn_dim], row stride in_stride
  int64_t in_stride = 0;
  // Instead of `in` when set: the gate/up GEMM output in bf16 (same shape and stride), half the
  // traffic of f32 for prefill-sized batches.
  const uint16_t* in_bf16 = nullptr;
  uint16_t* out = nullptr;  // bf16 [n_tokens, ffn_dim], row stride out_stride
  int64_t out_stride = 0;
  int64_t n_tokens = 0;
  int64_t ffn_dim = 0;
  Activation act = Activation::kSilu;
};

// A bf16 paged KV cache layer: position p of sequence s lives in block
// block_tables[s * max_blocks_per_seq + p / block_size], slot p % block_size; each slot holds
// [n_heads_kv, head_dim] for K and for V.
struct PagedKvBf16Params {
  uint16_t* k_cache = nullptr;            // bf16 [n_blocks, block_size, n_heads_kv, head_dim]
  uint16_t* v_cache = nullptr;            // bf16 [n_blocks, block_size, n_heads_kv, head_dim]
  const int32_t* block_tables = nullptr;  // [n_seqs, max_blocks_per_seq]
  int64_t max_blocks_per_seq = 0;
  int64_t n_seqs = 0;
  int64_t n_blocks = 0;
  int64_t block_size = 0;
  int64_t n_heads_kv = 0;
  int64_t head_dim = 0;
};

// Fused RoPE + KV append: from the fused QKV projection's f32 output row
// [q (n_heads*head_dim) | k (n_heads_kv*head_dim) | v (n_heads_kv*head_dim)] of token t
// (sequence token_seq[t], position token_pos[t]): rotate q and k (rotary_dim dims, pair style and
// inv_freq as RopeKernelParams; rotary_dim 0 = no rotation, e.g. learned positions), write q as
// bf16 to q_out and k, v as bf16 into the token's cache slot. A token whose sequence, position or
// block is invalid writes nothing to the cache (its q_out row is still written).
struct RopeKvAppendParams {
  const float* qkv = nullptr;  // f32 [n_tokens, (n_heads + 2 n_heads_kv) * head_dim]
  int64_t qkv_stride = 0;
  uint16_t* q_out = nullptr;  // bf16 [n_tokens, n_heads, head_dim], token stride q_out_stride
  int64_t q_out_stride = 0;
  const int32_t* token_seq = nullptr;  // [n_tokens]
  const int32_t* token_pos = nullptr;  // [n_tokens]
  int64_t n_tokens = 0;
  int64_t n_heads = 0;
  const float* inv_freq = nullptr;  // [rotary_dim / 2]
  int64_t rotary_dim = 0;
  bool neox_style = true;
  float attention_factor = 1.0f;
  // Optional per-head RMSNorm of q and k before the rotation (Gemma-3, Qwen3, OLMoE-style q/k
  // norms): q_head = q_head * rsqrt(mean(q_head^2) + norm_eps) * (q_norm + norm_weight_offset),
  // in f32; likewise k with k_norm. Either may be null (no norm).
  const float* q_norm = nullptr;  // f32 [head_dim]
  const float* k_norm = nullptr;  // f32 [head_dim]
  float norm_eps = 1e-6f;
  float norm_weight_offset = 0.0f;
  PagedKvBf16Params cache;
};

// RopeKvAppendParams' f32 twin, the CPU reference (f32 activations, cpu::rope_kv_append_f32): q
// written f32, k rotated in place in the qkv row, k and v appended to an f32 cache.
struct RopeKvAppendF32Params {
  float* qkv = nullptr;  // [n_tokens, (n_heads + 2 n_heads_kv) head_dim], row stride qkv_stride
  int64_t qkv_stride = 0;
  float* q_out = nullptr;  // [n_tokens, n_heads, head_dim], token stride q_out_stride
  int64_t q_out_stride = 0;
  const int32_t* token_seq = nullptr;  // [n_tokens]
  const int32_t* token_pos = nullptr;  // [n_tokens]
  int64_t n_tokens = 0;
  int64_t n_heads = 0;
  const float* inv_freq = nullptr;  // [rotary_dim / 2]
  int64_t rotary_dim = 0;
  bool neox_style = true;
  const float* q_norm = nullptr;  // f32 [head_dim], or null
  const float* k_norm = nullptr;
  float norm_eps = 1e-6f;
  float norm_weight_offset = 0.0f;
  PagedKvParams cache;
};

// Causal attention over a bf16 paged cache, variable-length layout (flash-attn "varlen" /
// flashinfer style): the queries of sequence s are tokens [cu_q[s], cu_q[s+1]) of q, and they
// are that sequence's LAST (cu_q[s+1] - cu_q[s]) positions of kv_len[s] cached positions (this
// step's K/V already appended), so query j of s sits at position kv_len[s] - n_q(s) + j and
// attends to positions [max(0, pos - sliding_window + 1), pos]. One call serves a prefill, a
// chunk of one, decode steps of many sequences, or a mix. Query head h reads KV head
// h / (n_heads / n_heads_kv). Scores s = scale * q.k (then softcap * tanh(s / softcap) when
// logit_softcap > 0), online softmax in f32; out is bf16 (it feeds the o_proj GEMM).
// max_q_len / max_kv_len are host-side upper bounds over the sequences (grid sizing; fixed while
// a CUDA graph replays). cu_q, kv_len and block tables are device arrays.
struct VarlenAttentionParams {
  const uint16_t* q = nullptr;  // bf16 [n_tokens, n_heads, head_dim], token stride q_stride
  int64_t q_stride = 0;
  uint16_t* out = nullptr;  // bf16 [n_tokens, n_heads, head_dim], token stride out_stride
  int64_t out_stride = 0;
  const int32_t* cu_q = nullptr;    // [n_seqs + 1], cu_q[0] = 0
  const int32_t* kv_len = nullptr;  // [n_seqs]
  int64_t n_seqs = 0;               // must equal cache.n_seqs
  int64_t n_heads = 0;
  int64_t max_q_len = 0;
  int64_t max_kv_len = 0;
  PagedKvBf16Params cache;  // only read
  float scale = 1.0f;
  int64_t sliding_window = 0;
  float logit_softcap = 0.0f;
  // Scratch for split-K partial results (decode); varlen_attention_workspace_bytes() says how
  // much. Null / too small: the decode kernel runs unsplit.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

}  // namespace strata
