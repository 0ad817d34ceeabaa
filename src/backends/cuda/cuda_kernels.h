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

// kernels/layer_norm.cu. Weight and bias dtypes f32, f16 or bf16 (bias optional); any hidden;
// out may equal x (same stride).
Status layer_norm(const LaunchCtx& ctx, const LayerNormParams& p);

// kernels/embedding.cu. Table dtype f32, f16 or bf16. The ids live on the device, so they cannot
// be checked before the launch: a row whose id is outside [0, vocab) is filled with NaN (the CPU
// twin returns kOutOfRange instead); ids of other vocab shards give zero rows, as on the CPU.
Status embedding(const LaunchCtx& ctx, const EmbeddingParams& p);

// kernels/rope.cu. In place on x; both pair styles; rotary_dim even, <= head_dim and <= 1024.
Status rope(const LaunchCtx& ctx, const RopeKernelParams& p);

// kernels/kv_append.cu. Token ids, positions and block tables live on the device: a token whose
// slot is invalid (the CPU twin's kOutOfRange cases) writes nothing.
Status kv_append(const LaunchCtx& ctx, const KvAppendParams& p);

// kernels/attention.cu. Paged causal attention, one block per (token, query head); head_dim
// <= 256; n_heads a multiple of n_heads_kv. A (token, head) whose sequence, position or blocks
// are invalid (the CPU twin's kOutOfRange cases) gets a NaN output row. Correct, not yet fast.
Status attention(const LaunchCtx& ctx, const AttentionKernelParams& p);

// kernels/kv_append.cu: the host-side checks of a PagedKvParams shared by kv_append and attention
// (sizes positive, pointers set); kInvalidArgument naming `op`.
Status check_paged_kv(const char* op, const PagedKvParams& c);

// kernels/activation.cu. out = act(gate) * up, and x = act(x) in place.
Status gated_act(const LaunchCtx& ctx, const GatedActParams& p);
Status act(const LaunchCtx& ctx, const ActParams& p);

// kernels/elementwise.cu. add's out may equal a or b (same stride); bias dtype f32, f16 or bf16;
// softcap needs cap > 0.
Status add(const LaunchCtx& ctx, const AddParams& p);
Status add_bias(const LaunchCtx& ctx, const AddBiasParams& p);
Status scale(const LaunchCtx& ctx, const ScaleParams& p);
Status softcap(const LaunchCtx& ctx, const SoftcapParams& p);

// kernels/softmax.cu. Row-wise softmax in place and argmax (first index on ties, NaN never wins).
Status softmax(const LaunchCtx& ctx, const SoftmaxParams& p);
Status argmax(const LaunchCtx& ctx, const ArgmaxParams& p);

}  // namespace strata::cuda
