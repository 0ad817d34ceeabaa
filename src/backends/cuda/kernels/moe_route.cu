// The router and the per-expert offset table of a mixture-of-experts layer (the data flow and
// the semantics: backends/moe_params.h; CPU twins: backends/cpu/moe.cpp, same Params).
//
// moe_route_kernel: one warp per token (4 per block). The warp finds the max logit, sums
// exp(l - max) in double (each lane its experts e = lane, lane + 32, ...; then a butterfly), and
// picks the k experts in k passes: pass j takes the largest logit that ranks below pick j - 1 in
// the order (logit descending, index ascending), NaN as -inf, so no "taken" table is needed and
// any n_experts works. Float comparisons are exact, so the choice is the twin's bit for bit;
// weights differ from the twin only by expf's last ulp and the double sum's order.
//
// moe_dispatch_kernel: a decode step's route + offsets + permute in one launch (at most 64
// slots, 1,024 experts; larger steps take the three kernels): each block repeats the routing and
// the tables in shared memory (a few hundred slots' work) and copies its own slots' rows.
//
// moe_offsets_kernel: one block of 1024 threads: a shared-memory histogram (integer atomics:
// order-independent, so deterministic), then a serial prefix sum over the experts by thread 0
// (n_experts <= 4096 by the config checks: a few microseconds at most). Ids outside
// [0, n_experts) cannot be reported from inside a graph: they are not counted (offsets[E] then
// falls short of n_slots; the CPU twin returns kOutOfRange).
#include <climits>
#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"

