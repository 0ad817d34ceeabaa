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
// Parallelism (model/model.h, ParallelConfig): attention and the dense layers are
// tensor-parallel over the TP group as in Llama; the shared expert is replicated. The routed
// experts run in one of three ways:
//   one rank      as above
//   expert slicing (tp > 1, ep = 1): every rank holds every expert with its slice of the FFN
//                 dimension; the combined partial sums are all-reduced over the TP group.
//   expert parallel (ep > 1, PCC): every rank holds E / ep whole experts. The n tokens (the
//                 same on every rank of the world) are cut into tp x ep chunks; rank (tp_rank,
//                 ep_rank) takes chunk tp_rank ep + ep_rank (PCC: the TP group's tokens split
//                 among its ranks, then among the expert-parallel group), sends its rows to
//                 the experts' owners (all-to-all with variable splits inside the EP group,
//                 the per-expert counts exchanged first), runs the rows it received through
//                 its experts, sends the outputs back, combines them, and the chunks are
//                 all-gathered in the EP group, then in the TP group.
// Routing is computed from the same inputs on every rank (the router over all n tokens), so
// every rank makes the one-rank decisions.
// Expert parallelism has two exchanges. Steps of at most WorkspaceLimits::ep_fixed_tokens
// tokens (decode) take the fixed-capacity one (model/moe_ep.h): fixed-size all-to-alls whose
// counts travel in device memory, nothing read on the host, so the executor captures them in
// CUDA graphs. Larger steps (prefill) take the variable-split one: the per-expert counts are
// read on the host (a synchronization per sparse layer) and the rows sent as all_to_all_v.
// Both group the received rows the same way, so they compute the same outputs.
#include <algorithm>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "model/moe_ep.h"
#include "model/program.h"
#include "parallel/comm.h"
#include "parallel/inproc_comm.h"

