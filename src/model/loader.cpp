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

KvCacheConfig Model::kv_config(int64_t n_blocks, int64_t block_size) const {
  KvCacheConfig c;
  c.n_layers = config_.n_layers;
  c.n_blocks = n_blocks;
  c.block_size = block_size;
  c.n_heads_kv = n_kv_local_;
  c.head_dim = config_.head_dim;
  return c;
}

Result<std::unique_ptr<Model>> Model::load(const ModelConfig& config, const ParallelConfig& par,
                                           std::shared_ptr<TensorSource> source) {
  std::unique_ptr<Model> m(new Model());
  m->config_ = config;
  m->par_ = par;
  m->source_ = std::move(source);
  const ModelConfig& c = m->config_;
  const int tp = par.tp_size;
  const std::string& where = m->source_->describe();
  if (tp < 1 || par.tp_rank < 0 || par.tp_rank >= tp) {
    return errorf(StatusCode::kInvalidArgument, "invalid tensor-parallel rank {} of {}",
                  par.tp_rank, tp);
  }
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
  if (c.ffn_dim % tp != 0) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: intermediate size {} cannot be split over tensor-parallel size {}", where,
                  c.ffn_dim, tp);
  }
  m->n_heads_local_ = c.n_heads / tp;
  m->n_kv_local_ = c.n_heads_kv >= tp ? c.n_heads_kv / tp : 1;
  m->ffn_local_ = c.ffn_dim / tp;
  m->vocab_range_ = par.padded_shard(c.vocab);
  if (c.pos_embedding == PosEmbedding::kRope) {
    m->inv_freq_ = rope_inv_freq(c.rotary_dim, c.rope_theta, c.rope_scaling);
    if (c.family == ArchFamily::kGemma3) {
      m->inv_freq_local_ = rope_inv_freq(c.rotary_dim, c.rope_theta_local, RopeScaling{});
    }
  }
  STRATA_RETURN_IF_ERROR(m->load_weights());
  return m;
}

