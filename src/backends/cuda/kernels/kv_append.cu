// Writes each token's K and V rows into its slot of one layer's paged KV cache: token t
// (sequence token_seq[t], position token_pos[t]) goes to block
// block_tables[seq * max_blocks_per_seq + pos / block_size], slot pos % block_size.
// CPU twin: src/backends/cpu/kv_append.cpp (same KvAppendParams).
//
// Layout: k, v f32 [n_tokens, n_heads_kv, head_dim] with token strides k_stride / v_stride (heads
// contiguous inside a token); caches f32 [n_blocks, block_size, n_heads_kv, head_dim] contiguous;
// token_seq, token_pos and block_tables are int32 device arrays.
//
// NOTE: the CPU twin checks every slot first and returns kOutOfRange. The indices are device data
// here (reading them would need a host sync, which a CUDA graph forbids), so the kernel checks
// each token's slot itself and a token with an invalid one writes nothing: no out-of-bounds write.
// Callers validate slots where the block tables are built (on the host).
//
// One block per token, copying n_heads_kv * head_dim floats of K and of V.
// Variants (template parameters):
//   kVec - 16-byte accesses when the row length and the strides are multiples of 4 and every
//          pointer is 16-byte aligned; the scalar variant handles odd head_dims (e.g. 12 * 1 heads
//          is fine vectorized, 3 * 5 is not).
#include <algorithm>
#include <cstdint>
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"

namespace strata::cuda {
namespace {

constexpr int kVecWidth = 4;
constexpr int kMaxThreads = 256;

template <bool kVec>
__global__ void __launch_bounds__(kMaxThreads) kv_append_kernel(const KvAppendParams p) {
  constexpr int kW = kVec ? kVecWidth : 1;
  const PagedKvParams& c = p.cache;
  const int64_t t = blockIdx.x;
  const int64_t seq = p.token_seq[t];
  const int64_t pos = p.token_pos[t];
  if (seq < 0 || seq >= c.n_seqs || pos < 0 || pos / c.block_size >= c.max_blocks_per_seq) return;
  const int64_t block = c.block_tables[seq * c.max_blocks_per_seq + pos / c.block_size];
  if (block < 0 || block >= c.n_blocks) return;
  const int row = static_cast<int>(c.n_heads_kv * c.head_dim);  // floats per slot
  const int64_t slot = block * c.block_size + pos % c.block_size;
  const float* k = p.k + t * p.k_stride;
  const float* v = p.v + t * p.v_stride;
  float* k_dst = c.k_cache + slot * row;
  float* v_dst = c.v_cache + slot * row;
  for (int i = static_cast<int>(threadIdx.x) * kW; i < row;
       i += static_cast<int>(blockDim.x) * kW) {
    store_packed(k_dst + i, load_packed<float, kW>(k + i));
    store_packed(v_dst + i, load_packed<float, kW>(v + i));
  }
}

}  // namespace

Status check_paged_kv(const char* op, const PagedKvParams& c) {
  if (c.n_seqs <= 0 || c.n_blocks <= 0 || c.block_size <= 0 || c.max_blocks_per_seq <= 0 ||
      c.n_heads_kv <= 0 || c.head_dim <= 0 || c.n_heads_kv * c.head_dim > INT32_MAX) {
    return invalid_argument(op, "cache sizes (n_seqs " + std::to_string(c.n_seqs) + ", n_blocks " +
                                    std::to_string(c.n_blocks) + ", block_size " +
                                    std::to_string(c.block_size) + ", max_blocks_per_seq " +
                                    std::to_string(c.max_blocks_per_seq) + ", n_heads_kv " +
                                    std::to_string(c.n_heads_kv) + ", head_dim " +
                                    std::to_string(c.head_dim) + ") must be positive");
  }
  if (c.k_cache == nullptr || c.v_cache == nullptr || c.block_tables == nullptr) {
    return invalid_argument(op, "null k_cache, v_cache or block_tables");
  }
  return ok_status();
}

Status kv_append(const LaunchCtx& ctx, const KvAppendParams& p) {
  const PagedKvParams& c = p.cache;
  STRATA_RETURN_IF_ERROR(check_paged_kv("kv_append", c));
  const int64_t row = c.n_heads_kv * c.head_dim;
  STRATA_RETURN_IF_ERROR(check_matrix("kv_append", "k", p.k, p.n_tokens, row, p.k_stride));
  STRATA_RETURN_IF_ERROR(check_matrix("kv_append", "v", p.v, p.n_tokens, row, p.v_stride));
  if (p.n_tokens > 0 && (p.token_seq == nullptr || p.token_pos == nullptr)) {
    return invalid_argument("kv_append", "null token_seq or token_pos");
  }
  if (p.n_tokens == 0) return ok_status();
  const bool vec = row % kVecWidth == 0 && p.k_stride % kVecWidth == 0 &&
                   p.v_stride % kVecWidth == 0 && is_aligned(p.k, 16) && is_aligned(p.v, 16) &&
                   is_aligned(c.k_cache, 16) && is_aligned(c.v_cache, 16);
  const int threads = static_cast<int>(std::min<int64_t>(
      kMaxThreads, round_up<int64_t>(ceil_div<int64_t>(row, vec ? kVecWidth : 1), kWarpSize)));
  const dim3 grid(static_cast<unsigned>(p.n_tokens));
  if (vec) {
    kv_append_kernel<true><<<grid, threads, 0, ctx.stream>>>(p);
  } else {
    kv_append_kernel<false><<<grid, threads, 0, ctx.stream>>>(p);
  }
  return kernel_launch_status("kv_append_kernel");
}

}  // namespace strata::cuda
