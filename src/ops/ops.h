// The op set the layer programs (src/model/<family>.cpp) are written in: the FUSED ops that make
// a GPU fast — a norm that writes the next GEMM's input (with the residual add folded in), a
// linear layer with epilogues (bias, residual accumulate, gated activation), RoPE + KV append
// (with optional q/k norms) from the fused QKV output, paged variable-length attention, and the
// explicit collectives. Each op checks its arguments (a Status naming the op and the tensors),
// then runs on the device of its Context:
//
//   CPU, f32 activations  - the reference: unfused f32 kernels (ops/reference.h, cpu::<op>), the
//                           checkpoint's weights as stored (f32/f16/bf16/GGUF blocks), f32 KV
//   CPU, bf16 activations - the bf16 twins of the GPU kernels (cpu::norm_bf16, cpu::gpu_linear,
//                           ...): the same rounding points as CUDA, for tests of the GPU path
//   CUDA                  - the kernels of src/backends/cuda (SBI-GeMM, cuBLASLt, flash attention)
//
// The activation dtype is a property of the tensors the caller passes (the runtime's workspace),
// so one program serves every backend. The residual stream x is f32 everywhere.
//
// Conventions: activations row-major [n_tokens, ...] with a row stride; a linear weight is
// [out_features, in_features] (the HF layout), possibly stored as several row blocks (parts)
// that act as one matrix.
#pragma once

#include <array>
#include <cstdint>

#include "backends/kernel_params.h"
#include "core/tensor.h"
#include "strata/status.h"

namespace strata::cuda {
struct LaunchCtx;
}

namespace strata {
class Communicator;
struct ExpertExchangeParams;
}  // namespace strata

namespace strata::ops {

using ::strata::Activation;
using ::strata::NormKind;

// Named sections of a forward pass, timed by the backend (CUDA: events on the stream).
class Profiler {
 public:
  virtual ~Profiler() = default;
  // Ends the running section (if any) and starts `name` (nullptr: just end it).
  virtual void section(const char* name) = 0;
};

// Where ops run: the device, and for CUDA the stream, cuBLASLt handle and properties.
struct Context {
  Device device;
  const cuda::LaunchCtx* cuda = nullptr;  // set iff device.is_cuda()
  Profiler* profiler = nullptr;           // null: no profiling
};

inline void section(Context& ctx, const char* name) {
  if (ctx.profiler != nullptr) ctx.profiler->section(name);
}

// ---- weights --------------------------------------------------------------------------------

// One linear layer, out = x W^T (+ b), W [rows, cols]. W may be stored as up to 3 row blocks
// (parts) that act as one matrix (Q/K/V or gate/up as the checkpoint holds them: views, no copy);
// device layouts concatenate them into one part at upload. int8 / fp8 parts carry one f32 scale
// per row (w = scale[r] * q[r, :]).
struct LinearWeight {
  struct Part {
    Tensor w;      // [rows_i, cols], float, GGUF blocks, or int8/fp8 with `scale`
    Tensor scale;  // [rows_i] f32 for int8 / fp8, else undefined
    Tensor bias;   // [rows_i] any float dtype, or undefined
  };
  std::array<Part, 3> parts{};
  int n_parts = 0;

