// Weight loading and tensor-parallel sharding for every family. The checkpoint's tensor names
// are mapped to the typed ModelWeights fields here, once per family; shards are views into
// the memory-mapped checkpoint wherever the layout allows (row slices of column-parallel
// weights, strided column slices of row-parallel weights). Copies are made only where the
// checkpoint's layout differs from ours: GPT-2's Conv1D [in, out] weights (transposed) and
// GPT-NeoX's per-head interleaved QKV (de-interleaved).
#include <cstring>

#include "core/log.h"
#include "core/status.h"
#include "model/model.h"
#include "model/rope.h"

namespace strata {

namespace {

int64_t elem_bytes(DType dt) {
  return dtype_bytes(dt, 1);
}

// Fetch a tensor and check its shape.
Result<Tensor> fetch(const TensorSource& src, const std::string& name,
                     std::initializer_list<int64_t> shape) {
  STRATA_ASSIGN_OR_RETURN(Tensor t, src.tensor(name));
  bool match = t.ndim == static_cast<int>(shape.size());
  int i = 0;
  for (int64_t d : shape) {
    if (!match) break;
    match = t.shape[static_cast<size_t>(i++)] == d;
  }
  if (!match) {
    std::string want = "[";
    for (int64_t d : shape) want += (want.size() > 1 ? ", " : "") + std::to_string(d);
    return errorf(StatusCode::kInvalidArgument, "{}: tensor '{}' has shape {}, expected {}]",
                  src.describe(), name, t.shape_string(), want);
  }
  const DTypeInfo& info = dtype_info(t.dtype);
  if (!info.is_float && !info.is_quantized) {
    return errorf(StatusCode::kUnimplemented, "{}: tensor '{}' has dtype {}, not a float type",
                  src.describe(), name, info.name);
  }
  return t;
}

}  // namespace

Status Model::check_ffn_layout(const std::string& where) const {
  const ModelConfig& c = config_;
  const ParallelConfig& par = par_;
  if (par.ffn_layout == FfnLayout::k1D && !par.gathers_ffn()) return ok_status();
  // The weight-gathered prefill of --ffn-gather-min-tokens has weight-gathered's constraints.
  const char* name = par.ffn_layout == FfnLayout::k1D ? "1d --ffn-gather-min-tokens"
                                                      : ffn_layout_name(par.ffn_layout);
  if (c.family != ArchFamily::kLlama) {
    return errorf(StatusCode::kUnimplemented,
                  "{}: --ffn-layout {} is built for the Llama family (Llama, Mistral, Qwen2) "
                  "only, not {} yet",
                  where, name, c.architecture);
  }
  if (c.is_moe()) {
    return errorf(StatusCode::kUnimplemented,
                  "{}: --ffn-layout {} with mixture-of-experts layers is not built yet", where,
                  name);
  }
  if (par.pp_size > 1 || par.ep_size > 1) {
    return errorf(StatusCode::kUnimplemented,
                  "{}: --ffn-layout {} with pipeline or expert parallelism is not built yet", where,
                  name);
  }
  if (par.gathers_ffn()) {
    if (c.mlp_bias) {
      return errorf(StatusCode::kUnimplemented,
                    "{}: --ffn-layout {} with MLP biases is not built yet", where, name);
    }
    return ok_status();
  }
  const int n = par.tp_size, x = par.grid_x();
  if (x < 2 || n % x != 0 || n / x < 2) {
    if (par.ws2d_x > 0) {
      return errorf(StatusCode::kInvalidArgument,
                    "--ffn-layout 2d: --ffn-2d-x {} does not split tensor-parallel size {} into "
                    "X x Y with X, Y >= 2",
                    par.ws2d_x, n);
    }
    return errorf(StatusCode::kInvalidArgument,
                  "--ffn-layout 2d needs a tensor-parallel size that factors as X x Y with X, Y "
                  ">= 2 (4, 6, 8, ...), not {}",
                  n);
  }
  const int y = n / x;
  if (c.hidden % x != 0 || c.ffn_dim % y != 0) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: --ffn-layout 2d grid {} x {}: hidden size {} must be a multiple of X = {} "
                  "and intermediate size {} of Y = {}",
                  where, x, y, c.hidden, x, c.ffn_dim, y);
  }
  return ok_status();
}

Status Model::check_attn_layout(const std::string& where) const {
  const ModelConfig& c = config_;
  const ParallelConfig& par = par_;
  if (par.attn_layout == AttnLayout::kHeadSharded) return ok_status();
  if (c.family != ArchFamily::kLlama || c.is_moe()) {
    return errorf(StatusCode::kUnimplemented,
                  "{}: --attn-layout batch-sharded is built for the dense Llama family (Llama, "
                  "Mistral, Qwen2) only, not {} yet",
                  where, c.architecture);
  }
  if (par.pp_size > 1 || par.ep_size > 1) {
    return errorf(StatusCode::kUnimplemented,
                  "{}: --attn-layout batch-sharded with pipeline or expert parallelism is not "
                  "built yet",
                  where);
  }
  return ok_status();
}

