// Embedding lookup: out[t, :] = scale * table[ids[t] - vocab_offset, :] converted to f32, zeros
// when the id belongs to another vocab shard (the all-reduce after a vocab-parallel lookup sums
// shards); with accumulate, out[t, :] += scale * row instead (learned position embeddings added
// to the token embeddings), and other shards' rows add nothing.
// CPU twin: src/backends/cpu/embedding.cpp (same EmbeddingParams).
//
// Layout: table [vocab_shard, hidden] in f32/f16/bf16 with row stride table_stride; ids [n_tokens]
// int32 on the device; out f32 [n_tokens, hidden] with row stride out_stride.
//
// NOTE: the CPU twin rejects an id outside [0, vocab) with kOutOfRange before copying. Here the ids
// are device data the launcher cannot read without a host sync (which a CUDA graph forbids), so
// the kernel fills such a row with NaN instead: no out-of-bounds read, and the error shows up in
// the logits rather than as a plausible-looking wrong token.
//
// One block per token, threads striding over the row.
// Variants (template parameters):
//   T    - table element type (float, __half, __nv_bfloat16): tables stay in checkpoint dtype.
//   kVec - 4 elements per access (16-byte f32 loads, 8-byte f16/bf16 loads, 16-byte stores) when
//          hidden and both strides are multiples of 4 and the pointers aligned; else scalar.
#include <algorithm>
#include <cstdint>
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"

namespace strata::cuda {
namespace {

constexpr int kVecWidth = 4;
constexpr int kMaxThreads = 512;

template <class T, bool kVec>
__global__ void __launch_bounds__(kMaxThreads) embedding_kernel(const EmbeddingParams p) {
  pdl_trigger();  // single-wave kernel: let the next (PDL) kernel prefetch its weights
  constexpr int kW = kVec ? kVecWidth : 1;
  const int64_t t = blockIdx.x;
  float* out = p.out + t * p.out_stride;  // [hidden]
  const int64_t id = p.ids[t];
  const int64_t row = id - p.vocab_offset;
  const int hidden = static_cast<int>(p.hidden);
  const int step = static_cast<int>(blockDim.x) * kW;
  const int start = static_cast<int>(threadIdx.x) * kW;

  if (id < 0 || id >= p.vocab || row < 0 || row >= p.vocab_shard) {
    const bool bad = id < 0 || id >= p.vocab;
    if (!bad && p.accumulate) return;  // another shard's row adds nothing
    const float fill = bad ? __int_as_float(0x7fc00000) : 0.0f;
    Packed<float, kW> o;
#pragma unroll
    for (int k = 0; k < kW; ++k) o.v[k] = fill;
    for (int i = start; i < hidden; i += step) store_packed(out + i, o);
    return;
  }
  const T* src = static_cast<const T*>(p.table) + row * p.table_stride;  // [hidden]
  const float scale = p.scale;
  for (int i = start; i < hidden; i += step) {
    float v[kW];
    load_f32<kW>(src + i, v);
    Packed<float, kW> o;
    if (p.accumulate) {
      o = load_packed<float, kW>(out + i);
#pragma unroll
      for (int k = 0; k < kW; ++k) o.v[k] = __fadd_rn(o.v[k], __fmul_rn(scale, v[k]));
    } else {
#pragma unroll
      for (int k = 0; k < kW; ++k) o.v[k] = scale == 1.0f ? v[k] : __fmul_rn(v[k], scale);
    }
    store_packed(out + i, o);
  }
}

Status check_params(const EmbeddingParams& p) {
  STRATA_RETURN_IF_ERROR(
      check_matrix("embedding", "out", p.out, p.n_tokens, p.hidden, p.out_stride));
  if (p.vocab <= 0 || p.vocab > INT32_MAX) {
    return invalid_argument("embedding", "vocab " + std::to_string(p.vocab) + " outside [1, 2^31)");
  }
  if (p.vocab_offset < 0 || p.vocab_shard < 0 || p.vocab_offset + p.vocab_shard > p.vocab) {
    return invalid_argument("embedding", "shard [" + std::to_string(p.vocab_offset) + ", +" +
                                             std::to_string(p.vocab_shard) +
                                             ") does not fit the vocab " + std::to_string(p.vocab));
  }
  if (p.vocab_shard > 0 && p.table_stride < p.hidden) {
    return invalid_argument("embedding", "table row stride " + std::to_string(p.table_stride) +
                                             " smaller than hidden " + std::to_string(p.hidden));
  }
  if (p.n_tokens > 0 && (p.ids == nullptr || (p.vocab_shard > 0 && p.table == nullptr))) {
    return invalid_argument("embedding", "null ids or table");
  }
  return ok_status();
}

}  // namespace

Status embedding(const LaunchCtx& ctx, const EmbeddingParams& p) {
  STRATA_RETURN_IF_ERROR(check_params(p));
  return dispatch_float_dtype(p.table_dtype, "embedding table", [&]<class T>(TypeTag<T>) {
    if (p.n_tokens == 0) return ok_status();
    const bool vec = p.hidden % kVecWidth == 0 && p.table_stride % kVecWidth == 0 &&
                     p.out_stride % kVecWidth == 0 && is_aligned(p.out, 16) &&
                     is_aligned(p.table, sizeof(T) * kVecWidth);
    const int64_t per_thread = vec ? kVecWidth : 1;
    const int threads = static_cast<int>(std::min<int64_t>(
        kMaxThreads, round_up<int64_t>(ceil_div(p.hidden, per_thread), kWarpSize)));
    const dim3 grid(static_cast<unsigned>(p.n_tokens));
    if (vec) {
      embedding_kernel<T, true><<<grid, threads, 0, ctx.stream>>>(p);
    } else {
      embedding_kernel<T, false><<<grid, threads, 0, ctx.stream>>>(p);
    }
    return kernel_launch_status("embedding_kernel");
  });
}

}  // namespace strata::cuda
