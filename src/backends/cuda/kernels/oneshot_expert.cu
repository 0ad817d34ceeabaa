// The expert-parallel exchange of a sparse layer in two one-shot kernels that write straight into
// the peers' buffers (cuda_kernels.h: oneshot_expert_dispatch / oneshot_expert_combine), instead
// of the composition of plans, packs and staged all-to-alls in model/moe_ep.cpp. The layout the
// rows land in is that composition's (its CPU twin): this rank's received rows grouped by local
// expert, within an expert by source rank, within a source in the source's order; the outputs
// come back into the senders' own row order.
//
// dispatch (epochs A = epoch + 1 and B = A + 1):
//   A. block 0 writes this rank's per-expert row counts (from its offsets) and the addresses of
//      its `grouped` and `y_back` buffers into slot `rank` of every peer's staging half (A & 1),
//      raises flags[rank][0] = A at every peer; every block waits for every peer's flag 0 >= A.
//   Every block then reads the count matrix [ranks][E] from its own staging: the rows each
//   source sends each expert, so where each of its rows lands at its expert's owner (the
//   composition's order) and this rank's grouped offsets (block 0 writes them, and copies the
//   matrix and the address table into e.counts / e.tables for the combine).
//   B. each warp copies whole rows (16-byte loads) to their owners' `grouped` buffers, peers'
//      through peer access; block b raises flags[rank][b] = B at every peer and waits for every
//      peer's flag b >= B, so when all blocks are through, every row for this rank has landed.
// combine (epoch C = epoch + 1): each grouped row's output row (f32 from the experts) is written
// to its sender's y_back at the row's index there (from e.counts), then the same flag
// round with C.
// Why the buffers may be written before this call's own handshake: a peer writes this rank's
// `grouped` / `y_back` only after this call's phase A (this rank has started the call, so it is
// done with the previous layer's rows); the staging slot of phase A is written at epoch A only
// after the peer's previous collective finished, which waited for this rank's flags of it,
// raised after this rank's last read of the same half (the protocol of oneshot.cu). Rows go to
// raw device pointers: the in-process communicator only (threads of one process, one GPU or
// GPUs with peer access), not the IPC one.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "backends/cuda/bf16.cuh"
#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"

namespace strata::cuda {
namespace {

#include "backends/cuda/kernels/oneshot_common.cuh"

constexpr int kExThreads = 512;
constexpr int kExWarps = kExThreads / 32;
constexpr int kExMaxRanks = kExWarps;  // one warp scans each destination's experts
constexpr int kRowUnroll = 4;

// Bytes of one source's slot in the staging header: E counts, then two addresses.
__host__ __device__ inline int64_t slot_bytes(int64_t experts) {
  return (experts * 4 + 16 + 15) / 16 * 16;
}

// After the block's writes: raise flag `slot` at every peer (only when `signal`) and wait for
// every peer's (oneshot_common.cuh).
__device__ __forceinline__ void signal_and_wait(const OneShotParams& p, int slot, uint32_t epoch,
                                                bool signal = true) {
  __syncthreads();
  arrive_and_wait(p, slot, epoch, signal);
}

// One warp: out[i] = carry + the sum of in[0..i) for i < len; returns carry + the sum of all.
__device__ __forceinline__ int warp_exclusive_scan(const int* in, int* out, int len, int carry) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  for (int base = 0; base < len; base += 32) {
    const int v = base + lane < len ? in[base + lane] : 0;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x += y;
    }
    if (base + lane < len) out[base + lane] = carry + x - v;
    carry += __shfl_sync(0xffffffffu, x, 31);
  }
  return carry;
}

// The last index i of sorted[0..n] with sorted[i] <= v (sorted[0] = 0 <= v).
__device__ __forceinline__ int segment_of(const int* sorted, int n, int v) {
  int lo = 0, hi = n;  // sorted[lo] <= v < sorted[hi] (sorted[n] = the total > v)
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (sorted[mid] <= v) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// One warp copies `vecs` 16-byte vectors from src to dst, kRowUnroll loads in flight per lane.
__device__ __forceinline__ void warp_copy(uint4* dst, const uint4* src, int64_t vecs) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  int64_t i = lane;
  for (; i + (kRowUnroll - 1) * 32 < vecs; i += kRowUnroll * 32) {
    uint4 v[kRowUnroll];
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) v[u] = __ldcg(src + i + u * 32);
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) dst[i + u * 32] = v[u];
  }
  for (; i < vecs; i += 32) dst[i] = __ldcg(src + i);
}