Status Model::init_shapes() {
  const ModelConfig& c = config_;
  const ParallelConfig& par = par_;
  const int tp = par.tp_size;
  const std::string where = store_.source() ? store_.source()->describe() : c.architecture;
  if (tp < 1 || par.tp_rank < 0 || par.tp_rank >= tp) {
    return errorf(StatusCode::kInvalidArgument, "invalid tensor-parallel rank {} of {}",
                  par.tp_rank, tp);
  }
  STRATA_RETURN_IF_ERROR(check_ffn_layout(where));
  STRATA_RETURN_IF_ERROR(check_attn_layout(where));
  if (c.n_heads % tp != 0) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: {} attention heads cannot be split over tensor-parallel size {}", where,
                  c.n_heads, tp);
  }
  if (c.n_heads_kv % tp != 0 && tp % c.n_heads_kv != 0) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: {} KV heads cannot be split or replicated over tensor-parallel size {}",
                  where, c.n_heads_kv, tp);
  }
  if (c.ffn_dim % tp != 0 && par.ffn_layout != FfnLayout::k2D) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: intermediate size {} cannot be split over tensor-parallel size {}", where,
                  c.ffn_dim, tp);
  }
  const int ep = par.ep_size;
  if (ep < 1 || par.ep_rank < 0 || par.ep_rank >= ep) {
    return errorf(StatusCode::kInvalidArgument, "invalid expert-parallel rank {} of {}",
                  par.ep_rank, ep);
  }
  if (ep > 1 && !c.is_moe()) {
    return errorf(
        StatusCode::kInvalidArgument,
        "{}: expert-parallel size {} needs a mixture-of-experts model ({} has no experts)", where,
        ep, c.architecture);
  }
  if (c.is_moe() && c.n_experts % ep != 0) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: {} experts cannot be split over expert-parallel size {} (the number of "
                  "experts must be a multiple of it)",
                  where, c.n_experts, ep);
  }
  if (c.is_moe() && ep == 1 && c.expert_ffn_dim % tp != 0) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: expert intermediate size {} cannot be sliced over tensor-parallel size {}",
                  where, c.expert_ffn_dim, tp);
  }
  if (c.is_moe()) {
    expert_range_ = par.expert_shard(c.n_experts);
    expert_ffn_range_ = par.expert_ffn_shard(c.expert_ffn_dim);
  }
  n_heads_local_ = c.n_heads / tp;
  n_kv_local_ = c.n_heads_kv >= tp ? c.n_heads_kv / tp : 1;
  ffn_local_ = par.ffn_layout == FfnLayout::k2D ? c.ffn_dim / par.grid_y() : c.ffn_dim / tp;
  vocab_range_ = par.padded_shard(c.vocab);
  return ok_status();
}

Result<std::unique_ptr<Model>> Model::load(const ModelConfig& config, const ParallelConfig& par,
                                           std::shared_ptr<TensorSource> source) {
  std::unique_ptr<Model> m(new Model());
  m->config_ = config;
  m->par_ = par;
  m->store_ = WeightStore(std::move(source));
  m->device_ = Device::cpu();
  STRATA_RETURN_IF_ERROR(m->init_shapes());
  const ModelConfig& c = m->config_;
  auto host_f32 = [&](const std::vector<float>& v) -> Result<Tensor> {
    STRATA_ASSIGN_OR_RETURN(Buffer b, allocate_host(v.size() * sizeof(float)));
    std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
    Tensor t =
        Tensor::make(m->store_.keep(std::move(b)), DType::kF32, {static_cast<int64_t>(v.size())});
    return t;
  };
  if (c.pos_embedding == PosEmbedding::kRope && c.rotary_dim > 0) {
    STRATA_ASSIGN_OR_RETURN(m->w_.inv_freq,
                            host_f32(rope_inv_freq(c.rotary_dim, c.rope_theta, c.rope_scaling)));
    if (c.family == ArchFamily::kGemma3) {
      STRATA_ASSIGN_OR_RETURN(
          m->w_.inv_freq_local,
          host_f32(rope_inv_freq(c.rotary_dim, c.rope_theta_local, RopeScaling{})));
    }
  }
  STRATA_RETURN_IF_ERROR(m->load_weights());
  return m;
}