namespace strata::cuda {
namespace {

constexpr int kRouteWarps = 4;
constexpr int kOffsetsThreads = 1024;
constexpr int kDispatchThreads = 256;
constexpr int kDispatchSlots = 64;
constexpr int kDispatchExperts = 1024;
// Up to kRankTokens tokens over at most kRankExperts experts are routed by the whole block
// (route_token_block: E / 256 rank loops of E steps a thread), more by a warp per token.
constexpr int kRankTokens = 4;
constexpr int kRankExperts = 256;

// The better of two (logit, index) candidates in the order (logit descending, index ascending);
// index INT_MAX is "none".
__device__ __forceinline__ void route_merge(float& v, int& i, float ov, int oi) {
  if (oi == INT_MAX) return;
  if (i == INT_MAX || ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

// One token's routing by one warp: its logits l[0, E), its k ids and weights written by lane 0
// (global or shared memory).
__device__ __forceinline__ void route_token(const float* l, int E, int k, bool renormalize,
                                            int32_t* ids, float* w) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  float m = -INFINITY;
  for (int e = lane; e < E; e += kWarpSize) m = l[e] > m ? l[e] : m;  // NaN never the max
  m = warp_reduce_max(m);
  double sum = 0.0;
  for (int e = lane; e < E; e += kWarpSize) sum += static_cast<double>(expf(l[e] - m));
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const float inv = static_cast<float>(1.0 / sum);

  float prev_v = INFINITY;
  int prev_i = -1;
  float picked = 0.0f;
  for (int j = 0; j < k; ++j) {
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int e = lane; e < E; e += kWarpSize) {
      const float v = isnan(l[e]) ? -INFINITY : l[e];
      if (v < prev_v || (v == prev_v && e > prev_i)) route_merge(bv, bi, v, e);
    }
#pragma unroll
    for (int off = kWarpSize / 2; off > 0; off /= 2) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
      route_merge(bv, bi, ov, oi);
    }
    // Every lane holds the same pick (the merge is a total order); k <= E guarantees one.
    prev_v = bv;
    prev_i = bi;
    const float wj = expf(l[bi] - m) * inv;
    picked += wj;
    if (lane == 0) {
      ids[j] = bi;
      w[j] = wj;
    }
  }
  if (renormalize && lane == 0) {
    for (int j = 0; j < k; ++j) w[j] /= picked;
  }
}

__global__ void __launch_bounds__(kRouteWarps* kWarpSize) moe_route_kernel(const MoeRouteParams p) {
  const int64_t t = int64_t{blockIdx.x} * kRouteWarps + static_cast<int>(threadIdx.x) / kWarpSize;
  if (t >= p.n_tokens) return;  // warp-uniform
  route_token(p.logits + t * p.logits_stride, static_cast<int>(p.n_experts), static_cast<int>(p.k),
              p.renormalize, p.topk_ids + t * p.k, p.topk_w + t * p.k);
}

// Token t's routing by the whole block (kDispatchThreads), for the few tokens of a decode step:
// route_token's k dependent passes on one warp took ~10 us; here each thread ranks its experts
// against all E in one pass (rank = the experts before it in the order logit descending, index
// ascending, NaN as -inf) and the expert of rank j is pick j. Max and sum as route_token (the
// sum in double, reduced in another order: the weights may differ in their last ulp); thread 0
// forms the k weights in pick order. raw / key: two shared arrays of E floats.
__device__ void route_token_block(const MoeRouteParams& r, int t, float* raw, float* key,
                                  int32_t* ids, float* w) {
  __shared__ float red_f[kDispatchThreads / kWarpSize];
  __shared__ double red_d[kDispatchThreads / kWarpSize];
  __shared__ int32_t pick[kRankExperts];
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / kWarpSize, lane = tid % kWarpSize;
  constexpr int kWarps = kDispatchThreads / kWarpSize;
  const int E = static_cast<int>(r.n_experts), k = static_cast<int>(r.k);
  const float* l = r.logits + int64_t{t} * r.logits_stride;
  float m = -INFINITY;
  for (int e = tid; e < E; e += kDispatchThreads) {
    const float x = l[e];
    raw[e] = x;
    key[e] = isnan(x) ? -INFINITY : x;
    m = x > m ? x : m;  // NaN never the max
  }
  m = warp_reduce_max(m);
  if (lane == 0) red_f[warp] = m;
  __syncthreads();
  m = red_f[0];
#pragma unroll
  for (int i = 1; i < kWarps; ++i) m = red_f[i] > m ? red_f[i] : m;
  double sum = 0.0;
  for (int e = tid; e < E; e += kDispatchThreads) sum += static_cast<double>(expf(raw[e] - m));
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) red_d[warp] = sum;
  for (int e = tid; e < E; e += kDispatchThreads) {
    const float v = key[e];
    int rank = 0;
#pragma unroll 4
    for (int e2 = 0; e2 < E; ++e2) {
      const float v2 = key[e2];
      rank += (v2 > v || (v2 == v && e2 < e)) ? 1 : 0;
    }
    if (rank < k) pick[rank] = e;
  }
  __syncthreads();
  if (tid == 0) {
    sum = 0.0;
    for (int i = 0; i < kWarps; ++i) sum += red_d[i];
    const float inv = static_cast<float>(1.0 / sum);
    float picked = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int e = pick[j];
      const float wj = expf(raw[e] - m) * inv;
      picked += wj;
      ids[t * k + j] = e;
      w[t * k + j] = wj;
    }
    if (r.renormalize) {
      for (int j = 0; j < k; ++j) w[t * k + j] /= picked;
    }
  }
  __syncthreads();  // the next token reuses raw, key, pick and the reductions
}

