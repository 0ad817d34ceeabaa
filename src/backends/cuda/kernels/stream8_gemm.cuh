// The streamed 8-bit GEMM: out = x_q[n, k] @ W[m, k]^T for 8-bit weights (fp8 e4m3 or int8) and
// 8-bit activations (x quantized per token by quantize_activations_{fp8,i8}), for the batches
// just above SBI-GeMM's crossover. There cuBLASLt's fp8 / int8 kernels read the weights at only
// 20-60% of the HBM bandwidth (few output tiles, little split-k), and SBI-GeMM (x in registers,
// re-read by every 16-row block) runs out of registers and L2 bandwidth past 16 tokens.
// Measured on one H100 (bench_gpu_linear --paths stream8; docs/performance.md, twelfth session):
// it beats cuBLASLt up to 32 tokens (fp8) and 64 (int8) where k < 2 m, and loses beyond. Nsight
// Compute at 64 tokens (gate_up, fp8): DRAM 31%, the schedulers issue every 1.9 cycles with 0.87
// eligible warps of 3.4: instruction- and latency-bound on mma.sync, whose fp8 form runs far
// below the int8 one on Hopper (fp8 at 64 tokens: 151 TFLOP/s; int8: 209). Reaching the
// bandwidth at 64-128 tokens needs wgmma (the warpgroup MMA reading both operands from shared
// memory), not written.
//
// Work split:
//   cluster - `splits` blocks (1, 2, 4 or 8) split k of one 128-row weight block: split s takes
//             k-blocks [s KB / splits, (s + 1) KB / splits) (KB = k / 128). Their f32 / int32
//             partial sums meet through distributed shared memory in a fixed order (no atomics,
//             deterministic, no workspace, no second kernel): each block sums a 128 / splits-row
//             slice of the outputs over all the cluster's blocks and stores it.
//   block   - 128 weight rows x all n tokens; a kStages-deep cp.async pipeline of 128-byte
//             k-blocks: 128 weight rows and the tokens' rows, 16-byte chunks XOR-swizzled by row
//             (chunk c of row r at c ^ (r & 7)), so the fragment loads below are conflict-free.
//   warp    - one 16-row m-tile, every 8-token n-tile: mma.sync m16n8k32 (e4m3 x e4m3 -> f32, or
//             s8 x s8 -> s32, exact).
//   lane    - (g, t) = (lane / 4, lane % 4) reads bytes [32 t, 32 t + 32) of weight rows g and
//             g + 8 and of token g of each n-tile: k-step s uses words 2 s and 2 s + 1 as the
//             fragments' "k 4t..4t+3" and "k 16+4t..16+4t+3" parts. The k order inside a k-block
//             is thereby permuted, the same way for A and B, so the dot products are unchanged.
// Epilogue, as linear_epilogue's: v = f32(sum) * x_scale[t]; v = fma(v, w_scale[row], bias[row]);
// + out (accumulate) or store (f32 or bf16, one rounding). For int8 the sums are exact int32, so
// the output equals the cuBLASLt A8W8 path's bit for bit; for fp8 the tensor cores' accumulation
// order differs from cuBLASLt's.
// Rows past m and tokens past n are zero-filled by cp.async (src-size 0), never stored.
// Requires k % 128 == 0, 16-byte aligned rows (stream8_eligible).
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/gpu_linear_internal.h"
#include "backends/cuda/kernels/flash_common.cuh"

