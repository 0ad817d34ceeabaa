// The decoder forward pass shared by every family. Per layer:
//
//   h = norm(x)                       attn_norm (RMSNorm or LayerNorm)
//   q, k, v = h Wq, h Wk, h Wv        column-parallel, + bias (Qwen2, GPT-2, NeoX)
//   rope(q, k); kv_append(k, v)       rotary (full or partial) unless learned positions
//   a = attention(q, cache) Wo        row-parallel partial sum
//   sequential block:  x += all_reduce(a) + bo;  x += all_reduce(mlp(norm(x))) + bd
//   parallel block:    x += all_reduce(a + mlp(norm2(x))) + bo + bd   (NeoX; one all-reduce)
//
// then the final norm on the rows that want logits, the vocab-parallel LM head, and an
// all-gather of the vocabulary shards. Every collective is written out here.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/status.h"
#include "model/model.h"
#include "ops/ops.h"

namespace strata {

namespace {

Tensor view(float* p, int64_t rows, int64_t cols) {
  return Tensor::make(p, DType::kF32, {rows, cols});
}

Status apply_norm(const ModelConfig& c, const NormWeights& n, const Tensor& x, Tensor& out) {
  switch (c.norm) {
    case NormType::kRmsNorm:
      return ops::rms_norm(x, n.w, c.norm_eps, c.norm_weight_offset, out);
    case NormType::kLayerNorm:
      return ops::layer_norm(x, n.w, n.b, c.norm_eps, out);
  }
  return ok_status();
}

}  // namespace

Status Model::ensure_workspace(int64_t n_tokens, int64_t n_logits) {
  if (n_tokens <= ws_tokens_ && n_logits <= ws_logits_) return ok_status();
  ws_tokens_ = std::max(ws_tokens_, n_tokens);
  ws_logits_ = std::max(ws_logits_, n_logits);
  const ModelConfig& c = config_;
  const int64_t n = ws_tokens_, H = c.hidden, D = c.head_dim;
  const int64_t q = n_heads_local_ * D, kv = n_kv_local_ * D;
  const int64_t chunk = par_.padded_chunk(c.vocab);
  const int64_t sizes[] = {n * H,
                           n * H,
                           n * q,
                           n * kv,
                           n * kv,
                           n * q,
                           n * H,
                           n * 2 * ffn_local_,
                           n * ffn_local_,
                           n * H,
                           ws_logits_ * H,
                           ws_logits_ * chunk,
                           ws_logits_ * chunk * par_.tp_size};
  int64_t total = 0;
  for (int64_t s : sizes) total += (s + 15) / 16 * 16;
  STRATA_ASSIGN_OR_RETURN(ws_, allocate_host(static_cast<size_t>(total) * sizeof(float)));
  float* p = ws_.as<float>();
  float* ptrs[13];
  for (int i = 0; i < 13; ++i) {
    ptrs[i] = p;
    p += (sizes[i] + 15) / 16 * 16;
  }
  x_.data = ptrs[0];
  h_.data = ptrs[1];
  q_.data = ptrs[2];
  k_.data = ptrs[3];
  v_.data = ptrs[4];
  attn_.data = ptrs[5];
  o_.data = ptrs[6];
  ffn_.data = ptrs[7];
  ffn2_.data = ptrs[8];
  mlp_.data = ptrs[9];
  sel_.data = ptrs[10];
  logits_local_.data = ptrs[11];
  gathered_.data = ptrs[12];
  return ok_status();
}

Status Model::forward(const ForwardBatch& batch, KvCache& cache, Communicator& comm,
                      float* logits) {
  const ModelConfig& c = config_;
  const int64_t n = static_cast<int64_t>(batch.tokens.size());
  const int64_t n_out = static_cast<int64_t>(batch.logit_rows.size());
  if (n == 0) return ok_status();
  if (static_cast<int64_t>(batch.token_seq.size()) != n ||
      static_cast<int64_t>(batch.token_pos.size()) != n) {
    return errorf(StatusCode::kInvalidArgument,
                  "forward: token, sequence and position counts differ");
  }
  for (int32_t pos : batch.token_pos) {
    if (pos < 0 || pos >= c.max_position_embeddings) {
      return errorf(StatusCode::kOutOfRange, "position {} is past the model's context length {}",
                    pos, c.max_position_embeddings);
    }
  }
  for (int32_t r : batch.logit_rows) {
    if (r < 0 || r >= n)
      return errorf(StatusCode::kInvalidArgument, "forward: bad logit row {}", r);
  }
  STRATA_RETURN_IF_ERROR(ensure_workspace(n, n_out));

  const int64_t H = c.hidden, D = c.head_dim;
  const int64_t hq = n_heads_local_, hkv = n_kv_local_, F = ffn_local_;
  Tensor x = view(x_.ptr<float>(), n, H);
  Tensor h = view(h_.ptr<float>(), n, H);
  Tensor q = view(q_.ptr<float>(), n, hq * D);
  Tensor k = view(k_.ptr<float>(), n, hkv * D);
  Tensor v = view(v_.ptr<float>(), n, hkv * D);
  Tensor attn = view(attn_.ptr<float>(), n, hq * D);
  Tensor o = view(o_.ptr<float>(), n, H);
  Tensor ffn = view(ffn_.ptr<float>(), n, 2 * F);
  Tensor ffn2 = view(ffn2_.ptr<float>(), n, F);
  Tensor mlp = view(mlp_.ptr<float>(), n, H);

  // Embedding (vocab-parallel: each rank fills its rows, the sum completes them).
  STRATA_RETURN_IF_ERROR(
      ops::embedding(w_.tok_embeddings, batch.tokens.data(), n, vocab_range_.begin, c.vocab, x));
  if (par_.tp_size > 1) STRATA_RETURN_IF_ERROR(comm.all_reduce_sum(x.ptr<float>(), n * H));
  if (c.embedding_scale != 1.0f) STRATA_RETURN_IF_ERROR(ops::scale(x, c.embedding_scale));
  if (w_.pos_embeddings.defined()) {
    STRATA_RETURN_IF_ERROR(ops::embedding(w_.pos_embeddings, batch.token_pos.data(), n, 0,
                                          w_.pos_embeddings.dim(0), h));
    STRATA_RETURN_IF_ERROR(ops::add(x, h, x));
  }

  const float attn_scale =
      c.attn_scale > 0.0f ? c.attn_scale : 1.0f / std::sqrt(static_cast<float>(D));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w_.layers[static_cast<size_t>(l)];
    const bool sliding = c.sliding_window > 0 &&
                         (c.layer_is_sliding.empty() || c.layer_is_sliding[static_cast<size_t>(l)]);

    // ---- attention ----
    STRATA_RETURN_IF_ERROR(apply_norm(c, L.attn_norm, x, h));
    STRATA_RETURN_IF_ERROR(ops::linear(h, L.q.w, L.q.b, q));
    STRATA_RETURN_IF_ERROR(ops::linear(h, L.k.w, L.k.b, k));
    STRATA_RETURN_IF_ERROR(ops::linear(h, L.v.w, L.v.b, v));
    Tensor q3 = Tensor::make(q.data, DType::kF32, {n, hq, D});
    Tensor k3 = Tensor::make(k.data, DType::kF32, {n, hkv, D});
    Tensor v3 = Tensor::make(v.data, DType::kF32, {n, hkv, D});
    if (L.q_norm.w.defined()) {
      Tensor qr = view(q.ptr<float>(), n * hq, D), kr = view(k.ptr<float>(), n * hkv, D);
      STRATA_RETURN_IF_ERROR(ops::rms_norm(qr, L.q_norm.w, c.norm_eps, c.norm_weight_offset, qr));
      STRATA_RETURN_IF_ERROR(ops::rms_norm(kr, L.k_norm.w, c.norm_eps, c.norm_weight_offset, kr));
    }
    if (c.pos_embedding == PosEmbedding::kRope) {
      const std::vector<float>& freq =
          (sliding && !inv_freq_local_.empty()) ? inv_freq_local_ : inv_freq_;
      ops::RopeParams rp;
      rp.rotary_dim = c.rotary_dim;
      rp.neox_style = c.rope_neox_style;
      rp.inv_freq = freq.data();
      STRATA_RETURN_IF_ERROR(ops::rope(q3, batch.token_pos.data(), rp));
      STRATA_RETURN_IF_ERROR(ops::rope(k3, batch.token_pos.data(), rp));
    }
    ops::PagedKv kv{cache.k(l), cache.v(l), batch.block_tables, batch.max_blocks_per_seq,
                    batch.n_seqs};
    STRATA_RETURN_IF_ERROR(
        ops::kv_append(k3, v3, batch.token_seq.data(), batch.token_pos.data(), kv));
    ops::AttentionParams ap;
    ap.token_seq = batch.token_seq.data();
    ap.token_pos = batch.token_pos.data();
    ap.scale = attn_scale;
    ap.sliding_window = sliding ? c.sliding_window : 0;
    Tensor attn3 = Tensor::make(attn.data, DType::kF32, {n, hq, D});
    STRATA_RETURN_IF_ERROR(ops::attention(q3, kv, ap, attn3));
    STRATA_RETURN_IF_ERROR(ops::linear(attn, L.o.w, Tensor{}, o));

    // ---- MLP (on norm(x) for the parallel block, on norm(x + attn) otherwise) ----
    auto run_mlp = [&](const Tensor& in) -> Status {
      STRATA_RETURN_IF_ERROR(apply_norm(c, L.ffn_norm, in, h));
      if (c.gated_mlp) {
        Tensor gate = ffn.slice_cols(0, F), up = ffn.slice_cols(F, 2 * F);
        STRATA_RETURN_IF_ERROR(ops::linear(h, L.gate.w, L.gate.b, gate));
        STRATA_RETURN_IF_ERROR(ops::linear(h, L.up.w, L.up.b, up));
        STRATA_RETURN_IF_ERROR(ops::gated_act(gate, up, c.activation, ffn2));
      } else {
        STRATA_RETURN_IF_ERROR(ops::linear(h, L.up.w, L.up.b, ffn2));
        STRATA_RETURN_IF_ERROR(ops::act(ffn2, c.activation));
      }
      return ops::linear(ffn2, L.down.w, Tensor{}, mlp);
    };

    if (c.parallel_block) {
      STRATA_RETURN_IF_ERROR(run_mlp(x));
      STRATA_RETURN_IF_ERROR(ops::add(o, mlp, o));
      if (par_.tp_size > 1) STRATA_RETURN_IF_ERROR(comm.all_reduce_sum(o.ptr<float>(), n * H));
      STRATA_RETURN_IF_ERROR(ops::add(x, o, x));
      if (L.o.b.defined()) STRATA_RETURN_IF_ERROR(ops::add_bias(x, L.o.b));
      if (L.down.b.defined()) STRATA_RETURN_IF_ERROR(ops::add_bias(x, L.down.b));
      continue;
    }
    if (par_.tp_size > 1) STRATA_RETURN_IF_ERROR(comm.all_reduce_sum(o.ptr<float>(), n * H));
    if (L.o.b.defined()) STRATA_RETURN_IF_ERROR(ops::add_bias(o, L.o.b));
    if (L.post_attn_norm.w.defined()) STRATA_RETURN_IF_ERROR(apply_norm(c, L.post_attn_norm, o, o));
    STRATA_RETURN_IF_ERROR(ops::add(x, o, x));
    STRATA_RETURN_IF_ERROR(run_mlp(x));
    if (par_.tp_size > 1) STRATA_RETURN_IF_ERROR(comm.all_reduce_sum(mlp.ptr<float>(), n * H));
    if (L.down.b.defined()) STRATA_RETURN_IF_ERROR(ops::add_bias(mlp, L.down.b));
    if (L.post_ffn_norm.w.defined()) {
      STRATA_RETURN_IF_ERROR(apply_norm(c, L.post_ffn_norm, mlp, mlp));
    }
    STRATA_RETURN_IF_ERROR(ops::add(x, mlp, x));
  }

