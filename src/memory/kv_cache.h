// Paged KV cache: per layer, K and V pools of [n_blocks, block_size, n_heads_kv, head_dim]
// f32 on the CPU backend. A sequence owns a list of blocks (its block table); the attention
// op finds position p in block table[p / block_size], slot p % block_size. The block pool is
// shared by all sequences, which is what continuous batching and prefix caching build on.
#pragma once

#include <cstdint>
#include <vector>

#include "core/buffer.h"
#include "core/tensor.h"
#include "strata/status.h"

namespace strata {

struct KvCacheConfig {
  int64_t n_layers = 0;
  int64_t n_blocks = 0;
  int64_t block_size = 16;
  int64_t n_heads_kv = 0;  // heads held by this rank
  int64_t head_dim = 0;
};

// Free-list allocator of block ids with reference counts (shared prefix blocks have > 1).
class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t n_blocks);
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_total() const { return static_cast<int64_t>(ref_.size()); }
  // Appends n fresh block ids to `out`; kOutOfMemory (nothing taken) when fewer are free.
  Status allocate(int64_t n, std::vector<int32_t>* out);
  void retain(int32_t block);
  void release(int32_t block);
  int32_t ref_count(int32_t block) const { return ref_[static_cast<size_t>(block)]; }

 private:
  std::vector<int32_t> free_;
  std::vector<int32_t> ref_;
};

class KvCache {
 public:
  static Result<KvCache> create(const KvCacheConfig& config);
  // Block accounting only: the K/V storage lives elsewhere (a GPU executor's device pool), so
  // k(), v() and the host copies must not be used; bytes() is 0.
  static Result<KvCache> create_unbacked(const KvCacheConfig& config);
  bool backed() const { return storage_.bytes() > 0; }

  const KvCacheConfig& config() const { return config_; }
  Tensor k(int64_t layer) const { return layer_view(layer, 0); }
  Tensor v(int64_t layer) const { return layer_view(layer, 1); }
  BlockAllocator& blocks() { return blocks_; }
  const BlockAllocator& blocks() const { return blocks_; }
  // Blocks needed to hold n_tokens positions.
  int64_t blocks_for(int64_t n_tokens) const {
    return (n_tokens + config_.block_size - 1) / config_.block_size;
  }
  size_t bytes() const { return storage_.bytes(); }
  // Floats of one block across all layers, K and V: what a host swap slot holds.
  int64_t block_floats() const {
    return 2 * config_.n_layers * config_.block_size * config_.n_heads_kv * config_.head_dim;
  }
  // Copy one block (every layer's K and V) to / from a host slot of block_floats() floats laid
  // out [n_layers, 2, block_size, n_heads_kv, head_dim]. Used to swap preempted sequences.
  void copy_block_to_host(int32_t block, float* host) const;
  void copy_block_from_host(int32_t block, const float* host);
  static size_t bytes_needed(const KvCacheConfig& c) {
    return static_cast<size_t>(2 * c.n_layers * c.n_blocks * c.block_size * c.n_heads_kv *
                               c.head_dim) *
           sizeof(float);
  }

 private:
  KvCache(const KvCacheConfig& c, Buffer storage)
      : config_(c), storage_(std::move(storage)), blocks_(c.n_blocks) {}
  Tensor layer_view(int64_t layer, int which) const;

  KvCacheConfig config_;
  Buffer storage_;
  BlockAllocator blocks_;
};

// One sequence's view of the cache: its block table and how many positions are filled.
struct SequenceKv {
  std::vector<int32_t> block_table;
  int64_t length = 0;
  // Grow the block table to hold `new_length` positions.
  Status reserve(KvCache& cache, int64_t new_length);
  void release(KvCache& cache);
};

}  // namespace strata
