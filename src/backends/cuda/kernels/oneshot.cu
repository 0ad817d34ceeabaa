// One-shot all-reduce, all-gather and all-to-all among ranks that can read each other's device
// memory (the threads of one process on one GPU, or GPUs with peer access over NVLink): the
// small-message collectives of decode steps, done inside one kernel per rank with no host
// synchronization, so they can be captured in CUDA graphs (TensorRT-LLM and FlashInfer call this
// shape "one-shot"). CPU twin of the arithmetic: strata::reduce_sum_host (src/parallel/reduce.cpp):
// ranks are summed in order 0..n-1 in f32 and rounded once, so every rank's result is bit-identical
// and equals the twin's.
//
// Each rank owns a staging buffer (two halves, alternating by epoch parity) and a flag array
// flags[src][block] that its peers write. A call with epoch e on rank r, block b of B:
//   1. copy chunk b of the input into half (e & 1) of r's staging buffer;
//   2. after a system fence, write e into flags[r][b] of every peer;
//   3. wait until each peer q has written flags[q][b] >= e in r's flag array;
//   4. read chunk b of every peer's half (e & 1) (L1 bypassed) and write the sum (all-reduce) or
//      the chunks side by side (all-gather) to the output;
//   5. the last block to finish stores e as the rank's epoch (the next call uses e + 1).
// Why this is safe to rerun: a peer can only write half (e & 1) again at epoch e + 2, which needs
// this rank's flags of epoch e + 1, which this rank raises only after this call finished; flags
// hold epochs, compared with >= (a fast peer may already have raised e + 1).
// A wait longer than ~10 s (a rank that never arrives) sets the error word and gives up instead
// of hanging the GPU; the host reads it with oneshot_check_error().
//
// Grid: B blocks (all ranks use the same B for the same message: a function of its size) of 256
// threads; on one GPU all ranks' blocks must be resident together (B <= 32 by construction).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "backends/cuda/bf16.cuh"
#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"

namespace strata::cuda {
namespace {

#include "backends/cuda/kernels/oneshot_common.cuh"

// T: float or uint16_t (bf16 bits). kGather: all-gather instead of all-reduce. kVec: the chunks
// move as 16-byte vectors (count a multiple of 16 / sizeof(T), buffers 16-byte aligned): a
// thread keeps one 16-byte load per peer in flight instead of one element, which is what a
// read across NVLink needs (scalar reads were latency-bound: ~50 us for 16 KB between GPUs).
// The sum is the same per element: rank order, f32, rounded once.
template <class T, bool kGather, bool kVec>
__global__ void __launch_bounds__(kThreads) oneshot_kernel(const OneShotParams p) {
  constexpr int64_t kV = kVec ? 16 / static_cast<int64_t>(sizeof(T)) : 1;  // elements per load
  using Load = std::conditional_t<kVec, uint4, T>;
  const int b = static_cast<int>(blockIdx.x);
  const int nb = static_cast<int>(gridDim.x);
  const uint32_t epoch = *p.epoch + 1;
  const int64_t half = p.staging_bytes / 2;
  const int64_t n = p.count / kV;         // loads in the message
  const int64_t per = (n + nb - 1) / nb;  // loads of chunk b
  const int64_t i0 = std::min<int64_t>(per * b, n);
  const int64_t i1 = std::min<int64_t>(i0 + per, n);
  const int64_t off = static_cast<int64_t>(epoch & 1u) * half;
  // 1. my chunk into my staging half
  Load* mine = reinterpret_cast<Load*>(static_cast<char*>(p.staging[p.rank]) + off);
  const Load* in = static_cast<const Load*>(p.in);
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) mine[i] = in[i];
  __syncthreads();
  // 2. raise my flag for this block at every peer; 3. wait for every peer's flag for it
  arrive_and_wait(p, b, epoch);
  // 4. read every peer's chunk (L1 bypassed: the same addresses held other data last epoch)
  Load* out = static_cast<Load*>(p.out);
  if constexpr (kGather) {
    for (int q = 0; q < p.n_ranks; ++q) {
      const Load* src = reinterpret_cast<const Load*>(static_cast<const char*>(p.staging[q]) + off);
      for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) out[q * n + i] = __ldcg(src + i);
    }
  } else {
    for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
      float s[kV];
      for (int q = 0; q < p.n_ranks; ++q) {
        const Load* src =
            reinterpret_cast<const Load*>(static_cast<const char*>(p.staging[q]) + off);
        const Load v = __ldcg(src + i);
        const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
        for (int64_t k = 0; k < kV; ++k) {
          const float x = widen<T>(e[k]);
          s[k] = q == 0 ? x : __fadd_rn(s[k], x);  // rank order, no contraction: as reduce_sum_host
        }
      }
      Load r;
      T* e = reinterpret_cast<T*>(&r);
#pragma unroll
      for (int64_t k = 0; k < kV; ++k) e[k] = narrow<T>(s[k]);
      out[i] = r;
    }
  }
  // 5. the last block publishes the epoch
  publish_epoch(p, nb, epoch);
}

