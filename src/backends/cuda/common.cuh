// Device-side helpers shared by the kernels in src/backends/cuda/kernels/: integer helpers,
// warp/block reductions, conversions of f32/f16/bf16 to f32, packed (vector) loads and stores,
// and the one dtype dispatch helper for launchers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "backends/cuda/launch_ctx.h"
#include "strata/status.h"
#include "strata/types.h"

namespace strata::cuda {

constexpr int kWarpSize = 32;

template <class T>
__host__ __device__ constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

template <class T>
__host__ __device__ constexpr T round_up(T a, T b) {
  return ceil_div(a, b) * b;
}

__host__ __device__ inline bool is_aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// ---- reductions ------------------------------------------------------------------------------

__device__ __forceinline__ float warp_reduce_sum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

__device__ __forceinline__ float warp_reduce_max(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Sum of `v` over the whole block, returned to every thread. Every thread of the block must
// call it (it has barriers) and blockDim.x must be a multiple of 32 (at most 1024), with
// blockDim.y == blockDim.z == 1. Safe to call repeatedly in one kernel.
__device__ inline float block_reduce_sum(float v) {
  __shared__ float partial[kWarpSize];
  __shared__ float total;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int n_warps = static_cast<int>(blockDim.x) / kWarpSize;
  v = warp_reduce_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < n_warps ? partial[lane] : 0.0f;
    t = warp_reduce_sum(t);
    if (lane == 0) total = t;
  }
  __syncthreads();
  return total;
}

// The same in double (LayerNorm's mean and variance, summed as the CPU twin sums them).
__device__ inline double block_reduce_sum_double(double v) {
  __shared__ double partial[kWarpSize];
  __shared__ double total;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int n_warps = static_cast<int>(blockDim.x) / kWarpSize;
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    double t = lane < n_warps ? partial[lane] : 0.0;
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      t += __shfl_xor_sync(0xffffffffu, t, offset);
    }
    if (lane == 0) total = t;
  }
  __syncthreads();
  return total;
}

// Max of `v` over the whole block, returned to every thread; same contract as block_reduce_sum.
__device__ inline float block_reduce_max(float v) {
  __shared__ float partial[kWarpSize];
  __shared__ float total;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int n_warps = static_cast<int>(blockDim.x) / kWarpSize;
  v = warp_reduce_max(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < n_warps ? partial[lane] : -INFINITY;
    t = warp_reduce_max(t);
    if (lane == 0) total = t;
  }
  __syncthreads();
  return total;
}

// ---- element conversions ---------------------------------------------------------------------

