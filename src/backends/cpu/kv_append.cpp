// Writes each token's K and V rows into its slot of the paged cache. Every slot is checked
// first (serially: position inside the block table, block id inside the pool), so the
// parallel copy never writes out of bounds.
#include <cstring>

#include "backends/cpu/cpu_kernels.h"
#include "core/status.h"

namespace strata::cpu {

Status check_kv_slot(const PagedKvParams& c, const char* op, int64_t token, int64_t seq,
                     int64_t pos) {
  if (seq < 0 || seq >= c.n_seqs || pos < 0) {
    return errorf(StatusCode::kOutOfRange, "{}: token {} has sequence {} (of {}) and position {}",
                  op, token, seq, c.n_seqs, pos);
  }
  const int64_t logical = pos / c.block_size;
  if (logical >= c.max_blocks_per_seq) {
    return errorf(StatusCode::kOutOfRange,
                  "{}: token {} position {} needs block {} but the block table holds {} blocks of "
                  "{}",
                  op, token, pos, logical, c.max_blocks_per_seq, c.block_size);
  }
  const int64_t block = c.block_tables[seq * c.max_blocks_per_seq + logical];
  if (block < 0 || block >= c.n_blocks) {
    return errorf(StatusCode::kOutOfRange,
                  "{}: token {} (sequence {}, position {}) maps to block {} outside [0, {})", op,
                  token, seq, pos, block, c.n_blocks);
  }
  return ok_status();
}

Status kv_append(const KvAppendParams& p) {
  const PagedKvParams& c = p.cache;
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    STRATA_RETURN_IF_ERROR(check_kv_slot(c, "kv_append", t, p.token_seq[t], p.token_pos[t]));
  }
  const int64_t row = c.n_heads_kv * c.head_dim;  // floats per slot
  const size_t row_bytes = static_cast<size_t>(row) * sizeof(float);
#pragma omp parallel for schedule(static) if (p.n_tokens * row >= kParallelMinElems)
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    const int64_t pos = p.token_pos[t];
    const int64_t block =
        c.block_tables[p.token_seq[t] * c.max_blocks_per_seq + pos / c.block_size];
    const int64_t slot = block * c.block_size + pos % c.block_size;
    std::memcpy(c.k_cache + slot * row, p.k + t * p.k_stride, row_bytes);
    std::memcpy(c.v_cache + slot * row, p.v + t * p.v_stride, row_bytes);
  }
  return ok_status();
}

}  // namespace strata::cpu