__global__ void __launch_bounds__(kExThreads, 2)
    expert_dispatch_kernel(const OneShotParams p, const ExpertExchangeParams e) {
  __shared__ int s_off[kOneShotExpertMax + 1];  // this rank's rows of each global expert
  __shared__ int s_tot[kOneShotExpertMax];      // rows every rank sends each expert
  __shared__ int s_pre[kOneShotExpertMax];      // rows of ranks before this one, per expert
  __shared__ int s_base[kOneShotExpertMax];     // where this rank's rows of e start at the owner
  __shared__ uint4* s_grouped[kExMaxRanks];
  const int n = p.n_ranks, me = p.rank, E = static_cast<int>(e.experts), El = E / n;
  const int b = static_cast<int>(blockIdx.x), warp = static_cast<int>(threadIdx.x) / 32;
  const uint32_t ep_a = *p.epoch + 1, ep_b = ep_a + 1;
  const int64_t half = p.staging_bytes / 2, slot = slot_bytes(E);
  const int64_t off_a = static_cast<int64_t>(ep_a & 1u) * half;
  for (int i = static_cast<int>(threadIdx.x); i <= E; i += blockDim.x) {
    s_off[i] = e.offsets != nullptr ? e.offsets[i] : 0;  // null: no rows
  }
  __syncthreads();
  // A. this rank's counts and addresses into every peer's header
  if (b == 0) {
    for (int q = 0; q < n; ++q) {
      char* dst = static_cast<char*>(p.staging[q]) + off_a + me * slot;
      int* counts = reinterpret_cast<int*>(dst);
      for (int i = static_cast<int>(threadIdx.x); i < E; i += blockDim.x) {
        counts[i] = s_off[i + 1] - s_off[i];
      }
      if (threadIdx.x == 0) {
        uint64_t* addr = reinterpret_cast<uint64_t*>(dst + E * 4);
        addr[0] = reinterpret_cast<uint64_t>(e.grouped);
        addr[1] = reinterpret_cast<uint64_t>(e.y_back);
      }
    }
  }
  signal_and_wait(p, 0, ep_a, b == 0);  // block 0 wrote the header; every block waits for it
  // The count matrix, from this rank's own staging half.
  const char* header = static_cast<const char*>(p.staging[me]) + off_a;
  for (int i = static_cast<int>(threadIdx.x); i < E; i += blockDim.x) {
    int tot = 0, pre = 0;
    for (int q = 0; q < n; ++q) {
      const int c = __ldcg(reinterpret_cast<const int*>(header + q * slot) + i);
      tot += c;
      if (q < me) pre += c;
    }
    s_tot[i] = tot;
    s_pre[i] = pre;
  }
  if (static_cast<int>(threadIdx.x) < n) {
    const uint64_t* addr = reinterpret_cast<const uint64_t*>(header + threadIdx.x * slot + E * 4);
    s_grouped[threadIdx.x] = reinterpret_cast<uint4*>(__ldcg(addr));
  }
  __syncthreads();
  // Each owner's grouped layout: its experts' totals scanned (warp d for owner d); this rank's
  // rows of expert x start after the rows of earlier ranks for x.
  if (warp < n) warp_exclusive_scan(s_tot + warp * El, s_base + warp * El, El, 0);
  __syncthreads();
  if (b == 0) {
    for (int i = static_cast<int>(threadIdx.x); i <= El; i += blockDim.x) {
      e.grouped_offsets[i] =
          i < El ? s_base[me * El + i] : s_base[me * El + El - 1] + s_tot[me * El + El - 1];
    }
    for (int i = static_cast<int>(threadIdx.x); i < n * E; i += blockDim.x) {
      e.counts[i] = __ldcg(reinterpret_cast<const int*>(header + (i / E) * slot) + i % E);
    }
    if (static_cast<int>(threadIdx.x) < n) {
      const uint64_t* addr = reinterpret_cast<const uint64_t*>(header + threadIdx.x * slot + E * 4);
      e.tables[threadIdx.x] = __ldcg(addr);
      e.tables[n + threadIdx.x] = __ldcg(addr + 1);
    }
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < E; i += blockDim.x) s_base[i] += s_pre[i];
  __syncthreads();
  // B. every row of this rank to its expert's owner
  const int rows = s_off[E];
  const int64_t vecs = e.x_row_bytes / 16;
  const int warps = static_cast<int>(gridDim.x) * kExWarps;
  const uint4* x = static_cast<const uint4*>(e.x);
  for (int i = b * kExWarps + warp; i < rows; i += warps) {
    const int x_e = segment_of(s_off, E, i);
    const int owner = x_e / El;
    const int64_t pos = s_base[x_e] + (i - s_off[x_e]);
    if (pos >= e.capacity) continue;  // more rows than the owner holds: a caller's bug
    warp_copy(s_grouped[owner] + pos * vecs, x + static_cast<int64_t>(i) * vecs, vecs);
  }
  signal_and_wait(p, b, ep_b);
  publish_epoch(p, static_cast<int>(gridDim.x), ep_b);
}

