// Llama-style decoder layers (Llama 2/3, SmolLM2, Mistral, Qwen2): pre-norm, sequential
// residual, RMSNorm, rotary positions, SwiGLU MLP, optional Q/K/V biases and sliding window.
//
//   h = rms_norm(x)                            (bf16 on the GPU: the QKV GEMM's input)
//   qkv = h Wqkv^T (+ b)                       one GEMM (column-parallel)
//   q, cache <- rope(q, k), v                  one fused kernel
//   a = attention(q, cache)
//   x += all_reduce(a Wo^T)                    row-parallel; residual add in the GEMM epilogue
//   h = rms_norm(x)                            with TP: fused into the all-reduce (one kernel)
//   g = silu(h Wg^T) * (h Wu^T)                one GEMM with the activation in its epilogue
//   x += all_reduce(g Wd^T)                    with TP: + the next layer's input norm
// The MLP in the 2D weight-stationary and weight-gathered layouts: model/ffn_layouts.cpp.
#include "model/program.h"

namespace strata {

Status llama_layer(const Model& m, ForwardArgs& a, int64_t layer) {
  const ModelConfig& c = m.config();
  const LayerWeights& L = m.weights().layers[static_cast<size_t>(layer)];
  const int64_t n = a.step.n_tokens;
  Tensor x = blocks::rows(a.ws.x, n), h = blocks::rows(a.ws.h, n);
  const bool sliding = c.sliding_window > 0 && (c.layer_is_sliding.empty() ||
                                                c.layer_is_sliding[static_cast<size_t>(layer)]);
  const FfnLayout ffn_layout = m.parallel().ffn_layout_for(n);
  if (m.parallel().tp_size == 1 && ffn_layout == FfnLayout::k1D && !a.next_norm_done) {
    // One rank: the attention block and the MLP block as one op each (each fused on the CPU for
    // a decode token).
    STRATA_RETURN_IF_ERROR(blocks::attention_block(m, a, layer, sliding));
    return blocks::ffn(m, a, layer);
  }
  if (a.next_norm_done) {
    a.next_norm_done = false;  // the previous layer's all-reduce wrote h
  } else {
    ops::section(a.ctx, "attn_norm");
    STRATA_RETURN_IF_ERROR(ops::norm(a.ctx, x, L.attn_norm, blocks::norm_args(c), h));
  }
  STRATA_RETURN_IF_ERROR(blocks::self_attention(m, a, layer, sliding));
  if (ffn_layout == FfnLayout::kWeightGathered) return blocks::weight_gathered_ffn(m, a, layer);
  ops::section(a.ctx, "o_proj");
  STRATA_RETURN_IF_ERROR(
      blocks::residual_linear_norm(m, a, blocks::rows(a.ws.attn, n), L.o, L.ffn_norm, "ffn_norm"));
  if (ffn_layout == FfnLayout::k2D) return blocks::ffn_2d(m, a, layer);
  STRATA_RETURN_IF_ERROR(blocks::mlp_in(m, a, layer));
  ops::section(a.ctx, "down");
  const int64_t last = a.last_layer < 0 ? c.n_layers : a.last_layer;
  if (m.parallel().tp_size > 1 && layer + 1 < last) {
    // Tensor parallel: the down projection's all-reduce also writes the next layer's input norm.
    const LayerWeights& next = m.weights().layers[static_cast<size_t>(layer + 1)];
    STRATA_RETURN_IF_ERROR(blocks::residual_linear_norm(m, a, blocks::rows(a.ws.act, n), L.down,
                                                        next.attn_norm, "attn_norm"));
    a.next_norm_done = true;
    return ok_status();
  }
  return blocks::residual_linear(m, a, blocks::rows(a.ws.act, n), L.down);
}

}  // namespace strata