  bool defined() const { return n_parts > 0; }
  int64_t rows() const {
    int64_t r = 0;
    for (int i = 0; i < n_parts; ++i) r += parts[static_cast<size_t>(i)].w.dim(0);
    return r;
  }
  int64_t cols() const { return n_parts > 0 ? parts[0].w.cols() : 0; }
  bool has_bias() const {
    for (int i = 0; i < n_parts; ++i) {
      if (parts[static_cast<size_t>(i)].bias.defined()) return true;
    }
    return false;
  }
  void add(const Tensor& w, const Tensor& bias = Tensor{}, const Tensor& scale = Tensor{}) {
    parts[static_cast<size_t>(n_parts++)] = Part{w, scale, bias};
  }
};

struct NormWeight {
  Tensor w;  // [dim]
  Tensor b;  // [dim] (LayerNorm) or undefined
  bool defined() const { return w.defined(); }
};

// ---- the batch and the KV cache --------------------------------------------------------------

// One forward pass's tokens as the ops see them, packed by the runtime (runtime/step.h) into
// arrays on the ops' device. Tokens are grouped in runs: maximal spans of one sequence at
// consecutive positions; run r is tokens [cu_q[r], cu_q[r+1]), they are the LAST n_q positions of
// kv_len[r] cached positions, and its block table is row r of block_tables.
struct StepArgs {
  int64_t n_tokens = 0;
  int64_t n_seqs = 0;               // runs
  int64_t max_q_len = 0;            // host-side bounds over the runs (grid sizes; fixed in a graph)
  int64_t max_kv_len = 0;           //
  const int32_t* tokens = nullptr;  // [n_tokens]
  const int32_t* token_seq = nullptr;     // [n_tokens] run index
  const int32_t* token_pos = nullptr;     // [n_tokens]
  const int32_t* cu_q = nullptr;          // [n_seqs + 1]
  const int32_t* kv_len = nullptr;        // [n_seqs]
  const int32_t* block_tables = nullptr;  // [n_seqs, max_blocks_per_seq]
  int64_t max_blocks_per_seq = 0;
};

// One layer of a paged KV pool: k, v [n_blocks, block_size, n_heads_kv, head_dim], f32 (CPU
// reference) or bf16 (GPU layout).
struct KvLayer {
  Tensor k;
  Tensor v;
};

// ---- ops --------------------------------------------------------------------------------------

// x[i] = scale * table[ids[i] - vocab_offset] when the id falls in this vocab shard, else 0
// (the shards are summed by an all-reduce); with accumulate, x[i] += instead. ids are the
// step's tokens (or its positions, for learned position embeddings).
struct EmbedArgs {
  int64_t vocab_offset = 0;
  int64_t vocab = 0;  // ids must be in [0, vocab)
  float scale = 1.0f;
  bool accumulate = false;
};
Status embed(Context& ctx, const Tensor& table, const int32_t* ids, const EmbedArgs& args,
             Tensor& x);

// out = norm(x) in out's dtype (f32, or bf16 for the GPU layout), after x += residual when
// residual is given (written back to x). x, residual: f32 [n, hidden].
struct NormArgs {
  NormKind kind = NormKind::kRms;
  float eps = 1e-6f;
  float weight_offset = 0.0f;  // RMSNorm's (1 + w) of Gemma
};
Status norm(Context& ctx, Tensor& x, const NormWeight& w, const NormArgs& args, Tensor& out,
            const Tensor* residual = nullptr);

// out (+)= x W^T (+ bias): x [n, cols] in the activation dtype; out [n, rows] f32 or bf16
// (accumulate needs f32). Without `bias`, the weight's biases are not added (row-parallel
// layers add theirs once, after the all-reduce).
struct LinearArgs {
  bool accumulate = false;
  bool bias = true;
};
Status linear(Context& ctx, const Tensor& x, const LinearWeight& w, Tensor& out,
              const LinearArgs& args = LinearArgs{});

// The MLP's first half. Gated (w = [gate; up], 2F rows): out [n, F] = act(x Wg^T + bg) *
// (x Wu^T + bu). Plain (w = up, F rows): out = act(x Wu^T + bu). scratch [n, w.rows()]: the GEMM
// output where the backend does not fuse the activation into the GEMM; out in the activation
// dtype.
Status linear_act(Context& ctx, const Tensor& x, const LinearWeight& w, Activation act, bool gated,
                  Tensor& scratch, Tensor& out);

// The MLP block with its input norm and residual: h = norm(x), act = linear_act(h, w_in),
// x += act W_down^T (+ bias). The ops above in that order (h, scratch, act as they use them);
// on the CPU, one token with GGUF block-quantized weights runs as one fused kernel
// (cpu::quant_ffn_decode, bit-identical to the composition).
struct FfnArgs {
  const NormWeight* norm = nullptr;
  NormArgs norm_args;
  const LinearWeight* w_in = nullptr;  // [gate; up] when gated, else up
  const LinearWeight* down = nullptr;
  Activation act = Activation::kSilu;
  bool gated = true;
};
Status ffn(Context& ctx, Tensor& x, const FfnArgs& args, Tensor& h, Tensor& scratch, Tensor& act);

// From the fused QKV projection qkv [n, (n_heads + 2 n_heads_kv) head_dim] f32: q_out [n,
// n_heads, head_dim] = rope(q_norm(q)) in the activation dtype, and rope(k_norm(k)), v written to
// the cache slots of the step's tokens. rotary_dim 0: no rotation (learned positions).
struct RopeArgs {
  const Tensor* inv_freq = nullptr;  // f32 [rotary_dim / 2] on the ops' device
  int64_t rotary_dim = 0;
  bool neox_style = true;
  const NormWeight* q_norm = nullptr;  // per-head RMSNorm weights [head_dim], or null
  const NormWeight* k_norm = nullptr;
  float norm_eps = 1e-6f;
  float norm_weight_offset = 0.0f;
};
Status rope_kv_append(Context& ctx, const Tensor& qkv, const StepArgs& step, const RopeArgs& args,
                      KvLayer& cache, Tensor& q_out);

// Causal attention of the step's queries q [n, n_heads, head_dim] over their runs' cached
// positions (sliding_window 0 = all; logit_softcap 0 = off): out [n, n_heads * head_dim] in the
// activation dtype. workspace: device scratch for split-K decode (may be undefined).
struct AttentionArgs {
  float scale = 1.0f;
  int64_t sliding_window = 0;
  float logit_softcap = 0.0f;
  Tensor workspace;
};
Status attention(Context& ctx, const Tensor& q, const StepArgs& step, const KvLayer& cache,
                 const AttentionArgs& args, Tensor& out);

// The attention block with its input norm and residual (one rank): h = norm(x),
// qkv = linear(h, w_qkv), q = rope_kv_append(qkv), attn = attention(q), x += attn W_o^T (+ bias).
// The ops above in that order, writing h, qkv, q, attn and the cache as they do; on the CPU, one
// token with GGUF block-quantized weights runs as one fused kernel (cpu::quant_attn_decode,
// bit-identical to the composition).
struct AttentionBlockArgs {
  const NormWeight* norm = nullptr;
  NormArgs norm_args;
  const LinearWeight* qkv = nullptr;
  RopeArgs rope;
  AttentionArgs attn;
  const LinearWeight* o = nullptr;
};
Status attention_block(Context& ctx, Tensor& x, const StepArgs& step,
                       const AttentionBlockArgs& args, KvLayer& cache, Tensor& h, Tensor& qkv,
                       Tensor& q, Tensor& attn);

// The MLP's activation alone, for layouts that reduce the gate/up GEMM's partial sums before
// activating them (the 2D weight-stationary FFN, model/ffn_layouts.cpp): gated, gu [n, 2F] =
// [gate | up] and out [n, F] = act(gate) * up; plain, gu and out [n, F], out = act(gu). f32 on the
// CPU, or bf16 / f32 in and bf16 out on either device (the kernel of linear_act's unfused bf16
// path); kUnimplemented for other dtypes.
Status activation(Context& ctx, const Tensor& gu, Activation act, bool gated, Tensor& out);

// Element-wise, f32 [n, cols] with row strides.
Status add(Context& ctx, const Tensor& a, const Tensor& b, Tensor& out);  // out may alias a or b
Status add_bias(Context& ctx, Tensor& x, const Tensor& bias);             // x[r, :] += bias
Status softcap(Context& ctx, Tensor& x, float cap);                       // cap * tanh(x / cap)
// ids[r] = argmax x[r, :] (first index on ties): x f32 [n, cols], ids i32 [n].
Status argmax(Context& ctx, const Tensor& x, Tensor& ids);
// dst[r, :] = src[r, :] for same-shaped 2-D tensors of one dtype on the ops' device.
Status copy(Context& ctx, const Tensor& src, Tensor& dst);

// ---- mixture of experts ------------------------------------------------------------------------
// One MoE block of a layer (the data flow and layouts: backends/moe_params.h): the router's
// logits come from ops::linear; then
//   moe_route    ids, w [n, k] = top-k(softmax(logits)), ties to the lower expert, optionally
//                renormalised to sum 1
//   moe_offsets  offsets [E + 1]: per-expert row ranges of the permuted batch (prefix sum)
//   moe_permute  x_perm [n k, H] = the rows of x grouped by expert (stable), perm [n k] = the
//                permuted row of each slot (t, j) = t k + j
//   moe_experts  y_perm [n k, H] = down_e(act(gate_e(x)) * up_e(x)) over each expert's rows
//   moe_combine  out [n, H] (+)= sum_j w[t, j] y_perm[perm[t k + j]]
// and sigmoid_gate_add for Qwen2-MoE's gated shared expert. ids / offsets / perm are i32 and
// w f32 on the ops' device; x_perm is in the activation dtype (f32 or bf16).

struct MoeRouteArgs {
  int64_t k = 1;             // experts per token (n_experts_used)
  bool renormalize = false;  // divide the k weights by their sum
};
Status moe_route(Context& ctx, const Tensor& logits, const MoeRouteArgs& args, Tensor& topk_ids,
                 Tensor& topk_w);
Status moe_offsets(Context& ctx, const Tensor& topk_ids, int64_t n_experts, Tensor& offsets);
Status moe_permute(Context& ctx, const Tensor& x, const Tensor& topk_ids, const Tensor& offsets,
                   Tensor& x_perm, Tensor& perm);
// moe_route, moe_offsets and moe_permute in one call (one launch on CUDA for decode-size steps):
// offsets [1, E + 1] with E the logits' columns.
Status moe_dispatch(Context& ctx, const Tensor& logits, const MoeRouteArgs& args, const Tensor& x,
                    Tensor& topk_ids, Tensor& topk_w, Tensor& offsets, Tensor& x_perm,
                    Tensor& perm);

// The experts of one layer: expert e's gated MLP is gate_up[e] ([gate; up], 2 F rows, as
// ops::linear_act reads it) then down[e] ([H, F]).
struct MoeExperts {
  const LinearWeight* gate_up = nullptr;  // [n_experts]
  const LinearWeight* down = nullptr;     // [n_experts]
  int64_t n_experts = 0;
  // Host-side bound on the rows of any one expert (n_tokens: a token picks an expert at most
  // once); 0 = the rows of x_perm. Sizes the GPU grids (SBI-GeMM for few rows, tiles above).
  int64_t max_rows_per_expert = 0;
};
// The grouped expert MLP over variable group sizes: rows [offsets[e], offsets[e + 1]) of x_perm
// through expert e (empty groups are skipped; rows past offsets[E] are left alone). act [n k, F] in
// the activation dtype; y_perm [n k, H] f32 (or bf16 with the device layout: the outputs rounded
// once, half the bytes for the expert-parallel exchange). f32 (the reference): scratch [n k, 2 F]
// f32 holds the
// gate/up GEMM output, and the group sizes are read on the host. bf16 (the device layout:
// backends/moe_params.h, MoeExpertsParams): SiLU-gated experts stacked per layer, scratch unused,
// the group sizes read on the device (graph-capturable, no host sync).
Status moe_experts(Context& ctx, const Tensor& x_perm, const Tensor& offsets,
                   const MoeExperts& experts, Activation act_fn, Tensor& scratch, Tensor& act,
                   Tensor& y_perm);
// y_perm f32 or bf16; out f32.
Status moe_combine(Context& ctx, const Tensor& y_perm, const Tensor& perm, const Tensor& topk_w,
                   Tensor& out, bool accumulate);
// out[t, :] += sigmoid(gate[t, 0]) * y[t, :]: y, out f32 [n, H]; gate f32 [n, 1].
Status sigmoid_gate_add(Context& ctx, const Tensor& y, const Tensor& gate, Tensor& out);

// The fixed-capacity expert-parallel exchange (model/moe_ep.h; the index semantics in
// backends/moe_params.h): i32 tensors on the ops' device, read there (graph-capturable).
//   moe_ep_send_plan  from a chunk's offsets [1, ep El + 1] (undefined: no rows) and its n_rows
//                     permuted rows: counts [1, ep El], send_map [1, ep C], back_map [1, >= n_rows]
//   moe_ep_recv_plan  from the received counts [1, ep El]: offsets [1, El + 1] of the rows
//                     grouped by local expert, group_map and ungroup_map [1, ep C]
//                     (rows, optional: [1, ep] the rows of each block, cut to C)
//   gather_rows       dst[i, :] = src[map[i], :], zeros where map[i] < 0 (2-D, one dtype);
//                     without zero_unmapped those rows are left alone
//   all_to_all_rows   the counted all-to-all (Communicator::all_to_all_rows) of send / recv
//                     [ep C, cols], send_rows / recv_rows i32 [1, ep] on the ops' device
Status moe_ep_send_plan(Context& ctx, const Tensor& offsets, int64_t ep, int64_t capacity,
                        int64_t n_rows, Tensor& counts, Tensor& send_map, Tensor& back_map,
                        Tensor* rows = nullptr);
Status moe_ep_recv_plan(Context& ctx, const Tensor& counts, int64_t ep, int64_t capacity,
                        Tensor& offsets, Tensor& group_map, Tensor& ungroup_map,
                        Tensor* rows = nullptr);
Status gather_rows(Context& ctx, const Tensor& src, const Tensor& map, Tensor& dst,
                   bool zero_unmapped = true);
Status all_to_all_rows(Context& ctx, Communicator& comm, const Tensor& send, Tensor& recv,
                       const Tensor& send_rows, const Tensor& recv_rows);
// The communicator's fused expert exchange (Communicator::expert_dispatch / expert_combine) on
// the ops' stream: kUnimplemented on the CPU and where the communicator has none (the caller
// composes the exchange instead: model/moe_ep.cpp, whose layout the fused kernels reproduce).
Status expert_dispatch(Context& ctx, Communicator& comm, const ExpertExchangeParams& a);
Status expert_combine(Context& ctx, Communicator& comm, const ExpertExchangeParams& a);

// ---- memory ---------------------------------------------------------------------------------
// Copies between the host and a contiguous tensor on the ops' device, ordered on its stream
// (the host memory must stay valid until synchronize()).
Status upload(Context& ctx, const void* host, Tensor& dst);
Status download(Context& ctx, const Tensor& src, void* host);
// Host-side conversions for building a device layout (no Context: they read host memory).
// dst[r, :] = bf16(t[r, :]) for every row of a host 2-D tensor of any float dtype or GGUF block
// type (blocks dequantized); dst holds rows x cols values, contiguous.
Status host_rows_to_bf16(const Tensor& t, uint16_t* dst);
// dst[i] = t[i] as f32 for a contiguous host tensor of any float dtype.
Status host_to_f32(const Tensor& t, float* dst);
// Waits for everything queued on the ops' stream.
Status synchronize(Context& ctx);
// dst (bf16, contiguous) = uniform(-scale, scale) from a counter-based hash of (seed, index):
// the same values on every run and device (random weights, `--load-format dummy`).
Status fill_random(Context& ctx, Tensor& dst, uint64_t seed, float scale);
// Per-row symmetric quantization of a bf16 [rows, cols] matrix to q (int8 or fp8-e4m3, [rows,
// cols]) with scale f32 [rows] (w = scale[r] * q[r, :]).
Status quantize_rows(Context& ctx, const Tensor& w_bf16, Tensor& q, Tensor& scale);

// ---- collectives (every one is an explicit call in a layer program) --------------------------
// x = sum over the ranks of x (f32, in place).
Status all_reduce(Context& ctx, Communicator& comm, Tensor& x);
// recv [size * n, cols] rank-major = every rank's send [n, cols] (f32).
Status all_gather(Context& ctx, Communicator& comm, const Tensor& send, Tensor& recv);
// recv [n, cols] = block rank() of the sum over the ranks of send [size * n, cols] (contiguous,
// one dtype; block r = rows [r n, (r + 1) n)).
Status reduce_scatter(Context& ctx, Communicator& comm, const Tensor& send, Tensor& recv);
// Rows of a contiguous 2-D tensor to every rank with variable splits (the mixture-of-experts
// dispatch and combine): send_rows[r] rows of send, in rank order, go to rank r; recv_rows[r]
// rows from rank r land in recv, in rank order (host arrays of comm.size() entries, zeros
// allowed; every rank's recv_rows[r] must equal rank r's send_rows[this rank]). Any dtype.
Status all_to_all_v(Context& ctx, Communicator& comm, const Tensor& send, const int64_t* send_rows,
                    Tensor& recv, const int64_t* recv_rows);
// Fixed splits: block r of send (rows / size() rows) goes to rank r, block r of recv comes
// from rank r (contiguous 2-D tensors of one dtype and shape; rows a multiple of size()). On a
// device through the communicator's device all-to-all (NCCL, the one-shot kernels): no host
// synchronization, graph-capturable.
Status all_to_all(Context& ctx, Communicator& comm, const Tensor& send, Tensor& recv);
// The end of a row-parallel layer and the next norm: y = all_reduce(y) (+ bias); x += y;
// h = norm(x). y, x f32 [n, hidden]. One kernel where the communicator fuses it (the one-shot
// all-reduce with RMSNorm into bf16, contiguous rows); otherwise all_reduce, add_bias and
// norm(..., residual = y), which is also its CPU twin.
Status all_reduce_add_norm(Context& ctx, Communicator& comm, Tensor& y, const Tensor* bias,
                           Tensor& x, const NormWeight& w, const NormArgs& args, Tensor& h);

}  // namespace strata::ops