// route + offsets + permute of a decode step in one launch (n k <= kDispatchSlots slots,
// E <= kDispatchExperts). Every block routes all tokens into shared memory (the whole block per
// token for a few tokens, route_token_block; else a warp per token, route_token), counts the slots
// per expert, scans the counts (warp 0: a chunk of experts per lane, then a shuffle scan), numbers
// the slots in the stable order (a slot counts the earlier slots of its expert), and copies the
// rows of its slots (s = block, block + grid, ...) to x_perm. Block 0 alone writes ids, w, offsets
// and perm. The same arithmetic as the three kernels (but for the block-wide router's sum order:
// route_token_block), so the same outputs.
__global__ void __launch_bounds__(kDispatchThreads)
    moe_dispatch_kernel(const MoeRouteParams r, const MoePermuteParams q, int32_t* offsets,
                        bool vec) {
  __shared__ int32_t s_ids[kDispatchSlots];
  __shared__ float s_w[kDispatchSlots];
  __shared__ int32_t s_perm[kDispatchSlots];
  __shared__ int32_t s_off[kDispatchExperts + 1];
  __shared__ float s_logits[kDispatchThreads / kWarpSize][kDispatchExperts];
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int E = static_cast<int>(r.n_experts), k = static_cast<int>(r.k);
  const int n = static_cast<int>(r.n_tokens), S = n * k;
  if (n <= kRankTokens && E <= kRankExperts) {
    for (int t = 0; t < n; ++t) route_token_block(r, t, s_logits[0], s_logits[1], s_ids, s_w);
  } else {
    for (int t = warp; t < n; t += kDispatchThreads / kWarpSize) {
      // The k passes of route_token read each logit k times: from shared memory, not global.
      const float* l = r.logits + int64_t{t} * r.logits_stride;
      for (int e = lane; e < E; e += kWarpSize) s_logits[warp][e] = l[e];
      __syncwarp();
      route_token(s_logits[warp], E, k, r.renormalize, s_ids + t * k, s_w + t * k);
      __syncwarp();  // the next token overwrites the buffer
    }
  }
  __syncthreads();
  for (int e = tid; e < E; e += kDispatchThreads) {
    int c = 0;
    for (int s = 0; s < S; ++s) c += s_ids[s] == e ? 1 : 0;
    s_off[e + 1] = c;
  }
  __syncthreads();
  if (warp == 0) {
    const int per = (E + kWarpSize - 1) / kWarpSize;
    const int e0 = min(E, lane * per), e1 = min(E, e0 + per);
    int sum = 0;
    for (int e = e0; e < e1; ++e) sum += s_off[e + 1];
    int incl = sum;
#pragma unroll
    for (int off = 1; off < kWarpSize; off *= 2) {
      const int v = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += v;
    }
    int run = incl - sum;
    for (int e = e0; e < e1; ++e) {
      run += s_off[e + 1];
      s_off[e + 1] = run;
    }
    if (lane == 0) s_off[0] = 0;
  }
  __syncthreads();
  for (int s = tid; s < S; s += kDispatchThreads) {
    const int e = s_ids[s];
    int before = 0;
    for (int s2 = 0; s2 < s; ++s2) before += s_ids[s2] == e ? 1 : 0;
    s_perm[s] = s_off[e] + before;
  }
  __syncthreads();
  if (blockIdx.x == 0) {
    for (int s = tid; s < S; s += kDispatchThreads) {
      r.topk_ids[s] = s_ids[s];
      r.topk_w[s] = s_w[s];
      q.perm[s] = s_perm[s];
    }
    for (int e = tid; e <= E; e += kDispatchThreads) offsets[e] = s_off[e];
  }
  const int64_t esize = q.dtype == DType::kF32 ? 4 : 2;
  const int64_t row_bytes = q.hidden * esize;
  for (int s = static_cast<int>(blockIdx.x); s < S; s += static_cast<int>(gridDim.x)) {
    const char* src = static_cast<const char*>(q.x) + int64_t{s / k} * q.x_stride * esize;
    char* dst = static_cast<char*>(q.x_perm) + int64_t{s_perm[s]} * row_bytes;
    if (vec) {
      for (int64_t i = int64_t{tid} * 16; i < row_bytes; i += kDispatchThreads * 16) {
        *reinterpret_cast<uint4*>(dst + i) = *reinterpret_cast<const uint4*>(src + i);
      }
    } else {
      for (int64_t i = int64_t{tid} * 2; i < row_bytes; i += kDispatchThreads * 2) {
        *reinterpret_cast<uint16_t*>(dst + i) = *reinterpret_cast<const uint16_t*>(src + i);
      }
    }
  }
}

__global__ void __launch_bounds__(kOffsetsThreads) moe_offsets_kernel(const MoeOffsetsParams p) {
  extern __shared__ int count[];  // [n_experts]
  const int E = static_cast<int>(p.n_experts);
  for (int e = static_cast<int>(threadIdx.x); e < E; e += kOffsetsThreads) count[e] = 0;
  __syncthreads();
  for (int64_t s = threadIdx.x; s < p.n_slots; s += kOffsetsThreads) {
    const int32_t e = p.topk_ids[s];
    if (e >= 0 && e < E) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t run = 0;
    p.offsets[0] = 0;
    for (int e = 0; e < E; ++e) {
      run += count[e];
      p.offsets[e + 1] = run;
    }
  }
}

}  // namespace

