#include "memory/kv_cache.h"

#include <cstring>

#include "core/log.h"
#include "core/status.h"

namespace strata {

BlockAllocator::BlockAllocator(int64_t n_blocks) : ref_(static_cast<size_t>(n_blocks), 0) {
  free_.reserve(static_cast<size_t>(n_blocks));
  // Hand out low ids first: pop from the back of a descending list.
  for (int64_t i = n_blocks - 1; i >= 0; --i) free_.push_back(static_cast<int32_t>(i));
}

Status BlockAllocator::allocate(int64_t n, std::vector<int32_t>* out) {
  if (n > num_free()) {
    return errorf(StatusCode::kOutOfMemory, "KV cache: {} blocks needed, {} of {} free", n,
                  num_free(), num_total());
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t b = free_.back();
    free_.pop_back();
    ref_[static_cast<size_t>(b)] = 1;
    out->push_back(b);
  }
  return ok_status();
}

void BlockAllocator::retain(int32_t block) {
  STRATA_CHECK(ref_[static_cast<size_t>(block)] > 0);
  ++ref_[static_cast<size_t>(block)];
}

void BlockAllocator::release(int32_t block) {
  STRATA_CHECK(ref_[static_cast<size_t>(block)] > 0);
  if (--ref_[static_cast<size_t>(block)] == 0) free_.push_back(block);
}

Result<KvCache> KvCache::create(const KvCacheConfig& config) {
  if (config.n_layers <= 0 || config.n_blocks <= 0 || config.block_size <= 0 ||
      config.n_heads_kv <= 0 || config.head_dim <= 0) {
    return errorf(StatusCode::kInvalidArgument, "KV cache: invalid configuration");
  }
  STRATA_ASSIGN_OR_RETURN(Buffer storage, allocate_host(bytes_needed(config)));
  return KvCache(config, std::move(storage));
}

Result<KvCache> KvCache::create_unbacked(const KvCacheConfig& config) {
  if (config.n_layers <= 0 || config.n_blocks <= 0 || config.block_size <= 0 ||
      config.n_heads_kv <= 0 || config.head_dim <= 0) {
    return errorf(StatusCode::kInvalidArgument, "KV cache: invalid configuration");
  }
  return KvCache(config, Buffer());
}

Tensor KvCache::layer_view(int64_t layer, int which) const {
  const KvCacheConfig& c = config_;
  const int64_t per = c.n_blocks * c.block_size * c.n_heads_kv * c.head_dim;
  float* base = storage_.as<float>() + (2 * layer + which) * per;
  return Tensor::make(base, DType::kF32, {c.n_blocks, c.block_size, c.n_heads_kv, c.head_dim});
}

void KvCache::copy_block_to_host(int32_t block, float* host) const {
  const int64_t per = config_.block_size * config_.n_heads_kv * config_.head_dim;
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    for (int which = 0; which < 2; ++which) {
      const Tensor t = layer_view(l, which);
      std::memcpy(host + (2 * l + which) * per, t.ptr<float>() + block * per,
                  static_cast<size_t>(per) * sizeof(float));
    }
  }
}

void KvCache::copy_block_from_host(int32_t block, const float* host) {
  const int64_t per = config_.block_size * config_.n_heads_kv * config_.head_dim;
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    for (int which = 0; which < 2; ++which) {
      const Tensor t = layer_view(l, which);
      std::memcpy(t.ptr<float>() + block * per, host + (2 * l + which) * per,
                  static_cast<size_t>(per) * sizeof(float));
    }
  }
}

Status SequenceKv::reserve(KvCache& cache, int64_t new_length) {
  const int64_t need = cache.blocks_for(new_length) - static_cast<int64_t>(block_table.size());
  if (need > 0) STRATA_RETURN_IF_ERROR(cache.blocks().allocate(need, &block_table));
  return ok_status();
}

void SequenceKv::release(KvCache& cache) {
  for (int32_t b : block_table) cache.blocks().release(b);
  block_table.clear();
  length = 0;
}

}  // namespace strata
