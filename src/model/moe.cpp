// Mixture-of-experts decoder layers (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE): Llama-style
// attention (Qwen2-MoE with q/k/v biases, Qwen3-MoE with per-head q/k RMSNorm, OLMoE with RMSNorm
// over the whole q and k projections), then in a sparse layer a router over the experts and the
// experts' gated SiLU MLPs run grouped by expert (ops.h, "mixture of experts"); a dense layer
// (Qwen2/3-MoE mlp_only_layers / decoder_sparse_step) has the plain SwiGLU MLP.
//
//   h = rms_norm(x);  x += attention(h) Wo^T;  h = rms_norm(x)
//   sparse:  logits = h Wr^T                              [n, E]
//            ids, w = top-k(softmax(logits)) (renormalised: Mixtral, norm_topk_prob)
//            h_perm = h grouped by expert                 [n k, H]   (perm: slot -> row)
//            y_perm = down_e(silu(gate_e h) * up_e h)     per expert group
//            x += sum_j w[t, j] y_perm[perm[t k + j]]
//            x += sigmoid(h Wsg^T) * shared(h)            Qwen2-MoE's shared expert
//   dense:   x += (silu(h Wg^T) * (h Wu^T)) Wd^T
//
// NOTE: one rank only for now (Model::init_shapes refuses tensor parallelism for MoE models);
// expert parallelism and expert slicing are separate work (issue 12, item 4).
#include "model/program.h"

namespace strata {

namespace {

// A view of the first `n` elements of a workspace slot with shape {rows, cols}.
Tensor view(const Tensor& slot, int64_t rows, int64_t cols) {
  return Tensor::make(slot.data, slot.dtype, {rows, cols}, slot.device);
}

}  // namespace

Status moe_layer(const Model& m, ForwardArgs& a, int64_t layer) {
  const ModelConfig& c = m.config();
  const LayerWeights& L = m.weights().layers[static_cast<size_t>(layer)];
  const int64_t n = a.step.n_tokens, H = c.hidden;
  Tensor x = blocks::rows(a.ws.x, n), h = blocks::rows(a.ws.h, n);
  const bool sliding = c.sliding_window > 0;
  ops::section(a.ctx, "attn_norm");
  STRATA_RETURN_IF_ERROR(ops::norm(a.ctx, x, L.attn_norm, blocks::norm_args(c), h));
  STRATA_RETURN_IF_ERROR(blocks::self_attention(m, a, layer, sliding));
  ops::section(a.ctx, "o_proj");
  STRATA_RETURN_IF_ERROR(
      blocks::residual_linear_norm(m, a, blocks::rows(a.ws.attn, n), L.o, L.ffn_norm, "ffn_norm"));
  if (!c.layer_moe(layer)) {
    STRATA_RETURN_IF_ERROR(blocks::mlp_in(m, a, layer));
    ops::section(a.ctx, "down");
    return blocks::residual_linear(m, a, blocks::rows(a.ws.act, n).slice_cols(0, L.down.cols()),
                                   L.down);
  }

  const int64_t E = c.n_experts, k = c.n_experts_used, S = n * k;
  ops::section(a.ctx, "router");
  Tensor logits = view(a.ws.moe_logits, n, E);
  STRATA_RETURN_IF_ERROR(ops::linear(a.ctx, h, L.router, logits));
  Tensor ids = view(a.ws.moe_ids, n, k), w = view(a.ws.moe_w, n, k);
  ops::MoeRouteArgs route;
  route.k = k;
  route.renormalize = c.moe_renormalize;
  STRATA_RETURN_IF_ERROR(ops::moe_route(a.ctx, logits, route, ids, w));
  ops::section(a.ctx, "moe_permute");
  Tensor offsets = view(a.ws.moe_offsets, 1, E + 1);
  STRATA_RETURN_IF_ERROR(ops::moe_offsets(a.ctx, ids, E, offsets));
  Tensor h_perm = view(a.ws.moe_x, S, H), perm = view(a.ws.moe_perm, 1, S);
  STRATA_RETURN_IF_ERROR(ops::moe_permute(a.ctx, h, ids, offsets, h_perm, perm));
  ops::section(a.ctx, "experts");
  // The experts' FFN size as stored: the device layout pads it (model.h, expert_ffn_padded).
  const int64_t Fe = L.expert_gate_up[0].rows() / 2;
  // The f32 reference's gate/up scratch; the device layout fuses it away (its slot is a stub).
  Tensor ff = a.ws.moe_ff.dtype == DType::kF32 ? view(a.ws.moe_ff, S, 2 * Fe) : Tensor{};
  Tensor act = view(a.ws.moe_act, S, Fe);
  Tensor y_perm = view(a.ws.moe_y, S, H);
  const ops::MoeExperts experts{L.expert_gate_up.data(), L.expert_down.data(), E, n};
  STRATA_RETURN_IF_ERROR(
      ops::moe_experts(a.ctx, h_perm, offsets, experts, c.activation, ff, act, y_perm));
  ops::section(a.ctx, "moe_combine");
  STRATA_RETURN_IF_ERROR(ops::moe_combine(a.ctx, y_perm, perm, w, x, /*accumulate=*/true));
  if (L.shared_gate_up.defined()) {
    ops::section(a.ctx, "shared_expert");
    const int64_t Fs = c.shared_expert_ffn_dim;
    Tensor sff = blocks::rows(a.ws.ff, n).slice_cols(0, 2 * Fs);
    Tensor sact = blocks::rows(a.ws.act, n).slice_cols(0, Fs);
    STRATA_RETURN_IF_ERROR(
        ops::linear_act(a.ctx, h, L.shared_gate_up, c.activation, /*gated=*/true, sff, sact));
    Tensor y = blocks::rows(a.ws.y, n);
    STRATA_RETURN_IF_ERROR(ops::linear(a.ctx, sact, L.shared_down, y));
    Tensor gate = view(a.ws.moe_gate, n, 1);
    STRATA_RETURN_IF_ERROR(ops::linear(a.ctx, h, L.shared_gate, gate));
    STRATA_RETURN_IF_ERROR(ops::sigmoid_gate_add(a.ctx, y, gate, x));
  }
  return ok_status();
}

}  // namespace strata
