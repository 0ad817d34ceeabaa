// ParallelConfig: this rank's place in the parallel world as a value type: its tensor-parallel
// rank (Megatron shards), its expert-parallel rank (which experts of a mixture-of-experts layer
// it holds) and its pipeline stage (a contiguous layer range). The sharding rules
// themselves live in the model loader, which asks this struct which slice of each dimension and
// which layers its rank owns.
//
// The FFN's partitioning over the tensor-parallel group (seed 003, "Efficiently Scaling
// Transformer Inference", Sec. 3.2) is a field here too, because it decides what the loader
// slices:
//   1d              Megatron (1D weight-stationary): gate/up rows and down columns split over
//                   the group, one all-reduce of the output. Every layout below keeps attention
//                   head-sharded as 1D does.
//   2d              2D weight-stationary: the group is an X x Y grid, rank (i, j) = tp_rank
//                   j X + i holds W_in[ffn slice j, hidden slice i] and W_out[hidden slice i, ffn
//                   slice j]; collectives within the X group (same j) and the Y group (same i).
//   weight-gathered stored as 1d; in the layer each rank runs the FFN for its slice of the
//                   tokens with the layer's whole FFN weights all-gathered just in time.
// The layout may change with the phase, as the seed's does (weight-gathered prefill, weight-
// stationary decode): with 1d and ffn_gather_min_tokens > 0 the shards are stored as 1d (bf16,
// as weight-gathered keeps them) and every step of at least that many tokens runs the
// weight-gathered FFN, the smaller ones (decode) the 1d one (ffn_layout_for).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>

namespace strata {

enum class FfnLayout { k1D, k2D, kWeightGathered };

// "1d", "2d", "weight-gathered" (the --ffn-layout spellings).
inline const char* ffn_layout_name(FfnLayout l) {
  switch (l) {
    case FfnLayout::k1D:
      return "1d";
    case FfnLayout::k2D:
      return "2d";
    case FfnLayout::kWeightGathered:
      return "weight-gathered";
  }
  return "?";
}
// False for an unknown spelling.
inline bool parse_ffn_layout(std::string_view s, FfnLayout* out) {
  for (FfnLayout l : {FfnLayout::k1D, FfnLayout::k2D, FfnLayout::kWeightGathered}) {
    if (s == ffn_layout_name(l)) {
      *out = l;
      return true;
    }
  }
  return false;
}

enum class AttnLayout { kHeadSharded, kBatchSharded };

// "head-sharded", "batch-sharded" (the --attn-layout spellings).
inline const char* attn_layout_name(AttnLayout l) {
  return l == AttnLayout::kBatchSharded ? "batch-sharded" : "head-sharded";
}
// False for an unknown spelling.
inline bool parse_attn_layout(std::string_view s, AttnLayout* out) {
  for (AttnLayout l : {AttnLayout::kHeadSharded, AttnLayout::kBatchSharded}) {
    if (s == attn_layout_name(l)) {
      *out = l;
      return true;
    }
  }
  return false;
}

// The 2D grid's X (the hidden split) for n ranks when none is asked for: the largest divisor of
// n in (1, sqrt(n)] (4 = 2 x 2, 8 = 2 x 4, 16 = 4 x 4); 0 when n has none (a prime, or 1). The
// seed's optimum X = sqrt(n) / 2 (for F = 4 E) would give X = 1 below 16 ranks, which is 1D.
inline int default_grid_x(int n) {
  int best = 0;
  for (int x = 2; x * x <= n; ++x) {
    if (n % x == 0) best = x;
  }
  return best;
}

struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

struct ParallelConfig {
  int tp_size = 1;
  int tp_rank = 0;
  // Pipeline stage pp_rank of pp_size runs layers [first_layer, last_layer) (last_layer -1: to
  // the last layer); the embedding runs on the first stage, the head on the last.
  int pp_size = 1;
  int pp_rank = 0;
  int64_t first_layer = 0;
  int64_t last_layer = -1;
  // Expert parallelism: the world is tp_size x ep_size ranks, numbered Megatron-style with the
  // tensor-parallel rank fastest (world rank = ep_rank * tp_size + tp_rank). The ranks of one
  // tensor-parallel rank form the expert-parallel group; ep_rank holds experts
  // [ep_rank E / ep_size, (ep_rank + 1) E / ep_size) of every sparse layer (whole experts).
  // With ep_size 1 and tp_size > 1 every rank holds every expert, its FFN dimension sliced over
  // the tensor-parallel group (expert slicing).
  int ep_size = 1;
  int ep_rank = 0;
  // The FFN's layout over the tensor-parallel group (see the top of this file), and for 2d the
  // grid's X (hidden split; Y = tp_size / X is the ffn split). ws2d_x 0: default_grid_x.
  FfnLayout ffn_layout = FfnLayout::k1D;
  int ws2d_x = 0;
  // With ffn_layout 1d: steps of at least this many tokens run the weight-gathered FFN (0: none).
  int64_t ffn_gather_min_tokens = 0;
  // Attention's layout (see the top of this file).
  AttnLayout attn_layout = AttnLayout::kHeadSharded;

