// Model: the weights of one decoder-only transformer as this rank holds them (after tensor-
// parallel sharding), and its forward pass over a batch of tokens from any number of
// sequences (prefill chunks and decode steps mixed), reading and writing the paged KV cache.
//
// Tensor parallelism follows Megatron: QKV and gate/up are column-parallel (each rank owns a
// slice of heads / ffn columns), o_proj and down_proj are row-parallel (partial sums, then an
// explicit all-reduce), embedding and LM head are vocab-parallel.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "core/buffer.h"
#include "core/tensor.h"
#include "io/tensor_source.h"
#include "memory/kv_cache.h"
#include "model/config.h"
#include "parallel/comm.h"
#include "parallel/parallel_config.h"

namespace strata {

struct LinearWeights {
  Tensor w;  // [out_local, in_local], rows possibly strided
  Tensor b;  // [out_local] or undefined
};

struct NormWeights {
  Tensor w;  // [dim]
  Tensor b;  // [dim] (LayerNorm) or undefined
};

struct LayerWeights {
  NormWeights attn_norm;       // input_layernorm / ln_1
  LinearWeights q, k, v;       // column-parallel: [heads_local * head_dim, hidden]
  LinearWeights o;             // row-parallel: [hidden, heads_local * head_dim]
  NormWeights q_norm, k_norm;  // per-head [head_dim] (Gemma-3), else undefined
  NormWeights post_attn_norm;  // Gemma-3, else undefined
  NormWeights ffn_norm;        // post_attention_layernorm / ln_2
  LinearWeights gate, up;      // column-parallel: [ffn_local, hidden]; gate undefined if ungated
  LinearWeights down;          // row-parallel: [hidden, ffn_local]
  NormWeights post_ffn_norm;   // Gemma-3, else undefined
};

struct ModelWeights {
  Tensor tok_embeddings;  // [vocab_local, hidden], rows [vocab_offset, +vocab_local)
  Tensor pos_embeddings;  // [max_positions, hidden] (learned positions) or undefined
  std::vector<LayerWeights> layers;
  NormWeights final_norm;
  LinearWeights lm_head;  // [vocab_local, hidden] (the embedding when tied)
};

// One forward call's inputs. Token i belongs to sequence token_seq[i] at position
// token_pos[i]; its K/V are written to that sequence's blocks before attention reads them.
struct ForwardBatch {
  std::span<const int32_t> tokens;        // [n_tokens]
  std::span<const int32_t> token_seq;     // [n_tokens]
  std::span<const int32_t> token_pos;     // [n_tokens]
  const int32_t* block_tables = nullptr;  // [n_seqs, max_blocks_per_seq]
  int64_t max_blocks_per_seq = 0;
  int64_t n_seqs = 1;                   // rows of block_tables
  std::span<const int32_t> logit_rows;  // token indices whose logits are wanted
};

class Model {
 public:
  // Load (and shard for par) the weights named per the config's family from `source`.
  static Result<std::unique_ptr<Model>> load(const ModelConfig& config, const ParallelConfig& par,
                                             std::shared_ptr<TensorSource> source);

  const ModelConfig& config() const { return config_; }
  const ParallelConfig& parallel() const { return par_; }
  int64_t n_heads_local() const { return n_heads_local_; }
  int64_t n_heads_kv_local() const { return n_kv_local_; }
  int64_t ffn_local() const { return ffn_local_; }
  int64_t vocab_local() const { return vocab_range_.size(); }
  size_t weight_bytes() const { return weight_bytes_; }

  // The weights as loaded (views into the checkpoint or re-laid-out copies), for executors on
  // other devices (CudaModel uploads them), and the rotary inverse frequencies (global layers,
  // and Gemma-3's local layers; empty when unused).
  const ModelWeights& weights() const { return w_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  const std::vector<float>& inv_freq_local() const { return inv_freq_local_; }

  // KV cache geometry this rank needs.
  KvCacheConfig kv_config(int64_t n_blocks, int64_t block_size) const;

  // logits: [batch.logit_rows.size(), vocab] f32, the full vocabulary on every rank.
  Status forward(const ForwardBatch& batch, KvCache& cache, Communicator& comm, float* logits);

 private:
  Model() = default;
  Status load_weights();
  Status ensure_workspace(int64_t n_tokens, int64_t n_logits);

  ModelConfig config_;
  ParallelConfig par_;
  std::shared_ptr<TensorSource> source_;
  ModelWeights w_;
  std::vector<Buffer> owned_;  // re-laid-out copies made at load
  std::vector<float> inv_freq_, inv_freq_local_;
  int64_t n_heads_local_ = 0, n_kv_local_ = 0, ffn_local_ = 0;
  ShardRange vocab_range_;
  size_t weight_bytes_ = 0;

  // Scratch, sized for the largest batch seen (no allocation for same-or-smaller batches).
  int64_t ws_tokens_ = 0, ws_logits_ = 0;
  Buffer ws_;
  Tensor x_, h_, q_, k_, v_, attn_, o_, ffn_, ffn2_, mlp_, sel_, logits_local_, gathered_;
};

}  // namespace strata
