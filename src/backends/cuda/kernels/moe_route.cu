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

// The better of two (logit, index) candidates in the order (logit descending, index ascending);
// index INT_MAX is "none".
__device__ __forceinline__ void route_merge(float& v, int& i, float ov, int oi) {
  if (oi == INT_MAX) return;
  if (i == INT_MAX || ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

__global__ void __launch_bounds__(kRouteWarps* kWarpSize) moe_route_kernel(const MoeRouteParams p) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t t = int64_t{blockIdx.x} * kRouteWarps + static_cast<int>(threadIdx.x) / kWarpSize;
  if (t >= p.n_tokens) return;  // warp-uniform
  const float* l = p.logits + t * p.logits_stride;
  const int E = static_cast<int>(p.n_experts);
  float m = -INFINITY;
  for (int e = lane; e < E; e += kWarpSize) m = l[e] > m ? l[e] : m;  // NaN never the max
  m = warp_reduce_max(m);
  double sum = 0.0;
  for (int e = lane; e < E; e += kWarpSize) sum += static_cast<double>(expf(l[e] - m));
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const float inv = static_cast<float>(1.0 / sum);

  int32_t* ids = p.topk_ids + t * p.k;
  float* w = p.topk_w + t * p.k;
  float prev_v = INFINITY;
  int prev_i = -1;
  float picked = 0.0f;
  for (int j = 0; j < static_cast<int>(p.k); ++j) {
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
  if (p.renormalize && lane == 0) {
    for (int j = 0; j < static_cast<int>(p.k); ++j) w[j] /= picked;
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

Status moe_route(const LaunchCtx& ctx, const MoeRouteParams& p) {
  constexpr const char* kOp = "moe_route";
  if (p.n_experts < 1 || p.n_experts > 4096 || p.k < 1 || p.k > p.n_experts) {
    return invalid_argument(kOp, "top-k " + std::to_string(p.k) + " of " +
                                     std::to_string(p.n_experts) +
                                     " experts (want 1 <= k <= n_experts <= 4096)");
  }
  STRATA_RETURN_IF_ERROR(
      check_matrix(kOp, "logits", p.logits, p.n_tokens, p.n_experts, p.logits_stride));
  if (p.n_tokens == 0) return ok_status();
  if (p.topk_ids == nullptr || p.topk_w == nullptr) return invalid_argument(kOp, "null outputs");
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

}  // namespace strata::cuda
