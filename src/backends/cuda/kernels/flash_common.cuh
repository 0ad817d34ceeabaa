// Shared by the varlen attention kernels (flash_prefill.cu, flash_decode.cu,
// varlen_attention.cu): tensor-core and async-copy primitives (sm_80+ PTX), the swizzled bf16
// shared-memory tile layout, per-sequence bookkeeping of the varlen layout, and the host-side
// argument check.
//
// Tiles of bf16 rows [rows][D] live in shared memory with their 16-byte chunks XOR-swizzled by
// row (chunk c of row r sits at chunk c ^ (r & 7)): ldmatrix reads one chunk column from 8
// consecutive rows at a time, and unswizzled rows of 128 or 256 bytes would put all 8 in the same
// bank group (8-way conflicts); cp.async writes 8 chunks of one row per quarter warp, also
// conflict-free.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_kernels.h"

namespace strata::cuda::flash {

constexpr float kLog2e = 1.4426950408889634f;

// ---- PTX wrappers --------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy that bypasses L1; src_bytes 0 writes 16 zero bytes instead (the
// source is then not read, but must still be a valid address).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a (16x16 bf16, row-major fragment) * b (16x8 bf16, column fragment), f32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as bf16x2 (lo in the low half, the element order of an mma fragment register).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));  // first source -> upper
  return r;
}

// 2^x in one MUFU instruction (ex2.approx, ~2 ulp); 2^-inf = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- shared-memory tile layout -------------------------------------------------------------

// Element offset of chunk `chunk` (8 bf16) of row `row` in a swizzled [rows][D] tile.
template <int D>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

// ---- the varlen layout ---------------------------------------------------------------------

// Sequence s of a VarlenAttentionParams batch as the kernels see it. `bad` marks what the host
// could not check (device data): more queries than cached positions, or counts beyond the
// host-side bounds the grid was sized with. Such a sequence gets NaN outputs (the rows the grid
// reaches), not an out-of-bounds access.
struct SeqView {
  int q0;      // first query token
  int n_q;     // query tokens this step
  int kv_len;  // cached positions, this step's included
  bool bad;
};

__device__ __forceinline__ SeqView seq_view(const VarlenAttentionParams& p, int s) {
  SeqView v;
  v.q0 = p.cu_q[s];
  v.n_q = p.cu_q[s + 1] - v.q0;
  v.kv_len = p.kv_len[s];
  v.bad =
      v.n_q < 0 || v.n_q > v.kv_len || v.kv_len > p.max_kv_len || v.n_q > p.max_q_len || v.q0 < 0;
  return v;
}

// The first position a query at `pos` attends to.
__device__ __forceinline__ int window_start(int pos, int64_t window) {
  return window > 0 ? max(0, pos - static_cast<int>(window) + 1) : 0;
}

// Cache slot (block * block_size + offset) of position `key` of the sequence whose block table
// row is `table`, or -1 when its block is past the table or outside the pool.
__device__ __forceinline__ int kv_slot(const PagedKvBf16Params& c, const int32_t* table, int key) {
  const int bs = static_cast<int>(c.block_size);
  // Block sizes are powers of two in practice (16, 32, 64): a shift instead of ~20 instructions
  // of integer division, on a uniform branch.
  const int logical = (bs & (bs - 1)) == 0 ? key >> (__ffs(bs) - 1) : key / bs;
  if (logical >= c.max_blocks_per_seq) return -1;
  const int block = table[logical];
  if (block < 0 || block >= c.n_blocks) return -1;
  return block * bs + (key - logical * bs);
}

__device__ __forceinline__ uint16_t bf16_nan() {
  return 0x7fc0;
}

}  // namespace strata::cuda::flash

namespace strata::cuda {

// kernels/varlen_attention.cu: the host-side checks shared by varlen_attention, flash_prefill
// and flash_decode (kInvalidArgument / kUnimplemented naming `op`), and the generic kernel
// (any head_dim <= 256, any alignment) the fast kernels fall back to.
Status check_varlen(const char* op, const VarlenAttentionParams& p);
Status varlen_attention_generic(const LaunchCtx& ctx, const VarlenAttentionParams& p);
// Whether the tensor-core kernels take these arguments: head_dim 64 or 128, q and the caches
// 16-byte aligned (rows and strides in multiples of 8 elements), out 4-byte aligned.
bool flash_supported(const VarlenAttentionParams& p);

}  // namespace strata::cuda
