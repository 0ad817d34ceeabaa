// CUDA backend launchers: strata::cuda::<op>(const LaunchCtx&, const <Op>Params&) -> Status.
// These are the kernels the fused op set (src/ops/ops.h) runs on a GPU; the unfused f32 ops of
// the CPU reference (cpu::rope, kv_append, attention, gated_act, act) have no CUDA version: the
// GPU runs their fused bf16 forms (rope_kv_append, varlen_attention, gated_act_bf16).
// Each takes the same Params as its CPU twin in src/backends/cpu/cpu_kernels.h, checks the
// arguments (before touching the GPU, so bad arguments fail the same way with or without one),
// launches on ctx.stream and returns the launch error, if any. Launches are asynchronous: errors
// raised while the kernel runs surface at the next synchronizing call. The caller makes
// ctx.device_index the current device; pointers are device (or managed) memory of that device.
#pragma once

#include "backends/cuda/launch_ctx.h"
#include "backends/kernel_params.h"
#include "backends/moe_params.h"
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

// kernels/elementwise.cu. add's out may equal a or b (same stride); bias dtype f32, f16 or bf16;
// softcap needs cap > 0.
Status add(const LaunchCtx& ctx, const AddParams& p);
Status add_bias(const LaunchCtx& ctx, const AddBiasParams& p);
Status scale(const LaunchCtx& ctx, const ScaleParams& p);
Status softcap(const LaunchCtx& ctx, const SoftcapParams& p);
// A strided row copy on ctx.stream (cudaMemcpy2DAsync, device to device).
Status copy_rows(const LaunchCtx& ctx, const CopyRowsParams& p);

// kernels/softmax.cu. Row-wise softmax in place and argmax (first index on ties, NaN never wins).
Status softmax(const LaunchCtx& ctx, const SoftmaxParams& p);
Status argmax(const LaunchCtx& ctx, const ArgmaxParams& p);

// ---- GPU executor kernels (backends/kernel_params.h, "GPU executor kernels") ---------------

// kernels/sbi_gemm*.cu + linear.cpp. linear() picks the kernel: SBI-GeMM (tensor-core GEMV
// reading W once, x in registers) for n_tokens <= sbi_max_tokens(), cuBLASLt above. in_features
// must be a multiple of 8 and rows 16-byte aligned. sbi_gemm() and cublaslt_linear() run one
// path unconditionally (tests, benchmarks).
Status linear(const LaunchCtx& ctx, const GpuLinearParams& p);
Status sbi_gemm(const LaunchCtx& ctx, const GpuLinearParams& p);
Status cublaslt_linear(const LaunchCtx& ctx, const GpuLinearParams& p);
int64_t sbi_max_tokens();

// kernels/norm_bf16.cu
Status norm_bf16(const LaunchCtx& ctx, const NormBf16Params& p);
// kernels/gated_act_bf16.cu (or with the other bf16 elementwise kernels)
Status gated_act_bf16(const LaunchCtx& ctx, const GatedActBf16Params& p);
// kernels/rope_kv_append.cu
Status rope_kv_append(const LaunchCtx& ctx, const RopeKvAppendParams& p);

// kernels/flash_prefill.cu (tensor-core tiles, many queries per sequence) and
// kernels/flash_decode.cu (split-K over the cached positions, then a combine pass).
// varlen_attention() picks: decode when max_q_len is small (<= 4 here), prefill otherwise.
// head_dim 64, 128 (and what else each kernel says); n_heads a multiple of cache.n_heads_kv.
Status varlen_attention(const LaunchCtx& ctx, const VarlenAttentionParams& p);
Status flash_prefill(const LaunchCtx& ctx, const VarlenAttentionParams& p);
Status flash_decode(const LaunchCtx& ctx, const VarlenAttentionParams& p);
size_t varlen_attention_workspace_bytes(int64_t n_seqs, int64_t n_heads, int64_t head_dim,
                                        int64_t max_kv_len);

// Mixture of experts (semantics: backends/moe_params.h; CPU twins: backends/cpu/moe.cpp). All
// graph-capturable: group sizes stay on the device, grids come from n_tokens, k and n_experts.
// Expert ids outside [0, n_experts) cannot be reported from the device: they are not counted
// or moved (the CPU twins return kOutOfRange), so the outputs are then undefined but every
// access stays in bounds.
// kernels/moe_route.cu: softmax / top-k router (one warp per token; the twin's choice bit for
// bit) and the per-expert offset table (one block: histogram, prefix sum); n_experts <= 4096.
Status moe_route(const LaunchCtx& ctx, const MoeRouteParams& p);
Status moe_offsets(const LaunchCtx& ctx, const MoeOffsetsParams& p);
// moe_route, moe_offsets (into `offsets`, which q.offsets must name) and moe_permute: one launch
// when n_tokens k <= 64 and n_experts <= 1024 (decode), else the three.
Status moe_dispatch(const LaunchCtx& ctx, const MoeRouteParams& r, const MoePermuteParams& q,
                    int32_t* offsets);