Status Model::load_weights() {
  const ModelConfig& c = config_;
  const TensorSource& src = *store_.source();
  const int64_t H = c.hidden, D = c.head_dim;
  const ShardRange heads = par_.even_shard(c.n_heads);
  const ShardRange ffn = par_.even_shard(c.ffn_dim);
  ShardRange kv_heads;
  if (c.n_heads_kv >= par_.tp_size) {
    kv_heads = par_.even_shard(c.n_heads_kv);
  } else {  // fewer KV heads than ranks: each rank keeps a copy of the one its queries use
    const int64_t h = par_.tp_rank / (par_.tp_size / c.n_heads_kv);
    kv_heads = {h, h + 1};
  }
  const ShardRange q_rows{heads.begin * D, heads.end * D};
  const ShardRange kv_rows{kv_heads.begin * D, kv_heads.end * D};

  auto own = [&](DType dt, std::initializer_list<int64_t> shape) -> Result<Tensor> {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    STRATA_ASSIGN_OR_RETURN(Buffer b, allocate_host(static_cast<size_t>(dtype_bytes(dt, n))));
    return Tensor::make(store_.keep(std::move(b)), dt, shape);
  };
  // Copy rows [r0, r1) of a contiguous plain-typed tensor into `dst` starting at row dst_row.
  auto copy_rows = [](const Tensor& from, int64_t r0, int64_t r1, Tensor& dst, int64_t dst_row) {
    const int64_t row_bytes = dtype_bytes(from.dtype, from.cols());
    std::memcpy(static_cast<char*>(dst.data) + dst_row * row_bytes,
                static_cast<const char*>(from.data) + r0 * row_bytes,
                static_cast<size_t>((r1 - r0) * row_bytes));
  };
  // Conv1D weight [in, out]: columns [c0, c1) transposed into an owned [c1 - c0, in].
  auto transpose_cols = [&](const Tensor& conv, int64_t c0, int64_t c1) -> Result<Tensor> {
    if (dtype_info(conv.dtype).is_quantized) {
      return errorf(StatusCode::kUnimplemented, "quantized Conv1D weights are not supported");
    }
    const int64_t in = conv.shape[0], out = conv.shape[1], eb = elem_bytes(conv.dtype);
    STRATA_ASSIGN_OR_RETURN(Tensor t, own(conv.dtype, {c1 - c0, in}));
    const char* s = static_cast<const char*>(conv.data);
    char* d = static_cast<char*>(t.data);
    for (int64_t i = 0; i < in; ++i) {
      for (int64_t j = c0; j < c1; ++j) {
        std::memcpy(d + ((j - c0) * in + i) * eb, s + (i * out + j) * eb, static_cast<size_t>(eb));
      }
    }
    return t;
  };
  auto opt = [&](const std::string& name, std::initializer_list<int64_t> shape,
                 bool wanted) -> Result<Tensor> {
    if (!wanted) return Tensor{};
    return fetch(src, name, shape);
  };

  // A norm weight as f32 (the f32 rope path reads q/k norms as f32).
  auto f32_norm = [&](const std::string& name, int64_t n) -> Result<Tensor> {
    STRATA_ASSIGN_OR_RETURN(Tensor t, fetch(src, name, {n}));
    if (t.dtype == DType::kF32) return t;
    STRATA_ASSIGN_OR_RETURN(Tensor f, own(DType::kF32, {n}));
    STRATA_RETURN_IF_ERROR(ops::host_to_f32(t, static_cast<float*>(f.data)));
    return f;
  };

  w_.layers.resize(static_cast<size_t>(c.n_layers));
  switch (c.family) {
    case ArchFamily::kLlama:
    case ArchFamily::kGemma3:
    case ArchFamily::kMoe: {
      const int64_t Q = c.n_heads * D, KV = c.n_heads_kv * D;
      STRATA_ASSIGN_OR_RETURN(Tensor emb, fetch(src, "model.embed_tokens.weight", {c.vocab, H}));
      w_.tok_embeddings = emb.slice_rows(vocab_range_.begin, vocab_range_.end);
      for (int64_t l = 0; l < c.n_layers; ++l) {
        if (!par_.has_layer(l)) continue;  // another pipeline stage's layer
        LayerWeights& L = w_.layers[static_cast<size_t>(l)];
        const std::string p = "model.layers." + std::to_string(l) + ".";
        STRATA_ASSIGN_OR_RETURN(L.attn_norm.w, fetch(src, p + "input_layernorm.weight", {H}));
        STRATA_ASSIGN_OR_RETURN(Tensor q, fetch(src, p + "self_attn.q_proj.weight", {Q, H}));
        STRATA_ASSIGN_OR_RETURN(Tensor k, fetch(src, p + "self_attn.k_proj.weight", {KV, H}));
        STRATA_ASSIGN_OR_RETURN(Tensor v, fetch(src, p + "self_attn.v_proj.weight", {KV, H}));
        STRATA_ASSIGN_OR_RETURN(Tensor o, fetch(src, p + "self_attn.o_proj.weight", {H, Q}));
        Tensor qb, kb, vb;
        if (c.qkv_bias) {
          STRATA_ASSIGN_OR_RETURN(qb, fetch(src, p + "self_attn.q_proj.bias", {Q}));
          STRATA_ASSIGN_OR_RETURN(kb, fetch(src, p + "self_attn.k_proj.bias", {KV}));
          STRATA_ASSIGN_OR_RETURN(vb, fetch(src, p + "self_attn.v_proj.bias", {KV}));
          qb = qb.slice_rows(q_rows.begin, q_rows.end);
          kb = kb.slice_rows(kv_rows.begin, kv_rows.end);
          vb = vb.slice_rows(kv_rows.begin, kv_rows.end);
        }
        L.qkv.add(q.slice_rows(q_rows.begin, q_rows.end), qb);
        L.qkv.add(k.slice_rows(kv_rows.begin, kv_rows.end), kb);
        L.qkv.add(v.slice_rows(kv_rows.begin, kv_rows.end), vb);
        STRATA_ASSIGN_OR_RETURN(Tensor ob, opt(p + "self_attn.o_proj.bias", {H}, c.o_bias));
        L.o.add(par_.tp_size == 1 ? o : o.slice_cols(q_rows.begin, q_rows.end), ob);
        if (c.family == ArchFamily::kGemma3) {
          STRATA_ASSIGN_OR_RETURN(L.q_norm.w, fetch(src, p + "self_attn.q_norm.weight", {D}));
          STRATA_ASSIGN_OR_RETURN(L.k_norm.w, fetch(src, p + "self_attn.k_norm.weight", {D}));
          STRATA_ASSIGN_OR_RETURN(L.post_attn_norm.w,
                                  fetch(src, p + "post_attention_layernorm.weight", {H}));
          STRATA_ASSIGN_OR_RETURN(L.ffn_norm.w,
                                  fetch(src, p + "pre_feedforward_layernorm.weight", {H}));
          STRATA_ASSIGN_OR_RETURN(L.post_ffn_norm.w,
                                  fetch(src, p + "post_feedforward_layernorm.weight", {H}));
        } else {
          STRATA_ASSIGN_OR_RETURN(L.ffn_norm.w,
                                  fetch(src, p + "post_attention_layernorm.weight", {H}));
        }
        if (c.qk_norm && c.family == ArchFamily::kMoe) {  // Qwen3-MoE: per head
          STRATA_ASSIGN_OR_RETURN(L.q_norm.w, f32_norm(p + "self_attn.q_norm.weight", D));
          STRATA_ASSIGN_OR_RETURN(L.k_norm.w, f32_norm(p + "self_attn.k_norm.weight", D));
        } else if (c.qk_norm_full) {  // OLMoE: the whole projection
          STRATA_ASSIGN_OR_RETURN(L.q_norm.w, f32_norm(p + "self_attn.q_norm.weight", Q));
          STRATA_ASSIGN_OR_RETURN(L.k_norm.w, f32_norm(p + "self_attn.k_norm.weight", KV));
        }
        if (c.layer_moe(l)) {
          STRATA_RETURN_IF_ERROR(load_moe_layer(l, L));
          continue;
        }
        STRATA_ASSIGN_OR_RETURN(Tensor g, fetch(src, p + "mlp.gate_proj.weight", {c.ffn_dim, H}));
        STRATA_ASSIGN_OR_RETURN(Tensor u, fetch(src, p + "mlp.up_proj.weight", {c.ffn_dim, H}));
        STRATA_ASSIGN_OR_RETURN(Tensor d, fetch(src, p + "mlp.down_proj.weight", {H, c.ffn_dim}));
        Tensor gb, ub, db;
        if (c.mlp_bias) {
          STRATA_ASSIGN_OR_RETURN(gb, fetch(src, p + "mlp.gate_proj.bias", {c.ffn_dim}));
          STRATA_ASSIGN_OR_RETURN(ub, fetch(src, p + "mlp.up_proj.bias", {c.ffn_dim}));
          STRATA_ASSIGN_OR_RETURN(db, fetch(src, p + "mlp.down_proj.bias", {H}));
        }
        if (par_.ffn_layout == FfnLayout::k2D) {
          // Rank (i, j) of the X x Y grid: W_in[ffn slice j, hidden slice i], W_out[hidden
          // slice i, ffn slice j] (strided views); the down bias's hidden slice i, added once
          // after the reduction over Y (model/ffn_layouts.cpp).
          const ShardRange hs = par_.grid_hidden_shard(H), fs = par_.grid_ffn_shard(c.ffn_dim);
          if (c.mlp_bias) {
            gb = gb.slice_rows(fs.begin, fs.end);
            ub = ub.slice_rows(fs.begin, fs.end);
            db = db.slice_rows(hs.begin, hs.end);
          }
          L.gate_up.add(g.slice_rows(fs.begin, fs.end).slice_cols(hs.begin, hs.end), gb);
          L.gate_up.add(u.slice_rows(fs.begin, fs.end).slice_cols(hs.begin, hs.end), ub);
          L.down.add(d.slice_rows(hs.begin, hs.end).slice_cols(fs.begin, fs.end), db);
          continue;
        }
        if (c.mlp_bias) {
          gb = gb.slice_rows(ffn.begin, ffn.end);
          ub = ub.slice_rows(ffn.begin, ffn.end);
        }
        L.gate_up.add(g.slice_rows(ffn.begin, ffn.end), gb);
        L.gate_up.add(u.slice_rows(ffn.begin, ffn.end), ub);
        L.down.add(par_.tp_size == 1 ? d : d.slice_cols(ffn.begin, ffn.end), db);
      }
      STRATA_ASSIGN_OR_RETURN(w_.final_norm.w, fetch(src, "model.norm.weight", {H}));
      if (c.tie_word_embeddings || !src.has("lm_head.weight")) {
        if (!c.tie_word_embeddings) {
          return errorf(StatusCode::kNotFound, "{}: tensor 'lm_head.weight' not found",
                        src.describe());
        }
        w_.lm_head.add(w_.tok_embeddings);
      } else {
        STRATA_ASSIGN_OR_RETURN(Tensor head, fetch(src, "lm_head.weight", {c.vocab, H}));
        w_.lm_head.add(head.slice_rows(vocab_range_.begin, vocab_range_.end));
      }
      break;
    }
    case ArchFamily::kGpt2: {
      const std::string root = src.has("transformer.wte.weight") ? "transformer." : "";
      const int64_t F = c.ffn_dim;
      STRATA_ASSIGN_OR_RETURN(Tensor emb, fetch(src, root + "wte.weight", {c.vocab, H}));
      w_.tok_embeddings = emb.slice_rows(vocab_range_.begin, vocab_range_.end);
      STRATA_ASSIGN_OR_RETURN(w_.pos_embeddings,
                              fetch(src, root + "wpe.weight", {c.max_position_embeddings, H}));
      for (int64_t l = 0; l < c.n_layers; ++l) {
        if (!par_.has_layer(l)) continue;  // another pipeline stage's layer
        LayerWeights& L = w_.layers[static_cast<size_t>(l)];
        const std::string p = root + "h." + std::to_string(l) + ".";
        STRATA_ASSIGN_OR_RETURN(L.attn_norm.w, fetch(src, p + "ln_1.weight", {H}));
        STRATA_ASSIGN_OR_RETURN(L.attn_norm.b, fetch(src, p + "ln_1.bias", {H}));
        STRATA_ASSIGN_OR_RETURN(Tensor qkv, fetch(src, p + "attn.c_attn.weight", {H, 3 * H}));
        STRATA_ASSIGN_OR_RETURN(Tensor qkv_b, fetch(src, p + "attn.c_attn.bias", {3 * H}));
        for (int64_t j = 0; j < 3; ++j) {
          STRATA_ASSIGN_OR_RETURN(Tensor part,
                                  transpose_cols(qkv, j * H + q_rows.begin, j * H + q_rows.end));
          L.qkv.add(part, qkv_b.slice_rows(j * H + q_rows.begin, j * H + q_rows.end));
        }
        STRATA_ASSIGN_OR_RETURN(Tensor proj, fetch(src, p + "attn.c_proj.weight", {H, H}));
        // Row-parallel o: rows q_rows of the Conv1D [in, out] weight, transposed to [H, q_local].
        STRATA_ASSIGN_OR_RETURN(Tensor o,
                                transpose_cols(proj.slice_rows(q_rows.begin, q_rows.end), 0, H));
        STRATA_ASSIGN_OR_RETURN(Tensor ob, fetch(src, p + "attn.c_proj.bias", {H}));
        L.o.add(o, ob);
        STRATA_ASSIGN_OR_RETURN(L.ffn_norm.w, fetch(src, p + "ln_2.weight", {H}));
        STRATA_ASSIGN_OR_RETURN(L.ffn_norm.b, fetch(src, p + "ln_2.bias", {H}));
        STRATA_ASSIGN_OR_RETURN(Tensor fc, fetch(src, p + "mlp.c_fc.weight", {H, F}));
        STRATA_ASSIGN_OR_RETURN(Tensor fc_b, fetch(src, p + "mlp.c_fc.bias", {F}));
        STRATA_ASSIGN_OR_RETURN(Tensor up, transpose_cols(fc, ffn.begin, ffn.end));
        L.gate_up.add(up, fc_b.slice_rows(ffn.begin, ffn.end));
        STRATA_ASSIGN_OR_RETURN(Tensor fc2, fetch(src, p + "mlp.c_proj.weight", {F, H}));
        STRATA_ASSIGN_OR_RETURN(Tensor down,
                                transpose_cols(fc2.slice_rows(ffn.begin, ffn.end), 0, H));
        STRATA_ASSIGN_OR_RETURN(Tensor down_b, fetch(src, p + "mlp.c_proj.bias", {H}));
        L.down.add(down, down_b);
      }
      STRATA_ASSIGN_OR_RETURN(w_.final_norm.w, fetch(src, root + "ln_f.weight", {H}));
      STRATA_ASSIGN_OR_RETURN(w_.final_norm.b, fetch(src, root + "ln_f.bias", {H}));
      w_.lm_head.add(w_.tok_embeddings);
      break;
    }
    case ArchFamily::kGptNeoX: {
      const int64_t F = c.ffn_dim;
      STRATA_ASSIGN_OR_RETURN(Tensor emb, fetch(src, "gpt_neox.embed_in.weight", {c.vocab, H}));
      w_.tok_embeddings = emb.slice_rows(vocab_range_.begin, vocab_range_.end);
      const int64_t hl = heads.size();
      for (int64_t l = 0; l < c.n_layers; ++l) {
        if (!par_.has_layer(l)) continue;  // another pipeline stage's layer
        LayerWeights& L = w_.layers[static_cast<size_t>(l)];
        const std::string p = "gpt_neox.layers." + std::to_string(l) + ".";
        STRATA_ASSIGN_OR_RETURN(L.attn_norm.w, fetch(src, p + "input_layernorm.weight", {H}));
        STRATA_ASSIGN_OR_RETURN(L.attn_norm.b, fetch(src, p + "input_layernorm.bias", {H}));
        STRATA_ASSIGN_OR_RETURN(Tensor qkv,
                                fetch(src, p + "attention.query_key_value.weight", {3 * H, H}));
        if (dtype_info(qkv.dtype).is_quantized) {
          return errorf(StatusCode::kUnimplemented, "quantized GPT-NeoX QKV is not supported");
        }
        // Rows are laid out [n_heads, 3 (q,k,v), head_dim]: gather each part per head.
        Tensor parts[3], bparts[3];
        for (int j = 0; j < 3; ++j) {
          STRATA_ASSIGN_OR_RETURN(parts[j], own(qkv.dtype, {hl * D, H}));
          for (int64_t h = 0; h < hl; ++h) {
            const int64_t r0 = ((heads.begin + h) * 3 + j) * D;
            copy_rows(qkv, r0, r0 + D, parts[j], h * D);
          }
        }
        if (c.qkv_bias) {
          STRATA_ASSIGN_OR_RETURN(Tensor qkv_b,
                                  fetch(src, p + "attention.query_key_value.bias", {3 * H}));
          for (int j = 0; j < 3; ++j) {
            STRATA_ASSIGN_OR_RETURN(bparts[j], own(qkv_b.dtype, {hl * D}));
            const int64_t eb = elem_bytes(qkv_b.dtype);
            for (int64_t h = 0; h < hl; ++h) {
              const int64_t r0 = ((heads.begin + h) * 3 + j) * D;
              std::memcpy(static_cast<char*>(bparts[j].data) + h * D * eb,
                          static_cast<const char*>(qkv_b.data) + r0 * eb,
                          static_cast<size_t>(D * eb));
            }
          }
        }
        for (int j = 0; j < 3; ++j) L.qkv.add(parts[j], bparts[j]);
        STRATA_ASSIGN_OR_RETURN(Tensor dense, fetch(src, p + "attention.dense.weight", {H, H}));
        STRATA_ASSIGN_OR_RETURN(Tensor dense_b, opt(p + "attention.dense.bias", {H}, c.o_bias));
        L.o.add(par_.tp_size == 1 ? dense : dense.slice_cols(q_rows.begin, q_rows.end), dense_b);
        STRATA_ASSIGN_OR_RETURN(L.ffn_norm.w,
                                fetch(src, p + "post_attention_layernorm.weight", {H}));
        STRATA_ASSIGN_OR_RETURN(L.ffn_norm.b, fetch(src, p + "post_attention_layernorm.bias", {H}));
        STRATA_ASSIGN_OR_RETURN(Tensor up, fetch(src, p + "mlp.dense_h_to_4h.weight", {F, H}));
        STRATA_ASSIGN_OR_RETURN(Tensor up_b, fetch(src, p + "mlp.dense_h_to_4h.bias", {F}));
        L.gate_up.add(up.slice_rows(ffn.begin, ffn.end), up_b.slice_rows(ffn.begin, ffn.end));
        STRATA_ASSIGN_OR_RETURN(Tensor down, fetch(src, p + "mlp.dense_4h_to_h.weight", {H, F}));
        STRATA_ASSIGN_OR_RETURN(Tensor down_b, fetch(src, p + "mlp.dense_4h_to_h.bias", {H}));
        L.down.add(par_.tp_size == 1 ? down : down.slice_cols(ffn.begin, ffn.end), down_b);
      }
      STRATA_ASSIGN_OR_RETURN(w_.final_norm.w, fetch(src, "gpt_neox.final_layer_norm.weight", {H}));
      STRATA_ASSIGN_OR_RETURN(w_.final_norm.b, fetch(src, "gpt_neox.final_layer_norm.bias", {H}));
      if (c.tie_word_embeddings) {
        w_.lm_head.add(w_.tok_embeddings);
      } else {
        STRATA_ASSIGN_OR_RETURN(Tensor head, fetch(src, "embed_out.weight", {c.vocab, H}));
        w_.lm_head.add(head.slice_rows(vocab_range_.begin, vocab_range_.end));
      }
      break;
    }
  }

  if (par_.ffn_layout != FfnLayout::k1D || par_.gathers_ffn()) {
    for (const LayerWeights& L : w_.layers) {
      for (const ops::LinearWeight* lw : {&L.gate_up, &L.down}) {
        for (int i = 0; i < lw->n_parts; ++i) {
          const DType dt = lw->parts[static_cast<size_t>(i)].w.dtype;
          if (!dtype_info(dt).is_quantized) continue;
          return errorf(StatusCode::kUnimplemented,
                        "{}: --ffn-layout {}{} with {} (GGUF-quantized) FFN weights is not "
                        "built yet (use --ffn-layout 1d)",
                        src.describe(), ffn_layout_name(par_.ffn_layout),
                        par_.ffn_layout == FfnLayout::k1D ? " --ffn-gather-min-tokens" : "",
                        dtype_info(dt).name);
        }
      }
    }
  }
  count_weight_bytes();
  return ok_status();
}

