// BlockManager: KV block ids with reference counts plus a hash-based prefix cache of FULL
// blocks, for the continuous-batching scheduler. It only does bookkeeping (no KV data), so the
// scheduler built on it is testable without a model.
//
// A full block is identified by hash(parent block's hash, its block_size token ids), so equal
// hashes mean equal prefixes. register_full() publishes a block under its hash; lookup() hands
// a cached block to another sequence (refcount + 1). When the last reference goes, a cached
// block is not freed but parked in an LRU list: it stays reusable by lookup() until allocate()
// needs the space and evicts the least recently released one. Blocks without a hash go straight
// back to the free list.
//
// Owners (batch-sharded attention, model/attn_layouts.cpp): with n_owners > 1 the ids are split
// among ranks that each hold only their own blocks, block b belonging to owner b % n_owners
// (stored there at local index b / n_owners). Every block of a sequence is on one owner:
// allocate(owner) hands out only that owner's ids, and evicts only its cached blocks. n_owners
// 1 (the default) is one pool, as before.
//
// NOTE: the cache keeps each cached block's parent hash and token ids and compares them on
// lookup, so a 64-bit hash collision costs a miss, never a wrong prefix.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace strata {

constexpr uint64_t kNoParentHash = 0x9e3779b97f4a7c15ull;

// Hash of one full block given its parent's hash (kNoParentHash for the first block).
uint64_t hash_block(uint64_t parent, std::span<const int32_t> tokens);

class BlockManager {
 public:
  BlockManager(int64_t n_blocks, int64_t block_size, bool enable_prefix_caching, int n_owners = 1);

  int64_t num_total() const { return static_cast<int64_t>(ref_.size()); }
  // Blocks allocate() can hand out: free ones plus cached ones nobody references.
  int64_t num_free() const { return num_free_total_; }
  // Blocks referenced by at least one sequence.
  int64_t num_used() const { return num_total() - num_free(); }
  // Cached blocks nobody references (reusable by lookup, evictable by allocate).
  int64_t num_cached_free() const { return lru_size_total_; }
  int32_t ref_count(int32_t block) const { return ref_[static_cast<size_t>(block)]; }
  bool prefix_caching() const { return enable_prefix_caching_; }

  // Owners (see the top of this file).
  int n_owners() const { return n_owners_; }
  int owner_of(int32_t block) const { return static_cast<int>(block % n_owners_); }
  // Ids of `owner` (total) and those allocate(owner) can hand out.
  int64_t num_total(int owner) const { return owner_total_[static_cast<size_t>(owner)]; }
  int64_t num_free(int owner) const {
    const auto o = static_cast<size_t>(owner);
    return static_cast<int64_t>(free_[o].size()) + lru_[o].size;
  }
  // The fewest ids any owner has: the most blocks one sequence can be sure to get.
  int64_t min_owner_total() const;
  // The owner with the most blocks to hand out (the lowest index among equals): where a new
  // sequence goes. Deterministic, so ranks keeping the same accounting agree.
  int most_free_owner() const;

  // A fresh block of `owner` (refcount 1), evicting its least recently used cached block when
  // no free one is left; -1 when every block of the owner is referenced.
  int32_t allocate(int owner);
  // allocate(most_free_owner()): with one owner, any block.
  int32_t allocate() { return allocate(most_free_owner()); }
  void retain(int32_t block);
  // Drops one reference; at zero the block is parked (cached) or freed.
  void release(int32_t block);

  // Publish a full, computed block under `hash`. No-op when caching is off or the hash is
  // already published (the first block stays the canonical one).
  void register_full(int32_t block, uint64_t hash, uint64_t parent,
                     std::span<const int32_t> tokens);
  // The cached block for (hash, parent, tokens) with one more reference, or -1 (also when it
  // is not `owner`'s; owner -1: any owner's).
  int32_t lookup(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens, int owner = -1);

 private:
  void forget_hash(int32_t block);
  void lru_push_back(int32_t block);
  void lru_unlink(int32_t block);

  struct Lru {
    int32_t head = -1, tail = -1;
    int64_t size = 0;
  };

  int64_t block_size_;
  bool enable_prefix_caching_;
  int n_owners_;
  std::vector<std::vector<int32_t>> free_;  // per owner: unhashed, unreferenced
  std::vector<int64_t> owner_total_;
  int64_t num_free_total_ = 0, lru_size_total_ = 0;
  std::vector<int32_t> ref_;
  // Hashed, unreferenced blocks, per owner: an intrusive doubly linked list (no allocation),
  // head = least recently released.
  std::vector<int32_t> lru_prev_, lru_next_;
  std::vector<Lru> lru_;
  std::vector<uint8_t> in_lru_;
  std::vector<uint8_t> hashed_;
  std::vector<uint64_t> hash_, parent_;
  std::vector<int32_t> tokens_;  // [n_blocks, block_size] ids of hashed blocks
  std::unordered_map<uint64_t, int32_t> by_hash_;
};

}  // namespace strata
