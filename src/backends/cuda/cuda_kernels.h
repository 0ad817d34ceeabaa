// CUDA backend launchers: strata::cuda::<op>(const LaunchCtx&, const <Op>Params&) -> Status.
// Each takes the same Params as its CPU twin in src/backends/cpu/cpu_kernels.h, checks the
// arguments (before touching the GPU, so bad arguments fail the same way with or without one),
// launches on ctx.stream and returns the launch error, if any. Launches are asynchronous: errors
// raised while the kernel runs surface at the next synchronizing call. The caller makes
// ctx.device_index the current device; pointers are device (or managed) memory of that device.
#pragma once

#include "backends/cuda/launch_ctx.h"
#include "backends/kernel_params.h"
#include "strata/status.h"

namespace strata::cuda {

// kernels/rms_norm.cu. Weight dtype f32, f16 or bf16; any hidden; out may equal x (same stride).
Status rms_norm(const LaunchCtx& ctx, const RmsNormParams& p);

}  // namespace strata::cuda