// The all-to-all: p.count 4-byte words (kVec: 16-byte vectors of them) per destination; the
// input is n_ranks blocks of count words. Block b stages its part of every destination's
// block, and after the flags reads its part of block `rank` from every peer:
// out[q count + i] = peer q's in[rank count + i]. The message in staging is n_ranks blocks.
template <bool kVec>
__global__ void __launch_bounds__(kThreads) oneshot_all_to_all_kernel(const OneShotParams p) {
  using Load = std::conditional_t<kVec, uint4, uint32_t>;
  constexpr int64_t kV = kVec ? 4 : 1;
  const int b = static_cast<int>(blockIdx.x);
  const int nb = static_cast<int>(gridDim.x);
  const uint32_t epoch = *p.epoch + 1;
  const int64_t off = static_cast<int64_t>(epoch & 1u) * (p.staging_bytes / 2);
  const int64_t n = p.count / kV;  // loads per destination
  const int64_t per = (n + nb - 1) / nb;
  const int64_t i0 = std::min<int64_t>(per * b, n);
  const int64_t i1 = std::min<int64_t>(i0 + per, n);
  Load* mine = reinterpret_cast<Load*>(static_cast<char*>(p.staging[p.rank]) + off);
  const Load* in = static_cast<const Load*>(p.in);
  for (int q = 0; q < p.n_ranks; ++q) {
    for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) mine[q * n + i] = in[q * n + i];
  }
  __syncthreads();
  arrive_and_wait(p, b, epoch);
  Load* out = static_cast<Load*>(p.out);
  for (int q = 0; q < p.n_ranks; ++q) {
    const Load* src =
        reinterpret_cast<const Load*>(static_cast<const char*>(p.staging[q]) + off) + p.rank * n;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) out[q * n + i] = __ldcg(src + i);
  }
  publish_epoch(p, nb, epoch);
}

// The counted all-to-all (oneshot_all_to_all_rows): the rows of source q for destination d are
// split into gridDim.x equal chunks of loads, and block b stages (sender) and reads (receiver)
// chunk b of every peer's rows: both sides compute the chunk from the same count (the sender's
// send_rows[d] is the receiver's recv_rows[q]), so block b's flag covers exactly what block b of
// the reader takes, whatever the routing, and every block has work when any peer has rows. A
// thread keeps kRowsUnroll loads in flight (a read across NVLink is latency-bound otherwise).
constexpr int kRowsUnroll = 8;

template <bool kCg, class Load>
__device__ __forceinline__ void copy_loads(Load* dst, const Load* src, int64_t i0, int64_t i1) {
  constexpr int64_t kStep = kThreads;
  int64_t i = i0 + threadIdx.x;
  for (; i + (kRowsUnroll - 1) * kStep < i1; i += kRowsUnroll * kStep) {
    Load v[kRowsUnroll];
#pragma unroll
    for (int u = 0; u < kRowsUnroll; ++u) {
      if constexpr (kCg) {
        v[u] = __ldcg(src + i + u * kStep);
      } else {
        v[u] = src[i + u * kStep];
      }
    }
#pragma unroll
    for (int u = 0; u < kRowsUnroll; ++u) dst[i + u * kStep] = v[u];
  }
  for (; i < i1; i += kStep) {
    if constexpr (kCg) {
      dst[i] = __ldcg(src + i);
    } else {
      dst[i] = src[i];
    }
  }
}

