// The row moves of a mixture-of-experts layer (semantics: backends/moe_params.h; CPU twins:
// backends/cpu/moe.cpp, same Params): the stable permutation that groups the token rows by
// expert, the weighted combine back to token order, and Qwen2-MoE's sigmoid-gated shared expert.
// No host synchronisation: the group sizes stay on the device, grids come from n_tokens, k and
// n_experts (graph-capturable).
//
// moe_permute_rows_kernel: one block per expert (1024 threads). The block walks the slots in
// order, 1024 at a time, marks those routed to its expert, and numbers them with a block-wide
// exclusive scan (warp ballots + the per-warp totals): perm[s] = offsets[e] + the number of
// earlier slots of expert e, the twin's stable order. Experts with an empty range exit at once
// (decode: most of them). Every block reads all n k ids (from L2): fine for the few thousand
// slots of decode; a 16k-token prefill with top-8 (131k slots) takes 128 steps per block.
// moe_permute_copy_kernel: one block per slot, x_perm[perm[s], :] = x[s / k, :] (a scatter that
// writes each row once), 16-byte vectors when rows and strides allow, else element by element;
// a row index outside [0, n k) (ids outside [0, E), which the device cannot report) is skipped.
//
// moe_combine_kernel: a block per (token, 128 columns) -- decode's few tokens still spread over
// hidden / 128 blocks; out[t, i] (+)= sum_j w[t, j] y_perm[perm[t k + j], i]
// in slot order with separate f32 multiplies and adds (__fmul_rn / __fadd_rn: no fma
// contraction), the twin's arithmetic bit for bit.
// sigmoid_gate_add_kernel: one block per token, out += sigmoid(gate[t]) * y (expf vs libm exp:
// the gate may differ in its last ulp).
#include <algorithm>
#include <cstdint>
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"

namespace strata::cuda {
namespace {

constexpr int kScanThreads = 1024;
constexpr int kRowThreads = 128;

__global__ void __launch_bounds__(kScanThreads) moe_permute_rows_kernel(const MoePermuteParams p) {
  __shared__ int warp_total[kScanThreads / kWarpSize];
  const int e = static_cast<int>(blockIdx.x);
  const int r0 = p.offsets[e], r1 = p.offsets[e + 1];
  if (r1 <= r0) return;  // block-uniform: an expert without rows
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int64_t n_slots = p.n_tokens * p.k;
  int base = r0;
  for (int64_t s0 = 0; s0 < n_slots && base < r1; s0 += kScanThreads) {
    const int64_t s = s0 + threadIdx.x;
    const bool mine = s < n_slots && p.topk_ids[s] == e;
    const unsigned ballot = __ballot_sync(0xffffffffu, mine);
    if (lane == 0) warp_total[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, total = 0;
#pragma unroll
    for (int w = 0; w < kScanThreads / kWarpSize; ++w) {
      before += w < warp ? warp_total[w] : 0;
      total += warp_total[w];
    }
    if (mine) p.perm[s] = base + before + __popc(ballot & ((1u << lane) - 1u));
    base += total;
    __syncthreads();  // warp_total is rewritten by the next chunk
  }
}

template <int kW>
__global__ void __launch_bounds__(kRowThreads) moe_permute_copy_kernel(const MoePermuteParams p) {
  const int64_t s = blockIdx.x;
  const int64_t n_slots = p.n_tokens * p.k;
  const int32_t r = p.perm[s];
  if (r < 0 || r >= n_slots) return;
  const int64_t esize = p.dtype == DType::kF32 ? 4 : 2;
  const int64_t row_bytes = p.hidden * esize;
  const char* src = static_cast<const char*>(p.x) + (s / p.k) * p.x_stride * esize;
  char* dst = static_cast<char*>(p.x_perm) + int64_t{r} * row_bytes;
  if constexpr (kW == 16) {
    for (int64_t i = threadIdx.x * 16; i < row_bytes; i += kRowThreads * 16) {
      *reinterpret_cast<uint4*>(dst + i) = *reinterpret_cast<const uint4*>(src + i);
    }
  } else {
    for (int64_t i = threadIdx.x * 2; i < row_bytes; i += kRowThreads * 2) {
      *reinterpret_cast<uint16_t*>(dst + i) = *reinterpret_cast<const uint16_t*>(src + i);
    }
  }
}

__global__ void __launch_bounds__(kRowThreads) moe_combine_kernel(const MoeCombineParams p) {
  const int64_t t = blockIdx.x;
  float* o = p.out + t * p.out_stride;
  const int32_t* rows = p.perm + t * p.k;
  const float* w = p.topk_w + t * p.k;
  const int64_t n_slots = p.n_tokens * p.k;
  const bool y_bf16 = p.y_dtype == DType::kBF16;
  for (int64_t i = int64_t{blockIdx.y} * kRowThreads + threadIdx.x; i < p.hidden;
       i += int64_t{gridDim.y} * kRowThreads) {
    float acc = 0.0f;
    for (int64_t j = 0; j < p.k; ++j) {
      const int32_t r = rows[j];
      const int64_t yi = int64_t{r} * p.hidden + i;
      const float y = r < 0 || r >= n_slots ? NAN
                      : y_bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p.y_perm)[yi])
                               : static_cast<const float*>(p.y_perm)[yi];
      acc = __fadd_rn(acc, __fmul_rn(w[j], y));
    }
    o[i] = p.accumulate ? __fadd_rn(o[i], acc) : acc;
  }
}

__global__ void __launch_bounds__(kRowThreads)
    sigmoid_gate_add_kernel(const SigmoidGateAddParams p) {
  const int64_t t = blockIdx.x;
  const float g = 1.0f / (1.0f + expf(-p.gate[t * p.gate_stride]));
  const float* y = p.y + t * p.y_stride;
  float* o = p.out + t * p.out_stride;
  for (int64_t i = threadIdx.x; i < p.hidden; i += kRowThreads) {
    o[i] = __fadd_rn(o[i], __fmul_rn(g, y[i]));
  }
}

Status check_rows(const char* op, int64_t n_tokens, int64_t k) {
  if (n_tokens < 0 || k < 1 || n_tokens * k > INT32_MAX) {
    return invalid_argument(op, std::to_string(n_tokens) + " tokens x top-k " + std::to_string(k) +
                                    " slots outside [0, 2^31)");
  }
  return ok_status();
}

}  // namespace

