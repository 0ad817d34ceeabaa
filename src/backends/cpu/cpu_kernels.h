// CPU backend: the readable reference implementation of every kernel (OpenMP over rows,
// f32 accumulation). Each function is the CPU twin of strata::cuda::<op> with the same Params.
#pragma once

#include "backends/kernel_params.h"
#include "backends/moe_params.h"
#include "strata/status.h"

namespace strata::cpu {

// Row-wise ops below this many elements run on the calling thread: starting a team and joining
// it costs microseconds, more than adding, normalising or rotating one token's rows (a decode
// step of SmolLM2-135M ran 16 parallel regions per layer, ~15% of its time in OpenMP waits).
// The weight-streaming kernels (linear, attention) always use the team.
constexpr int64_t kParallelMinElems = int64_t{1} << 15;

Status embedding(const EmbeddingParams& p);
Status rms_norm(const RmsNormParams& p);
Status layer_norm(const LayerNormParams& p);
Status linear(const LinearParams& p);
Status rope(const RopeKernelParams& p);
Status kv_append(const KvAppendParams& p);
Status attention(const AttentionKernelParams& p);
// attention's work cut into items (a token, a KV head and a subgroup of the query heads that
// share it), for a caller that runs them inside its own parallel region (attn_block.cpp).
// attention_items checks every cache slot the tokens read, as attention does, and sizes the
// subgroups for n_threads; run_attention_item(w, i) computes item i < w.count. attention() is
// these two with omp_get_max_threads(), so the same n_threads gives bit-identical outputs.
struct AttentionItems {
  struct Shape {
    int64_t group, per, hd, slot_stride;
    bool capped;
    float inv_cap;
  };
  AttentionKernelParams p;
  int64_t count = 0;
  int64_t per_token = 0;
  int64_t subgroups = 0;
  Shape shape{};
  void (*item)(const AttentionKernelParams&, const Shape&, int64_t t, int64_t kv_head,
               int64_t sub) = nullptr;
};
Status attention_items(const AttentionKernelParams& p, int n_threads, AttentionItems* w);
void run_attention_item(const AttentionItems& w, int64_t i);
Status gated_act(const GatedActParams& p);
// One row of each on the calling thread, as rms_norm / gated_act compute it (bit-identical: the
// same variant and lanes; n a multiple of 8 keeps gated_act's lanes).
void rms_norm_row(const RmsNormParams& p, const float* x, float* out);
void gated_act_row(Activation act, const float* gate, const float* up, float* out, int64_t n);
// rope's pieces: one head rotated in place with one token's cos / sin table (cos[rotary_dim / 2],
// then sin; bit-identical to rope).
void rope_head(float* x, const float* cos_sin, int64_t half, bool neox_style);
// Whether a non-zero rotary_dim is one rope takes: even, in (0, head_dim] and within its table.
bool rotary_dim_ok(int64_t rotary_dim, int64_t head_dim);

// rope_kv_append's f32 path (ops::rope_kv_append with f32 activations) as one kernel: per
// token, q copied out of its qkv row, per-head q / k RMSNorms, rope of q and of k (k in place in
// the qkv row), then k and v appended to the token's cache slot. Bit-identical to copy_rows,
// rms_norm, rope and kv_append in that order, in one parallel loop over tokens x heads. Every
// slot is checked first (kv_append's errors, nothing written); rotary_dim 0: no rotation.
Status rope_kv_append_f32(const RopeKvAppendF32Params& p);
// Its pieces, for kernels that run the units inside their own region (attn_block.cpp): the
// cos / sin table of p's positions (null when rotary_dim is 0; kept for the calling thread's next
// calls with the same positions, so read it, do not keep it), and the work for token t, unit u
// (u < n_heads: query head u; n_heads + j: KV head j, norm, rope and append; the slot must have
// been checked).
const float* rope_kv_cos_sin(const RopeKvAppendF32Params& p);
void rope_kv_unit(const RopeKvAppendF32Params& p, const float* cos_sin, int64_t t, int64_t u);
Status act(const ActParams& p);
Status add(const AddParams& p);
Status add_bias(const AddBiasParams& p);
Status scale(const ScaleParams& p);
Status softcap(const SoftcapParams& p);
Status softmax(const SoftmaxParams& p);
Status argmax(const ArgmaxParams& p);
Status copy_rows(const CopyRowsParams& p);  // elementwise.cpp

// Mixture of experts (moe.cpp; the data flow in backends/moe_params.h). f32 arithmetic; the
// permute copies f32 or bf16 rows unchanged, so these serve the reference and the bf16 layout.
Status moe_route(const MoeRouteParams& p);
Status moe_offsets(const MoeOffsetsParams& p);
Status moe_permute(const MoePermuteParams& p);
Status moe_experts(const MoeExpertsParams& p);  // the device layout's grouped MLP (bf16)
Status moe_combine(const MoeCombineParams& p);
Status sigmoid_gate_add(const SigmoidGateAddParams& p);
// moe_ep.cpp: the fixed-capacity expert-parallel exchange's index plans and row gather.
Status moe_ep_send_plan(const MoeEpSendPlanParams& p);
Status moe_ep_recv_plan(const MoeEpRecvPlanParams& p);
Status gather_rows(const GatherRowsParams& p);

// Twins of the GPU executor kernels: plain loops with the same rounding points as the CUDA
// kernels (bf16 in, f32 accumulate, bf16/f32 out).
Status gpu_linear(const GpuLinearParams& p);              // gpu_linear.cpp
Status norm_bf16(const NormBf16Params& p);                // fused_bf16.cpp
Status gated_act_bf16(const GatedActBf16Params& p);       // fused_bf16.cpp
Status rope_kv_append(const RopeKvAppendParams& p);       // fused_bf16.cpp
Status varlen_attention(const VarlenAttentionParams& p);  // varlen_attention.cpp
// gpu_linear.cpp: the twins of the GPU linear layer's A8W8 path (int8 weights above the SBI
// crossover, cuda/linear.cpp). quantize_activations_i8: per token, x_scale[t] = max|x[t, :]| /
// 127 (1 for an all-zero row), q[t, i] = round-to-nearest-even(x[t, i] / x_scale[t]) clamped to
// [-127, 127], row stride q_stride. gpu_linear_a8w8: x quantized so, exact int32 dot products
// with the int8 weights, then out = fma(f32(acc) * x_scale[t], w_scale[m], bias[m]) (+ out), one
// rounding to bf16 for bf16 out: the same operations as the GPU, so f32 results are bit-equal.
// Needs a8w8_eligible(p).
Status quantize_activations_i8(const uint16_t* x, int64_t x_stride, int64_t n_tokens, int64_t k,
                               int8_t* q, int64_t q_stride, float* x_scale);
Status gpu_linear_a8w8(const GpuLinearParams& p);
// gpu_linear.cpp: the twin of cuda::quantize_rows (same scale and rounding rule).
Status quantize_rows(const uint16_t* w_bf16, int64_t rows, int64_t cols, DType q_dtype, void* q,
                     float* scale);

// gguf_device.cpp: GGUF block formats on the GPU (cuda/kernels/gguf_fragments.h describes the
// device row layout and the values). gguf_pack_row: one row of k values from the GGUF file's
// blocks into the device row (same byte count; Q4_K / Q5_K copied, Q8_0 / Q4_0 / Q6_K split into
// quants and scales). gguf_row_to_bf16: the twin of the GPU's dequantization, the bf16 weights
// bf16_rn(q * S - M) of a device row (what the decode kernel multiplies and the prefill
// dequantizer writes). gguf_fill_random_row: a device row of random blocks (quants uniform, d so
// that the weights are about uniform in [-scale, scale]), deterministic in (seed, row).
// gguf_device_ok: whether `dt` has a device kernel and rows of k values fit it (k a multiple of
// 256).
bool gguf_device_ok(DType dt, int64_t k);
void gguf_pack_row(DType dt, const uint8_t* raw, uint8_t* dev, int64_t k);
void gguf_row_to_bf16(DType dt, const uint8_t* dev, int64_t k, uint16_t* out);
void gguf_fill_random_row(DType dt, uint64_t seed, int64_t row, float scale, int64_t k,
                          uint8_t* dev);

// gpu_linear.cpp: the twin of cuda::fill_random_bf16 (the same counter-based hash, so the same
// bits).
Status fill_random_bf16(uint16_t* dst, int64_t n, uint64_t seed, float scale);

// Checks that position `pos` of sequence `seq` maps to a block of the pool (kOutOfRange naming
// `op` and the token otherwise). Shared by kv_append and attention.
Status check_kv_slot(const PagedKvParams& c, const char* op, int64_t token, int64_t seq,
                     int64_t pos);

// Load element i of a float-typed array of dtype dt (f32, f16, bf16, fp8_e4m3) as f32.
float load_as_f32(const void* data, DType dt, int64_t i);

// Instruction sets the CPU kernels have variants for, best last.
enum class CpuIsa { kScalar, kAvx2, kAvx512 };

// Whether this CPU (and OS) can run `isa`'s variants; detected once.
bool cpu_supports(CpuIsa isa);
// The best variant this CPU runs.
CpuIsa best_cpu_isa();
const char* cpu_isa_name(CpuIsa isa);
// Whether this CPU has AVX512-VNNI on top of kAvx512 (the block-quant kernels' vpdpbusd).
bool cpu_has_avx512_vnni();
// AMX-TILE and AMX-INT8 with the tile state enabled by the OS (implies avx512_vnni).
bool cpu_has_amx_int8();

// Which algorithm linear uses: kAuto picks GEMV for few tokens and GEMM for more.
enum class LinearPath { kAuto, kGemv, kGemm };

// linear with an explicit variant and path, for tests and benchmarks (linear() uses
// best_cpu_isa() and kAuto). The scalar variant has one path and ignores `path`.
// kFailedPrecondition when the CPU cannot run `isa`.
Status linear_with_isa(const LinearParams& p, CpuIsa isa, LinearPath path = LinearPath::kAuto);

// The GEMM path for block-quantized weights (p.w_dtype a GGUF block type, p.w_stride in values,
// a multiple of the block): weight panels are dequantized to f32 while they are packed, then
// run through `isa`'s micro-kernel (f32 activations; results equal the f32 product with the
// dequantized weights up to summation order). kFailedPrecondition when the CPU cannot run
// `isa` or it has no dequantizer (scalar).
Status linear_quant_gemm(const LinearParams& p, CpuIsa isa);

}  // namespace strata::cpu