// Chunk b of nb of n loads: [i0, i1).
__device__ __forceinline__ void chunk_of(int64_t n, int b, int nb, int64_t& i0, int64_t& i1) {
  const int64_t per = (n + nb - 1) / nb;
  i0 = std::min<int64_t>(per * b, n);
  i1 = std::min<int64_t>(i0 + per, n);
}

__device__ __forceinline__ int64_t rows_of(const int32_t* rows, int q, int64_t capacity) {
  const int64_t n = rows[q];
  return n < 0 ? 0 : (n > capacity ? capacity : n);
}

template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    oneshot_all_to_all_rows_kernel(const OneShotParams p, const OneShotRowsParams r) {
  using Load = std::conditional_t<kVec, uint4, uint32_t>;
  const int b = static_cast<int>(blockIdx.x);
  const int nb = static_cast<int>(gridDim.x);
  const uint32_t epoch = *p.epoch + 1;
  const int64_t off = static_cast<int64_t>(epoch & 1u) * (p.staging_bytes / 2);
  const int64_t row = r.row_bytes / static_cast<int64_t>(sizeof(Load));  // loads per row
  const int64_t block = row * r.capacity;                                // loads per block
  Load* mine = reinterpret_cast<Load*>(static_cast<char*>(p.staging[p.rank]) + off);
  const Load* in = static_cast<const Load*>(p.in);
  Load* out = static_cast<Load*>(p.out);
  int64_t i0 = 0, i1 = 0;
  // 1. stage chunk b of the rows for every peer (the rows to this rank skip the staging)
  for (int q = 0; q < p.n_ranks; ++q) {
    if (q == p.rank) continue;
    chunk_of(rows_of(r.send_rows, q, r.capacity) * row, b, nb, i0, i1);
    copy_loads<false>(mine + q * block, in + q * block, i0, i1);
  }
  __syncthreads();
  arrive_and_wait(p, b, epoch);
  // 4. chunk b of every source's rows for this rank (L1 bypassed, as oneshot_kernel)
  for (int q = 0; q < p.n_ranks; ++q) {
    chunk_of(rows_of(r.recv_rows, q, r.capacity) * row, b, nb, i0, i1);
    if (q == p.rank) {
      copy_loads<false>(out + q * block, in + q * block, i0, i1);
    } else {
      const Load* src =
          reinterpret_cast<const Load*>(static_cast<const char*>(p.staging[q]) + off) +
          p.rank * block;
      copy_loads<true>(out + q * block, src, i0, i1);
    }
  }
  publish_epoch(p, nb, epoch);
}

template <class T>
void launch_oneshot(const LaunchCtx& ctx, const OneShotParams& p, bool gather, bool vec,
                    dim3 grid) {
  if (vec) {
    if (gather) {
      oneshot_kernel<T, true, true><<<grid, kThreads, 0, ctx.stream>>>(p);
    } else {
      oneshot_kernel<T, false, true><<<grid, kThreads, 0, ctx.stream>>>(p);
    }
  } else if (gather) {
    oneshot_kernel<T, true, false><<<grid, kThreads, 0, ctx.stream>>>(p);
  } else {
    oneshot_kernel<T, false, false><<<grid, kThreads, 0, ctx.stream>>>(p);
  }
}

