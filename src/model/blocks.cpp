// The pieces every layer program shares (model/program.h), the workspace layout, and
// Model::forward, which runs a family's program over a layer range.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/moe_ep.h"
#include "model/program.h"
#include "parallel/comm.h"

namespace strata {

namespace blocks {

Tensor rows(const Tensor& t, int64_t n) {
  return t.slice_rows(0, n);
}

ops::NormArgs norm_args(const ModelConfig& c) {
  ops::NormArgs n;
  n.kind = c.norm == NormType::kLayerNorm ? NormKind::kLayer : NormKind::kRms;
  n.eps = c.norm_eps;
  n.weight_offset = c.norm_weight_offset;
  return n;
}

Status embed(const Model& m, ForwardArgs& a) {
  const ModelConfig& c = m.config();
  const ModelWeights& w = m.weights();
  const int64_t n = a.step.n_tokens;
  Tensor x = rows(a.ws.x, n);
  ops::section(a.ctx, "embedding");
  ops::EmbedArgs e;
  e.vocab_offset = m.vocab_range().begin;
  e.vocab = c.vocab;
  e.scale = c.embedding_scale;
  STRATA_RETURN_IF_ERROR(ops::embed(a.ctx, w.tok_embeddings, a.step.tokens, e, x));
  if (m.parallel().tp_size > 1) {
    ops::section(a.ctx, "all_reduce");
    STRATA_RETURN_IF_ERROR(ops::all_reduce(a.ctx, a.comm, x));
    ops::section(a.ctx, "embedding");
  }
  if (w.pos_embeddings.defined()) {
    ops::EmbedArgs pe;
    pe.vocab = w.pos_embeddings.dim(0);
    pe.accumulate = true;
    STRATA_RETURN_IF_ERROR(ops::embed(a.ctx, w.pos_embeddings, a.step.token_pos, pe, x));
  }
  return ok_status();
}

Status head(const Model& m, ForwardArgs& a) {
  const ModelConfig& c = m.config();
  const ModelWeights& w = m.weights();
  const HeadArgs& hd = a.head;
  const int64_t n_out = hd.n_out;
  ops::section(a.ctx, n_out == 0 ? nullptr : "lm_head");
  if (n_out == 0) return ok_status();
  // The rows that want logits: the first n_out tokens, or gathered runs of them.
  Tensor sel = rows(a.ws.x, n_out);
  if (!hd.all_rows) {
    if (hd.out_runs == nullptr) return Status(StatusCode::kInvalidArgument, "head: no out_runs");
    int64_t r = 0;
    for (const auto& [first, count] : *hd.out_runs) {
      Tensor dst = a.ws.sel.slice_rows(r, r + count);
      STRATA_RETURN_IF_ERROR(ops::copy(a.ctx, a.ws.x.slice_rows(first, first + count), dst));
      r += count;
    }
    sel = rows(a.ws.sel, n_out);
  }
  Tensor h = rows(a.ws.h, n_out);
  STRATA_RETURN_IF_ERROR(ops::norm(a.ctx, sel, w.final_norm, norm_args(c), h));
  Tensor logits = rows(a.ws.logits, n_out);
  const int tp = m.parallel().tp_size;
  if (tp == 1) {
    STRATA_RETURN_IF_ERROR(ops::linear(a.ctx, h, w.lm_head, logits));
  } else {
    // Each rank computes its vocabulary chunk (padded to the common chunk size); the all-gather
    // lays the chunks out rank-major [tp, n_out, chunk], copied into [n_out, vocab].
    const int64_t chunk = m.parallel().padded_chunk(c.vocab);
    const int64_t vl = m.vocab_local();
    Tensor local =
        Tensor::make(a.ws.logits_local.data, DType::kF32, {n_out, chunk}, a.ws.logits_local.device);
    if (vl > 0) {
      Tensor mine = local.slice_cols(0, vl);
      STRATA_RETURN_IF_ERROR(ops::linear(a.ctx, h, w.lm_head, mine));
    }
    Tensor all =
        Tensor::make(a.ws.gathered.data, DType::kF32, {tp * n_out, chunk}, a.ws.gathered.device);
    ops::section(a.ctx, "all_gather");
    STRATA_RETURN_IF_ERROR(ops::all_gather(a.ctx, a.comm, local, all));
    ops::section(a.ctx, "lm_head");
    for (int r = 0; r < tp; ++r) {
      const int64_t v0 = chunk * r, v1 = std::min(c.vocab, v0 + chunk);
      if (v1 <= v0) continue;
      Tensor src = all.slice_rows(r * n_out, (r + 1) * n_out).slice_cols(0, v1 - v0);
      Tensor dst = logits.slice_cols(v0, v1);
      STRATA_RETURN_IF_ERROR(ops::copy(a.ctx, src, dst));
    }
  }
  if (c.final_logit_softcap > 0.0f) {
    STRATA_RETURN_IF_ERROR(ops::softcap(a.ctx, logits, c.final_logit_softcap));
  }
  if (hd.argmax) {
    Tensor ids = rows(a.ws.ids, n_out);
    STRATA_RETURN_IF_ERROR(ops::argmax(a.ctx, logits, ids));
  }
  ops::section(a.ctx, nullptr);
  return ok_status();
}

ops::RopeArgs rope_args(const Model& m, int64_t layer, bool sliding) {
  const ModelConfig& c = m.config();
  const ModelWeights& w = m.weights();
  const LayerWeights& L = w.layers[static_cast<size_t>(layer)];
  ops::RopeArgs r;
  if (c.pos_embedding == PosEmbedding::kRope) {
    r.inv_freq = sliding && w.inv_freq_local.defined() ? &w.inv_freq_local : &w.inv_freq;
    r.rotary_dim = c.rotary_dim;
  }
  r.neox_style = c.rope_neox_style;
  if (L.q_norm.defined() && !c.qk_norm_full) r.q_norm = &L.q_norm;
  if (L.k_norm.defined() && !c.qk_norm_full) r.k_norm = &L.k_norm;
  r.norm_eps = c.norm_eps;
  r.norm_weight_offset = c.norm_weight_offset;
  return r;
}

ops::AttentionArgs attention_args(const Model& m, const ForwardArgs& a, bool sliding) {
  const ModelConfig& c = m.config();
  ops::AttentionArgs at;
  at.scale = c.attn_scale > 0.0f ? c.attn_scale : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  at.sliding_window = sliding ? c.sliding_window : 0;
  at.logit_softcap = c.attn_logit_softcap;
  at.workspace = a.ws.attn_ws;
  return at;
}

Status self_attention(const Model& m, ForwardArgs& a, int64_t layer, bool sliding) {
  if (m.parallel().attn_layout == AttnLayout::kBatchSharded) {
    return batch_sharded_attention(m, a, layer, sliding);
  }
  const ModelConfig& c = m.config();
  const LayerWeights& L = m.weights().layers[static_cast<size_t>(layer)];
  const int64_t n = a.step.n_tokens, D = c.head_dim;
  ops::section(a.ctx, "qkv");
  Tensor h = rows(a.ws.h, n);
  Tensor qkv = rows(a.ws.qkv, n);
  STRATA_RETURN_IF_ERROR(ops::linear(a.ctx, h, L.qkv, qkv));
  if (c.qk_norm_full) {
    // OLMoE: RMSNorm over the whole q and k projections (in place in the qkv rows).
    ops::section(a.ctx, "qk_norm");
    const int64_t Q = m.n_heads_local() * D, KV = m.n_heads_kv_local() * D;
    Tensor q_all = qkv.slice_cols(0, Q), k_all = qkv.slice_cols(Q, Q + KV);
    STRATA_RETURN_IF_ERROR(ops::norm(a.ctx, q_all, L.q_norm, norm_args(c), q_all));
    STRATA_RETURN_IF_ERROR(ops::norm(a.ctx, k_all, L.k_norm, norm_args(c), k_all));
  }
  ops::section(a.ctx, "rope_kv");
  Tensor q = Tensor::make(a.ws.q.data, a.ws.q.dtype, {n, m.n_heads_local(), D}, a.ws.q.device);
  ops::KvLayer& cache = a.kv[static_cast<size_t>(layer)];
  STRATA_RETURN_IF_ERROR(
      ops::rope_kv_append(a.ctx, qkv, a.step, rope_args(m, layer, sliding), cache, q));
  ops::section(a.ctx, "attention");
  Tensor attn = rows(a.ws.attn, n);
  return ops::attention(a.ctx, q, a.step, cache, attention_args(m, a, sliding), attn);
}

Status attention_block(const Model& m, ForwardArgs& a, int64_t layer, bool sliding) {
  const ModelConfig& c = m.config();
  const LayerWeights& L = m.weights().layers[static_cast<size_t>(layer)];
  const int64_t n = a.step.n_tokens;
  Tensor x = rows(a.ws.x, n), h = rows(a.ws.h, n);
  if (m.parallel().attn_layout == AttnLayout::kBatchSharded || c.qk_norm_full) {
    ops::section(a.ctx, "attn_norm");
    STRATA_RETURN_IF_ERROR(ops::norm(a.ctx, x, L.attn_norm, norm_args(c), h));
    STRATA_RETURN_IF_ERROR(self_attention(m, a, layer, sliding));
    ops::section(a.ctx, "o_proj");
    return residual_linear(m, a, rows(a.ws.attn, n), L.o);
  }
  ops::section(a.ctx, "attn_block");
  Tensor qkv = rows(a.ws.qkv, n), attn = rows(a.ws.attn, n);
  Tensor q =
      Tensor::make(a.ws.q.data, a.ws.q.dtype, {n, m.n_heads_local(), c.head_dim}, a.ws.q.device);
  ops::AttentionBlockArgs b;
  b.norm = &L.attn_norm;
  b.norm_args = norm_args(c);
  b.qkv = &L.qkv;
  b.rope = rope_args(m, layer, sliding);
  b.attn = attention_args(m, a, sliding);
  b.o = &L.o;
  return ops::attention_block(a.ctx, x, a.step, b, a.kv[static_cast<size_t>(layer)], h, qkv, q,
                              attn);
}

Status mlp_in(const Model& m, ForwardArgs& a, int64_t layer) {
  const ModelConfig& c = m.config();
  const LayerWeights& L = m.weights().layers[static_cast<size_t>(layer)];
  const int64_t n = a.step.n_tokens;
  ops::section(a.ctx, "gate_up_act");
  Tensor h = rows(a.ws.h, n), ff = rows(a.ws.ff, n);
  // The activation's width is the weight's (the workspace may be wider: a MoE model's shared
  // expert).
  const int64_t F = c.gated_mlp ? L.gate_up.rows() / 2 : L.gate_up.rows();
  Tensor act = rows(a.ws.act, n).slice_cols(0, F);
  return ops::linear_act(a.ctx, h, L.gate_up, c.activation, c.gated_mlp, ff, act);
}

Status ffn(const Model& m, ForwardArgs& a, int64_t layer) {
  const ModelConfig& c = m.config();
  const LayerWeights& L = m.weights().layers[static_cast<size_t>(layer)];
  const int64_t n = a.step.n_tokens;
  ops::section(a.ctx, "ffn");
  Tensor x = rows(a.ws.x, n), h = rows(a.ws.h, n), ff = rows(a.ws.ff, n);
  const int64_t F = c.gated_mlp ? L.gate_up.rows() / 2 : L.gate_up.rows();
  Tensor act = rows(a.ws.act, n).slice_cols(0, F);
  ops::FfnArgs f;
  f.norm = &L.ffn_norm;
  f.norm_args = norm_args(c);
  f.w_in = &L.gate_up;
  f.down = &L.down;
  f.act = c.activation;
  f.gated = c.gated_mlp;
  return ops::ffn(a.ctx, x, f, h, ff, act);
}

Status residual_linear(const Model& m, ForwardArgs& a, const Tensor& in,
                       const ops::LinearWeight& w) {
  const int64_t n = a.step.n_tokens;
  Tensor x = rows(a.ws.x, n);
  if (m.parallel().tp_size == 1) {
    ops::LinearArgs la;
    la.accumulate = true;
    return ops::linear(a.ctx, in, w, x, la);
  }
  // Partial sums of a row-parallel layer: reduced first, the bias added once.
  Tensor y = rows(a.ws.y, n);
  ops::LinearArgs la;
  la.bias = false;
  STRATA_RETURN_IF_ERROR(ops::linear(a.ctx, in, w, y, la));
  ops::section(a.ctx, "all_reduce");
  STRATA_RETURN_IF_ERROR(ops::all_reduce(a.ctx, a.comm, y));
  ops::section(a.ctx, "residual_add");
  if (w.parts[0].bias.defined()) STRATA_RETURN_IF_ERROR(ops::add_bias(a.ctx, y, w.parts[0].bias));
  return ops::add(a.ctx, x, y, x);
}

Status residual_linear_norm(const Model& m, ForwardArgs& a, const Tensor& in,
                            const ops::LinearWeight& w, const ops::NormWeight& next,
                            const char* norm_section) {
  const int64_t n = a.step.n_tokens;
  Tensor x = rows(a.ws.x, n), h = rows(a.ws.h, n);
  if (m.parallel().tp_size == 1) {
    STRATA_RETURN_IF_ERROR(residual_linear(m, a, in, w));
    ops::section(a.ctx, norm_section);
    return ops::norm(a.ctx, x, next, norm_args(m.config()), h);
  }
  Tensor y = rows(a.ws.y, n);
  ops::LinearArgs la;
  la.bias = false;
  STRATA_RETURN_IF_ERROR(ops::linear(a.ctx, in, w, y, la));
  ops::section(a.ctx, "all_reduce");
  const Tensor* bias = w.parts[0].bias.defined() ? &w.parts[0].bias : nullptr;
  return ops::all_reduce_add_norm(a.ctx, a.comm, y, bias, x, next, norm_args(m.config()), h);
}

// On the tensors directly where the communicator takes the device's memory (host memory; NCCL;
// the in-process group with its device state, whose ranks copy from each other's buffers), else
// staged through host memory: the rows go down to the host, through the group's host
// all_to_all_v and back up, with a stream synchronization each way (never a device-wide one: a
// peer may be inside a device collective, parallel/inproc_comm.h). Eager only: nothing here can
// be captured in a CUDA graph.
Status group_all_to_all_v(ops::Context& ctx, Communicator& comm, const Tensor& send,
                          const int64_t* send_rows, Tensor& recv, const int64_t* recv_rows) {
  if (comm.supports(ctx.device)) {
    return ops::all_to_all_v(ctx, comm, send, send_rows, recv, recv_rows);
  }
  const int n = comm.size();
  const int64_t row_bytes = dtype_bytes(send.dtype, send.cols());
  int64_t s_total = 0, r_total = 0;
  std::vector<int64_t> sc(static_cast<size_t>(n)), so(static_cast<size_t>(n)),
      rc(static_cast<size_t>(n)), ro(static_cast<size_t>(n));
  for (size_t r = 0; r < static_cast<size_t>(n); ++r) {
    so[r] = s_total * row_bytes;
    sc[r] = send_rows[r] * row_bytes;
    ro[r] = r_total * row_bytes;
    rc[r] = recv_rows[r] * row_bytes;
    s_total += send_rows[r];
    r_total += recv_rows[r];
  }
  std::vector<uint8_t> hs(static_cast<size_t>(s_total * row_bytes)),
      hr(static_cast<size_t>(r_total * row_bytes));
  if (s_total > 0) {
    STRATA_RETURN_IF_ERROR(ops::download(ctx, send.slice_rows(0, s_total), hs.data()));
    STRATA_RETURN_IF_ERROR(ops::synchronize(ctx));
  }
  STRATA_RETURN_IF_ERROR(comm.all_to_all_v(hs.data(), sc.data(), so.data(), hr.data(), rc.data(),
                                           ro.data(), DType::kU8, CommStream::host()));
  if (r_total > 0) {
    Tensor dst = recv.slice_rows(0, r_total);
    STRATA_RETURN_IF_ERROR(ops::upload(ctx, hr.data(), dst));
    STRATA_RETURN_IF_ERROR(ops::synchronize(ctx));
  }
  return ok_status();
}

}  // namespace blocks

const LayerProgram& layer_program(ArchFamily family) {
  static const LayerProgram kLlama{"llama", llama_layer};
  static const LayerProgram kGemma3{"gemma3", gemma3_layer};
  static const LayerProgram kGpt2{"gpt2", gpt2_layer};
  static const LayerProgram kNeoX{"gpt-neox", neox_layer};
  static const LayerProgram kMoe{"moe", moe_layer};
  switch (family) {
    case ArchFamily::kLlama:
      return kLlama;
    case ArchFamily::kGemma3:
      return kGemma3;
    case ArchFamily::kGpt2:
      return kGpt2;
    case ArchFamily::kGptNeoX:
      return kNeoX;
    case ArchFamily::kMoe:
      return kMoe;
  }
  return kLlama;
}

// ---- the workspace ----------------------------------------------------------------------------

namespace {

struct Slot {
  Tensor Workspace::*field;
  DType dtype;
  std::vector<int64_t> shape;
};

// The dtype the FFN weights are stored in (the weight-gathered layout's scratch holds them).
DType ffn_weight_dtype(const Model& m) {
  for (const LayerWeights& L : m.weights().layers) {
    if (L.gate_up.defined()) return L.gate_up.parts[0].w.dtype;
  }
  return DType::kF32;
}

std::vector<Slot> workspace_slots(const Model& m, const WorkspaceLimits& l) {
  const ModelConfig& c = m.config();
  const int64_t T = std::max<int64_t>(1, l.max_tokens), R = std::max<int64_t>(1, l.max_logit_rows);
  const int64_t H = c.hidden, D = c.head_dim, hq = m.n_heads_local();
  const int64_t F = std::max(m.ffn_local(), c.shared_expert_ffn_dim);
  const int tp = m.parallel().tp_size;
  const int64_t chunk = m.parallel().padded_chunk(c.vocab);
  // The QKV GEMM's output, in both layouts (ops::rope_kv_append reads f32 projections).
  const DType qkv_dt = DType::kF32;
  std::vector<Slot> s = {
      {&Workspace::x, DType::kF32, {T, H}},   {&Workspace::y, DType::kF32, {T, H}},
      {&Workspace::h, l.act, {T, H}},         {&Workspace::qkv, qkv_dt, {T, m.qkv_dim()}},
      {&Workspace::q, l.act, {T, hq, D}},     {&Workspace::attn, l.act, {T, hq * D}},
      {&Workspace::ff, l.act, {T, 2 * F}},    {&Workspace::act, l.act, {T, F}},
      {&Workspace::sel, DType::kF32, {R, H}}, {&Workspace::logits, DType::kF32, {R, c.vocab}},
      {&Workspace::ids, DType::kI32, {R}},
  };
  if (c.is_moe()) {
    const int64_t E = c.n_experts, K = c.n_experts_used;
    // The device layout's experts are padded (expert_ffn_padded); the reference's are not.
    const int64_t Fl = m.expert_ffn_local();
    const int64_t Fe = l.act == DType::kBF16 ? expert_ffn_padded(Fl) : Fl;
    s.push_back({&Workspace::moe_logits, DType::kF32, {T, E}});
    s.push_back({&Workspace::moe_ids, DType::kI32, {T, K}});
    s.push_back({&Workspace::moe_w, DType::kF32, {T, K}});
    s.push_back({&Workspace::moe_offsets, DType::kI32, {E + 1}});
    s.push_back({&Workspace::moe_perm, DType::kI32, {T * K}});
    s.push_back({&Workspace::moe_x, l.act, {T * K, H}});
    // The device layout's expert kernels fuse SiLU * up into the gate/up GEMM: no scratch.
    const int64_t ff_rows = l.act == DType::kBF16 ? 1 : T * K;
    s.push_back({&Workspace::moe_ff, l.act, {ff_rows, 2 * Fe}});
    s.push_back({&Workspace::moe_act, l.act, {T * K, Fe}});
    // Expert outputs in the activation dtype: bf16 on the device layout (rounded once, as every
    // layout and parallelism rounds them; half the bytes of the expert-parallel exchange).
    s.push_back({&Workspace::moe_y, l.act, {T * K, H}});
    s.push_back({&Workspace::moe_gate, DType::kF32, {T, 1}});
    const int ep = m.parallel().ep_size;
    if (ep > 1) {
      // Expert parallelism (model/moe.cpp): the rows received from the group, their local
      // expert ids, unit weights and grouping, the expert outputs in arrival order, and the
      // gathered chunks of the layer output (padded: every rank's chunk has the same size).
      const int64_t W = m.parallel().world_size(), Tp = (T + W - 1) / W * W;
      s.push_back({&Workspace::moe_recv_x, l.act, {T * K, H}});
      s.push_back({&Workspace::moe_recv_y, l.act, {T * K, H}});
      s.push_back({&Workspace::moe_recv_ids, DType::kI32, {T * K, 1}});
      s.push_back({&Workspace::moe_recv_perm, DType::kI32, {T * K}});
      s.push_back({&Workspace::moe_recv_offsets, DType::kI32, {E + 1}});
      s.push_back({&Workspace::moe_chunks, DType::kF32, {Tp, H}});
      s.push_back({&Workspace::moe_gathered, DType::kF32, {Tp, H}});
      if (l.ep_fixed_tokens > 0) {
        const int64_t El = E / ep, P = (std::min(l.ep_fixed_tokens, T) + W - 1) / W;
        const int64_t C = P * std::min(K, El), rows = ep * C;
        s.push_back({&Workspace::moe_ep_x, l.act, {rows, H}});
        s.push_back({&Workspace::moe_ep_recv_x, l.act, {rows, H}});
        s.push_back({&Workspace::moe_ep_y, l.act, {rows, H}});
        s.push_back({&Workspace::moe_ep_recv_y, l.act, {rows, H}});
        s.push_back({&Workspace::moe_ep_act, l.act, {rows, Fe}});
        s.push_back({&Workspace::moe_ep_ff, l.act, {l.act == DType::kBF16 ? 1 : rows, 2 * Fe}});
        s.push_back({&Workspace::moe_ep_index, DType::kI32, {ep_index_entries(ep, El, C, P * K)}});
      }
    }
  }
  const FfnLayout ffn_layout = m.parallel().ffn_layout;
  if (m.parallel().gathers_ffn()) {
    // Weight-gathered FFN (model/ffn_layouts.cpp): P tokens per rank, the layer's whole FFN.
    const int64_t N = tp, P = (T + N - 1) / N, F = c.ffn_dim;
    const DType wdt = ffn_weight_dtype(m);
    s.push_back({&Workspace::ffn_tokens, DType::kF32, {N * P, H}});
    s.push_back({&Workspace::ffn_x, DType::kF32, {P, H}});
    s.push_back({&Workspace::ffn_ff, l.act, {P, 2 * F}});
    s.push_back({&Workspace::ffn_act, l.act, {P, F}});
    s.push_back({&Workspace::ffn_w_in, wdt, {2 * F, H}});
    s.push_back({&Workspace::ffn_w_out, wdt, {H, F}});
    s.push_back({&Workspace::ffn_w_send, wdt, {H, F / N}});
    s.push_back({&Workspace::ffn_w_recv, wdt, {N * H, F / N}});
  } else if (ffn_layout == FfnLayout::k2D) {
    s.push_back({&Workspace::ffn_tokens, DType::kF32, {T, H}});  // the X group's hidden slices
    // The gate/up partial sums, reduced over X in f32 (then activated to act's dtype).
    const int64_t gu = c.gated_mlp ? 2 * m.ffn_local() : m.ffn_local();
    s.push_back({&Workspace::ffn_ff, DType::kF32, {T, gu}});
  }
  if (m.parallel().attn_layout == AttnLayout::kBatchSharded) {
    // Batch-sharded attention (model/attn_layouts.cpp): the projections' rows move in qkv's
    // dtype, the attention output in the activations'.
    const int64_t N = tp, Wl = m.qkv_dim(), Wf = (c.n_heads + 2 * c.n_heads_kv) * D;
    s.push_back({&Workspace::bsa_send, qkv_dt, {T, Wl}});
    s.push_back({&Workspace::bsa_recv, qkv_dt, {N * T, Wl}});
    s.push_back({&Workspace::bsa_qkv, qkv_dt, {T, Wf}});
    s.push_back({&Workspace::bsa_q, l.act, {T, c.n_heads, D}});
    s.push_back({&Workspace::bsa_attn, l.act, {T, c.n_heads * D}});
    s.push_back({&Workspace::bsa_out_send, l.act, {N * T, hq * D}});
    s.push_back({&Workspace::bsa_out_recv, l.act, {T, hq * D}});
  }
  if (tp > 1) {
    s.push_back({&Workspace::logits_local, DType::kF32, {R, chunk}});
    s.push_back({&Workspace::gathered, DType::kF32, {tp * R, chunk}});
  }
  if (l.attn_workspace_bytes > 0) {
    s.push_back({&Workspace::attn_ws, DType::kU8, {static_cast<int64_t>(l.attn_workspace_bytes)}});
  }
  return s;
}

size_t slot_bytes(const Slot& s) {
  int64_t n = 1;
  for (int64_t d : s.shape) n *= d;
  return (static_cast<size_t>(dtype_bytes(s.dtype, n)) + 255) / 256 * 256;
}

}  // namespace

size_t Model::workspace_bytes(const WorkspaceLimits& limits) const {
  size_t total = 0;
  for (const Slot& s : workspace_slots(*this, limits)) total += slot_bytes(s);
  return total;
}

Workspace Model::bind_workspace(const WorkspaceLimits& limits, void* base, Device device) const {
  Workspace ws;
  char* p = static_cast<char*>(base);
  for (const Slot& s : workspace_slots(*this, limits)) {
    Tensor t;
    t.data = p;
    t.dtype = s.dtype;
    t.ndim = static_cast<int>(s.shape.size());
    int64_t stride = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      t.shape[static_cast<size_t>(i)] = s.shape[static_cast<size_t>(i)];
      t.stride[static_cast<size_t>(i)] = stride;
      stride *= s.shape[static_cast<size_t>(i)];
    }
    t.device = device;
    ws.*(s.field) = t;
    p += slot_bytes(s);
  }
  return ws;
}