__device__ __forceinline__ float to_f32(float v) {
  return v;
}
__device__ __forceinline__ float to_f32(__half v) {
  return __half2float(v);
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <class T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Element i of a float-typed array whose dtype is only known at run time (f32, f16 or bf16; the
// launcher has checked it). For small side inputs such as a bias, where a template parameter per
// dtype would multiply the instantiations for no measurable gain.
__device__ __forceinline__ float load_as_f32(const void* p, DType dt, int64_t i) {
  if (dt == DType::kF16) return __half2float(static_cast<const __half*>(p)[i]);
  if (dt == DType::kBF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

// ---- packed loads and stores -----------------------------------------------------------------

// N elements of T moved as one access (N * sizeof(T) of 4, 8 or 16 bytes), e.g. Packed<float, 4>
// is one 16-byte ld.global.v4. The pointer must be aligned to sizeof(Packed<T, N>).
template <class T, int N>
struct alignas(sizeof(T) * N) Packed {
  T v[N];
};

template <class T, int N>
__device__ __forceinline__ Packed<T, N> load_packed(const T* p) {
  return *reinterpret_cast<const Packed<T, N>*>(p);
}

template <class T, int N>
__device__ __forceinline__ void store_packed(T* p, const Packed<T, N>& v) {
  *reinterpret_cast<Packed<T, N>*>(p) = v;
}

// N consecutive elements of T at p, converted to f32 (one packed load).
template <int N, class T>
__device__ __forceinline__ void load_f32(const T* p, float (&out)[N]) {
  const Packed<T, N> packed = load_packed<T, N>(p);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = to_f32(packed.v[i]);
}

// ---- launcher helpers (host) -----------------------------------------------------------------

// kInvalidArgument "<op>: <message>".
inline Status invalid_argument(const char* op, const std::string& message) {
  return Status(StatusCode::kInvalidArgument, std::string(op) + ": " + message);
}

// Checks an f32 matrix view [rows, cols] with row stride `stride`: rows in [0, 2^31), cols in
// [1, 2^31), stride >= cols, and a non-null pointer when there is at least one row.
inline Status check_matrix(const char* op, const char* name, const void* ptr, int64_t rows,
                           int64_t cols, int64_t stride) {
  if (rows < 0 || rows > INT32_MAX) {
    return invalid_argument(
        op, std::string(name) + " rows " + std::to_string(rows) + " outside [0, 2^31)");
  }
  if (cols <= 0 || cols > INT32_MAX) {
    return invalid_argument(
        op, std::string(name) + " cols " + std::to_string(cols) + " outside [1, 2^31)");
  }
  if (stride < cols) {
    return invalid_argument(op, std::string(name) + " row stride " + std::to_string(stride) +
                                    " smaller than cols " + std::to_string(cols));
  }
  if (rows > 0 && ptr == nullptr) return invalid_argument(op, std::string("null ") + name);
  return ok_status();
}

// Grid for element-wise kernels over [rows, cols]: blockIdx.x covers a row's columns in chunks of
// threads * per_thread, blockIdx.y walks the rows (kernels loop over rows by gridDim.y, since
// gridDim.y is at most 65535).
constexpr int kElementwiseThreads = 256;
inline dim3 elementwise_grid(int64_t rows, int64_t cols, int per_thread) {
  const int64_t chunk = int64_t{kElementwiseThreads} * per_thread;
  return dim3(static_cast<unsigned>(ceil_div<int64_t>(cols, chunk)),
              static_cast<unsigned>(rows < 65535 ? rows : 65535));
}

// ---- dtype dispatch (host) -------------------------------------------------------------------

template <class T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with T the CUDA type of a float dtype (float, __half, __nv_bfloat16) and
// returns its Status; any other dtype gives kUnimplemented naming `what`. Usage:
//   return dispatch_float_dtype(p.weight_dtype, "rms_norm weight", [&]<class W>(TypeTag<W>) {...});
template <class F>
Status dispatch_float_dtype(DType dt, const char* what, F&& f) {
  switch (dt) {
    case DType::kF32:
      return f(TypeTag<float>{});
    case DType::kF16:
      return f(TypeTag<__half>{});
    case DType::kBF16:
      return f(TypeTag<__nv_bfloat16>{});
    case DType::kI8:
    case DType::kFP8E4M3:
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      break;
  }
  return Status(StatusCode::kUnimplemented, std::string(what) + ": dtype " +
                                                std::string(dtype_name(dt)) +
                                                " is not supported by the CUDA backend");
}

// ---- programmatic dependent launch (PDL, sm_90) ---------------------------------------------
// A kernel launched with the programmatic-serialization attribute (pdl_launch) may start while
// the kernel before it on the stream is still running; it must call pdl_wait() before reading
// anything that kernel (or an earlier one) wrote, and may do independent work (prefetching
// weights) before. pdl_trigger() lets the next PDL-launched kernel start: kernels call it once
// their blocks no longer hold back the SMs (at the start for small single-wave kernels, after
// the main loop for weight-streaming ones). Both are no-ops for kernels launched normally.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// False when STRATA_NO_PDL=1 (A/B timing) or the device is older than sm_90.
bool pdl_enabled(const LaunchCtx& ctx);

// kernel<<<grid, block, smem, ctx.stream>>>(args...), launched with programmatic stream
// serialization when pdl_enabled(ctx): the kernel MUST call pdl_wait() before it reads anything
// an earlier kernel wrote. Returns the launch error and leaves it pending, so the caller's
// kernel_launch_status() reports it either way.
// `use` lets the caller keep PDL to where it was measured to help (see its callers).
template <typename... KArgs, typename... Args>
cudaError_t launch_pdl(const LaunchCtx& ctx, bool use, void (*kernel)(KArgs...), dim3 grid,
                       dim3 block, size_t smem, Args&&... args) {
  if (!use || !pdl_enabled(ctx)) {
    kernel<<<grid, block, smem, ctx.stream>>>(std::forward<Args>(args)...);
    return cudaPeekAtLastError();
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = ctx.stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace strata::cuda