__device__ __forceinline__ float load_as_f32(const void* p, DType dt, int64_t i) {
  if (dt == DType::kBF16) return bf16_value(static_cast<const uint16_t*>(p)[i]);
  if (dt == DType::kF16) return __half2float(static_cast<const __half*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

// Blocks own rows b, b + B, ...; steps 1-3 and 5 are the protocol of oneshot_kernel, step 4 reads
// the peers' rows, adds the bias and the residual, and normalizes the row. 1024 threads: a
// decode row of 4096 features is one float4 per thread (kVec4: cols % 4 == 0 and every row
// 16-byte aligned), so the row's reads, adds and stores are one wide access each.
//
// A decode step has one row, so one block reads every peer's staging over NVLink: the reads'
// latency, not their bandwidth, sets the time. With the group size known at compile time (kR =
// 2, 4 or 8; 0: any, read rank after rank) a thread issues all its peer loads of kIt column
// steps (2 up to four ranks: a row of 8,192 f32) before the first add, so they are in flight
// together. The sum is taken in rank order either way (bit-identical to reduce_sum_host).
constexpr int kNormThreads = 1024;

template <class W, bool kVec4, int kR>
__global__ void __launch_bounds__(kNormThreads)
    oneshot_add_norm_kernel(const OneShotParams p, const OneShotAddNormParams f) {
  static_assert(kR == 0 || kVec4, "the unrolled reads are float4 rows");
  constexpr int kN = kVec4 ? 4 : 1;
  constexpr int kIt = kR > 0 && kR <= 4 ? 2 : 1;  // column steps per round
  constexpr int kLoads = kR > 0 ? kR : 1;         // peer values held per column step
  const int b = static_cast<int>(blockIdx.x);
  const int nb = static_cast<int>(gridDim.x);
  const uint32_t epoch = *p.epoch + 1;
  const int64_t off = static_cast<int64_t>(epoch & 1u) * (p.staging_bytes / 2);
  const int64_t cols = f.cols;
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t step = kVec4 ? 4 * static_cast<int64_t>(blockDim.x) : blockDim.x;
  const int64_t first = kVec4 ? 4 * static_cast<int64_t>(tid) : tid;
  float* mine = reinterpret_cast<float*>(static_cast<char*>(p.staging[p.rank]) + off);
  const float* y = static_cast<const float*>(p.in);
  for (int64_t r = b; r < f.rows; r += nb) {
    for (int64_t i = first; i < cols; i += step) {
      if constexpr (kVec4) {
        *reinterpret_cast<float4*>(mine + r * cols + i) =
            *reinterpret_cast<const float4*>(y + r * cols + i);
      } else {
        mine[r * cols + i] = y[r * cols + i];
      }
    }
  }
  __syncthreads();
  arrive_and_wait(p, b, epoch);
  const W* w = static_cast<const W*>(f.weight);
  auto peer = [&](int q, int64_t r, int64_t i) {
    return reinterpret_cast<const float*>(static_cast<const char*>(p.staging[q]) + off) + r * cols +
           i;
  };
  for (int64_t r = b; r < f.rows; r += nb) {
    float* x = f.x + r * cols;
    float sum_sq = 0.0f;
    for (int64_t i0 = first; i0 < cols; i0 += kIt * step) {
      float v[kIt][kLoads][kN];
      // Every load of the round first (rows past cols are skipped).
      if constexpr (kR > 0) {
#pragma unroll
        for (int u = 0; u < kIt; ++u) {
          const int64_t i = i0 + u * step;
          if (i >= cols) continue;
#pragma unroll
          for (int q = 0; q < kR; ++q) {
            const float4 t = __ldcg(reinterpret_cast<const float4*>(peer(q, r, i)));
            v[u][q][0] = t.x, v[u][q][1] = t.y, v[u][q][2] = t.z, v[u][q][3] = t.w;
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kIt; ++u) {
        const int64_t i = i0 + u * step;
        if (i >= cols) continue;
        float s[kN];
        if constexpr (kR > 0) {
#pragma unroll
          for (int k = 0; k < kN; ++k) s[k] = v[u][0][k];
#pragma unroll
          for (int q = 1; q < kR; ++q) {
#pragma unroll
            for (int k = 0; k < kN; ++k) s[k] = __fadd_rn(s[k], v[u][q][k]);
          }
        } else {
          for (int q = 0; q < p.n_ranks; ++q) {
            const float* src = peer(q, r, i);
            float t[kN];
            if constexpr (kVec4) {
              const float4 l = __ldcg(reinterpret_cast<const float4*>(src));
              t[0] = l.x, t[1] = l.y, t[2] = l.z, t[3] = l.w;
            } else {
              t[0] = __ldcg(src);
            }
#pragma unroll
            for (int k = 0; k < kN; ++k) s[k] = q == 0 ? t[k] : __fadd_rn(s[k], t[k]);
          }
        }
        float xv[kN];
        if constexpr (kVec4) {
          const float4 t = *reinterpret_cast<const float4*>(x + i);
          xv[0] = t.x, xv[1] = t.y, xv[2] = t.z, xv[3] = t.w;
        } else {
          xv[0] = x[i];
        }
#pragma unroll
        for (int k = 0; k < kN; ++k) {
          if (f.bias != nullptr) s[k] = __fadd_rn(s[k], load_as_f32(f.bias, f.bias_dtype, i + k));
          xv[k] = __fadd_rn(xv[k], s[k]);
          sum_sq += xv[k] * xv[k];
        }
        if constexpr (kVec4) {
          *reinterpret_cast<float4*>(x + i) = make_float4(xv[0], xv[1], xv[2], xv[3]);
        } else {
          x[i] = xv[0];
        }
      }
    }
    const float mean_sq = block_reduce_sum(sum_sq) / static_cast<float>(cols);
    const float inv = 1.0f / sqrtf(mean_sq + f.eps);
    uint16_t* h = f.h + r * cols;
    for (int64_t i = first; i < cols; i += step) {
      if constexpr (kVec4) {
        const float4 t = *reinterpret_cast<const float4*>(x + i);
        const float o = f.weight_offset;
        const uint32_t lo = static_cast<uint32_t>(bf16_bits(t.x * inv * (to_f32(w[i]) + o))) |
                            static_cast<uint32_t>(bf16_bits(t.y * inv * (to_f32(w[i + 1]) + o)))
                                << 16;
        const uint32_t hi = static_cast<uint32_t>(bf16_bits(t.z * inv * (to_f32(w[i + 2]) + o))) |
                            static_cast<uint32_t>(bf16_bits(t.w * inv * (to_f32(w[i + 3]) + o)))
                                << 16;
        *reinterpret_cast<uint2*>(h + i) = make_uint2(lo, hi);
      } else {
        h[i] = bf16_bits(x[i] * inv * (to_f32(w[i]) + f.weight_offset));
      }
    }
  }
  publish_epoch(p, nb, epoch);
}

template <class W>
void launch_add_norm(const LaunchCtx& ctx, const OneShotParams& p, const OneShotAddNormParams& f,
                     bool vec4) {
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(f.rows, kOneShotMaxBlocks)));
  if (!vec4) {
    oneshot_add_norm_kernel<W, false, 0><<<grid, kNormThreads, 0, ctx.stream>>>(p, f);
  } else if (p.n_ranks == 2) {
    oneshot_add_norm_kernel<W, true, 2><<<grid, kNormThreads, 0, ctx.stream>>>(p, f);
  } else if (p.n_ranks == 4) {
    oneshot_add_norm_kernel<W, true, 4><<<grid, kNormThreads, 0, ctx.stream>>>(p, f);
  } else if (p.n_ranks == 8) {
    oneshot_add_norm_kernel<W, true, 8><<<grid, kNormThreads, 0, ctx.stream>>>(p, f);
  } else {
    oneshot_add_norm_kernel<W, true, 0><<<grid, kNormThreads, 0, ctx.stream>>>(p, f);
  }
}

template <class W>
Status preload_add_norm() {
  cudaFuncAttributes a{};
  STRATA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&a, oneshot_add_norm_kernel<W, false, 0>));
  STRATA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&a, oneshot_add_norm_kernel<W, true, 0>));
  STRATA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&a, oneshot_add_norm_kernel<W, true, 2>));
  STRATA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&a, oneshot_add_norm_kernel<W, true, 4>));
  STRATA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&a, oneshot_add_norm_kernel<W, true, 8>));
  return ok_status();
}

}  // namespace

