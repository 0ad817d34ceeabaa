// Element-wise row ops on the CPU: add, bias add, scale and tanh soft-capping, one row per OpenMP
// iteration over possibly strided f32 matrices; and the strided row copy.
#include <cmath>
#include <cstring>

#include "backends/cpu/cpu_kernels.h"

namespace strata::cpu {

Status add(const AddParams& p) {
#pragma omp parallel for schedule(static) if (p.rows * p.cols >= kParallelMinElems)
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* a = p.a + r * p.a_stride;
    const float* b = p.b + r * p.b_stride;
    float* o = p.out + r * p.out_stride;
#pragma omp simd
    for (int64_t i = 0; i < p.cols; ++i) o[i] = a[i] + b[i];
  }
  return ok_status();
}

Status add_bias(const AddBiasParams& p) {
#pragma omp parallel for schedule(static) if (p.rows * p.cols >= kParallelMinElems)
  for (int64_t r = 0; r < p.rows; ++r) {
    float* x = p.x + r * p.stride;
    for (int64_t i = 0; i < p.cols; ++i) x[i] += load_as_f32(p.bias, p.bias_dtype, i);
  }
  return ok_status();
}

Status scale(const ScaleParams& p) {
#pragma omp parallel for schedule(static) if (p.rows * p.cols >= kParallelMinElems)
  for (int64_t r = 0; r < p.rows; ++r) {
    float* x = p.x + r * p.stride;
#pragma omp simd
    for (int64_t i = 0; i < p.cols; ++i) x[i] *= p.s;
  }
  return ok_status();
}

Status softcap(const SoftcapParams& p) {
  const float inv = 1.0f / p.cap;
#pragma omp parallel for schedule(static) if (p.rows * p.cols >= kParallelMinElems)
  for (int64_t r = 0; r < p.rows; ++r) {
    float* x = p.x + r * p.stride;
    for (int64_t i = 0; i < p.cols; ++i) x[i] = p.cap * std::tanh(x[i] * inv);
  }
  return ok_status();
}

Status copy_rows(const CopyRowsParams& p) {
  if (p.rows < 0 || p.row_bytes < 0 || (p.rows > 0 && (p.src == nullptr || p.dst == nullptr))) {
    return Status(StatusCode::kInvalidArgument, "copy_rows: invalid rows, row size or pointers");
  }
  for (int64_t r = 0; r < p.rows; ++r) {
    std::memcpy(static_cast<char*>(p.dst) + r * p.dst_stride,
                static_cast<const char*>(p.src) + r * p.src_stride,
                static_cast<size_t>(p.row_bytes));
  }
  return ok_status();
}

}  // namespace strata::cpu