  // Batch-sharded attention: the tensor-parallel rank that holds KV block `block` (at local
  // index block / tp_size), and so the KV cache of the sequence it belongs to, which runs that
  // sequence's attention: the block accounting gives a sequence blocks of one rank only
  // (memory/block_manager.h, KvPoolConfig::n_owners).
  int attn_owner(int32_t block) const {
    return static_cast<int>(static_cast<uint32_t>(block) % static_cast<uint32_t>(tp_size));
  }

  // The FFN layout a step of n_tokens runs.
  FfnLayout ffn_layout_for(int64_t n_tokens) const {
    if (ffn_layout == FfnLayout::k1D && ffn_gather_min_tokens > 0 &&
        n_tokens >= ffn_gather_min_tokens) {
      return FfnLayout::kWeightGathered;
    }
    return ffn_layout;
  }
  // Whether any step may run the weight-gathered FFN (its weights' format and its scratch).
  bool gathers_ffn() const {
    return ffn_layout == FfnLayout::kWeightGathered ||
           (ffn_layout == FfnLayout::k1D && ffn_gather_min_tokens > 0);
  }

  // The 2D grid: X, Y and this rank's (i, j), i fastest.
  int grid_x() const { return ws2d_x > 0 ? ws2d_x : default_grid_x(tp_size); }
  int grid_y() const { return grid_x() > 0 ? tp_size / grid_x() : 0; }
  int grid_i() const { return tp_rank % std::max(1, grid_x()); }
  int grid_j() const { return tp_rank / std::max(1, grid_x()); }
  // This rank's slice of the FFN's weights in the 2D layout: hidden (i of X), ffn (j of Y).
  ShardRange grid_hidden_shard(int64_t hidden) const {
    const int64_t per = hidden / grid_x();
    return {per * grid_i(), per * (grid_i() + 1)};
  }
  ShardRange grid_ffn_shard(int64_t ffn) const {
    const int64_t per = ffn / grid_y();
    return {per * grid_j(), per * (grid_j() + 1)};
  }

  int world_size() const { return tp_size * ep_size; }
  int world_rank() const { return ep_rank * tp_size + tp_rank; }
  // This rank's experts of n_experts (n_experts % ep_size == 0 required by the caller).
  ShardRange expert_shard(int64_t n_experts) const {
    const int64_t per = n_experts / ep_size;
    return {per * ep_rank, per * (ep_rank + 1)};
  }
  // This rank's slice of each expert's FFN dimension: whole with expert parallelism, split over
  // the tensor-parallel group without it (ffn % tp_size == 0 required by the caller).
  ShardRange expert_ffn_shard(int64_t ffn) const {
    if (ep_size > 1) return {0, ffn};
    return even_shard(ffn);
  }

  bool has_layer(int64_t l) const { return l >= first_layer && (last_layer < 0 || l < last_layer); }
  int64_t stage_end(int64_t n_layers) const { return last_layer < 0 ? n_layers : last_layer; }
  bool first_stage() const { return pp_rank == 0; }
  bool last_stage() const { return pp_rank == pp_size - 1; }

  // Even split of n items (n % tp_size == 0 required by the caller, e.g. attention heads).
  ShardRange even_shard(int64_t n) const {
    const int64_t per = n / tp_size;
    return {per * tp_rank, per * (tp_rank + 1)};
  }
  // Split of n items into tp_size chunks of ceil(n / tp_size), the last one shorter (or empty):
  // the vocab-parallel embedding and LM head, where every rank gathers padded chunks.
  int64_t padded_chunk(int64_t n) const { return (n + tp_size - 1) / tp_size; }
  ShardRange padded_shard(int64_t n) const {
    const int64_t per = padded_chunk(n);
    return {std::min(n, per * tp_rank), std::min(n, per * (tp_rank + 1))};
  }
};

}  // namespace strata