int oneshot_blocks(int64_t bytes) {
  // 4 KB per block: 256 threads x one 16-byte load each per peer (more blocks, more reads in
  // flight across NVLink).
  constexpr int64_t kBytesPerBlock = 4 * 1024;
  return static_cast<int>(
      std::clamp<int64_t>((bytes + kBytesPerBlock - 1) / kBytesPerBlock, 1, kOneShotMaxBlocks));
}

Status oneshot_preload() {
  cudaFuncAttributes a{};
  STRATA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&a, oneshot_kernel<float, false, false>));
  STRATA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&a, oneshot_kernel<float, true, false>));
  STRATA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&a, oneshot_kernel<uint16_t, false, false>));
  STRATA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&a, oneshot_kernel<uint16_t, true, false>));
  STRATA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&a, oneshot_kernel<float, false, true>));
  STRATA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&a, oneshot_kernel<float, true, true>));
  STRATA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&a, oneshot_kernel<uint16_t, false, true>));
  STRATA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&a, oneshot_kernel<uint16_t, true, true>));
  STRATA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&a, oneshot_all_to_all_kernel<false>));
  STRATA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&a, oneshot_all_to_all_kernel<true>));
  STRATA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&a, oneshot_all_to_all_rows_kernel<false>));
  STRATA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&a, oneshot_all_to_all_rows_kernel<true>));
  STRATA_RETURN_IF_ERROR(preload_add_norm<float>());
  STRATA_RETURN_IF_ERROR(preload_add_norm<__half>());
  STRATA_RETURN_IF_ERROR(preload_add_norm<__nv_bfloat16>());
  STRATA_RETURN_IF_ERROR(oneshot_expert_preload());
  return oneshot_reduce_scatter_preload();
}