// ---- the forward pass -------------------------------------------------------------------------

Status Model::forward(ForwardArgs& a) const {
  const int64_t L = config_.n_layers;
  const int64_t first = a.first_layer, last = a.last_layer < 0 ? L : a.last_layer;
  if (first < 0 || first > last || last > L) {
    return errorf(StatusCode::kInvalidArgument, "forward: layer range [{}, {}) of {} layers", first,
                  last, L);
  }
  if (static_cast<int64_t>(a.kv.size()) < last) {
    return errorf(StatusCode::kInvalidArgument, "forward: {} KV layers for layer {}", a.kv.size(),
                  last - 1);
  }
  if (a.step.n_tokens == 0) return ok_status();
  const LayerProgram& program = layer_program(config_.family);
  if (first == 0) STRATA_RETURN_IF_ERROR(blocks::embed(*this, a));
  if (a.weights != nullptr) STRATA_RETURN_IF_ERROR(a.weights->begin_pass(first, last));
  for (int64_t l = first; l < last; ++l) {
    if (a.weights != nullptr) STRATA_RETURN_IF_ERROR(a.weights->before_layer(l));
    STRATA_RETURN_IF_ERROR(program.layer(*this, a, l));
    if (a.weights != nullptr) STRATA_RETURN_IF_ERROR(a.weights->after_layer(l));
  }
  if (last == L) STRATA_RETURN_IF_ERROR(blocks::head(*this, a));
  return ok_status();
}

}  // namespace strata