namespace strata {

namespace {

// A view of the first `n` elements of a workspace slot with shape {rows, cols}.
Tensor view(const Tensor& slot, int64_t rows, int64_t cols) {
  return Tensor::make(slot.data, slot.dtype, {rows, cols}, slot.device);
}

// Whether the expert-parallel group's device collectives take messages of `bytes` on the
// tensors directly: host memory; NCCL; an in-process group registered for device collectives
// (the one-shot kernels) when the message fits its staging buffer.
bool group_takes(const ops::Context& ctx, Communicator& comm, int64_t bytes) {
  if (ctx.device.is_cpu() || comm.size() == 1) return true;
  if (!comm.supports(ctx.device)) return false;
  if (std::string(comm.name()) != "in-process") return true;
  return bytes <= in_process_device_max_bytes(comm);
}

Status group_all_gather(ops::Context& ctx, Communicator& comm, const Tensor& send, Tensor& recv) {
  if (group_takes(ctx, comm, dtype_bytes(send.dtype, send.numel()))) {
    return ops::all_gather(ctx, comm, send, recv);
  }
  const int64_t bytes = dtype_bytes(send.dtype, send.numel());
  std::vector<uint8_t> hs(static_cast<size_t>(bytes)), hr(static_cast<size_t>(bytes * comm.size()));
  STRATA_RETURN_IF_ERROR(ops::download(ctx, send, hs.data()));
  STRATA_RETURN_IF_ERROR(ops::synchronize(ctx));
  STRATA_RETURN_IF_ERROR(
      comm.all_gather(hs.data(), bytes, DType::kU8, hr.data(), CommStream::host()));
  STRATA_RETURN_IF_ERROR(ops::upload(ctx, hr.data(), recv));
  return ops::synchronize(ctx);
}

// Appends a step's routing decisions to the trace the tests read (model/model.h), if any.
Status trace_routes(ForwardArgs& a, const Tensor& ids, int64_t slots) {
  if (a.moe_route_trace == nullptr) return ok_status();
  std::vector<int32_t>& t = *a.moe_route_trace;
  t.resize(t.size() + static_cast<size_t>(slots));
  STRATA_RETURN_IF_ERROR(ops::download(a.ctx, ids, t.data() + t.size() - slots));
  return ops::synchronize(a.ctx);
}

// The routed experts on this rank: every expert, whole (one rank) or its FFN slice (expert
// slicing: the partial outputs are all-reduced over the tensor-parallel group). The router's
// logits are routed, counted and permuted in one op (one launch for a decode step on CUDA).
Status experts_local(const Model& m, ForwardArgs& a, const LayerWeights& L, const Tensor& h,
                     const Tensor& logits, const ops::MoeRouteArgs& route, Tensor& ids, Tensor& w,
                     Tensor& x) {
  const ModelConfig& c = m.config();
  const int64_t n = a.step.n_tokens, H = c.hidden, E = c.n_experts, S = n * c.n_experts_used;
  Tensor offsets = view(a.ws.moe_offsets, 1, E + 1);
  Tensor h_perm = view(a.ws.moe_x, S, H), perm = view(a.ws.moe_perm, 1, S);
  STRATA_RETURN_IF_ERROR(ops::moe_dispatch(a.ctx, logits, route, h, ids, w, offsets, h_perm, perm));
  STRATA_RETURN_IF_ERROR(trace_routes(a, ids, n * c.n_experts_used));
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
  if (m.parallel().tp_size == 1) {
    return ops::moe_combine(a.ctx, y_perm, perm, w, x, /*accumulate=*/true);
  }
  // Expert slicing: each rank's combine is a partial sum over its FFN slice.
  Tensor y = blocks::rows(a.ws.y, n);
  STRATA_RETURN_IF_ERROR(ops::moe_combine(a.ctx, y_perm, perm, w, y, /*accumulate=*/false));
  STRATA_RETURN_IF_ERROR(ops::all_reduce(a.ctx, a.comm, y));
  return ops::add(a.ctx, x, y, x);
}

// The capacity of the fixed-capacity exchange for chunks of `per` tokens: a token's k experts
// are distinct, so a chunk sends one rank at most per min(k, El) rows.
int64_t fixed_capacity(const Model& m, int64_t per) {
  return per * std::min<int64_t>(m.config().n_experts_used, m.n_experts_local());
}

// Whether this step takes the fixed-capacity exchange: the workspace has its buffers for chunks
// of `per` tokens, and the group's device collectives take its messages (an in-process group
// on a GPU: registered, and the f32 rows back fit its staging buffer).
bool fixed_exchange(const Model& m, ForwardArgs& a, int64_t per) {
  const int ep = m.parallel().ep_size;
  const int64_t rows = int64_t{ep} * fixed_capacity(m, per), H = m.config().hidden;
  if (!a.ws.moe_ep_x.defined() || a.ws.moe_ep_x.rows() < rows) return false;
  return group_takes(a.ctx, *a.expert_comm, dtype_bytes(DType::kF32, rows * H));
}

// The chunk [t0, t1)'s (token, slot) rows grouped by expert, for both exchanges: offsets
// [1, E + 1] over them, h_perm [mc k, H] the rows in that order, perm their places, w the
// chunk's routing weights. An empty chunk (mc = 0) leaves offsets unwritten.
struct ChunkRows {
  Tensor offsets, h_perm, perm, w;
};
Status group_chunk(const Model& m, ForwardArgs& a, const Tensor& h, const Tensor& ids,
                   const Tensor& w, int64_t t0, int64_t t1, ChunkRows& out) {
  const ModelConfig& c = m.config();
  const int64_t H = c.hidden, E = c.n_experts, k = c.n_experts_used, mc = t1 - t0;
  out.offsets = view(a.ws.moe_offsets, 1, E + 1);
  out.h_perm = view(a.ws.moe_x, mc * k, H);
  out.perm = view(a.ws.moe_perm, 1, mc * k);
  out.w = w.slice_rows(t0, t1);
  if (mc == 0) return ok_status();
  const Tensor ids_c = ids.slice_rows(t0, t1);
  STRATA_RETURN_IF_ERROR(ops::moe_offsets(a.ctx, ids_c, E, out.offsets));
  return ops::moe_permute(a.ctx, h.slice_rows(t0, t1), ids_c, out.offsets, out.h_perm, out.perm);
}

Status chunk_experts_variable(const Model& m, ForwardArgs& a, const LayerWeights& L,
                              const Tensor& h, const Tensor& ids, const Tensor& w, int64_t t0,
                              int64_t t1, Tensor& mine) {
  const ModelConfig& c = m.config();
  const ParallelConfig& par = m.parallel();
  Communicator& group = *a.expert_comm;
  const int ep = par.ep_size;
  const int64_t H = c.hidden, E = c.n_experts, k = c.n_experts_used, mc = t1 - t0;
  const int64_t El = m.n_experts_local();
  Workspace& ws = a.ws;
  ops::Context& ctx = a.ctx;
  // Group the chunk's (token, slot) rows by expert, hence by the rank that owns the expert.
  ops::section(ctx, "moe_dispatch");
  std::vector<int32_t> off(static_cast<size_t>(E + 1), 0);
  ChunkRows rows;
  STRATA_RETURN_IF_ERROR(group_chunk(m, a, h, ids, w, t0, t1, rows));
  if (mc > 0) {
    STRATA_RETURN_IF_ERROR(ops::download(ctx, rows.offsets, off.data()));
    STRATA_RETURN_IF_ERROR(ops::synchronize(ctx));
  }
  // The counts first: rank r gets how many of this chunk's rows go to each of its experts.
  std::vector<int32_t> send_counts(static_cast<size_t>(E)), recv_counts(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    send_counts[static_cast<size_t>(e)] =
        off[static_cast<size_t>(e + 1)] - off[static_cast<size_t>(e)];
  }
  STRATA_RETURN_IF_ERROR(group.all_to_all(send_counts.data(), El, DType::kI32, recv_counts.data(),
                                          CommStream::host()));
  std::vector<int64_t> send_rows(static_cast<size_t>(ep)), recv_rows(static_cast<size_t>(ep));
  std::vector<int32_t> recv_expert;  // the local expert of every received row, in arrival order
  for (int r = 0; r < ep; ++r) {
    const auto ri = static_cast<size_t>(r);
    send_rows[ri] = off[static_cast<size_t>((r + 1) * El)] - off[static_cast<size_t>(r * El)];
    recv_rows[ri] = 0;
    for (int64_t e = 0; e < El; ++e) {
      const int32_t cnt = recv_counts[static_cast<size_t>(r * El + e)];
      recv_rows[ri] += cnt;
      recv_expert.insert(recv_expert.end(), static_cast<size_t>(cnt), static_cast<int32_t>(e));
    }
  }
  const auto R = static_cast<int64_t>(recv_expert.size());
  Tensor recv_x = view(ws.moe_recv_x, R, H);
  STRATA_RETURN_IF_ERROR(blocks::group_all_to_all_v(ctx, group, rows.h_perm, send_rows.data(),
                                                    recv_x, recv_rows.data()));

  // This rank's experts over the rows it received, grouped by expert, then back in arrival order.
  ops::section(ctx, "experts");
  Tensor recv_y = view(ws.moe_recv_y, R, H);
  if (R > 0) {
    Tensor rids = view(ws.moe_recv_ids, R, 1);
    STRATA_RETURN_IF_ERROR(ops::upload(ctx, recv_expert.data(), rids));
    Tensor roff = view(ws.moe_recv_offsets, 1, El + 1), rperm = view(ws.moe_recv_perm, 1, R);
    Tensor grouped = view(ws.moe_x, R, H);  // h_perm has been sent
    STRATA_RETURN_IF_ERROR(ops::moe_offsets(ctx, rids, El, roff));
    STRATA_RETURN_IF_ERROR(ops::moe_permute(ctx, recv_x, rids, roff, grouped, rperm));
    const int64_t Fe = L.expert_gate_up[0].rows() / 2;
    Tensor ff = ws.moe_ff.dtype == DType::kF32 ? view(ws.moe_ff, R, 2 * Fe) : Tensor{};
    Tensor act = view(ws.moe_act, R, Fe);
    Tensor y_grouped = view(ws.moe_y, R, H);
    const ops::MoeExperts experts{L.expert_gate_up.data(), L.expert_down.data(), El, R};
    STRATA_RETURN_IF_ERROR(
        ops::moe_experts(ctx, grouped, roff, experts, c.activation, ff, act, y_grouped));
    // Back in arrival order: recv_y[i] = y_grouped[rperm[i]] (an exact copy, any dtype).
    STRATA_RETURN_IF_ERROR(ops::gather_rows(ctx, y_grouped, rperm, recv_y));
    // The upload's host array must outlive the copy.
    STRATA_RETURN_IF_ERROR(ops::synchronize(ctx));
  }

  // The outputs back to the rows' owners, combined per token into this rank's chunk.
  ops::section(ctx, "moe_combine");
  Tensor y_back = view(ws.moe_y, mc * k, H);
  STRATA_RETURN_IF_ERROR(
      blocks::group_all_to_all_v(ctx, group, recv_y, recv_rows.data(), y_back, send_rows.data()));
  if (mc > 0) {
    Tensor out = mine.slice_rows(0, mc);
    STRATA_RETURN_IF_ERROR(ops::moe_combine(ctx, y_back, rows.perm, rows.w, out, false));
  }
  return ok_status();
}

// The fixed-capacity exchange (model/moe_ep.h): the same rows, grouped the same way, through
// fixed-size device all-to-alls (nothing read on the host: graph-capturable).
Status chunk_experts_fixed(const Model& m, ForwardArgs& a, const LayerWeights& L, const Tensor& h,
                           const Tensor& ids, const Tensor& w, int64_t t0, int64_t t1, int64_t per,
                           Tensor& mine) {
  const ModelConfig& c = m.config();
  const ParallelConfig& par = m.parallel();
  const int ep = par.ep_size;
  const int64_t H = c.hidden, k = c.n_experts_used, mc = t1 - t0;
  const int64_t El = m.n_experts_local(), C = fixed_capacity(m, per);
  Workspace& ws = a.ws;
  ops::Context& ctx = a.ctx;
  EpExchange ex;
  ex.ep = ep;
  ex.experts_per_rank = El;
  ex.capacity = C;
  ex.counted = !env_config().moe_ep_no_counted;
  ex.fused = !env_config().moe_ep_no_fused;
  ex.send_x = view(ws.moe_ep_x, ep * C, H);
  ex.recv_x = view(ws.moe_ep_recv_x, ep * C, H);
  ex.offsets = view(ws.moe_recv_offsets, 1, El + 1);
  ex.y = view(ws.moe_ep_y, ep * C, H);
  ex.recv_y = view(ws.moe_ep_recv_y, ep * C, H);
  carve_ep_index(ex, static_cast<int32_t*>(ws.moe_ep_index.data), per * k, ctx.device);
  Tensor y_perm = view(ws.moe_y, mc * k, H);
  ex.y_back = y_perm;  // the fused combine writes the outputs straight here

  ops::section(ctx, "moe_dispatch");
  ChunkRows rows;
  STRATA_RETURN_IF_ERROR(group_chunk(m, a, h, ids, w, t0, t1, rows));
  STRATA_RETURN_IF_ERROR(ep_dispatch(ctx, *a.expert_comm, rows.h_perm, rows.offsets, ex));

  ops::section(ctx, "experts");
  const int64_t Fe = L.expert_gate_up[0].rows() / 2;
  Tensor ff = ws.moe_ep_ff.dtype == DType::kF32 ? view(ws.moe_ep_ff, ep * C, 2 * Fe) : Tensor{};
  Tensor act = view(ws.moe_ep_act, ep * C, Fe);
  // A local expert gets at most one row per token of the group's chunks.
  const ops::MoeExperts experts{L.expert_gate_up.data(), L.expert_down.data(), El, ep * per};
  STRATA_RETURN_IF_ERROR(
      ops::moe_experts(ctx, ex.grouped(), ex.offsets, experts, c.activation, ff, act, ex.y));

  ops::section(ctx, "moe_combine");
  STRATA_RETURN_IF_ERROR(ep_combine(ctx, *a.expert_comm, ex, y_perm));
  if (mc > 0) {
    Tensor out = mine.slice_rows(0, mc);
    STRATA_RETURN_IF_ERROR(ops::moe_combine(ctx, y_perm, rows.perm, rows.w, out, false));
  }
  return ok_status();
}

// The routed experts with expert parallelism (see the top of the file): x[0, n) += the
// combined expert outputs, computed by the expert-parallel group. h, ids, w: every token's
// normed input and routing, identical on every rank.
Status experts_parallel(const Model& m, ForwardArgs& a, const LayerWeights& L, const Tensor& h,
                        const Tensor& ids, const Tensor& w, Tensor& x) {
  const ModelConfig& c = m.config();
  const ParallelConfig& par = m.parallel();
  if (a.expert_comm == nullptr || a.expert_comm->size() != par.ep_size ||
      a.expert_comm->rank() != par.ep_rank) {
    return errorf(StatusCode::kInvalidArgument,
                  "expert-parallel rank {} of {} runs without its expert-parallel group",
                  par.ep_rank, par.ep_size);
  }
  Communicator& group = *a.expert_comm;
  const int ep = par.ep_size, tp = par.tp_size;
  const int64_t n = a.step.n_tokens, H = c.hidden, W = par.world_size();
  // PCC: this rank's chunk of the tokens.
  const int64_t per = (n + W - 1) / W, chunk = int64_t{par.tp_rank} * ep + par.ep_rank;
  const int64_t t0 = std::min(n, chunk * per), t1 = std::min(n, t0 + per);
  Workspace& ws = a.ws;
  ops::Context& ctx = a.ctx;
  Tensor mine = view(ws.y, per, H);
  if (fixed_exchange(m, a, per)) {
    STRATA_RETURN_IF_ERROR(chunk_experts_fixed(m, a, L, h, ids, w, t0, t1, per, mine));
  } else {
    STRATA_RETURN_IF_ERROR(chunk_experts_variable(m, a, L, h, ids, w, t0, t1, mine));
  }
  // Every rank's chunk (padded to `per` rows), in chunk order: the EP group's, then the TP group's.
  Tensor chunks = view(ws.moe_chunks, ep * per, H);
  STRATA_RETURN_IF_ERROR(group_all_gather(ctx, group, mine, chunks));
  Tensor all = chunks;
  if (tp > 1) {
    all = view(ws.moe_gathered, W * per, H);
    STRATA_RETURN_IF_ERROR(ops::all_gather(ctx, a.comm, chunks, all));
  }
  Tensor y = all.slice_rows(0, n);
  return ops::add(ctx, x, y, x);
}

}  // namespace

Status moe_layer(const Model& m, ForwardArgs& a, int64_t layer) {
  const ModelConfig& c = m.config();
  const LayerWeights& L = m.weights().layers[static_cast<size_t>(layer)];
  const int64_t n = a.step.n_tokens;
  Tensor x = blocks::rows(a.ws.x, n), h = blocks::rows(a.ws.h, n);
  const bool sliding = c.sliding_window > 0;
  if (m.parallel().tp_size == 1) {
    // One rank: the attention block as one op (fused on the CPU for a decode token).
    STRATA_RETURN_IF_ERROR(blocks::attention_block(m, a, layer, sliding));
    ops::section(a.ctx, "ffn_norm");
    STRATA_RETURN_IF_ERROR(ops::norm(a.ctx, x, L.ffn_norm, blocks::norm_args(c), h));
  } else {
    ops::section(a.ctx, "attn_norm");
    STRATA_RETURN_IF_ERROR(ops::norm(a.ctx, x, L.attn_norm, blocks::norm_args(c), h));
    STRATA_RETURN_IF_ERROR(blocks::self_attention(m, a, layer, sliding));
    ops::section(a.ctx, "o_proj");
    STRATA_RETURN_IF_ERROR(blocks::residual_linear_norm(m, a, blocks::rows(a.ws.attn, n), L.o,
                                                        L.ffn_norm, "ffn_norm"));
  }
  if (!c.layer_moe(layer)) {
    STRATA_RETURN_IF_ERROR(blocks::mlp_in(m, a, layer));
    ops::section(a.ctx, "down");
    return blocks::residual_linear(m, a, blocks::rows(a.ws.act, n).slice_cols(0, L.down.cols()),
                                   L.down);
  }

  const int64_t E = c.n_experts, k = c.n_experts_used;
  ops::section(a.ctx, "router");
  Tensor logits = view(a.ws.moe_logits, n, E);
  STRATA_RETURN_IF_ERROR(ops::linear(a.ctx, h, L.router, logits));
  Tensor ids = view(a.ws.moe_ids, n, k), w = view(a.ws.moe_w, n, k);
  ops::MoeRouteArgs route;
  route.k = k;
  route.renormalize = c.moe_renormalize;
  if (m.parallel().ep_size > 1) {
    STRATA_RETURN_IF_ERROR(ops::moe_route(a.ctx, logits, route, ids, w));
    STRATA_RETURN_IF_ERROR(trace_routes(a, ids, n * k));
    STRATA_RETURN_IF_ERROR(experts_parallel(m, a, L, h, ids, w, x));
  } else {
    ops::section(a.ctx, "moe_dispatch");
    STRATA_RETURN_IF_ERROR(experts_local(m, a, L, h, logits, route, ids, w, x));
  }
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