namespace {

Status check_route(const MoeRouteParams& p) {
  constexpr const char* kOp = "moe_route";
  if (p.n_experts < 1 || p.n_experts > 4096 || p.k < 1 || p.k > p.n_experts) {
    return invalid_argument(kOp, "top-k " + std::to_string(p.k) + " of " +
                                     std::to_string(p.n_experts) +
                                     " experts (want 1 <= k <= n_experts <= 4096)");
  }
  STRATA_RETURN_IF_ERROR(
      check_matrix(kOp, "logits", p.logits, p.n_tokens, p.n_experts, p.logits_stride));
  if (p.n_tokens > 0 && (p.topk_ids == nullptr || p.topk_w == nullptr)) {
    return invalid_argument(kOp, "null outputs");
  }
  return ok_status();
}

}  // namespace

Status moe_route(const LaunchCtx& ctx, const MoeRouteParams& p) {
  STRATA_RETURN_IF_ERROR(check_route(p));
  if (p.n_tokens == 0) return ok_status();
  const unsigned blocks = static_cast<unsigned>(ceil_div<int64_t>(p.n_tokens, kRouteWarps));
  moe_route_kernel<<<blocks, kRouteWarps * kWarpSize, 0, ctx.stream>>>(p);
  return kernel_launch_status("moe_route_kernel");
}

Status moe_offsets(const LaunchCtx& ctx, const MoeOffsetsParams& p) {
  constexpr const char* kOp = "moe_offsets";
  if (p.n_experts < 1 || p.n_experts > 4096) {
    return invalid_argument(kOp, std::to_string(p.n_experts) + " experts (want 1..4096)");
  }
  if (p.n_slots < 0 || p.n_slots > INT32_MAX) {
    return invalid_argument(kOp, std::to_string(p.n_slots) + " slots outside [0, 2^31)");
  }
  if (p.offsets == nullptr || (p.n_slots > 0 && p.topk_ids == nullptr)) {
    return invalid_argument(kOp, "null topk_ids or offsets");
  }
  const size_t smem = static_cast<size_t>(p.n_experts) * sizeof(int);
  moe_offsets_kernel<<<1, kOffsetsThreads, smem, ctx.stream>>>(p);
  return kernel_launch_status("moe_offsets_kernel");
}

Status moe_dispatch(const LaunchCtx& ctx, const MoeRouteParams& r, const MoePermuteParams& q,
                    int32_t* offsets) {
  constexpr const char* kOp = "moe_dispatch";
  STRATA_RETURN_IF_ERROR(check_route(r));
  if (q.n_tokens != r.n_tokens || q.k != r.k || q.n_experts != r.n_experts ||
      q.topk_ids != r.topk_ids || q.offsets != offsets || offsets == nullptr) {
    return invalid_argument(kOp, "route and permute parameters disagree");
  }
  const int64_t slots = r.n_tokens * r.k;
  if (slots > kDispatchSlots || r.n_experts > kDispatchExperts ||
      (q.dtype != DType::kF32 && q.dtype != DType::kBF16) || q.x_perm == nullptr ||
      q.perm == nullptr || slots == 0) {
    STRATA_RETURN_IF_ERROR(moe_route(ctx, r));
    MoeOffsetsParams o;
    o.topk_ids = r.topk_ids;
    o.n_slots = slots;
    o.n_experts = r.n_experts;
    o.offsets = offsets;
    STRATA_RETURN_IF_ERROR(moe_offsets(ctx, o));
    return moe_permute(ctx, q);
  }
  STRATA_RETURN_IF_ERROR(check_matrix(kOp, "x", q.x, q.n_tokens, q.hidden, q.x_stride));
  const int64_t esize = q.dtype == DType::kF32 ? 4 : 2;
  const bool vec = (q.hidden * esize) % 16 == 0 && (q.x_stride * esize) % 16 == 0 &&
                   is_aligned(q.x, 16) && is_aligned(q.x_perm, 16);
  moe_dispatch_kernel<<<static_cast<unsigned>(slots), kDispatchThreads, 0, ctx.stream>>>(
      r, q, offsets, vec);
  return kernel_launch_status("moe_dispatch_kernel");
}

}  // namespace strata::cuda