// kernels/moe_permute.cu: the stable permute (a block per expert numbers its slots, then one
// row copy per slot), the weighted combine (a block per token, slot order: bit-exact with the
// twin) and Qwen2-MoE's sigmoid-gated shared-expert add.
Status moe_permute(const LaunchCtx& ctx, const MoePermuteParams& p);
Status moe_combine(const LaunchCtx& ctx, const MoeCombineParams& p);
Status sigmoid_gate_add(const LaunchCtx& ctx, const SigmoidGateAddParams& p);
// kernels/moe_experts.cu (+ moe_sbi*.cu, moe_gemm.cu): the grouped SiLU-gated expert MLP over
// stacked bf16 / int8 / fp8 experts; hidden and ffn multiples of 8 (bf16) or 16 (8-bit).
Status moe_experts(const LaunchCtx& ctx, const MoeExpertsParams& p);
// kernels/moe_ep.cu: the fixed-capacity expert-parallel exchange's index plans (the send plan
// a grid-stride pass; the receive plan one block, El x ep small enough for 48 KiB of shared
// memory) and the row gather (a block per row).
Status moe_ep_send_plan(const LaunchCtx& ctx, const MoeEpSendPlanParams& p);
Status moe_ep_recv_plan(const LaunchCtx& ctx, const MoeEpRecvPlanParams& p);
Status gather_rows(const LaunchCtx& ctx, const GatherRowsParams& p);

// memcpy.cpp: async copies on ctx.stream (host memory must stay valid until the stream reaches
// them: pinned host memory makes the copy asynchronous, pageable memory is staged by the driver)
// and a wait for the stream.
Status copy_h2d(const LaunchCtx& ctx, void* dst, const void* src, size_t bytes);
Status copy_d2h(const LaunchCtx& ctx, void* dst, const void* src, size_t bytes);
Status stream_synchronize(const LaunchCtx& ctx);
// A device-to-device copy on a stream given as a type-erased cudaStream_t (communicators).
Status copy_d2d_on_stream(void* stream, void* dst, const void* src, size_t bytes);

// kernels/oneshot.cu: the one-shot all-reduce / all-gather among ranks that read each other's
// device memory (see the file header). Registered once per rank; the arrays are device memory.
constexpr int kOneShotMaxRanks = 16;
constexpr int kOneShotMaxBlocks = 32;
struct OneShotParams {
  int n_ranks = 0;
  int rank = 0;
  void* const* staging = nullptr;    // device array [n_ranks]: each rank's staging buffer
  int64_t staging_bytes = 0;         // bytes of each staging buffer (two halves)
  uint32_t* const* flags = nullptr;  // device array [n_ranks]: flags [n_ranks][kOneShotMaxBlocks]
  uint32_t* epoch = nullptr;         // this rank's epoch (device)
  uint32_t* done = nullptr;          // this rank's finished-block counter (device)
  uint32_t* error = nullptr;         // set to 1 when a wait for a peer timed out (device)
  const void* in = nullptr;          // [count] (all-reduce: may equal out)
  void* out = nullptr;               // all-reduce: [count]; all-gather: [n_ranks * count]
  int64_t count = 0;
  DType dtype = DType::kF32;  // kF32 or kBF16 (summed in f32, rank order)
};
Status oneshot(const LaunchCtx& ctx, const OneShotParams& p, bool gather);
// The all-to-all of `bytes` bytes per rank (a multiple of 4; any dtype: the copy is exact):
// p.in holds n_ranks blocks of `bytes`, block r for rank r; p.out block q comes from rank q.
// Same epochs and flags; every rank's whole input must fit half its staging buffer. CPU twin:
// the in-process communicator's host all_to_all.
Status oneshot_all_to_all(const LaunchCtx& ctx, const OneShotParams& p, int64_t bytes);
// The counted all-to-all of a fixed-capacity exchange (Communicator::all_to_all_rows): p.in and
// p.out are n_ranks blocks of `capacity` rows of row_bytes bytes (a multiple of 4); only the
// first send_rows[r] rows of input block r go to rank r, landing as the first rows of its
// output block p.rank, and output block q receives recv_rows[q] rows (rank q's
// send_rows[p.rank]; every count cut to [0, capacity]). The counts are device arrays read by
// the kernel, so the launch (grid, addresses) does not depend on them and a captured graph
// replays with new counts; the rest of p.out is left alone. Rows to this rank are copied from
// p.in directly (not staged). Same epochs, flags and staging fit as oneshot_all_to_all.
struct OneShotRowsParams {
  int64_t row_bytes = 0;
  int64_t capacity = 0;
  const int32_t* send_rows = nullptr;  // device [n_ranks]
  const int32_t* recv_rows = nullptr;  // device [n_ranks]
};
Status oneshot_all_to_all_rows(const LaunchCtx& ctx, const OneShotParams& p,
                               const OneShotRowsParams& r);