namespace strata::cuda::stream8 {

namespace cg = cooperative_groups;
using flash::cp_async_16;
using flash::cp_async_16_l2_256;
using flash::cp_async_commit;
using flash::cp_async_wait;
using flash::smem_u32;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kBM = 16 * kWarps;     // weight rows per block
constexpr int kBK = 128;             // bytes (= k values) per pipeline stage
constexpr int kRedStride = kBM + 4;  // partial sums [token][row], padded: conflict-free stores

template <int NT>
struct Cfg {
  static constexpr int kTokens = 8 * NT;
  static constexpr int kStages = NT >= 16 ? 3 : 4;
  static constexpr int kStageBytes = (kBM + kTokens) * kBK;
  static constexpr int kPipeBytes = kStages * kStageBytes;
  static constexpr int kRedBytes = kTokens * kRedStride * 4;
  static constexpr int kSmemBytes = kPipeBytes > kRedBytes ? kPipeBytes : kRedBytes;
};

// d += A (16 x 32) * B (32 x 8): int8 x int8 -> int32 (exact), or e4m3 x e4m3 -> f32.
__device__ __forceinline__ void mma8(int32_t (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                     uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma8(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                     uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}

// The 32 bytes of row r (r & 7 == g) that lane (g, t) uses, from a swizzled 128-byte-row tile.
__device__ __forceinline__ void load_row32(uint32_t tile, int r, int t, uint32_t (&w)[8]) {
  const uint32_t row = tile + static_cast<uint32_t>(r) * kBK;
  const uint4 lo = lds128(row + ((2 * t) ^ (r & 7)) * 16);
  const uint4 hi = lds128(row + ((2 * t + 1) ^ (r & 7)) * 16);
  w[0] = lo.x;
  w[1] = lo.y;
  w[2] = lo.z;
  w[3] = lo.w;
  w[4] = hi.x;
  w[5] = hi.y;
  w[6] = hi.z;
  w[7] = hi.w;
}

template <bool kI8, int NT>
__global__ void __launch_bounds__(kThreads, 2) stream8_gemm_kernel(const Args a) {
  using C = Cfg<NT>;
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int g = lane / 4;
  const int t = lane % 4;
  const int split = static_cast<int>(blockIdx.x);
  const int splits = static_cast<int>(gridDim.x);
  const int row0 = static_cast<int>(blockIdx.y) * kBM;
  const int kb_total = a.k / kBK;
  const int kb0 = split * kb_total / splits;
  const int nk = (split + 1) * kb_total / splits - kb0;
  const uint32_t base = smem_u32(smem);

  // One stage: 128 weight rows then the tokens' rows, 8 chunks of 16 bytes each. Thread tid
  // copies chunk tid % 8 of rows tid / 8, tid / 8 + 32, ...: fixed per thread, so the source
  // pointers advance by a stride (rows past m / tokens past n copy zeros from a valid address).
  const int c_thr = tid % 8;
  const int r_thr = tid / 8;
  const uint8_t* w_src = a.w + static_cast<int64_t>(row0 + r_thr) * a.w_stride + c_thr * 16;
  const int64_t w_step = 32 * a.w_stride;
  const uint8_t* x_src = a.xq + static_cast<int64_t>(r_thr) * a.xq_stride + c_thr * 16;
  const int64_t x_step = 32 * a.xq_stride;
  const uint32_t dst_thr = r_thr * kBK + ((c_thr ^ (r_thr & 7)) * 16);  // (r + 32 j) & 7 == r & 7
  const auto load_stage = [&](int stage, int kb) {
    const uint32_t sw = base + stage * C::kStageBytes + dst_thr;
    const int64_t k_off = static_cast<int64_t>(kb) * kBK;
#pragma unroll
    for (int j = 0; j < kBM / 32; ++j) {
      const bool ok = row0 + r_thr + 32 * j < a.m;
      cp_async_16_l2_256(sw + j * 32 * kBK, ok ? w_src + j * w_step + k_off : a.w, ok ? 16 : 0);
    }
    const uint32_t sx = sw + kBM * kBK;
#pragma unroll
    for (int j = 0; j < (C::kTokens + 31) / 32; ++j) {
      if (r_thr + 32 * j >= C::kTokens) break;  // NT = 2: 16 token rows, half the threads
      const bool ok = r_thr + 32 * j < a.n_tokens;
      cp_async_16(sx + j * 32 * kBK, ok ? x_src + j * x_step + k_off : a.xq, ok ? 16 : 0);
    }
  };

  using Acc = std::conditional_t<kI8, int32_t, float>;
  Acc acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int v = 0; v < 4; ++v) acc[nt][v] = Acc{0};
  }
  const int n_tiles = (a.n_tokens + 7) / 8;
  const bool warp_on = row0 + 16 * warp < a.m;

  // x comes from the quantize kernel before this one.
  pdl_wait();
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < nk) load_stage(s, kb0 + s);
    cp_async_commit();
  }
  for (int i = 0; i < nk; ++i) {
    cp_async_wait<C::kStages - 2>();
    __syncthreads();  // stage i is in; stage i - 1 is no longer read by any warp
    const int next = i + C::kStages - 1;
    if (next < nk) load_stage(next % C::kStages, kb0 + next);
    cp_async_commit();
    if (!warp_on) continue;
    const uint32_t sw = base + (i % C::kStages) * C::kStageBytes;
    const uint32_t sx = sw + kBM * kBK;
    uint32_t wg[8];
    uint32_t wg8[8];
    load_row32(sw, 16 * warp + g, t, wg);
    load_row32(sw, 16 * warp + g + 8, t, wg8);
    // Two n-tiles at a time: two independent accumulator chains between the dependent k-steps.
#pragma unroll
    for (int nt = 0; nt < NT; nt += 2) {
      if (nt >= n_tiles) break;  // warp-uniform
      const bool two = nt + 1 < n_tiles;
      uint32_t xv0[8];
      uint32_t xv1[8];
      load_row32(sx, 8 * nt + g, t, xv0);
      if (two) load_row32(sx, 8 * nt + 8 + g, t, xv1);
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint32_t af[4] = {wg[2 * s], wg8[2 * s], wg[2 * s + 1], wg8[2 * s + 1]};
        mma8(acc[nt], af, xv0[2 * s], xv0[2 * s + 1]);
        if (two) mma8(acc[nt + 1], af, xv1[2 * s], xv1[2 * s + 1]);
      }
    }
  }
  cp_async_wait<0>();
  // The weights are read: the next PDL-launched kernel may start.
  pdl_trigger();
  __syncthreads();  // every warp is done with the pipeline buffers: reuse them for the sums

  // Partial sums -> red[token][row] (f32, or int32 for int8).
  Acc* red = reinterpret_cast<Acc*>(smem);
  if (warp_on) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if (nt >= n_tiles) break;
      const int tok = 8 * nt + 2 * t;
      const int r = 16 * warp + g;
      red[tok * kRedStride + r] = acc[nt][0];
      red[(tok + 1) * kRedStride + r] = acc[nt][1];
      red[tok * kRedStride + r + 8] = acc[nt][2];
      red[(tok + 1) * kRedStride + r + 8] = acc[nt][3];
    }
  }
  cg::cluster_group cluster = cg::this_cluster();
  if (splits > 1) {
    cluster.sync();
  } else {
    __syncthreads();
  }

  // This block's slice of rows: [rank * rows, (rank + 1) * rows), summed over the cluster's
  // blocks in rank order.
  const int rows = kBM / splits;
  const int r_lo = split * rows;
  for (int e = tid; e < a.n_tokens * rows; e += kThreads) {
    const int tok = e / rows;
    const int r = r_lo + e % rows;
    const int row = row0 + r;
    if (row >= a.m) continue;
    const int idx = tok * kRedStride + r;
    Acc sum = Acc{0};
    for (int q = 0; q < splits; ++q) {
      const Acc* src = splits > 1 ? cluster.map_shared_rank(red, q) : red;
      sum += src[idx];
    }
    float v = kI8 ? __int2float_rn(static_cast<int>(sum)) : static_cast<float>(sum);
    if (a.x_scale) v *= a.x_scale[tok];
    v = __fmaf_rn(v, a.w_scale[row], a.bias ? a.bias[row] : 0.0f);
    const int64_t o = tok * a.out_stride + row;
    if (a.out_bf16) {
      static_cast<__nv_bfloat16*>(a.out)[o] = __float2bfloat16_rn(v);
    } else {
      float* out = static_cast<float*>(a.out) + o;
      *out = a.accumulate ? *out + v : v;
    }
  }
  // No block may leave while another still reads its shared memory.
  if (splits > 1) cluster.sync();
}