// One sparse layer's router, experts and (Qwen2-MoE) gated shared expert. The experts are read
// from whichever form the checkpoint holds:
//   Hugging Face, per expert   {mlp|block_sparse_moe}.experts.E.{gate,up,down}_proj (Mixtral:
//                              w1 = gate, w3 = up, w2 = down)
//   GGUF, stacked              mlp.{gate,up,down}_exps.weight: [E, F, H] / [E, H, F] (the GGUF
//                              source's names for blk.N.ffn_{gate,up,down}_exps)
Status Model::load_moe_layer(int64_t l, LayerWeights& L) {
  const ModelConfig& c = config_;
  const TensorSource& src = *store_.source();
  const int64_t H = c.hidden, E = c.n_experts, F = c.expert_ffn_dim;
  const std::string p = "model.layers." + std::to_string(l) + ".";
  const bool mixtral = src.has(p + "block_sparse_moe.gate.weight");
  const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
  STRATA_ASSIGN_OR_RETURN(Tensor router, fetch(src, moe + "gate.weight", {E, H}));
  L.router.add(router);
  // This rank's experts [e0, e0 + El) (expert parallelism), each one's FFN rows / down columns
  // [f.begin, f.end) (expert slicing over the tensor-parallel group).
  const int64_t e0 = expert_range_.begin, El = expert_range_.size();
  const ShardRange f = expert_ffn_range_;
  const bool sliced = f.size() != F;
  L.expert_gate_up.resize(static_cast<size_t>(El));
  L.expert_down.resize(static_cast<size_t>(El));
  auto add_expert = [&](int64_t e, const Tensor& g, const Tensor& u, const Tensor& d) -> Status {
    if (sliced && dtype_info(d.dtype).is_quantized) {
      // A column slice of block-quantized rows would cut blocks.
      return errorf(StatusCode::kUnimplemented,
                    "{}: layer {}: slicing {} experts over tensor-parallel size {} is not "
                    "supported (use --expert-parallel-size to split whole experts)",
                    src.describe(), l, dtype_info(d.dtype).name, par_.tp_size);
    }
    L.expert_gate_up[static_cast<size_t>(e)].add(sliced ? g.slice_rows(f.begin, f.end) : g);
    L.expert_gate_up[static_cast<size_t>(e)].add(sliced ? u.slice_rows(f.begin, f.end) : u);
    L.expert_down[static_cast<size_t>(e)].add(sliced ? d.slice_cols(f.begin, f.end) : d);
    return ok_status();
  };
  if (src.has(moe + "gate_exps.weight")) {
    STRATA_ASSIGN_OR_RETURN(Tensor g, fetch(src, moe + "gate_exps.weight", {E, F, H}));
    STRATA_ASSIGN_OR_RETURN(Tensor u, fetch(src, moe + "up_exps.weight", {E, F, H}));
    STRATA_ASSIGN_OR_RETURN(Tensor d, fetch(src, moe + "down_exps.weight", {E, H, F}));
    for (const Tensor* t : {&g, &u, &d}) {
      if (!t->is_contiguous()) {
        return errorf(StatusCode::kInvalidArgument,
                      "{}: stacked expert tensors of layer {} are "
                      "not contiguous",
                      src.describe(), l);
      }
    }
    // Expert e of a stacked [E, R, C] tensor: the [R, C] matrix at e R C elements.
    auto expert = [](const Tensor& t, int64_t e) {
      const int64_t R = t.dim(1), C = t.dim(2);
      return Tensor::make(static_cast<char*>(t.data) + dtype_bytes(t.dtype, e * R * C), t.dtype,
                          {R, C}, t.device);
    };
    for (int64_t e = 0; e < El; ++e) {
      STRATA_RETURN_IF_ERROR(
          add_expert(e, expert(g, e0 + e), expert(u, e0 + e), expert(d, e0 + e)));
    }
  } else {
    const char* gn = mixtral ? "w1" : "gate_proj";
    const char* un = mixtral ? "w3" : "up_proj";
    const char* dn = mixtral ? "w2" : "down_proj";
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = moe + "experts." + std::to_string(e) + ".";
      if (!src.has(ep + gn + ".weight")) {
        return errorf(StatusCode::kNotFound,
                      "{}: expert {} of layer {} is missing (no tensor '{}{}.weight'; the config "
                      "says {} experts)",
                      src.describe(), e, l, ep, gn, E);
      }
      STRATA_ASSIGN_OR_RETURN(Tensor g, fetch(src, ep + gn + ".weight", {F, H}));
      STRATA_ASSIGN_OR_RETURN(Tensor u, fetch(src, ep + un + ".weight", {F, H}));
      STRATA_ASSIGN_OR_RETURN(Tensor d, fetch(src, ep + dn + ".weight", {H, F}));
      if (e >= e0 && e < e0 + El) STRATA_RETURN_IF_ERROR(add_expert(e - e0, g, u, d));
    }
    if (src.has(moe + "experts." + std::to_string(E) + "." + gn + ".weight")) {
      return errorf(StatusCode::kInvalidArgument,
                    "{}: layer {} has more than the {} experts the config declares", src.describe(),
                    l, E);
    }
  }
  const int64_t S = c.shared_expert_ffn_dim;
  if (S > 0) {
    const std::string sp = moe + "shared_expert.";
    STRATA_ASSIGN_OR_RETURN(Tensor g, fetch(src, sp + "gate_proj.weight", {S, H}));
    STRATA_ASSIGN_OR_RETURN(Tensor u, fetch(src, sp + "up_proj.weight", {S, H}));
    STRATA_ASSIGN_OR_RETURN(Tensor d, fetch(src, sp + "down_proj.weight", {H, S}));
    L.shared_gate_up.add(g);
    L.shared_gate_up.add(u);
    L.shared_down.add(d);
    STRATA_ASSIGN_OR_RETURN(Tensor sg, src.tensor(moe + "shared_expert_gate.weight"));
    if (sg.numel() != H || !sg.is_contiguous() || !dtype_info(sg.dtype).is_float) {
      return errorf(StatusCode::kInvalidArgument,
                    "{}: tensor '{}shared_expert_gate.weight' has shape {}, expected [1, {}]",
                    src.describe(), moe, sg.shape_string(), H);
    }
    L.shared_gate.add(Tensor::make(sg.data, sg.dtype, {1, H}, sg.device));
  } else if (src.has(moe + "shared_expert.gate_proj.weight")) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: layer {} has a shared expert but the config declares none "
                  "(shared_expert_intermediate_size)",
                  src.describe(), l);
  }
  return ok_status();
}