Status oneshot(const LaunchCtx& ctx, const OneShotParams& p, bool gather) {
  if (p.n_ranks < 1 || p.n_ranks > kOneShotMaxRanks || p.rank < 0 || p.rank >= p.n_ranks ||
      p.count < 0 || p.staging == nullptr || p.flags == nullptr || p.epoch == nullptr ||
      p.done == nullptr || p.error == nullptr) {
    return invalid_argument("oneshot", "bad rank, count or registration");
  }
  if (p.dtype != DType::kF32 && p.dtype != DType::kBF16) {
    return invalid_argument("oneshot", "dtype must be f32 or bf16");
  }
  const int64_t bytes = dtype_bytes(p.dtype, p.count);
  if (bytes > p.staging_bytes / 2) {
    return invalid_argument("oneshot", "message of " + std::to_string(bytes) +
                                           " bytes exceeds half the staging buffer");
  }
  if (p.count == 0) return ok_status();
  if (p.in == nullptr || p.out == nullptr) return invalid_argument("oneshot", "null in or out");
  const dim3 grid(static_cast<unsigned>(oneshot_blocks(bytes)));
  // 16-byte loads when the message is whole vectors and the buffers are aligned (the staging
  // buffers come from cudaMalloc; their halves are when half the size is a multiple of 16).
  auto aligned = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15u) == 0; };
  const bool vec =
      bytes % 16 == 0 && aligned(p.in) && aligned(p.out) && (p.staging_bytes / 2) % 16 == 0;
  if (p.dtype == DType::kF32) {
    launch_oneshot<float>(ctx, p, gather, vec, grid);
  } else {
    launch_oneshot<uint16_t>(ctx, p, gather, vec, grid);
  }
  return kernel_launch_status("oneshot_kernel");
}

Status oneshot_all_to_all(const LaunchCtx& ctx, const OneShotParams& p, int64_t bytes) {
  if (p.n_ranks < 1 || p.n_ranks > kOneShotMaxRanks || p.rank < 0 || p.rank >= p.n_ranks ||
      bytes < 0 || p.staging == nullptr || p.flags == nullptr || p.epoch == nullptr ||
      p.done == nullptr || p.error == nullptr) {
    return invalid_argument("oneshot_all_to_all", "bad rank, size or registration");
  }
  if (bytes % 4 != 0) {
    return invalid_argument("oneshot_all_to_all", "bytes per rank must be a multiple of 4");
  }
  const int64_t total = bytes * p.n_ranks;
  if (total > p.staging_bytes / 2) {
    return invalid_argument("oneshot_all_to_all", "message of " + std::to_string(total) +
                                                      " bytes exceeds half the staging buffer");
  }
  if (bytes == 0) return ok_status();
  if (p.in == nullptr || p.out == nullptr) {
    return invalid_argument("oneshot_all_to_all", "null in or out");
  }
  OneShotParams q = p;
  auto aligned = [](const void* x) { return (reinterpret_cast<uintptr_t>(x) & 15u) == 0; };
  const bool vec =
      bytes % 16 == 0 && aligned(p.in) && aligned(p.out) && (p.staging_bytes / 2) % 16 == 0;
  q.count = bytes / 4;
  const dim3 grid(static_cast<unsigned>(oneshot_blocks(total)));
  if (vec) {
    oneshot_all_to_all_kernel<true><<<grid, kThreads, 0, ctx.stream>>>(q);
  } else {
    oneshot_all_to_all_kernel<false><<<grid, kThreads, 0, ctx.stream>>>(q);
  }
  return kernel_launch_status("oneshot_all_to_all_kernel");
}