template <bool kI8, int NT>
Status run(const LaunchCtx& ctx, const Args& a, int splits) {
  using C = Cfg<NT>;
  const auto kernel = stream8_gemm_kernel<kI8, NT>;
  // Once per device (a host call that would otherwise add to every launch).
  static std::atomic<uint64_t> smem_set{0};
  int dev = 0;
  STRATA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t{1} << (dev & 63);
  if ((smem_set.load(std::memory_order_relaxed) & bit) == 0) {
    STRATA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(C::kSmemBytes)));
    smem_set.fetch_or(bit, std::memory_order_relaxed);
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(splits), static_cast<unsigned>(ceil_div(a.m, kBM)));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = C::kSmemBytes;
  cfg.stream = ctx.stream;
  cudaLaunchAttribute attr[2];
  int n_attr = 0;
  attr[n_attr].id = cudaLaunchAttributeClusterDimension;
  attr[n_attr].val.clusterDim.x = static_cast<unsigned>(splits);
  attr[n_attr].val.clusterDim.y = 1;
  attr[n_attr].val.clusterDim.z = 1;
  ++n_attr;
  if (pdl_enabled(ctx)) {
    attr[n_attr].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n_attr].val.programmaticStreamSerializationAllowed = 1;
    ++n_attr;
  }
  cfg.attrs = attr;
  cfg.numAttrs = static_cast<unsigned>(n_attr);
  (void)cudaLaunchKernelEx(&cfg, kernel, a);
  return kernel_launch_status("stream8_gemm_kernel");
}

template <bool kI8>
Status launch(const LaunchCtx& ctx, const Args& a, int splits) {
  if (a.n_tokens <= 16) return run<kI8, 2>(ctx, a, splits);
  if (a.n_tokens <= 32) return run<kI8, 4>(ctx, a, splits);
  if (a.n_tokens <= 64) return run<kI8, 8>(ctx, a, splits);
  return run<kI8, 16>(ctx, a, splits);
}

}  // namespace strata::cuda::stream8
