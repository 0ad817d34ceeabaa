// The fixed-capacity expert-parallel exchange's index plans and row gather (semantics:
// backends/moe_params.h; CPU twins: backends/cpu/moe_ep.cpp). Everything reads its counts on the
// device, grids come from host sizes only: graph-capturable.
//
// moe_ep_send_plan_kernel: a grid-stride pass over the counts, the send slots and the rows.
// moe_ep_recv_plan_kernel: one block; the counts in shared memory, each source's prefix over its
// experts (a thread per source), the per-expert totals (a thread per expert) and their prefix
// (thread 0: El steps), then every received slot finds its expert by binary search.
// gather_rows_kernel: a block per output row, 16-byte vectors when rows and pointers allow.
#include <algorithm>
#include <cstdint>
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"

namespace strata::cuda {
namespace {

constexpr int kPlanThreads = 256;
constexpr int kGatherThreads = 128;

__global__ void moe_ep_send_plan_kernel(const MoeEpSendPlanParams p) {
  const int64_t El = p.experts_per_rank, C = p.capacity, ep = p.ep;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t t0 = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  for (int64_t j = t0; j < ep * El; j += stride) {
    p.counts[j] = p.offsets != nullptr ? p.offsets[j + 1] - p.offsets[j] : 0;
  }
  for (int64_t j = t0; j < ep * C; j += stride) {
    const int64_t d = j / C, i = j % C;
    const int64_t first = p.offsets != nullptr ? p.offsets[d * El] : 0;
    const int64_t rows = p.offsets != nullptr ? p.offsets[(d + 1) * El] - first : 0;
    p.send_map[j] = i < rows ? static_cast<int32_t>(first + i) : -1;
  }
  if (p.rows != nullptr) {
    for (int64_t d = t0; d < ep; d += stride) {
      const int64_t rows = p.offsets != nullptr ? p.offsets[(d + 1) * El] - p.offsets[d * El] : 0;
      p.rows[d] = static_cast<int32_t>(rows < C ? rows : C);
    }
  }
  for (int64_t r = t0; r < p.n_rows; r += stride) {
    int32_t v = -1;
    for (int64_t d = 0; d < ep; ++d) {
      const int64_t first = p.offsets[d * El];
      if (r >= first && r < p.offsets[(d + 1) * El]) {
        v = r - first < C ? static_cast<int32_t>(d * C + r - first) : -1;
        break;
      }
    }
    p.back_map[r] = v;
  }
}

__global__ void __launch_bounds__(kPlanThreads)
    moe_ep_recv_plan_kernel(const MoeEpRecvPlanParams p) {
  extern __shared__ int32_t smem[];
  const int El = static_cast<int>(p.experts_per_rank), ep = static_cast<int>(p.ep);
  const int64_t C = p.capacity;
  int32_t* cnt = smem;                    // [ep El], cut to the capacity
  int32_t* prefix = cnt + ep * El;        // [ep][El + 1]: a source's rows before each expert
  int32_t* off = prefix + ep * (El + 1);  // [El + 1]
  const int tid = static_cast<int>(threadIdx.x);
  for (int s = tid; s < ep; s += blockDim.x) {
    int64_t left = C, acc = 0;
    for (int e = 0; e < El; ++e) {
      int64_t c = p.counts[s * El + e];
      c = c < 0 ? 0 : (c > left ? left : c);
      cnt[s * El + e] = static_cast<int32_t>(c);
      prefix[s * (El + 1) + e] = static_cast<int32_t>(acc);
      acc += c;
      left -= c;
    }
    prefix[s * (El + 1) + El] = static_cast<int32_t>(acc);
    if (p.rows != nullptr) p.rows[s] = static_cast<int32_t>(acc);
  }
  __syncthreads();
  for (int e = tid; e < El; e += blockDim.x) {
    int32_t total = 0;
    for (int s = 0; s < ep; ++s) total += cnt[s * El + e];
    off[e + 1] = total;
  }
  __syncthreads();
  if (tid == 0) {
    off[0] = 0;
    for (int e = 0; e < El; ++e) off[e + 1] += off[e];
  }
  __syncthreads();
  for (int e = tid; e <= El; e += blockDim.x) p.offsets[e] = off[e];
  const int64_t total = off[El];
  for (int64_t j = tid; j < ep * C; j += blockDim.x) {
    if (j >= total) p.group_map[j] = -1;
    const int s = static_cast<int>(j / C);
    const int32_t i = static_cast<int32_t>(j % C);
    const int32_t* pre = prefix + s * (El + 1);
    if (i >= pre[El]) {
      p.ungroup_map[j] = -1;
      continue;
    }
    int lo = 0, hi = El - 1;  // the last expert whose first row is <= i
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (pre[mid] <= i) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    int32_t before = 0;  // rows of expert lo from earlier sources
    for (int s2 = 0; s2 < s; ++s2) before += cnt[s2 * El + lo];
    const int32_t g = off[lo] + before + (i - pre[lo]);
    p.ungroup_map[j] = g;
    p.group_map[g] = static_cast<int32_t>(j);
  }
}

template <class V>
__global__ void __launch_bounds__(kGatherThreads) gather_rows_kernel(const GatherRowsParams p) {
  const int64_t i = blockIdx.x;
  const int64_t n = p.row_bytes / static_cast<int64_t>(sizeof(V));
  V* d = reinterpret_cast<V*>(static_cast<char*>(p.dst) + i * p.row_bytes);
  const int32_t r = p.map[i];
  if (r >= 0 && r < p.src_rows) {
    const V* s = reinterpret_cast<const V*>(static_cast<const char*>(p.src) + r * p.row_bytes);
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) d[c] = s[c];
  } else if (p.zero_unmapped) {
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) d[c] = V{};
  }
}

