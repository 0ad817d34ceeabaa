// GPT-NeoX / Pythia decoder layers: LayerNorm with biases, partial rotary (rotary_pct of each
// head), biases on every linear layer, a plain GELU MLP, and either the parallel block
// (use_parallel_residual: attention and MLP both read the layer's input, one all-reduce for both
// — the parallel formulation of seed 003, Sec. 3.4) or the sequential one.
//
//   parallel:    h1 = ln1(x); h2 = ln2(x)
//                y = all_reduce(attn(h1) Wo^T + gelu(h2 W1^T + b1) W2^T);  x += y + bo + b2
//   sequential:  as GPT-2, with rotary positions
#include "model/program.h"

namespace strata {

Status neox_layer(const Model& m, ForwardArgs& a, int64_t layer) {
  const ModelConfig& c = m.config();
  const LayerWeights& L = m.weights().layers[static_cast<size_t>(layer)];
  const int64_t n = a.step.n_tokens;
  Tensor x = blocks::rows(a.ws.x, n), h = blocks::rows(a.ws.h, n);
  ops::section(a.ctx, "attn_norm");
  STRATA_RETURN_IF_ERROR(ops::norm(a.ctx, x, L.attn_norm, blocks::norm_args(c), h));
  STRATA_RETURN_IF_ERROR(blocks::self_attention(m, a, layer, /*sliding=*/false));
  if (!c.parallel_block) {
    ops::section(a.ctx, "o_proj");
    STRATA_RETURN_IF_ERROR(blocks::residual_linear(m, a, blocks::rows(a.ws.attn, n), L.o));
    ops::section(a.ctx, "ffn_norm");
    STRATA_RETURN_IF_ERROR(ops::norm(a.ctx, x, L.ffn_norm, blocks::norm_args(c), h));
    STRATA_RETURN_IF_ERROR(blocks::mlp_in(m, a, layer));
    ops::section(a.ctx, "down");
    return blocks::residual_linear(m, a, blocks::rows(a.ws.act, n), L.down);
  }
  // Parallel block: the MLP reads norm2 of the same x; both partial sums meet in y, one
  // all-reduce, then the biases once.
  ops::section(a.ctx, "ffn_norm");
  STRATA_RETURN_IF_ERROR(ops::norm(a.ctx, x, L.ffn_norm, blocks::norm_args(c), h));
  STRATA_RETURN_IF_ERROR(blocks::mlp_in(m, a, layer));
  ops::section(a.ctx, "o_down");
  Tensor y = blocks::rows(a.ws.y, n);
  ops::LinearArgs first;
  first.bias = false;
  STRATA_RETURN_IF_ERROR(ops::linear(a.ctx, blocks::rows(a.ws.attn, n), L.o, y, first));
  ops::LinearArgs second = first;
  second.accumulate = true;
  STRATA_RETURN_IF_ERROR(ops::linear(a.ctx, blocks::rows(a.ws.act, n), L.down, y, second));
  STRATA_RETURN_IF_ERROR(ops::all_reduce(a.ctx, a.comm, y));
  STRATA_RETURN_IF_ERROR(ops::add(a.ctx, x, y, x));
  for (const ops::LinearWeight* w : {&L.o, &L.down}) {
    if (w->parts[0].bias.defined()) {
      STRATA_RETURN_IF_ERROR(ops::add_bias(a.ctx, x, w->parts[0].bias));
    }
  }
  return ok_status();
}

}  // namespace strata