void Model::count_weight_bytes() {
  // Bytes this rank reads per token: every weight it holds once (scales count; the tied
  // embedding once).
  weight_bytes_ = 0;
  auto add = [&](const Tensor& t) {
    if (t.defined()) weight_bytes_ += static_cast<size_t>(dtype_bytes(t.dtype, t.numel()));
  };
  add(w_.tok_embeddings);
  add(w_.pos_embeddings);
  auto add_linear = [&](const ops::LinearWeight& lw) {
    for (int i = 0; i < lw.n_parts; ++i) {
      add(lw.parts[static_cast<size_t>(i)].w);
      add(lw.parts[static_cast<size_t>(i)].scale);
    }
  };
  for (const LayerWeights& L : w_.layers) {
    for (const ops::LinearWeight* lw : {&L.qkv, &L.o, &L.gate_up, &L.down, &L.router,
                                        &L.shared_gate_up, &L.shared_down, &L.shared_gate}) {
      add_linear(*lw);
    }
    for (const auto& lw : L.expert_gate_up) add_linear(lw);
    for (const auto& lw : L.expert_down) add_linear(lw);
  }
  if (w_.lm_head.defined() && w_.lm_head.parts[0].w.data != w_.tok_embeddings.data) {
    add_linear(w_.lm_head);
  }
}

}  // namespace strata
