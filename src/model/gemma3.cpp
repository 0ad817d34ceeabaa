// Gemma-3 decoder layers: RMSNorm with (1 + w) weights everywhere, four norms per layer (pre and
// post attention, pre and post MLP), per-head RMSNorm of q and k before the rotation, layers
// alternating sliding-window attention (local rope base) with global attention (global base and
// scaling), GeGLU (tanh GELU) MLP, query scale query_pre_attn_scalar^-1/2; the embedding is
// scaled by sqrt(hidden) (shared embedding block).
//
//   h = norm_in(x)
//   qkv = h Wqkv^T;  q, cache <- rope(q_norm(q), k_norm(k)), v;  a = attention(q, cache)
//   y = all_reduce(a Wo^T);  y = norm_post_attn(y)
//   h = norm_pre_ffn(x += y)                   (the residual add fused into the norm)
//   y = all_reduce(gelu(h Wg^T) * (h Wu^T) Wd^T);  x += norm_post_ffn(y)
#include "model/program.h"

namespace strata {

Status gemma3_layer(const Model& m, ForwardArgs& a, int64_t layer) {
  const ModelConfig& c = m.config();
  const LayerWeights& L = m.weights().layers[static_cast<size_t>(layer)];
  const int64_t n = a.step.n_tokens;
  Tensor x = blocks::rows(a.ws.x, n), h = blocks::rows(a.ws.h, n), y = blocks::rows(a.ws.y, n);
  const ops::NormArgs na = blocks::norm_args(c);
  const bool sliding = c.sliding_window > 0 && (c.layer_is_sliding.empty() ||
                                                c.layer_is_sliding[static_cast<size_t>(layer)]);
  ops::section(a.ctx, "attn_norm");
  STRATA_RETURN_IF_ERROR(ops::norm(a.ctx, x, L.attn_norm, na, h));
  STRATA_RETURN_IF_ERROR(blocks::self_attention(m, a, layer, sliding));
  ops::section(a.ctx, "o_proj");
  ops::LinearArgs no_bias;
  no_bias.bias = false;
  STRATA_RETURN_IF_ERROR(ops::linear(a.ctx, blocks::rows(a.ws.attn, n), L.o, y, no_bias));
  STRATA_RETURN_IF_ERROR(ops::all_reduce(a.ctx, a.comm, y));
  if (L.o.parts[0].bias.defined())
    STRATA_RETURN_IF_ERROR(ops::add_bias(a.ctx, y, L.o.parts[0].bias));
  ops::section(a.ctx, "post_norms");
  STRATA_RETURN_IF_ERROR(ops::norm(a.ctx, y, L.post_attn_norm, na, y));
  ops::section(a.ctx, "ffn_norm");
  STRATA_RETURN_IF_ERROR(ops::norm(a.ctx, x, L.ffn_norm, na, h, &y));
  STRATA_RETURN_IF_ERROR(blocks::mlp_in(m, a, layer));
  ops::section(a.ctx, "down");
  STRATA_RETURN_IF_ERROR(ops::linear(a.ctx, blocks::rows(a.ws.act, n), L.down, y, no_bias));
  STRATA_RETURN_IF_ERROR(ops::all_reduce(a.ctx, a.comm, y));
  if (L.down.parts[0].bias.defined()) {
    STRATA_RETURN_IF_ERROR(ops::add_bias(a.ctx, y, L.down.parts[0].bias));
  }
  ops::section(a.ctx, "post_norms");
  STRATA_RETURN_IF_ERROR(ops::norm(a.ctx, y, L.post_ffn_norm, na, y));
  return ops::add(a.ctx, x, y, x);
}

}  // namespace strata