Status Model::load_weights() {
  const ModelConfig& c = config_;
  const TensorSource& src = *source_;
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
    Tensor t = Tensor::make(b.data(), dt, shape);
    owned_.push_back(std::move(b));
    return t;
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

  w_.layers.resize(static_cast<size_t>(c.n_layers));
  switch (c.family) {
    case ArchFamily::kLlama:
    case ArchFamily::kGemma3: {
      const int64_t Q = c.n_heads * D, KV = c.n_heads_kv * D;
      STRATA_ASSIGN_OR_RETURN(Tensor emb, fetch(src, "model.embed_tokens.weight", {c.vocab, H}));
      w_.tok_embeddings = emb.slice_rows(vocab_range_.begin, vocab_range_.end);
      for (int64_t l = 0; l < c.n_layers; ++l) {
        LayerWeights& L = w_.layers[static_cast<size_t>(l)];
        const std::string p = "model.layers." + std::to_string(l) + ".";
        STRATA_ASSIGN_OR_RETURN(L.attn_norm.w, fetch(src, p + "input_layernorm.weight", {H}));
        STRATA_ASSIGN_OR_RETURN(Tensor q, fetch(src, p + "self_attn.q_proj.weight", {Q, H}));
        STRATA_ASSIGN_OR_RETURN(Tensor k, fetch(src, p + "self_attn.k_proj.weight", {KV, H}));
        STRATA_ASSIGN_OR_RETURN(Tensor v, fetch(src, p + "self_attn.v_proj.weight", {KV, H}));
        STRATA_ASSIGN_OR_RETURN(Tensor o, fetch(src, p + "self_attn.o_proj.weight", {H, Q}));
        L.q.w = q.slice_rows(q_rows.begin, q_rows.end);
        L.k.w = k.slice_rows(kv_rows.begin, kv_rows.end);
        L.v.w = v.slice_rows(kv_rows.begin, kv_rows.end);
        L.o.w = par_.tp_size == 1 ? o : o.slice_cols(q_rows.begin, q_rows.end);
        if (c.qkv_bias) {
          STRATA_ASSIGN_OR_RETURN(Tensor qb, fetch(src, p + "self_attn.q_proj.bias", {Q}));
          STRATA_ASSIGN_OR_RETURN(Tensor kb, fetch(src, p + "self_attn.k_proj.bias", {KV}));
          STRATA_ASSIGN_OR_RETURN(Tensor vb, fetch(src, p + "self_attn.v_proj.bias", {KV}));
          L.q.b = qb.slice_rows(q_rows.begin, q_rows.end);
          L.k.b = kb.slice_rows(kv_rows.begin, kv_rows.end);
          L.v.b = vb.slice_rows(kv_rows.begin, kv_rows.end);
        }
        STRATA_ASSIGN_OR_RETURN(L.o.b, opt(p + "self_attn.o_proj.bias", {H}, c.o_bias));
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
        STRATA_ASSIGN_OR_RETURN(Tensor g, fetch(src, p + "mlp.gate_proj.weight", {c.ffn_dim, H}));
        STRATA_ASSIGN_OR_RETURN(Tensor u, fetch(src, p + "mlp.up_proj.weight", {c.ffn_dim, H}));
        STRATA_ASSIGN_OR_RETURN(Tensor d, fetch(src, p + "mlp.down_proj.weight", {H, c.ffn_dim}));
        L.gate.w = g.slice_rows(ffn.begin, ffn.end);
        L.up.w = u.slice_rows(ffn.begin, ffn.end);
        L.down.w = par_.tp_size == 1 ? d : d.slice_cols(ffn.begin, ffn.end);
        if (c.mlp_bias) {
          STRATA_ASSIGN_OR_RETURN(Tensor gb, fetch(src, p + "mlp.gate_proj.bias", {c.ffn_dim}));
          STRATA_ASSIGN_OR_RETURN(Tensor ub, fetch(src, p + "mlp.up_proj.bias", {c.ffn_dim}));
          STRATA_ASSIGN_OR_RETURN(L.down.b, fetch(src, p + "mlp.down_proj.bias", {H}));
          L.gate.b = gb.slice_rows(ffn.begin, ffn.end);
          L.up.b = ub.slice_rows(ffn.begin, ffn.end);
        }
      }
      STRATA_ASSIGN_OR_RETURN(w_.final_norm.w, fetch(src, "model.norm.weight", {H}));
      if (c.tie_word_embeddings || !src.has("lm_head.weight")) {
        if (!c.tie_word_embeddings) {
          return errorf(StatusCode::kNotFound, "{}: tensor 'lm_head.weight' not found",
                        src.describe());
        }
        w_.lm_head.w = w_.tok_embeddings;
      } else {
        STRATA_ASSIGN_OR_RETURN(Tensor head, fetch(src, "lm_head.weight", {c.vocab, H}));
        w_.lm_head.w = head.slice_rows(vocab_range_.begin, vocab_range_.end);
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
        LayerWeights& L = w_.layers[static_cast<size_t>(l)];
        const std::string p = root + "h." + std::to_string(l) + ".";
        STRATA_ASSIGN_OR_RETURN(L.attn_norm.w, fetch(src, p + "ln_1.weight", {H}));
        STRATA_ASSIGN_OR_RETURN(L.attn_norm.b, fetch(src, p + "ln_1.bias", {H}));
        STRATA_ASSIGN_OR_RETURN(Tensor qkv, fetch(src, p + "attn.c_attn.weight", {H, 3 * H}));
        STRATA_ASSIGN_OR_RETURN(Tensor qkv_b, fetch(src, p + "attn.c_attn.bias", {3 * H}));
        STRATA_ASSIGN_OR_RETURN(L.q.w, transpose_cols(qkv, q_rows.begin, q_rows.end));
        STRATA_ASSIGN_OR_RETURN(L.k.w, transpose_cols(qkv, H + q_rows.begin, H + q_rows.end));
        STRATA_ASSIGN_OR_RETURN(L.v.w,
                                transpose_cols(qkv, 2 * H + q_rows.begin, 2 * H + q_rows.end));
        L.q.b = qkv_b.slice_rows(q_rows.begin, q_rows.end);
        L.k.b = qkv_b.slice_rows(H + q_rows.begin, H + q_rows.end);
        L.v.b = qkv_b.slice_rows(2 * H + q_rows.begin, 2 * H + q_rows.end);
        STRATA_ASSIGN_OR_RETURN(Tensor proj, fetch(src, p + "attn.c_proj.weight", {H, H}));
        // Row-parallel o: rows q_rows of the Conv1D [in, out] weight, transposed to [H, q_local].
        STRATA_ASSIGN_OR_RETURN(L.o.w,
                                transpose_cols(proj.slice_rows(q_rows.begin, q_rows.end), 0, H));
        STRATA_ASSIGN_OR_RETURN(L.o.b, fetch(src, p + "attn.c_proj.bias", {H}));
        STRATA_ASSIGN_OR_RETURN(L.ffn_norm.w, fetch(src, p + "ln_2.weight", {H}));
        STRATA_ASSIGN_OR_RETURN(L.ffn_norm.b, fetch(src, p + "ln_2.bias", {H}));
        STRATA_ASSIGN_OR_RETURN(Tensor fc, fetch(src, p + "mlp.c_fc.weight", {H, F}));
        STRATA_ASSIGN_OR_RETURN(Tensor fc_b, fetch(src, p + "mlp.c_fc.bias", {F}));
        STRATA_ASSIGN_OR_RETURN(L.up.w, transpose_cols(fc, ffn.begin, ffn.end));
        L.up.b = fc_b.slice_rows(ffn.begin, ffn.end);
        STRATA_ASSIGN_OR_RETURN(Tensor fc2, fetch(src, p + "mlp.c_proj.weight", {F, H}));
        STRATA_ASSIGN_OR_RETURN(L.down.w, transpose_cols(fc2.slice_rows(ffn.begin, ffn.end), 0, H));
        STRATA_ASSIGN_OR_RETURN(L.down.b, fetch(src, p + "mlp.c_proj.bias", {H}));
      }
      STRATA_ASSIGN_OR_RETURN(w_.final_norm.w, fetch(src, root + "ln_f.weight", {H}));
      STRATA_ASSIGN_OR_RETURN(w_.final_norm.b, fetch(src, root + "ln_f.bias", {H}));
      w_.lm_head.w = w_.tok_embeddings;
      break;
    }
    case ArchFamily::kGptNeoX: {
      const int64_t F = c.ffn_dim;
      STRATA_ASSIGN_OR_RETURN(Tensor emb, fetch(src, "gpt_neox.embed_in.weight", {c.vocab, H}));
      w_.tok_embeddings = emb.slice_rows(vocab_range_.begin, vocab_range_.end);
      const int64_t hl = heads.size();
      for (int64_t l = 0; l < c.n_layers; ++l) {
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
        Tensor* parts[3] = {&L.q.w, &L.k.w, &L.v.w};
        for (int j = 0; j < 3; ++j) {
          STRATA_ASSIGN_OR_RETURN(*parts[j], own(qkv.dtype, {hl * D, H}));
          for (int64_t h = 0; h < hl; ++h) {
            const int64_t r0 = ((heads.begin + h) * 3 + j) * D;
            copy_rows(qkv, r0, r0 + D, *parts[j], h * D);
          }
        }
        if (c.qkv_bias) {
          STRATA_ASSIGN_OR_RETURN(Tensor qkv_b,
                                  fetch(src, p + "attention.query_key_value.bias", {3 * H}));
          Tensor* bparts[3] = {&L.q.b, &L.k.b, &L.v.b};
          for (int j = 0; j < 3; ++j) {
            STRATA_ASSIGN_OR_RETURN(*bparts[j], own(qkv_b.dtype, {hl * D}));
            const int64_t eb = elem_bytes(qkv_b.dtype);
            for (int64_t h = 0; h < hl; ++h) {
              const int64_t r0 = ((heads.begin + h) * 3 + j) * D;
              std::memcpy(static_cast<char*>(bparts[j]->data) + h * D * eb,
                          static_cast<const char*>(qkv_b.data) + r0 * eb,
                          static_cast<size_t>(D * eb));
            }
          }
        }
        STRATA_ASSIGN_OR_RETURN(Tensor dense, fetch(src, p + "attention.dense.weight", {H, H}));
        L.o.w = par_.tp_size == 1 ? dense : dense.slice_cols(q_rows.begin, q_rows.end);
        STRATA_ASSIGN_OR_RETURN(L.o.b, opt(p + "attention.dense.bias", {H}, c.o_bias));
        STRATA_ASSIGN_OR_RETURN(L.ffn_norm.w,
                                fetch(src, p + "post_attention_layernorm.weight", {H}));
        STRATA_ASSIGN_OR_RETURN(L.ffn_norm.b, fetch(src, p + "post_attention_layernorm.bias", {H}));
        STRATA_ASSIGN_OR_RETURN(Tensor up, fetch(src, p + "mlp.dense_h_to_4h.weight", {F, H}));
        STRATA_ASSIGN_OR_RETURN(Tensor up_b, fetch(src, p + "mlp.dense_h_to_4h.bias", {F}));
        L.up.w = up.slice_rows(ffn.begin, ffn.end);
        L.up.b = up_b.slice_rows(ffn.begin, ffn.end);
        STRATA_ASSIGN_OR_RETURN(Tensor down, fetch(src, p + "mlp.dense_4h_to_h.weight", {H, F}));
        L.down.w = par_.tp_size == 1 ? down : down.slice_cols(ffn.begin, ffn.end);
        STRATA_ASSIGN_OR_RETURN(L.down.b, fetch(src, p + "mlp.dense_4h_to_h.bias", {H}));
      }
      STRATA_ASSIGN_OR_RETURN(w_.final_norm.w, fetch(src, "gpt_neox.final_layer_norm.weight", {H}));
      STRATA_ASSIGN_OR_RETURN(w_.final_norm.b, fetch(src, "gpt_neox.final_layer_norm.bias", {H}));
      if (c.tie_word_embeddings) {
        w_.lm_head.w = w_.tok_embeddings;
      } else {
        STRATA_ASSIGN_OR_RETURN(Tensor head, fetch(src, "embed_out.weight", {c.vocab, H}));
        w_.lm_head.w = head.slice_rows(vocab_range_.begin, vocab_range_.end);
      }
      break;
    }
  }

  // Bytes this rank reads per token: every weight it holds once.
  auto add = [&](const Tensor& t) {
    if (t.defined()) weight_bytes_ += static_cast<size_t>(dtype_bytes(t.dtype, t.numel()));
  };
  add(w_.tok_embeddings);
  add(w_.pos_embeddings);
  for (const LayerWeights& L : w_.layers) {
    for (const Tensor* t : {&L.q.w, &L.k.w, &L.v.w, &L.o.w, &L.gate.w, &L.up.w, &L.down.w}) add(*t);
  }
  if (w_.lm_head.w.data != w_.tok_embeddings.data) add(w_.lm_head.w);
  return ok_status();
}

}  // namespace strata