Status oneshot_all_to_all_rows(const LaunchCtx& ctx, const OneShotParams& p,
                               const OneShotRowsParams& r) {
  constexpr const char* kOp = "oneshot_all_to_all_rows";
  if (p.n_ranks < 1 || p.n_ranks > kOneShotMaxRanks || p.rank < 0 || p.rank >= p.n_ranks ||
      r.row_bytes < 0 || r.capacity < 0 || p.staging == nullptr || p.flags == nullptr ||
      p.epoch == nullptr || p.done == nullptr || p.error == nullptr) {
    return invalid_argument(kOp, "bad rank, size or registration");
  }
  if (r.row_bytes % 4 != 0) return invalid_argument(kOp, "row bytes must be a multiple of 4");
  const int64_t total = r.row_bytes * r.capacity * p.n_ranks;
  if (total > p.staging_bytes / 2) {
    return invalid_argument(
        kOp, "message of " + std::to_string(total) + " bytes exceeds half the staging buffer");
  }
  if (total == 0) return ok_status();
  if (p.in == nullptr || p.out == nullptr || r.send_rows == nullptr || r.recv_rows == nullptr) {
    return invalid_argument(kOp, "null in, out or row counts");
  }
  auto aligned = [](const void* x) { return (reinterpret_cast<uintptr_t>(x) & 15u) == 0; };
  const bool vec =
      r.row_bytes % 16 == 0 && aligned(p.in) && aligned(p.out) && (p.staging_bytes / 2) % 16 == 0;
  // The grid is a function of the capacity (the same on every rank, and at every replay).
  const dim3 grid(static_cast<unsigned>(oneshot_blocks(total)));
  if (vec) {
    oneshot_all_to_all_rows_kernel<true><<<grid, kThreads, 0, ctx.stream>>>(p, r);
  } else {
    oneshot_all_to_all_rows_kernel<false><<<grid, kThreads, 0, ctx.stream>>>(p, r);
  }
  return kernel_launch_status("oneshot_all_to_all_rows_kernel");
}

}  // namespace strata::cuda

namespace strata::cuda {

Status oneshot_add_norm(const LaunchCtx& ctx, const OneShotParams& p,
                        const OneShotAddNormParams& f) {
  if (p.n_ranks < 1 || p.n_ranks > kOneShotMaxRanks || p.rank < 0 || p.rank >= p.n_ranks ||
      p.staging == nullptr || p.flags == nullptr || p.epoch == nullptr || p.done == nullptr ||
      p.error == nullptr) {
    return invalid_argument("oneshot_add_norm", "bad rank or registration");
  }
  if (p.dtype != DType::kF32 || f.rows < 0 || f.cols < 1 || p.count != f.rows * f.cols) {
    return invalid_argument("oneshot_add_norm", "y must be f32 [rows, cols]");
  }
  if (dtype_bytes(DType::kF32, p.count) > p.staging_bytes / 2) {
    return invalid_argument("oneshot_add_norm", "message exceeds half the staging buffer");
  }
  if (f.rows == 0) return ok_status();
  if (p.in == nullptr || f.x == nullptr || f.h == nullptr || f.weight == nullptr) {
    return invalid_argument("oneshot_add_norm", "null y, x, h or weight");
  }
  if (f.bias != nullptr && f.bias_dtype != DType::kF32 && f.bias_dtype != DType::kF16 &&
      f.bias_dtype != DType::kBF16) {
    return invalid_argument("oneshot_add_norm", "bias must be f32, f16 or bf16");
  }
  // Rows as float4 when every row start is 16-byte aligned (the staging buffers come from
  // cudaMalloc, so their halves are when half the size is a multiple of 16; p.staging is a
  // device array the host does not read).
  auto aligned = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15u) == 0; };
  const bool vec4 = f.cols % 4 == 0 && aligned(p.in) && aligned(f.x) && aligned(f.h) &&
                    (p.staging_bytes / 2) % 16 == 0;
  switch (f.weight_dtype) {
    case DType::kF32:
      launch_add_norm<float>(ctx, p, f, vec4);
      break;
    case DType::kF16:
      launch_add_norm<__half>(ctx, p, f, vec4);
      break;
    case DType::kBF16:
      launch_add_norm<__nv_bfloat16>(ctx, p, f, vec4);
      break;
    default:
      return invalid_argument("oneshot_add_norm", "norm weight must be f32, f16 or bf16");
  }
  return kernel_launch_status("oneshot_add_norm_kernel");
}

}  // namespace strata::cuda
