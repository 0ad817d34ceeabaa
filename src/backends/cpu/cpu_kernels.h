// CPU backend: the readable reference implementation of every kernel (OpenMP over rows,
// f32 accumulation). Each function is the CPU twin of strata::cuda::<op> with the same Params.
#pragma once

#include "backends/kernel_params.h"
#include "strata/status.h"

namespace strata::cpu {

Status rms_norm(const RmsNormParams& p);

// Load element i of a float-typed array of dtype dt (f32, f16, bf16, fp8_e4m3) as f32.
float load_as_f32(const void* data, DType dt, int64_t i);

}  // namespace strata::cpu