  if (n_out == 0) return ok_status();
  // ---- final norm + LM head on the selected rows ----
  Tensor sel = view(sel_.ptr<float>(), n_out, H);
  for (int64_t i = 0; i < n_out; ++i) {
    std::memcpy(sel.ptr<float>() + i * H,
                x.ptr<float>() + batch.logit_rows[static_cast<size_t>(i)] * H,
                static_cast<size_t>(H) * sizeof(float));
  }
  STRATA_RETURN_IF_ERROR(apply_norm(c, w_.final_norm, sel, sel));
  const int64_t vl = vocab_range_.size();
  if (par_.tp_size == 1) {
    Tensor out = view(logits, n_out, c.vocab);
    STRATA_RETURN_IF_ERROR(ops::linear(sel, w_.lm_head.w, w_.lm_head.b, out));
  } else {
    // Each rank computes its vocabulary chunk, zero-padded to the common chunk size, and the
    // all-gather lays chunks out rank-major: [tp, n_out, chunk] -> [n_out, vocab].
    const int64_t chunk = par_.padded_chunk(c.vocab);
    Tensor local = view(logits_local_.ptr<float>(), n_out, chunk);
    std::memset(local.data, 0, static_cast<size_t>(n_out * chunk) * sizeof(float));
    if (vl > 0) {
      Tensor out = local.slice_cols(0, vl);
      Tensor tmp = view(gathered_.ptr<float>(), n_out, vl);
      STRATA_RETURN_IF_ERROR(ops::linear(sel, w_.lm_head.w, w_.lm_head.b, tmp));
      for (int64_t i = 0; i < n_out; ++i) {
        std::memcpy(out.ptr<float>() + i * chunk, tmp.ptr<float>() + i * vl,
                    static_cast<size_t>(vl) * sizeof(float));
      }
    }
    float* gathered = gathered_.ptr<float>();
    STRATA_RETURN_IF_ERROR(comm.all_gather(local.ptr<float>(), n_out * chunk, gathered));
    for (int r = 0; r < par_.tp_size; ++r) {
      const int64_t v0 = chunk * r, v1 = std::min(c.vocab, v0 + chunk);
      if (v1 <= v0) continue;
      for (int64_t i = 0; i < n_out; ++i) {
        std::memcpy(logits + i * c.vocab + v0, gathered + (r * n_out + i) * chunk,
                    static_cast<size_t>(v1 - v0) * sizeof(float));
      }
    }
  }
  if (c.final_logit_softcap > 0.0f) {
    const float cap = c.final_logit_softcap;
    for (int64_t i = 0; i < n_out * c.vocab; ++i) logits[i] = cap * std::tanh(logits[i] / cap);
  }
  return ok_status();
}

}  // namespace strata
