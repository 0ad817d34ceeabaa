#include "memory/kv_pool.h"

#include <cstring>

#include "core/status.h"

namespace strata {

KvPool::KvPool(const KvPoolConfig& c, Buffer storage)
    : config_(c),
      storage_(std::move(storage)),
      blocks_(c.n_blocks, c.block_size, c.enable_prefix_caching, c.n_owners) {
  const int64_t rows = c.local_blocks() + 1;
  const int64_t per = rows * c.block_size * c.n_heads_kv * c.head_dim;
  char* base = static_cast<char*>(storage_.data());
  layers_.resize(static_cast<size_t>(c.first_layer));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    ops::KvLayer layer;
    for (int which = 0; which < 2; ++which) {
      Tensor t = Tensor::make(base + dtype_bytes(c.dtype, (2 * l + which) * per), c.dtype,
                              {rows, c.block_size, c.n_heads_kv, c.head_dim}, storage_.device());
      (which == 0 ? layer.k : layer.v) = t;
    }
    layers_.push_back(layer);
  }
}

Result<KvPool> KvPool::create(const KvPoolConfig& c, Allocator& alloc) {
  if (c.n_layers <= 0 || c.first_layer < 0 || c.n_blocks <= 0 || c.block_size <= 0 ||
      c.n_heads_kv <= 0 || c.head_dim <= 0 || (c.dtype != DType::kF32 && c.dtype != DType::kBF16) ||
      c.n_owners < 1 || c.owner < 0 || c.owner >= c.n_owners) {
    return errorf(
        StatusCode::kInvalidArgument,
        "KV cache: invalid configuration ({} layers, {} blocks of {}, {} heads of {}, {}, owner {} "
        "of {})",
        c.n_layers, c.n_blocks, c.block_size, c.n_heads_kv, c.head_dim, dtype_name(c.dtype),
        c.owner, c.n_owners);
  }
  STRATA_ASSIGN_OR_RETURN(Buffer storage, alloc.allocate(c.bytes()));
  return KvPool(c, std::move(storage));
}

Status KvPool::check_block(int32_t block) const {
  if (block < 0 || block >= config_.n_blocks) {
    return errorf(StatusCode::kOutOfRange, "KV block {} outside the pool of {}", block,
                  config_.n_blocks);
  }
  return ok_status();
}

Status KvPool::copy_block_to_host(ops::Context& ctx, int32_t block, void* host) {
  STRATA_RETURN_IF_ERROR(check_block(block));
  const KvPoolConfig& c = config_;
  if (!c.holds(block)) return ok_status();  // another rank's
  block = c.local_block(block);
  const int64_t per = c.block_size * c.n_heads_kv * c.head_dim;  // elements of one block
  char* h = static_cast<char*>(host);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (int which = 0; which < 2; ++which) {
      const ops::KvLayer& layer = layers_[static_cast<size_t>(c.first_layer + l)];
      const Tensor& pool = which == 0 ? layer.k : layer.v;
      const Tensor src = pool.slice_rows(block, block + 1);
      STRATA_RETURN_IF_ERROR(
          ops::download(ctx, src, h + dtype_bytes(c.dtype, (2 * l + which) * per)));
    }
  }
  return ops::synchronize(ctx);
}

Status KvPool::copy_block_from_host(ops::Context& ctx, int32_t block, const void* host) {
  STRATA_RETURN_IF_ERROR(check_block(block));
  const KvPoolConfig& c = config_;
  if (!c.holds(block)) return ok_status();  // another rank's
  block = c.local_block(block);
  const int64_t per = c.block_size * c.n_heads_kv * c.head_dim;
  const char* h = static_cast<const char*>(host);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (int which = 0; which < 2; ++which) {
      const ops::KvLayer& layer = layers_[static_cast<size_t>(c.first_layer + l)];
      const Tensor& pool = which == 0 ? layer.k : layer.v;
      Tensor dst = pool.slice_rows(block, block + 1);
      STRATA_RETURN_IF_ERROR(
          ops::upload(ctx, h + dtype_bytes(c.dtype, (2 * l + which) * per), dst));
    }
  }
  return ops::synchronize(ctx);
}

Status KvPool::offload_copies(void* host, int64_t host_n_blocks,
                              std::span<const int32_t> device_blocks,
                              std::span<const int32_t> host_blocks, int parity, bool to_host,
                              std::vector<KvCopy>& out) const {
  if (config_.n_owners > 1) {
    return Status(StatusCode::kUnimplemented, "KV offload of a pool split among ranks");
  }
  if (device_blocks.size() != host_blocks.size()) {
    return errorf(StatusCode::kInvalidArgument, "KV offload: {} device blocks for {} host blocks",
                  device_blocks.size(), host_blocks.size());
  }
  for (size_t i = 0; i < device_blocks.size(); ++i) {
    STRATA_RETURN_IF_ERROR(check_block(device_blocks[i]));
    if (host_blocks[i] < 0 || host_blocks[i] >= host_n_blocks) {
      return errorf(StatusCode::kOutOfRange, "KV offload: host block {} outside the pool of {}",
                    host_blocks[i], host_n_blocks);
    }
  }
  const KvPoolConfig& c = config_;
  const size_t block = dtype_bytes(c.dtype, c.block_size * c.n_heads_kv * c.head_dim);
  char* h = static_cast<char*>(host);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const int64_t layer = c.first_layer + l;
    if (layer % 2 != parity) continue;
    const ops::KvLayer& kv = layers_[static_cast<size_t>(layer)];
    for (int which = 0; which < 2; ++which) {
      char* dev = static_cast<char*>((which == 0 ? kv.k : kv.v).data);
      char* hbase =
          h + static_cast<size_t>(2 * l + which) * static_cast<size_t>(host_n_blocks) * block;
      for (size_t i = 0; i < device_blocks.size();) {
        size_t n = 1;  // a run of pairs consecutive in both pools
        while (i + n < device_blocks.size() &&
               device_blocks[i + n] == device_blocks[i] + static_cast<int32_t>(n) &&
               host_blocks[i + n] == host_blocks[i] + static_cast<int32_t>(n)) {
          ++n;
        }
        char* d = dev + static_cast<size_t>(device_blocks[i]) * block;
        char* hp = hbase + static_cast<size_t>(host_blocks[i]) * block;
        out.push_back(to_host ? KvCopy{hp, d, n * block} : KvCopy{d, hp, n * block});
        i += n;
      }
    }
  }
  return ok_status();
}

Status SequenceKv::reserve(KvPool& pool, int64_t new_length) {
  const int64_t need = pool.blocks_for(new_length) - static_cast<int64_t>(block_table.size());
  if (need <= 0) return ok_status();
  BlockManager& bm = pool.blocks();
  const int owner = block_table.empty() ? bm.most_free_owner() : bm.owner_of(block_table[0]);
  if (need > bm.num_free(owner)) {
    return errorf(StatusCode::kOutOfMemory, "KV cache: {} blocks needed, {} of {} free{}", need,
                  bm.num_free(owner), bm.num_total(owner),
                  bm.n_owners() > 1 ? " on the sequence's rank" : "");
  }
  for (int64_t i = 0; i < need; ++i) block_table.push_back(bm.allocate(owner));
  return ok_status();
}

void SequenceKv::release(KvPool& pool) {
  for (int32_t b : block_table) pool.blocks().release(b);
  block_table.clear();
  length = 0;
}

}  // namespace strata
