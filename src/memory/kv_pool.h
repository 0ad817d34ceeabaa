// KvPool: one paged KV cache per device. Per layer, K and V pools of
// [local_blocks() + 1, block_size, n_heads_kv, head_dim] in one dtype (f32 for the CPU reference,
// bf16 for the device layout), in one buffer on the device that runs the model; the extra last
// block is a scratch block that padded rows of a CUDA-graph bucket write to. Block ids are handed
// out by a BlockManager (reference counts, prefix caching), so the single-request engine and the
// serving scheduler count blocks the same way on every backend. A sequence owns a list of blocks
// (its block table): position p lives in block table[p / block_size], slot p % block_size.
//
// Batch-sharded attention (n_owners = the tensor-parallel ranks > 1): the block ids are the
// engines' (every rank agrees on them), but block b lives on rank b % n_owners only, at local
// index b / n_owners, so each rank's pool holds local_blocks() = n_blocks / n_owners blocks (with
// every KV head) and the BlockManager gives each sequence blocks of one owner.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/buffer.h"
#include "memory/block_manager.h"
#include "ops/ops.h"
#include "strata/status.h"

namespace strata {

struct KvPoolConfig {
  int64_t n_layers = 0;     // layers held: [first_layer, first_layer + n_layers)
  int64_t first_layer = 0;  // a pipeline stage holds only its own layers' K and V
  int64_t n_blocks = 0;     // usable block ids [0, n_blocks); the pool holds one more (scratch)
  int n_owners = 1;         // ranks the ids are split among (see above); 1: all held here
  int owner = 0;            // this rank's index among them
  int64_t block_size = 16;
  int64_t n_heads_kv = 0;  // heads held by this rank
  int64_t head_dim = 0;
  DType dtype = DType::kF32;  // kF32 or kBF16
  bool enable_prefix_caching = false;

  // Bytes of one block: every layer's K and V.
  size_t block_bytes() const {
    return static_cast<size_t>(
        dtype_bytes(dtype, 2 * n_layers * block_size * n_heads_kv * head_dim));
  }
  // Blocks this rank holds (the ids b with b % n_owners == owner, rounded up).
  int64_t local_blocks() const { return (n_blocks + n_owners - 1) / n_owners; }
  bool holds(int32_t block) const { return block % n_owners == owner; }
  int32_t local_block(int32_t block) const { return block / n_owners; }
  // Bytes of the whole pool (local_blocks() + the scratch block).
  size_t bytes() const { return block_bytes() * static_cast<size_t>(local_blocks() + 1); }
};

// One memory copy (host or device pointers), as KV offload queues them (runtime KvCopier).
struct KvCopy {
  void* dst;
  const void* src;
  size_t bytes;
};

class KvPool {
 public:
  // A pool whose storage comes from `alloc` (host or device memory), zeroed on the host.
  static Result<KvPool> create(const KvPoolConfig& config, Allocator& alloc);

  const KvPoolConfig& config() const { return config_; }
  Device device() const { return storage_.device(); }
  size_t bytes() const { return storage_.bytes(); }
  int64_t scratch_block() const { return config_.local_blocks(); }  // a local index

  // The per-layer views the ops read and write, indexed by the model's layer number (entries
  // before first_layer are empty).
  std::vector<ops::KvLayer>& layers() { return layers_; }
  BlockManager& blocks() { return blocks_; }
  const BlockManager& blocks() const { return blocks_; }
  int64_t blocks_for(int64_t n_tokens) const {
    return (n_tokens + config_.block_size - 1) / config_.block_size;
  }

  // Swapping a preempted sequence: one block (every layer's K and V) to / from a host slot of
  // block_bytes() bytes laid out [n_layers, 2, block_size, n_heads_kv, head_dim] (the layers held).
  // Ordered on ctx's stream and waited for. A block another rank holds (n_owners > 1): nothing.
  Status copy_block_to_host(ops::Context& ctx, int32_t block, void* host);
  Status copy_block_from_host(ops::Context& ctx, int32_t block, const void* host);

  // KV offload (serving/kv_offload.h): the copies that move device_blocks[i] <-> host_blocks[i]
  // between this pool and a host pool of `host_n_blocks` blocks laid out as this one (per held
  // layer, K then V, each [host_n_blocks, block_size, n_heads_kv, head_dim]), for the held layers
  // whose model layer index has parity `parity` (1: odd). to_host: pool -> host. Pairs that
  // continue the previous one in both pools are merged into one copy. Appended to `out`.
  Status offload_copies(void* host, int64_t host_n_blocks, std::span<const int32_t> device_blocks,
                        std::span<const int32_t> host_blocks, int parity, bool to_host,
                        std::vector<KvCopy>& out) const;

 private:
  KvPool(const KvPoolConfig& c, Buffer storage);
  Status check_block(int32_t block) const;

  KvPoolConfig config_;
  Buffer storage_;
  std::vector<ops::KvLayer> layers_;
  BlockManager blocks_;
};

// One sequence's view of the pool: its block table and how many positions are filled.
struct SequenceKv {
  std::vector<int32_t> block_table;
  int64_t length = 0;
  // Grow the block table to hold `new_length` positions (kOutOfMemory, nothing taken, when the
  // pool has too few free blocks). Several owners: the blocks of its first block's owner (the
  // one with the most free blocks for an empty table).
  Status reserve(KvPool& pool, int64_t new_length);
  void release(KvPool& pool);
};

}  // namespace strata