int64_t recv_plan_smem(const MoeEpRecvPlanParams& p) {
  const int64_t El = p.experts_per_rank, ep = p.ep;
  return static_cast<int64_t>(sizeof(int32_t)) * (ep * El + ep * (El + 1) + El + 1);
}

}  // namespace

Status moe_ep_send_plan(const LaunchCtx& ctx, const MoeEpSendPlanParams& p) {
  constexpr const char* kOp = "moe_ep_send_plan";
  if (p.ep < 1 || p.experts_per_rank < 1 || p.capacity < 0 || p.n_rows < 0 ||
      p.ep * p.capacity > INT32_MAX) {
    return invalid_argument(kOp, "bad sizes");
  }
  if (p.counts == nullptr || p.send_map == nullptr || (p.n_rows > 0 && p.back_map == nullptr) ||
      (p.n_rows > 0 && p.offsets == nullptr)) {
    return invalid_argument(kOp, "null counts, maps or offsets");
  }
  const int64_t work = std::max(std::max(p.ep * p.experts_per_rank, p.ep * p.capacity), p.n_rows);
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div<int64_t>(work, 256), 64));
  moe_ep_send_plan_kernel<<<std::max(blocks, 1u), kPlanThreads, 0, ctx.stream>>>(p);
  return kernel_launch_status("moe_ep_send_plan_kernel");
}

Status moe_ep_recv_plan(const LaunchCtx& ctx, const MoeEpRecvPlanParams& p) {
  constexpr const char* kOp = "moe_ep_recv_plan";
  if (p.ep < 1 || p.experts_per_rank < 1 || p.capacity < 0 || p.ep * p.capacity > INT32_MAX) {
    return invalid_argument(kOp, "bad sizes");
  }
  if (recv_plan_smem(p) > 48 * 1024) {
    return invalid_argument(kOp, std::to_string(p.ep) + " ranks x " +
                                     std::to_string(p.experts_per_rank) +
                                     " experts: the plan exceeds 48 KiB of shared memory");
  }
  if (p.counts == nullptr || p.offsets == nullptr || p.group_map == nullptr ||
      p.ungroup_map == nullptr) {
    return invalid_argument(kOp, "null counts, offsets or maps");
  }
  moe_ep_recv_plan_kernel<<<1, kPlanThreads, static_cast<size_t>(recv_plan_smem(p)), ctx.stream>>>(
      p);
  return kernel_launch_status("moe_ep_recv_plan_kernel");
}

Status gather_rows(const LaunchCtx& ctx, const GatherRowsParams& p) {
  constexpr const char* kOp = "gather_rows";
  if (p.n_rows < 0 || p.row_bytes < 0 || p.src_rows < 0 || p.n_rows > INT32_MAX) {
    return invalid_argument(kOp, "bad sizes");
  }
  if (p.n_rows == 0 || p.row_bytes == 0) return ok_status();
  if (p.src == nullptr || p.dst == nullptr || p.map == nullptr) {
    return invalid_argument(kOp, "null src, dst or map");
  }
  const auto grid = static_cast<unsigned>(p.n_rows);
  if (p.row_bytes % 16 == 0 && is_aligned(p.src, 16) && is_aligned(p.dst, 16)) {
    gather_rows_kernel<uint4><<<grid, kGatherThreads, 0, ctx.stream>>>(p);
  } else if (p.row_bytes % 4 == 0 && is_aligned(p.src, 4) && is_aligned(p.dst, 4)) {
    gather_rows_kernel<uint32_t><<<grid, kGatherThreads, 0, ctx.stream>>>(p);
  } else {
    gather_rows_kernel<uint8_t><<<grid, kGatherThreads, 0, ctx.stream>>>(p);
  }
  return kernel_launch_status("gather_rows_kernel");
}

}  // namespace strata::cuda