Status moe_permute(const LaunchCtx& ctx, const MoePermuteParams& p) {
  constexpr const char* kOp = "moe_permute";
  STRATA_RETURN_IF_ERROR(check_rows(kOp, p.n_tokens, p.k));
  if (p.dtype != DType::kF32 && p.dtype != DType::kBF16) {
    return Status(
        StatusCode::kUnimplemented,
        std::string(kOp) + ": x dtype " + std::string(dtype_name(p.dtype)) + " (want f32 or bf16)");
  }
  if (p.n_experts < 1 || p.n_experts > INT32_MAX) {
    return invalid_argument(kOp, std::to_string(p.n_experts) + " experts");
  }
  STRATA_RETURN_IF_ERROR(check_matrix(kOp, "x", p.x, p.n_tokens, p.hidden, p.x_stride));
  if (p.n_tokens == 0) return ok_status();
  if (p.topk_ids == nullptr || p.offsets == nullptr || p.x_perm == nullptr || p.perm == nullptr) {
    return invalid_argument(kOp, "null topk_ids, offsets, x_perm or perm");
  }
  moe_permute_rows_kernel<<<static_cast<unsigned>(p.n_experts), kScanThreads, 0, ctx.stream>>>(p);
  STRATA_RETURN_IF_ERROR(kernel_launch_status("moe_permute_rows_kernel"));
  const int64_t esize = p.dtype == DType::kF32 ? 4 : 2;
  const bool vec = (p.hidden * esize) % 16 == 0 && (p.x_stride * esize) % 16 == 0 &&
                   is_aligned(p.x, 16) && is_aligned(p.x_perm, 16);
  const unsigned blocks = static_cast<unsigned>(p.n_tokens * p.k);
  if (vec) {
    moe_permute_copy_kernel<16><<<blocks, kRowThreads, 0, ctx.stream>>>(p);
  } else {
    moe_permute_copy_kernel<2><<<blocks, kRowThreads, 0, ctx.stream>>>(p);
  }
  return kernel_launch_status("moe_permute_copy_kernel");
}

Status moe_combine(const LaunchCtx& ctx, const MoeCombineParams& p) {
  constexpr const char* kOp = "moe_combine";
  STRATA_RETURN_IF_ERROR(check_rows(kOp, p.n_tokens, p.k));
  STRATA_RETURN_IF_ERROR(check_matrix(kOp, "out", p.out, p.n_tokens, p.hidden, p.out_stride));
  if (p.n_tokens == 0) return ok_status();
  if (p.y_dtype != DType::kF32 && p.y_dtype != DType::kBF16) {
    return invalid_argument(
        kOp, "y dtype " + std::string(dtype_name(p.y_dtype)) + " (want f32 or bf16)");
  }
  if (p.y_perm == nullptr || p.perm == nullptr || p.topk_w == nullptr) {
    return invalid_argument(kOp, "null y_perm, perm or topk_w");
  }
  const dim3 grid(
      static_cast<unsigned>(p.n_tokens),
      static_cast<unsigned>(std::min<int64_t>(ceil_div<int64_t>(p.hidden, kRowThreads), 64)));
  moe_combine_kernel<<<grid, kRowThreads, 0, ctx.stream>>>(p);
  return kernel_launch_status("moe_combine_kernel");
}

Status sigmoid_gate_add(const LaunchCtx& ctx, const SigmoidGateAddParams& p) {
  constexpr const char* kOp = "sigmoid_gate_add";
  STRATA_RETURN_IF_ERROR(check_matrix(kOp, "y", p.y, p.n_tokens, p.hidden, p.y_stride));
  STRATA_RETURN_IF_ERROR(check_matrix(kOp, "out", p.out, p.n_tokens, p.hidden, p.out_stride));
  if (p.n_tokens == 0) return ok_status();
  if (p.gate == nullptr || p.gate_stride < 1) return invalid_argument(kOp, "null gate");
  sigmoid_gate_add_kernel<<<static_cast<unsigned>(p.n_tokens), kRowThreads, 0, ctx.stream>>>(p);
  return kernel_launch_status("sigmoid_gate_add_kernel");
}

}  // namespace strata::cuda
