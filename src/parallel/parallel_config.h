// ParallelConfig: tensor-parallel rank math as a value type (pipeline/expert/data parallel
// sizes join it later). The sharding rules themselves live in the model loader, which asks
// this struct which slice of each dimension its rank owns.
#pragma once

#include <algorithm>
#include <cstdint>

namespace strata {

struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

struct ParallelConfig {
  int tp_size = 1;
  int tp_rank = 0;

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