__global__ void __launch_bounds__(kExThreads, 2)
    expert_combine_kernel(const OneShotParams p, const ExpertExchangeParams e) {
  __shared__ int s_loff[kOneShotExpertMax + 1];  // this rank's grouped offsets
  __shared__ int s_cnt[kOneShotExpertMax];       // [source][local expert] rows
  __shared__ int s_src[kOneShotExpertMax];       // [source][local expert]: index at the source
  __shared__ uint4* s_back[kExMaxRanks];
  const int n = p.n_ranks, me = p.rank, E = static_cast<int>(e.experts), El = E / n;
  const int b = static_cast<int>(blockIdx.x), warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const uint32_t ep_c = *p.epoch + 1;
  for (int i = static_cast<int>(threadIdx.x); i <= El; i += blockDim.x) {
    s_loff[i] = e.grouped_offsets[i];
  }
  for (int i = static_cast<int>(threadIdx.x); i < n * El; i += blockDim.x) {
    s_cnt[i] = e.counts[(i / El) * E + me * El + i % El];
  }
  if (static_cast<int>(threadIdx.x) < n) {
    s_back[threadIdx.x] = reinterpret_cast<uint4*>(e.tables[n + threadIdx.x]);
  }
  __syncthreads();
  // Source q's rows of this rank's experts start at the rows it sent earlier experts.
  if (warp < n) {
    const int* row = e.counts + warp * E;
    int carry = 0;
    for (int i = lane; i < me * El; i += 32) carry += row[i];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) carry += __shfl_xor_sync(0xffffffffu, carry, o);
    warp_exclusive_scan(s_cnt + warp * El, s_src + warp * El, El, carry);
  }
  __syncthreads();
  const int rows = s_loff[El];
  const int64_t vecs = e.y_row_bytes / 16;
  const int warps = static_cast<int>(gridDim.x) * kExWarps;
  const uint4* y = static_cast<const uint4*>(static_cast<const void*>(e.y));
  for (int i = b * kExWarps + warp; i < rows; i += warps) {
    const int le = segment_of(s_loff, El, i);
    int within = i - s_loff[le], q = 0;
    while (q + 1 < n && within >= s_cnt[q * El + le]) {
      within -= s_cnt[q * El + le];
      ++q;
    }
    const int64_t at = s_src[q * El + le] + within;
    warp_copy(s_back[q] + at * vecs, y + static_cast<int64_t>(i) * vecs, vecs);
  }
  signal_and_wait(p, b, ep_c);
  publish_epoch(p, static_cast<int>(gridDim.x), ep_c);
}

Status check(const char* op, const OneShotParams& p, const ExpertExchangeParams& e, bool rows_in) {
  if (p.n_ranks < 1 || p.n_ranks > kExMaxRanks || p.rank < 0 || p.rank >= p.n_ranks ||
      p.staging == nullptr || p.flags == nullptr || p.epoch == nullptr || p.done == nullptr ||
      p.error == nullptr) {
    return invalid_argument(
        op, "bad rank (at most " + std::to_string(kExMaxRanks) + " ranks) or registration");
  }
  if (e.experts < p.n_ranks || e.experts > kOneShotExpertMax || e.experts % p.n_ranks != 0) {
    return invalid_argument(op, std::to_string(e.experts) + " experts over " +
                                    std::to_string(p.n_ranks) + " ranks (at most " +
                                    std::to_string(kOneShotExpertMax) + ", a multiple of them)");
  }
  if (slot_bytes(e.experts) * p.n_ranks > p.staging_bytes / 2) {
    return invalid_argument(op, "the count header does not fit half the staging buffer");
  }
  const int64_t row = rows_in ? e.x_row_bytes : e.y_row_bytes;
  auto aligned = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15u) == 0; };
  if (row <= 0 || row % 16 != 0 || !aligned(e.x) || !aligned(e.grouped) || !aligned(e.y) ||
      !aligned(e.y_back)) {
    return invalid_argument(op, "rows must be whole 16-byte vectors in 16-byte aligned buffers");
  }
  if (e.grouped == nullptr || e.grouped_offsets == nullptr || e.counts == nullptr ||
      e.tables == nullptr || (rows_in && e.offsets != nullptr && e.x == nullptr) ||
      (!rows_in && e.y == nullptr)) {
    return invalid_argument(op, "a null buffer");
  }
  return ok_status();
}

// 32 blocks when the rows may be many (bandwidth across NVLink), else 8 (fewer flags).
dim3 expert_grid(const ExpertExchangeParams& e, int64_t row_bytes) {
  return dim3(e.capacity * row_bytes >= (int64_t{1} << 20) ? kOneShotMaxBlocks : 8);
}

}  // namespace

Status oneshot_expert_preload() {
  cudaFuncAttributes a{};
  STRATA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&a, expert_dispatch_kernel));
  STRATA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&a, expert_combine_kernel));
  return ok_status();
}

Status oneshot_expert_dispatch(const LaunchCtx& ctx, const OneShotParams& p,
                               const ExpertExchangeParams& e) {
  STRATA_RETURN_IF_ERROR(check("oneshot_expert_dispatch", p, e, true));
  expert_dispatch_kernel<<<expert_grid(e, e.x_row_bytes), kExThreads, 0, ctx.stream>>>(p, e);
  return kernel_launch_status("expert_dispatch_kernel");
}

Status oneshot_expert_combine(const LaunchCtx& ctx, const OneShotParams& p,
                              const ExpertExchangeParams& e) {
  STRATA_RETURN_IF_ERROR(check("oneshot_expert_combine", p, e, false));
  expert_combine_kernel<<<expert_grid(e, e.y_row_bytes), kExThreads, 0, ctx.stream>>>(p, e);
  return kernel_launch_status("expert_combine_kernel");
}

}  // namespace strata::cuda
