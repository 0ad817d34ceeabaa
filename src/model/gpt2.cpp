// GPT-2 decoder layers: pre-norm LayerNorm (with biases), learned absolute positions (added by
// the shared embedding block), no rotation, biases on every linear layer, a plain GELU MLP
// (gelu_new, the tanh approximation), sequential residual.
//
//   h = layer_norm(x)
//   qkv = h Wqkv^T + b;  cache <- k, v;  a = attention(q, cache)
//   x += all_reduce(a Wo^T) + bo
//   h = layer_norm(x)
//   g = gelu(h Wfc^T + bfc)
//   x += all_reduce(g Wproj^T) + bproj
#include "model/program.h"

namespace strata {

Status gpt2_layer(const Model& m, ForwardArgs& a, int64_t layer) {
  const ModelConfig& c = m.config();
  const LayerWeights& L = m.weights().layers[static_cast<size_t>(layer)];
  const int64_t n = a.step.n_tokens;
  Tensor x = blocks::rows(a.ws.x, n), h = blocks::rows(a.ws.h, n);
  ops::section(a.ctx, "attn_norm");
  STRATA_RETURN_IF_ERROR(ops::norm(a.ctx, x, L.attn_norm, blocks::norm_args(c), h));
  STRATA_RETURN_IF_ERROR(blocks::self_attention(m, a, layer, /*sliding=*/false));
  ops::section(a.ctx, "o_proj");
  STRATA_RETURN_IF_ERROR(blocks::residual_linear(m, a, blocks::rows(a.ws.attn, n), L.o));
  ops::section(a.ctx, "ffn_norm");
  STRATA_RETURN_IF_ERROR(ops::norm(a.ctx, x, L.ffn_norm, blocks::norm_args(c), h));
  STRATA_RETURN_IF_ERROR(blocks::mlp_in(m, a, layer));
  ops::section(a.ctx, "down");
  return blocks::residual_linear(m, a, blocks::rows(a.ws.act, n), L.down);
}

}  // namespace strata
