// The reference ops: one unfused f32 op per kernel of the CPU backend, over Tensor views, each
// checking shapes and dtypes (a Status that names the op and the mismatch) before calling
// strata::cpu::<op>. They are the readable specification the fused op set (ops/ops.h) is
// tested against and the building blocks of its f32 CPU implementation; layer programs call
// ops/ops.h, not these. Ops contain no math themselves.
//
// Conventions: activations are f32 on the CPU backend, row-major, [n_tokens, ...]. Weights may
// be f32, f16, bf16 (and block-quantized types where the op says so). A linear weight is
// [out_features, in_features] (the HF nn.Linear layout); its rows may be strided (a column
// slice of a row-parallel shard is a strided view into the mmap'd checkpoint).
#pragma once

#include <cstdint>

#include "backends/kernel_params.h"
#include "core/tensor.h"
#include "strata/status.h"

namespace strata::ops::ref {

using ::strata::Activation;

// out[i, :] = table[ids[i] - vocab_offset, :] when the id falls inside this shard's rows
// [vocab_offset, vocab_offset + table.rows()), else zeros (vocab-parallel embedding: the
// shards are summed by an all-reduce afterwards). Ids outside [0, vocab) are an error.
// table: [vocab_shard, hidden] any float dtype; out: [n, hidden] f32.
Status embedding(const Tensor& table, const int32_t* ids, int64_t n, int64_t vocab_offset,
                 int64_t vocab, Tensor& out);

// out = x / rms(x) * (weight + weight_offset); x, out: [n, hidden] f32 (may alias);
// weight: [hidden] any float dtype. weight_offset is 1 for Gemma ("(1 + w)"), else 0.
Status rms_norm(const Tensor& x, const Tensor& weight, float eps, float weight_offset, Tensor& out);

// out = (x - mean) / sqrt(var + eps) * weight + bias; bias may be undefined.
Status layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                  Tensor& out);

// out[n, m] = x[n, k] @ w[m, k]^T (+ bias[m]). x, out f32; w f32/f16/bf16 (rows may be
// strided); bias any float dtype or undefined. out must not alias x. Block-quantized w passes
// the checks here; the CPU backend answers kUnimplemented until its GGUF kernels are wired in.
Status linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out);

// Rotary position embedding applied in place to x: [n_tokens, n_heads, head_dim] f32, for the
// first `rotary_dim` dims of each head. neox_style rotates (i, i + rotary_dim/2) pairs
// (Llama/HF "rotate_half"); otherwise interleaved (2i, 2i+1) pairs (GPT-J / GGUF llama).
// inv_freq: [rotary_dim / 2] f32, already including any rope_scaling (see model/rope.h).
struct RopeParams {
  int64_t rotary_dim = 0;
  bool neox_style = true;
  const float* inv_freq = nullptr;  // [rotary_dim / 2]
  float attention_factor = 1.0f;    // cos/sin multiplier (yarn); 1 otherwise
};
Status rope(Tensor& x, const int32_t* positions, const RopeParams& params);

// Paged KV cache of one layer: k and v are [n_blocks, block_size, n_heads_kv, head_dim] f32.
// A sequence's tokens live in the blocks its block table lists, position p in block
// table[p / block_size], slot p % block_size.
struct PagedKv {
  Tensor k;
  Tensor v;
  const int32_t* block_tables = nullptr;  // [n_seqs, max_blocks_per_seq]
  int64_t max_blocks_per_seq = 0;
  int64_t n_seqs = 0;  // rows of block_tables; a token_seq outside [0, n_seqs) is an error
};

// Token i (sequence token_seq[i], position token_pos[i]) writes k[i], v[i]: [n_tokens,
// n_heads_kv, head_dim] into its slot of the cache.
Status kv_append(const Tensor& k, const Tensor& v, const int32_t* token_seq,
                 const int32_t* token_pos, PagedKv& cache);

// Causal attention over the paged cache. Token i of sequence s at position p attends to that
// sequence's cached positions [max(0, p - sliding_window + 1), p] (window 0 = unlimited), so
// one call serves a prefill chunk, a decode step, or a mix. q, out: [n_tokens, n_heads,
// head_dim] f32; n_heads must be a multiple of n_heads_kv (GQA/MQA share KV heads).
struct AttentionParams {
  const int32_t* token_seq = nullptr;  // [n_tokens]
  const int32_t* token_pos = nullptr;  // [n_tokens]
  float scale = 1.0f;                  // usually 1/sqrt(head_dim)
  int64_t sliding_window = 0;
  float logit_softcap = 0.0f;  // tanh soft-capping (Gemma 2); 0 = off
};
Status attention(const Tensor& q, const PagedKv& cache, const AttentionParams& params, Tensor& out);

// out[n, f] = act(gate[n, f]) * up[n, f]. gate and up may be strided column views of one
// [n, 2f] buffer (the fused gate/up projection's output); out must be contiguous.
Status gated_act(const Tensor& gate, const Tensor& up, Activation act, Tensor& out);
// x = act(x) in place: [n, f] f32.
Status act(Tensor& x, Activation act);
// out = a + b (same shape, f32; out may alias either).
Status add(const Tensor& a, const Tensor& b, Tensor& out);
// x[n, m] += bias[m]; bias any float dtype.
Status add_bias(Tensor& x, const Tensor& bias);
// x *= s.
Status scale(Tensor& x, float s);
// x = cap * tanh(x / cap) in place, cap > 0 (Gemma final-logit soft-capping): [n, f] f32.
Status softcap(Tensor& x, float cap);
// Row-wise softmax in place: [n, f] f32.
Status softmax(Tensor& x);
// out[r] = index of the largest x[r, :] (first on ties): x [n, f] f32, out [n] i32.
Status argmax(const Tensor& x, Tensor& out);

}  // namespace strata::ops::ref
