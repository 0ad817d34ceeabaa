#include "memory/block_manager.h"

#include <algorithm>

#include "core/log.h"

namespace strata {

namespace {

uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

}  // namespace

uint64_t hash_block(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = mix(parent);
  for (int32_t t : tokens) h = mix(h ^ static_cast<uint32_t>(t)) + 0x632be59bd9b4e019ull;
  return h;
}

BlockManager::BlockManager(int64_t n_blocks, int64_t block_size, bool enable_prefix_caching,
                           int n_owners)
    : block_size_(block_size),
      enable_prefix_caching_(enable_prefix_caching),
      n_owners_(std::max(n_owners, 1)),
      free_(static_cast<size_t>(n_owners_)),
      owner_total_(static_cast<size_t>(n_owners_), 0),
      num_free_total_(n_blocks),
      ref_(static_cast<size_t>(n_blocks), 0),
      lru_prev_(static_cast<size_t>(n_blocks), -1),
      lru_next_(static_cast<size_t>(n_blocks), -1),
      lru_(static_cast<size_t>(n_owners_)),
      in_lru_(static_cast<size_t>(n_blocks), 0),
      hashed_(static_cast<size_t>(n_blocks), 0),
      hash_(static_cast<size_t>(n_blocks), 0),
      parent_(static_cast<size_t>(n_blocks), 0) {
  if (enable_prefix_caching_) tokens_.resize(static_cast<size_t>(n_blocks * block_size));
  for (int o = 0; o < n_owners_; ++o) {
    const auto ou = static_cast<size_t>(o);
    owner_total_[ou] = n_blocks > o ? (n_blocks - o + n_owners_ - 1) / n_owners_ : 0;
    free_[ou].reserve(static_cast<size_t>(owner_total_[ou]));
  }
  // Hand out low ids first: pop from the back of a descending list.
  for (int64_t i = n_blocks - 1; i >= 0; --i) {
    free_[static_cast<size_t>(i % n_owners_)].push_back(static_cast<int32_t>(i));
  }
  by_hash_.reserve(static_cast<size_t>(n_blocks));
}

int64_t BlockManager::min_owner_total() const {
  return *std::min_element(owner_total_.begin(), owner_total_.end());
}

int BlockManager::most_free_owner() const {
  int best = 0;
  for (int o = 1; o < n_owners_; ++o) {
    if (num_free(o) > num_free(best)) best = o;
  }
  return best;
}

int32_t BlockManager::allocate(int owner) {
  STRATA_CHECK(owner >= 0 && owner < n_owners_);
  std::vector<int32_t>& free = free_[static_cast<size_t>(owner)];
  int32_t b = -1;
  if (!free.empty()) {
    b = free.back();
    free.pop_back();
  } else if (lru_[static_cast<size_t>(owner)].head >= 0) {
    b = lru_[static_cast<size_t>(owner)].head;
    lru_unlink(b);
    forget_hash(b);
  } else {
    return -1;
  }
  --num_free_total_;
  ref_[static_cast<size_t>(b)] = 1;
  return b;
}

void BlockManager::retain(int32_t block) {
  const auto i = static_cast<size_t>(block);
  if (ref_[i] == 0) {
    STRATA_CHECK(in_lru_[i]);
    lru_unlink(block);
    --num_free_total_;
  }
  ++ref_[i];
}

void BlockManager::release(int32_t block) {
  const auto i = static_cast<size_t>(block);
  STRATA_CHECK(ref_[i] > 0);
  if (--ref_[i] > 0) return;
  ++num_free_total_;
  if (hashed_[i]) {
    lru_push_back(block);
  } else {
    free_[static_cast<size_t>(owner_of(block))].push_back(block);
  }
}

void BlockManager::register_full(int32_t block, uint64_t hash, uint64_t parent,
                                 std::span<const int32_t> tokens) {
  const auto i = static_cast<size_t>(block);
  if (!enable_prefix_caching_ || hashed_[i]) return;
  if (by_hash_.count(hash) != 0) return;
  STRATA_CHECK(static_cast<int64_t>(tokens.size()) == block_size_);
  hashed_[i] = 1;
  hash_[i] = hash;
  parent_[i] = parent;
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<int64_t>(i) * block_size_);
  by_hash_.emplace(hash, block);
}

int32_t BlockManager::lookup(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens,
                             int owner) {
  if (!enable_prefix_caching_) return -1;
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return -1;
  const int32_t b = it->second;
  if (owner >= 0 && owner_of(b) != owner) return -1;
  const auto i = static_cast<size_t>(b);
  const auto first = tokens_.begin() + static_cast<int64_t>(i) * block_size_;
  if (parent_[i] != parent || !std::equal(tokens.begin(), tokens.end(), first)) return -1;
  retain(b);
  return b;
}

void BlockManager::lru_push_back(int32_t block) {
  const auto i = static_cast<size_t>(block);
  Lru& l = lru_[static_cast<size_t>(owner_of(block))];
  lru_prev_[i] = l.tail;
  lru_next_[i] = -1;
  if (l.tail >= 0) {
    lru_next_[static_cast<size_t>(l.tail)] = block;
  } else {
    l.head = block;
  }
  l.tail = block;
  in_lru_[i] = 1;
  ++l.size;
  ++lru_size_total_;
}

void BlockManager::lru_unlink(int32_t block) {
  const auto i = static_cast<size_t>(block);
  Lru& l = lru_[static_cast<size_t>(owner_of(block))];
  const int32_t prev = lru_prev_[i], next = lru_next_[i];
  if (prev >= 0) {
    lru_next_[static_cast<size_t>(prev)] = next;
  } else {
    l.head = next;
  }
  if (next >= 0) {
    lru_prev_[static_cast<size_t>(next)] = prev;
  } else {
    l.tail = prev;
  }
  lru_prev_[i] = lru_next_[i] = -1;
  in_lru_[i] = 0;
  --l.size;
  --lru_size_total_;
}

void BlockManager::forget_hash(int32_t block) {
  const auto i = static_cast<size_t>(block);
  if (!hashed_[i]) return;
  by_hash_.erase(hash_[i]);
  hashed_[i] = 0;
}

}  // namespace strata
