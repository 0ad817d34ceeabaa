// Layer programs: each architecture family's forward pass, written once against the fused op set
// (ops/ops.h) and run by every backend. A family file defines the body of one layer; the
// embedding and the head (final norm, LM head, logits, argmax) are shared (model/blocks.cpp).
// Model::forward runs them over a layer range, so a pipeline stage runs a slice of the same
// program, and tensor parallelism is in the program itself: every collective is an explicit
// ops::all_reduce / all_gather call here.
//
// Adding an architecture: a family file with its layer function, an entry in layer_program()
// (model/blocks.cpp), and its config parsing and weight names (model/config.cpp, loader.cpp).
#pragma once

#include "model/config.h"
#include "model/model.h"

namespace strata {

using LayerFn = Status (*)(const Model& m, ForwardArgs& a, int64_t layer);

struct LayerProgram {
  const char* name;
  LayerFn layer;
};

const LayerProgram& layer_program(ArchFamily family);

// The family bodies (model/<family>.cpp).
Status llama_layer(const Model& m, ForwardArgs& a, int64_t layer);   // Llama, Mistral, Qwen2
Status gemma3_layer(const Model& m, ForwardArgs& a, int64_t layer);  // Gemma-3
Status gpt2_layer(const Model& m, ForwardArgs& a, int64_t layer);    // GPT-2
Status neox_layer(const Model& m, ForwardArgs& a, int64_t layer);    // GPT-NeoX / Pythia
Status moe_layer(const Model& m, ForwardArgs& a, int64_t layer);     // Mixtral, Qwen2/3-MoE, OLMoE

// Shared blocks (model/blocks.cpp).
namespace blocks {

// The first n rows of a workspace tensor.
Tensor rows(const Tensor& t, int64_t n);
ops::NormArgs norm_args(const ModelConfig& c);

// x = embedding of the step's tokens (vocab-parallel: all-reduced), scaled, plus learned
// position embeddings when the model has them.
Status embed(const Model& m, ForwardArgs& a);
// Final norm, LM head and (when asked) argmax of the rows in a.head.
Status head(const Model& m, ForwardArgs& a);

// qkv = h Wqkv^T (+ b); q, cache <- rope(q/k norms(q, k)), v; ws.attn = attention(q, cache).
// `sliding`: this layer attends within the sliding window (with the local rope frequencies when
// the model has them). With batch-sharded attention (ParallelConfig::attn_layout), that of
// batch_sharded_attention.
Status self_attention(const Model& m, ForwardArgs& a, int64_t layer, bool sliding);
// One rank's whole attention block: ws.h = attn_norm(x), self_attention, x += ws.attn Wo^T
// (ops::attention_block: one fused kernel for a CPU decode token of a GGUF model; the
// batch-sharded layout and whole-projection q/k norms compose the blocks above).
Status attention_block(const Model& m, ForwardArgs& a, int64_t layer, bool sliding);
// The rope and attention arguments of a layer.
ops::RopeArgs rope_args(const Model& m, int64_t layer, bool sliding);
ops::AttentionArgs attention_args(const Model& m, const ForwardArgs& a, bool sliding);
// self_attention with the batch-sharded layout (model/attn_layouts.cpp): the projections
// head-sharded, an all-to-all to the ranks owning the sequences, every head of this rank's
// sequences against its KV cache, and an all-to-all back to ws.attn, head-sharded.
Status batch_sharded_attention(const Model& m, ForwardArgs& a, int64_t layer, bool sliding);
// ops::all_to_all_v of a contiguous 2-D tensor's rows (send_rows / recv_rows: host arrays of
// comm.size() entries) for any communicator: through host memory, eagerly (two stream
// synchronizations), where it takes no device buffers (an in-process group without its device
// state). The mixture-of-experts exchange and batch-sharded attention.
Status group_all_to_all_v(ops::Context& ctx, Communicator& comm, const Tensor& send,
                          const int64_t* send_rows, Tensor& recv, const int64_t* recv_rows);
// ws.act = act(h W1^T) (gated: act(h Wg^T) * (h Wu^T)).
Status mlp_in(const Model& m, ForwardArgs& a, int64_t layer);
// One rank's whole MLP block: ws.h = ffn_norm(x), ws.act as mlp_in, x += ws.act W_down^T
// (ops::ffn: one fused kernel for a CPU decode token of a GGUF model).
Status ffn(const Model& m, ForwardArgs& a, int64_t layer);
// x += all_reduce(in W^T) + b for a row-parallel layer (the residual add fused into the GEMM
// epilogue when there is nothing to reduce).
Status residual_linear(const Model& m, ForwardArgs& a, const Tensor& in,
                       const ops::LinearWeight& w);
// residual_linear, then ws.h = norm(x) with `next` (the following norm): with tensor parallelism
// one ops::all_reduce_add_norm (a single kernel on the one-shot path), else the two ops.
Status residual_linear_norm(const Model& m, ForwardArgs& a, const Tensor& in,
                            const ops::LinearWeight& w, const ops::NormWeight& next,
                            const char* norm_section);

// The FFN layouts other than 1d (model/ffn_layouts.cpp; ParallelConfig::ffn_layout).
// x += FFN(h) with the 2D weight-stationary layout: h = the FFN's input norm, replicated.
Status ffn_2d(const Model& m, ForwardArgs& a, int64_t layer);
// From the attention output (ws.attn, head-sharded) to the end of the layer with the
// weight-gathered FFN: o_proj, the residual add and the FFN's input norm on this rank's token
// slice, the FFN with the layer's weights all-gathered, and x replicated again.
Status weight_gathered_ffn(const Model& m, ForwardArgs& a, int64_t layer);

}  // namespace blocks
}  // namespace strata