// kernels/oneshot_expert.cu: the expert-parallel exchange of a sparse layer as two kernels that
// write into the peers' buffers (semantics: ExpertExchangeParams in backends/moe_params.h; see
// the file header). Same epochs and flags as the other one-shot kernels (dispatch takes two);
// peers' buffers are raw device pointers, so the ranks must share an address space (in-process
// ranks). At most 16 ranks and 1,024 experts.
constexpr int64_t kOneShotExpertMax = 1024;
Status oneshot_expert_dispatch(const LaunchCtx& ctx, const OneShotParams& p,
                               const ExpertExchangeParams& e);
Status oneshot_expert_combine(const LaunchCtx& ctx, const OneShotParams& p,
                              const ExpertExchangeParams& e);
Status oneshot_expert_preload();
// The all-reduce of a row-parallel layer's f32 partial sums fused with what follows it
// (TensorRT-LLM's and FlashInfer's all-reduce + residual + RMSNorm fusion): per row r,
//   y = sum over ranks of y[r, :] (rank order, f32)  (+ bias)
//   x[r, :] += y;   h[r, :] = bf16(rms_norm(x[r, :]) * (weight + weight_offset))
// Same epochs and flags as oneshot(); blocks own whole rows. p.in = y (f32 [rows, cols],
// contiguous), p.count = rows * cols, p.dtype = kF32; p.out unused. CPU twin: the composition
// all_reduce -> add_bias -> norm_bf16 with the residual (ops::all_reduce_add_norm).
struct OneShotAddNormParams {
  const void* bias = nullptr;  // [cols] in bias_dtype, or null
  DType bias_dtype = DType::kF32;
  float* x = nullptr;            // residual stream f32 [rows, cols], contiguous, updated in place
  const void* weight = nullptr;  // [cols] f32 / f16 / bf16
  DType weight_dtype = DType::kF32;
  float weight_offset = 0.0f;
  float eps = 1e-6f;
  uint16_t* h = nullptr;  // bf16 [rows, cols], contiguous
  int64_t rows = 0, cols = 0;
};
Status oneshot_add_norm(const LaunchCtx& ctx, const OneShotParams& p,
                        const OneShotAddNormParams& f);
// kernels/oneshot_reduce_scatter.cu: the reduce-scatter (Communicator::reduce_scatter): p.in
// holds n_ranks blocks of p.count elements (f32 or bf16), block r for rank r; p.out [p.count] =
// the sum over ranks q in order 0..n-1 of rank q's block p.rank, in f32, rounded once (CPU twin:
// reduce_sum_host over the same blocks, as the in-process host reduce_scatter). Same epochs and
// flags as oneshot(); every rank's whole input must fit half its staging buffer.
Status oneshot_reduce_scatter(const LaunchCtx& ctx, const OneShotParams& p);
Status oneshot_reduce_scatter_preload();  // part of oneshot_preload()
int oneshot_blocks(int64_t bytes);
// Loads the one-shot kernels into the current device's context now. With lazy module loading
// (CUDA's default) the first launch of a kernel loads it, and a load can wait for the whole
// context: if a peer's one-shot kernel is already spinning on that GPU waiting for this rank,
// neither ever proceeds. Every rank calls this while registering (before any collective).
Status oneshot_preload();

// kernels/convert.cu: dst_bf16[i] = bf16(src_f32[i]); dst_f32[i] = f32(src_bf16[i]).
Status f32_to_bf16(const LaunchCtx& ctx, const float* src, uint16_t* dst, int64_t n);
Status bf16_to_f32(const LaunchCtx& ctx, const uint16_t* src, float* dst, int64_t n);
// kernels/convert.cu: fill n bf16 values with uniform(-scale, scale) from a counter-based hash of
// (seed, index): the same values on every run and device (`--load-format dummy`).
Status fill_random_bf16(const LaunchCtx& ctx, uint16_t* dst, int64_t n, uint64_t seed, float scale);
// kernels/quantize.cu: per-row symmetric weight quantization at load: for each row m of a
// bf16 [rows, cols] matrix, scale[m] = max|w[m, :]| / qmax (127 for kI8, 448 for kFP8E4M3) and
// q[m, k] = round(w[m, k] / scale[m]) (saturating; fp8 round-to-nearest-even).
Status quantize_rows(const LaunchCtx& ctx, const uint16_t* w_bf16, int64_t rows, int64_t cols,
                     DType q_dtype, void* q, float* scale);

}  // namespace strata::cuda
