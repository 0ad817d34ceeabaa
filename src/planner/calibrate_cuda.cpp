// `strata plan --calibrate FILE`: measure this machine's GPU into a hardware profile (the
// planner's JSON format, README "strata plan"). Compiled only with the CUDA backend; the planner
// itself never needs a GPU.
//
// Probes, each timed with CUDA events on the device's stream (median of several repetitions
// after a warm-up):
//   - HBM: a device-to-device copy of 2 GiB; read bandwidth taken as (read + write) / time, the
//     copy being read- and write-bound alike (on the H100 the copy and a read-only kernel agree
//     within 3%: bench/results/2026-11-22-h100-gpu-linear.json).
//   - host to device: 1 GiB from pinned host memory.
//   - GEMMs through cuda::linear (the engine's route: SBI-GeMM for few tokens, cuBLASLt above)
//     for bf16 / int8 / fp8 weights, over a Llama-3-8B layer's shapes (QKV, O, gate/up, down)
//     at 1..4096 tokens, with enough weight copies to stream from HBM as layers do; the curve
//     point is total FLOPs / total time at that token count. Peak bf16: an 8192^3 GEMM.
//   - attention: flash prefill of one 2048-token sequence (32 heads, 8 KV heads, head_dim 128).
//   - collectives, when the machine has two GPUs or more: g in-process ranks (threads, GPU r
//     each) for g = 2 and for every GPU, NCCL all-gather and all-reduce from 16 KB to 256 MB and
//     the one-shot all-reduce (what the engine takes for decode-sized messages) up to 256 KB,
//     each replayed from a CUDA graph. The ring model's link bandwidth comes from the largest
//     all-gather over every GPU (bytes x (g - 1) / g over its time less the latency term) and
//     its per-hop latency from the engine's fastest 16 KB all-reduce (an all-reduce is a
//     reduce-scatter plus an all-gather: 2 (g - 1) hops). The raw points are kept in the profile
//     ("collective_probes"). With one GPU the interconnect entry stays at public NVLink 4
//     figures and "source" says so.
//   - a mixture-of-experts block of a decode step (router, top-k, permute, grouped expert MLP,
//     combine) for a Qwen3-30B-A3B and a Mixtral-8x7B layer at 1, 8 and 64 tokens, bf16,
//     replayed from a graph ("moe_block_probes"; the cost model's MoE overhead term).
//   - a collective between two in-process ranks sharing GPU 0 (strata's --tp / --pp / --ep on
//     one GPU): the one-shot all-reduce at 16 KB and 32 MB, per call of an 8-call graph; a line
//     through both is "shared_device_collective" (fixed_us, GBps).
#if defined(STRATA_HAS_CUDA)

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/moe_params.h"
#include "core/status.h"
#include "parallel/comm.h"
#include "parallel/inproc_comm.h"
#include "strata/plan.h"

namespace strata {

namespace {

using cuda::LaunchCtx;

// Device buffers freed on scope exit.
class DeviceBuffers {
 public:
  ~DeviceBuffers() {
    for (void* p : device_) cudaFree(p);
    for (void* p : host_) cudaFreeHost(p);
  }
  Result<void*> device(size_t bytes, int fill) {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess)
      return errorf(StatusCode::kOutOfMemory, "--calibrate: cudaMalloc({} bytes): {}", bytes,
                    cudaGetErrorString(e));
    device_.push_back(p);
    // A constant byte pattern: 0x3c is a small normal value as bf16 (0x3c3c), int8, fp8 e4m3 and
    // f32 (scales), so no NaN or denormal slows a kernel down.
    if (cudaMemset(p, fill, bytes) != cudaSuccess)
      return errorf(StatusCode::kInternal, "--calibrate: cudaMemset failed");
    return p;
  }
  Result<void*> pinned(size_t bytes) {
    void* p = nullptr;
    const cudaError_t e = cudaMallocHost(&p, bytes);
    if (e != cudaSuccess)
      return errorf(StatusCode::kOutOfMemory, "--calibrate: cudaMallocHost({} bytes): {}", bytes,
                    cudaGetErrorString(e));
    host_.push_back(p);
    return p;
  }

 private:
  std::vector<void*> device_, host_;
};

// n random bf16 values, uniform in (-scale, scale), as weights and activations are. The probes
// filled their operands with one constant byte before, and that may flatter the tensor cores
// (less switching, less power, higher clocks): the H200 curve calibrated that way read 851 TFLOP/s
// at 2,048 tokens, while the engine's prefill on random weights implies about 620 (its 1 x 2,048
// pass took 51.3 ms where the curve predicts 38.7; tests/planner/data/h200x2_measured.json).
Result<void*> random_bf16(const LaunchCtx& ctx, DeviceBuffers& mem, int64_t n, uint64_t seed,
                          float scale) {
  STRATA_ASSIGN_OR_RETURN(void* p, mem.device(static_cast<size_t>(n) * 2, 0));
  STRATA_RETURN_IF_ERROR(cuda::fill_random_bf16(ctx, static_cast<uint16_t*>(p), n, seed, scale));
  return p;
}

// Median seconds of `reps` runs of fn(i) after `warmup` runs.
template <class Fn>
Result<double> median_seconds(const LaunchCtx& ctx, int warmup, int reps, Fn&& fn) {
  cudaEvent_t start = nullptr, stop = nullptr;
  STRATA_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  STRATA_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  std::vector<double> times;
  Status status;
  for (int i = 0; i < warmup + reps && status.ok(); ++i) {
    if (cudaEventRecord(start, ctx.stream) != cudaSuccess) break;
    status = fn(i);
    if (cudaEventRecord(stop, ctx.stream) != cudaSuccess) break;
    if (cudaEventSynchronize(stop) != cudaSuccess) break;
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (i >= warmup) times.push_back(1e-3 * ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!status.ok()) return status;
  if (times.size() != static_cast<size_t>(reps))
    return errorf(StatusCode::kInternal, "--calibrate: a timed probe failed: {}",
                  cudaGetErrorString(cudaGetLastError()));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

struct Shape {
  int64_t out, in;
};

// The Llama-3-8B layer's GEMMs: what the shipped h100 curve was measured on.
constexpr Shape kLayerShapes[] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};

// Median seconds of one call of fn, replayed from a CUDA graph of `calls` calls of it on the
// stream, divided by `calls`. With several ranks (`barrier` not null) every rank runs it and
// they meet before the capture and before each replay (rank 0's time is the one kept).
Result<double> graph_seconds(cudaStream_t stream, Communicator* barrier,
                             const std::function<Status()>& fn, int reps, int calls = 1) {
  auto meet = [&] { return barrier != nullptr ? barrier->barrier() : ok_status(); };
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  // One eager call first: NCCL sets up a collective's connections on its first call, and a GEMM
  // shape's first run may load a library, neither of which may happen inside a capture.
  STRATA_RETURN_IF_ERROR(fn());
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  STRATA_RETURN_IF_ERROR(meet());
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  Status st = fn();
  for (int c = 1; c < calls && st.ok(); ++c) st = fn();
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (!st.ok()) return st;
  if (end != cudaSuccess || graph == nullptr)
    return errorf(StatusCode::kInternal, "--calibrate: capturing a probe: {}",
                  cudaGetErrorString(end));
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (inst != cudaSuccess)
    return errorf(StatusCode::kInternal, "--calibrate: instantiating a probe's graph: {}",
                  cudaGetErrorString(inst));
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<double> times;
  for (int i = 0; i < reps + 3 && st.ok(); ++i) {
    st = meet();
    if (!st.ok()) break;
    cudaEventRecord(e0, stream);
    cudaGraphLaunch(exec, stream);
    cudaEventRecord(e1, stream);
    if (cudaEventSynchronize(e1) != cudaSuccess) {
      st = errorf(StatusCode::kInternal, "--calibrate: a probe failed: {}",
                  cudaGetErrorString(cudaGetLastError()));
      break;
    }
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i >= 3) times.push_back(1e-3 * ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(exec);
  if (!st.ok()) return st;
  std::sort(times.begin(), times.end());
  return times[times.size() / 2] / calls;
}

Result<double> gemm_curve_point(const LaunchCtx& ctx, DeviceBuffers& mem, DType w_dtype,
                                int64_t tokens) {
  const size_t wbytes = w_dtype == DType::kBF16 ? 2 : 1;
  double flops = 0, seconds = 0;
  for (const Shape& s : kLayerShapes) {
    const size_t w_size = static_cast<size_t>(s.out * s.in) * wbytes;
    // Enough copies that the weights stream from HBM (4x the L2 cache).
    const int copies = static_cast<int>(std::max<size_t>(2, 4 * ctx.l2_bytes / w_size + 1));
    std::vector<void*> w(static_cast<size_t>(copies));
    auto scale = mem.device(static_cast<size_t>(s.out) * sizeof(float), 0x3c);
    if (!scale.ok()) return scale.status();
    // Random weights (8-bit ones quantized from random bf16 rows, as at load), random inputs.
    void* src = nullptr;
    for (size_t c = 0; c < w.size(); ++c) {
      if (w_dtype == DType::kBF16) {
        STRATA_ASSIGN_OR_RETURN(w[c], random_bf16(ctx, mem, s.out * s.in, 17 + c, 0.02f));
        continue;
      }
      if (src == nullptr) {
        STRATA_ASSIGN_OR_RETURN(src, random_bf16(ctx, mem, s.out * s.in, 17, 0.02f));
      }
      STRATA_ASSIGN_OR_RETURN(w[c], mem.device(w_size, 0));
      STRATA_RETURN_IF_ERROR(cuda::quantize_rows(ctx, static_cast<const uint16_t*>(src), s.out,
                                                 s.in, w_dtype, w[c], static_cast<float*>(*scale)));
    }
    auto x = random_bf16(ctx, mem, tokens * s.in, 5, 1.0f);
    auto out = mem.device(static_cast<size_t>(tokens * s.out) * 4, 0);
    if (!x.ok()) return x.status();
    if (!out.ok()) return out.status();
    // Timed from a CUDA graph of one call per weight copy, as decode steps run. Event-timed
    // eager launches count the host's launch latency into the small GEMMs: two calibrations of
    // one H100 (2026-11-26) differed by 14% at 64 int8 tokens, and int8 decode was predicted up
    // to 34% slow.
    size_t call = 0;
    auto t = graph_seconds(
        ctx.stream, nullptr,
        [&]() -> Status {
          GpuLinearParams p;
          p.x = static_cast<const uint16_t*>(*x);
          p.x_stride = s.in;
          p.w = w[call++ % w.size()];
          p.w_dtype = w_dtype;
          p.w_stride = s.in;
          p.w_scale = w_dtype == DType::kBF16 ? nullptr : static_cast<const float*>(*scale);
          p.out = *out;
          p.out_dtype = DType::kF32;
          p.out_stride = s.out;
          p.n_tokens = tokens;
          p.in_features = s.in;
          p.out_features = s.out;
          return cuda::linear(ctx, p);
        },
        10, copies);
    if (!t.ok()) return t.status();
    flops += 2.0 * static_cast<double>(tokens * s.out * s.in);
    seconds += *t;
  }
  return flops / seconds;
}

// ---- mixture of experts ------------------------------------------------------------------------

// One MoE block of a decode step as the engine runs it on one GPU (model/moe.cpp): the router
// GEMM, top-k, the per-expert offsets, the permute, the grouped SiLU-gated expert MLP and the
// weighted combine, bf16 weights and random inputs (the routing spreads as a trained router's
// roughly does), replayed from a CUDA graph. The cost model subtracts its own price of the same
// block (the expert GEMMs off the curve) and prices the rest per layer and per expert touched
// (cost_model.cpp, moe_overhead).
struct MoeShape {
  int64_t experts, k, hidden, ffn;
};
// Qwen3-30B-A3B's (many small experts) and Mixtral-8x7B's (few large ones) blocks.
constexpr MoeShape kMoeShapes[] = {{128, 8, 2048, 768}, {8, 2, 4096, 14336}};
constexpr int64_t kMoeTokens[] = {1, 8, 64};

// w_dtype: the experts' weights, bf16 or 8-bit with per-row scales (quantized from random bf16
// rows, as at load); the router stays bf16, as in the engine.
Result<double> moe_block_seconds(const LaunchCtx& ctx, const MoeShape& m, int64_t tokens,
                                 DType w_dtype) {
  DeviceBuffers mem;
  const int64_t E = m.experts, H = m.hidden, F = m.ffn, k = m.k, T = tokens, S = T * k;
  STRATA_ASSIGN_OR_RETURN(void* x, random_bf16(ctx, mem, T * H, 3, 1.0f));
  STRATA_ASSIGN_OR_RETURN(void* router, random_bf16(ctx, mem, E * H, 7, 0.02f));
  STRATA_ASSIGN_OR_RETURN(void* gate_up, random_bf16(ctx, mem, E * 2 * F * H, 11, 0.02f));
  STRATA_ASSIGN_OR_RETURN(void* down, random_bf16(ctx, mem, E * H * F, 13, 0.02f));
  float* gate_up_scale = nullptr;
  float* down_scale = nullptr;
  if (w_dtype != DType::kBF16) {
    STRATA_ASSIGN_OR_RETURN(void* gu_q, mem.device(static_cast<size_t>(E * 2 * F * H), 0));
    STRATA_ASSIGN_OR_RETURN(void* dn_q, mem.device(static_cast<size_t>(E * H * F), 0));
    STRATA_ASSIGN_OR_RETURN(void* gu_s, mem.device(static_cast<size_t>(E * 2 * F) * 4, 0));
    STRATA_ASSIGN_OR_RETURN(void* dn_s, mem.device(static_cast<size_t>(E * H) * 4, 0));
    gate_up_scale = static_cast<float*>(gu_s);
    down_scale = static_cast<float*>(dn_s);
    STRATA_RETURN_IF_ERROR(cuda::quantize_rows(ctx, static_cast<const uint16_t*>(gate_up),
                                               E * 2 * F, H, w_dtype, gu_q, gate_up_scale));
    STRATA_RETURN_IF_ERROR(cuda::quantize_rows(ctx, static_cast<const uint16_t*>(down), E * H, F,
                                               w_dtype, dn_q, down_scale));
    gate_up = gu_q;
    down = dn_q;
  }
  STRATA_ASSIGN_OR_RETURN(void* logits, mem.device(static_cast<size_t>(T * E) * 4, 0));
  STRATA_ASSIGN_OR_RETURN(void* ids, mem.device(static_cast<size_t>(S) * 4, 0));
  STRATA_ASSIGN_OR_RETURN(void* w, mem.device(static_cast<size_t>(S) * 4, 0));
  STRATA_ASSIGN_OR_RETURN(void* offsets, mem.device(static_cast<size_t>(E + 1) * 4, 0));
  STRATA_ASSIGN_OR_RETURN(void* x_perm, mem.device(static_cast<size_t>(S * H) * 2, 0));
  STRATA_ASSIGN_OR_RETURN(void* perm, mem.device(static_cast<size_t>(S) * 4, 0));
  STRATA_ASSIGN_OR_RETURN(void* act, mem.device(static_cast<size_t>(S * F) * 2, 0));
  // The expert outputs in bf16, as the device layout keeps them (model/blocks.cpp, moe_y).
  STRATA_ASSIGN_OR_RETURN(void* y_perm, mem.device(static_cast<size_t>(S * H) * 2, 0));
  STRATA_ASSIGN_OR_RETURN(void* out, mem.device(static_cast<size_t>(T * H) * 4, 0));
  auto block = [&]() -> Status {
    GpuLinearParams r;
    r.x = static_cast<const uint16_t*>(x);
    r.x_stride = H;
    r.w = router;
    r.w_stride = H;
    r.out = logits;
    r.out_stride = E;
    r.n_tokens = T;
    r.in_features = H;
    r.out_features = E;
    STRATA_RETURN_IF_ERROR(cuda::linear(ctx, r));
    MoeRouteParams rp;
    rp.logits = static_cast<const float*>(logits);
    rp.logits_stride = E;
    rp.topk_ids = static_cast<int32_t*>(ids);
    rp.topk_w = static_cast<float*>(w);
    rp.n_tokens = T;
    rp.n_experts = E;
    rp.k = k;
    rp.renormalize = true;
    STRATA_RETURN_IF_ERROR(cuda::moe_route(ctx, rp));
    MoeOffsetsParams op;
    op.topk_ids = static_cast<const int32_t*>(ids);
    op.n_slots = S;
    op.n_experts = E;
    op.offsets = static_cast<int32_t*>(offsets);
    STRATA_RETURN_IF_ERROR(cuda::moe_offsets(ctx, op));
    MoePermuteParams pp;
    pp.x = x;
    pp.x_stride = H;
    pp.dtype = DType::kBF16;
    pp.topk_ids = static_cast<const int32_t*>(ids);
    pp.offsets = static_cast<const int32_t*>(offsets);
    pp.n_tokens = T;
    pp.k = k;
    pp.n_experts = E;
    pp.hidden = H;
    pp.x_perm = x_perm;
    pp.perm = static_cast<int32_t*>(perm);
    STRATA_RETURN_IF_ERROR(cuda::moe_permute(ctx, pp));
    MoeExpertsParams ep;
    ep.x_perm = static_cast<const uint16_t*>(x_perm);
    ep.offsets = static_cast<const int32_t*>(offsets);
    ep.gate_up = gate_up;
    ep.gate_up_scale = gate_up_scale;
    ep.gate_up_expert_stride = 2 * F * H;
    ep.down = down;
    ep.down_scale = down_scale;
    ep.down_expert_stride = H * F;
    ep.w_dtype = w_dtype;
    ep.act = static_cast<uint16_t*>(act);
    ep.y_perm = y_perm;
    ep.y_dtype = DType::kBF16;
    ep.n_rows = S;
    ep.max_rows_per_expert = T;
    ep.n_experts = E;
    ep.hidden = H;
    ep.ffn = F;
    STRATA_RETURN_IF_ERROR(cuda::moe_experts(ctx, ep));
    MoeCombineParams cp;
    cp.y_perm = y_perm;
    cp.y_dtype = DType::kBF16;
    cp.perm = static_cast<const int32_t*>(perm);
    cp.topk_w = static_cast<const float*>(w);
    cp.out = static_cast<float*>(out);
    cp.out_stride = H;
    cp.n_tokens = T;
    cp.k = k;
    cp.hidden = H;
    cp.accumulate = true;
    return cuda::moe_combine(ctx, cp);
  };
  // Eight blocks per graph, as a step's graph runs them back to back.
  return graph_seconds(ctx.stream, nullptr, block, 10, 8);
}

// One layer's decode attention as the engine runs it (Llama-3-8B heads: 32 query, 8 KV, 128
// wide): RoPE + KV append of each sequence's new token, then the split-K flash decode over a
// paged bf16 cache of kv_len positions per sequence; eight layers per graph, each with its own
// cache (so the KV comes from HBM, not L2, where it can).
Result<double> decode_attention_seconds(const LaunchCtx& ctx, int64_t seqs, int64_t kv_len) {
  DeviceBuffers mem;
  constexpr int64_t H = 32, Hkv = 8, D = 128, block = 16, kLayers = 8;
  const int64_t bps = (kv_len + block - 1) / block, blocks = seqs * bps;
  const int64_t qkv_w = (H + 2 * Hkv) * D;
  std::vector<void*> k(kLayers), v(kLayers);
  for (int64_t l = 0; l < kLayers; ++l) {
    STRATA_ASSIGN_OR_RETURN(k[static_cast<size_t>(l)],
                            random_bf16(ctx, mem, blocks * block * Hkv * D, 21 + l, 1.0f));
    STRATA_ASSIGN_OR_RETURN(v[static_cast<size_t>(l)],
                            random_bf16(ctx, mem, blocks * block * Hkv * D, 41 + l, 1.0f));
  }
  STRATA_ASSIGN_OR_RETURN(void* qkv, mem.device(static_cast<size_t>(seqs * qkv_w) * 4, 0));
  STRATA_ASSIGN_OR_RETURN(void* q, mem.device(static_cast<size_t>(seqs * H * D) * 2, 0));
  STRATA_ASSIGN_OR_RETURN(void* o, mem.device(static_cast<size_t>(seqs * H * D) * 2, 0));
  STRATA_ASSIGN_OR_RETURN(void* inv_freq, mem.device(static_cast<size_t>(D / 2) * 4, 0));
  // Device arrays: cu_q [seqs + 1], kv_len [seqs], token_seq [seqs], token_pos [seqs], then the
  // block tables [seqs, bps].
  std::vector<int32_t> host(static_cast<size_t>((seqs + 1) + 3 * seqs + blocks));
  int32_t* cu_q = host.data();
  int32_t* lens = cu_q + seqs + 1;
  int32_t* tseq = lens + seqs;
  int32_t* tpos = tseq + seqs;
  int32_t* tables = tpos + seqs;
  for (int64_t i = 0; i <= seqs; ++i) cu_q[i] = static_cast<int32_t>(i);
  for (int64_t i = 0; i < seqs; ++i) {
    lens[i] = static_cast<int32_t>(kv_len);
    tseq[i] = static_cast<int32_t>(i);
    tpos[i] = static_cast<int32_t>(kv_len - 1);
  }
  for (int64_t b = 0; b < blocks; ++b) tables[b] = static_cast<int32_t>(b);
  STRATA_ASSIGN_OR_RETURN(void* meta, mem.device(host.size() * sizeof(int32_t), 0));
  STRATA_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(meta, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  const auto* dev = static_cast<const int32_t*>(meta);
  const int32_t* d_cu_q = dev;
  const int32_t* d_lens = d_cu_q + seqs + 1;
  const int32_t* d_tseq = d_lens + seqs;
  const int32_t* d_tpos = d_tseq + seqs;
  const int32_t* d_tables = d_tpos + seqs;
  const size_t ws_bytes = cuda::varlen_attention_workspace_bytes(seqs, H, D, kv_len);
  void* ws = nullptr;
  if (ws_bytes > 0) {
    STRATA_ASSIGN_OR_RETURN(ws, mem.device(ws_bytes, 0));
  }
  int64_t layer = 0;
  auto step = [&]() -> Status {
    const auto l = static_cast<size_t>(layer++ % kLayers);
    PagedKvBf16Params cache;
    cache.k_cache = static_cast<uint16_t*>(k[l]);
    cache.v_cache = static_cast<uint16_t*>(v[l]);
    cache.block_tables = d_tables;
    cache.max_blocks_per_seq = bps;
    cache.n_seqs = seqs;
    cache.n_blocks = blocks;
    cache.block_size = block;
    cache.n_heads_kv = Hkv;
    cache.head_dim = D;
    RopeKvAppendParams r;
    r.qkv = static_cast<const float*>(qkv);
    r.qkv_stride = qkv_w;
    r.q_out = static_cast<uint16_t*>(q);
    r.q_out_stride = H * D;
    r.token_seq = d_tseq;
    r.token_pos = d_tpos;
    r.n_tokens = seqs;
    r.n_heads = H;
    r.inv_freq = static_cast<const float*>(inv_freq);
    r.rotary_dim = D;
    r.cache = cache;
    STRATA_RETURN_IF_ERROR(cuda::rope_kv_append(ctx, r));
    VarlenAttentionParams a;
    a.q = static_cast<const uint16_t*>(q);
    a.q_stride = H * D;
    a.out = static_cast<uint16_t*>(o);
    a.out_stride = H * D;
    a.cu_q = d_cu_q;
    a.kv_len = d_lens;
    a.n_seqs = seqs;
    a.n_heads = H;
    a.max_q_len = 1;
    a.max_kv_len = kv_len;
    a.cache = cache;
    a.scale = 0.088f;
    a.workspace = ws;
    a.workspace_bytes = ws_bytes;
    return cuda::varlen_attention(ctx, a);
  };
  return graph_seconds(ctx.stream, nullptr, step, 10, kLayers);
}

// ---- collectives --------------------------------------------------------------------------------

struct CollectivePoints {
  std::vector<std::pair<int64_t, double>> all_gather, all_reduce, all_reduce_oneshot;  // bytes, s
};

// NCCL all-gather / all-reduce (16 KB .. max_bytes, output bytes) and the one-shot all-reduce
// (16 .. 256 KB) among g in-process ranks on GPUs 0..g-1.
Result<CollectivePoints> probe_collectives(int g, int64_t max_bytes) {
  constexpr int64_t kMin = 16 << 10, kOneShotMax = 256 << 10;
  auto oneshot = make_in_process_communicators(g);
  auto host = make_in_process_communicators(g);
  std::vector<std::string> err(static_cast<size_t>(g));
  CollectivePoints pts;
  std::vector<std::thread> threads;
  for (int r = 0; r < g; ++r) {
    threads.emplace_back([&, r] {
      // A failed rank wakes the others from their barriers (they fail too) instead of leaving
      // them waiting.
      auto fail = [&](const Status& s) {
        err[static_cast<size_t>(r)] = s.to_string();
        for (auto& c : oneshot) c->abort();
      };
      auto device = cuda::CudaDevice::create(r);
      if (!device.ok()) return fail(device.status());
      cudaStream_t stream = (*device)->launch_ctx().stream;
      Communicator& os = *oneshot[static_cast<size_t>(r)];
      Status st = init_in_process_device(os, r, kOneShotMax);
      if (!st.ok()) return fail(st);
      auto nccl = make_nccl_communicator(std::move(host[static_cast<size_t>(r)]), r, 0);
      if (!nccl.ok()) return fail(nccl.status());
      void *send = nullptr, *recv = nullptr;
      if (cudaMalloc(&send, static_cast<size_t>(max_bytes)) != cudaSuccess ||
          cudaMalloc(&recv, static_cast<size_t>(max_bytes)) != cudaSuccess) {
        cudaFree(send);
        return fail(
            errorf(StatusCode::kOutOfMemory, "--calibrate: cudaMalloc({} bytes) x 2", max_bytes));
      }
      cudaMemset(send, 0, static_cast<size_t>(max_bytes));
      CommStream s;
      s.device = Device::cuda(r);
      s.cuda_stream = stream;
      for (int64_t b = kMin; b <= max_bytes && st.ok(); b *= 4) {
        const int64_t per_rank = b / 2 / g;  // bf16 elements each rank contributes
        auto ag = graph_seconds(
            stream, &os, [&] { return (*nccl)->all_gather(send, per_rank, DType::kBF16, recv, s); },
            10);
        if (!ag.ok()) return fail(ag.status());
        auto ar = graph_seconds(
            stream, &os, [&] { return (*nccl)->all_reduce(send, b / 2, DType::kBF16, s); }, 10);
        if (!ar.ok()) return fail(ar.status());
        if (r == 0) {
          pts.all_gather.emplace_back(b, *ag);
          pts.all_reduce.emplace_back(b, *ar);
        }
        if (b <= kOneShotMax) {
          auto one = graph_seconds(
              stream, &os, [&] { return os.all_reduce(send, b / 2, DType::kBF16, s); }, 10);
          if (!one.ok()) return fail(one.status());
          if (r == 0) pts.all_reduce_oneshot.emplace_back(b, *one);
        }
      }
      cudaStreamSynchronize(stream);
      cudaFree(send);
      cudaFree(recv);
    });
  }
  for (auto& t : threads) t.join();
  for (const std::string& e : err)
    if (!e.empty()) return Status(StatusCode::kInternal, "--calibrate collectives: " + e);
  return pts;
}

// Two in-process ranks sharing GPU 0 (how strata runs --tp / --pp / --ep on one GPU): the
// one-shot all-reduce of bf16 at each size, per call of a graph of 8 calls (as a decode step's
// graph runs them).
Result<std::vector<std::pair<int64_t, double>>> probe_shared_device(
    const std::vector<int64_t>& sizes) {
  constexpr int kRanks = 2;
  const int64_t max_bytes = *std::max_element(sizes.begin(), sizes.end());
  auto oneshot = make_in_process_communicators(kRanks);
  std::vector<std::string> err(kRanks);
  std::vector<std::pair<int64_t, double>> pts;
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      auto fail = [&](const Status& s) {
        err[static_cast<size_t>(r)] = s.to_string();
        for (auto& c : oneshot) c->abort();
      };
      auto device = cuda::CudaDevice::create(0);
      if (!device.ok()) return fail(device.status());
      cudaStream_t stream = (*device)->launch_ctx().stream;
      Communicator& os = *oneshot[static_cast<size_t>(r)];
      Status st = init_in_process_device(os, 0, max_bytes);
      if (!st.ok()) return fail(st);
      void* buf = nullptr;
      if (cudaMalloc(&buf, static_cast<size_t>(max_bytes)) != cudaSuccess) {
        return fail(
            errorf(StatusCode::kOutOfMemory, "--calibrate: cudaMalloc({} bytes)", max_bytes));
      }
      cudaMemsetAsync(buf, 0, static_cast<size_t>(max_bytes), stream);
      CommStream s;
      s.device = Device::cuda(0);
      s.cuda_stream = stream;
      for (int64_t b : sizes) {
        auto t = graph_seconds(
            stream, &os, [&] { return os.all_reduce(buf, b / 2, DType::kBF16, s); }, 10, 8);
        if (!t.ok()) {
          cudaFree(buf);
          return fail(t.status());
        }
        if (r == 0) pts.emplace_back(b, *t);
      }
      cudaStreamSynchronize(stream);
      cudaFree(buf);
    });
  }
  for (auto& t : threads) t.join();
  for (const std::string& e : err)
    if (!e.empty()) return Status(StatusCode::kInternal, "--calibrate shared-GPU collective: " + e);
  return pts;
}

nlohmann::json points_json(const std::vector<std::pair<int64_t, double>>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& [bytes, s] : v) a.push_back({bytes, s * 1e6});
  return a;
}

// The interconnect entry from the probes (see the file comment), and the raw points.
Status calibrate_interconnect(int gpus, nlohmann::json& j) {
  int g_all = 2;
  while (g_all * 2 <= gpus) g_all *= 2;
  std::vector<int> groups = {2};
  if (g_all > 2) groups.push_back(g_all);
  nlohmann::json probes = nlohmann::json::object();
  CollectivePoints all;
  for (int g : groups) {
    STRATA_ASSIGN_OR_RETURN(CollectivePoints p, probe_collectives(g, int64_t{256} << 20));
    probes[std::to_string(g)] = {{"all_gather_nccl_us", points_json(p.all_gather)},
                                 {"all_reduce_nccl_us", points_json(p.all_reduce)},
                                 {"all_reduce_oneshot_us", points_json(p.all_reduce_oneshot)}};
    all = std::move(p);  // the last group (every GPU) sets the model's constants
  }
  const double g = static_cast<double>(g_all);
  const double hops = g - 1;
  // Latency per hop from the engine's fastest 16 KB all-reduce (2 (g - 1) hops), bandwidth from
  // the largest all-gather with that latency taken off.
  double ar16 = all.all_reduce.front().second;
  if (!all.all_reduce_oneshot.empty()) ar16 = std::min(ar16, all.all_reduce_oneshot.front().second);
  const auto [big_bytes, big_s] = all.all_gather.back();
  double alpha = ar16 / (2 * hops);
  const double bw =
      static_cast<double>(big_bytes) * hops / g / std::max(big_s - alpha * hops, 1e-9);
  // Take off the bandwidth term of the 16 KB all-reduce too (small, but not nothing).
  alpha = std::max(0.0, (ar16 - 2 * 16384.0 * hops / g / bw) / (2 * hops));
  j["interconnect"] = {{"topology", "switch"},
                       {"bandwidth_GBps", bw / 1e9},
                       {"latency_us", alpha * 1e6},
                       {"measured_on_gpus", g_all}};
  j["collective_probes"] = probes;
  return ok_status();
}

}  // namespace

Result<std::string> calibrate_profile(const std::string& name) {
  auto dev = cuda::CudaDevice::create(0);
  if (!dev.ok()) return dev.status().with_context("--calibrate");
  const LaunchCtx& ctx = (*dev)->launch_ctx();
  auto info = (*dev)->memory_info();
  if (!info.ok()) return info.status();

  nlohmann::json j;
  j["name"] = name;
  j["description"] = (*dev)->name() + ", measured by strata plan --calibrate";
  const int gpus = cuda::cuda_device_count();
  j["source"] =
      "strata plan --calibrate on " + (*dev)->name() +
      ": HBM copy, pinned host-to-device copy, cuda::linear GEMMs over a Llama-3-8B layer's "
      "shapes, flash prefill attention" +
      (gpus >= 2 ? "; interconnect from NCCL all-gather / all-reduce and the one-shot all-reduce "
                   "over " +
                       std::to_string(gpus) + " GPUs (collective_probes)"
                 : "; interconnect NOT measured (one GPU: public NVLink 4 figures)");
  j["memory_GB"] = static_cast<double>(info->total_bytes) / 1e9;

  // HBM: device-to-device copy.
  {
    DeviceBuffers mem;
    const size_t bytes = size_t{2} << 30;
    auto a = mem.device(bytes, 0x3c);
    auto b = mem.device(bytes, 0);
    if (!a.ok()) return a.status();
    if (!b.ok()) return b.status();
    auto t = median_seconds(ctx, 2, 10, [&](int) -> Status {
      STRATA_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(*b, *a, bytes, cudaMemcpyDeviceToDevice, ctx.stream));
      return ok_status();
    });
    if (!t.ok()) return t.status();
    j["hbm_read_GBps"] = 2.0 * static_cast<double>(bytes) / *t / 1e9;
  }
  // Host to device from pinned memory.
  {
    DeviceBuffers mem;
    const size_t bytes = size_t{1} << 30;
    auto h = mem.pinned(bytes);
    auto d = mem.device(bytes, 0);
    if (!h.ok()) return h.status();
    if (!d.ok()) return d.status();
    auto t = median_seconds(ctx, 1, 5, [&](int) -> Status {
      STRATA_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(*d, *h, bytes, cudaMemcpyHostToDevice, ctx.stream));
      return ok_status();
    });
    if (!t.ok()) return t.status();
    j["host_to_device_GBps"] = static_cast<double>(bytes) / *t / 1e9;
  }
  // Peak bf16: one 8192^3 GEMM through cuBLASLt.
  double peak = 0;
  {
    DeviceBuffers mem;
    const int64_t n = 8192;
    auto w = random_bf16(ctx, mem, n * n, 3, 0.02f);
    auto x = random_bf16(ctx, mem, n * n, 4, 1.0f);
    auto out = mem.device(static_cast<size_t>(n * n) * 4, 0);
    if (!w.ok()) return w.status();
    if (!x.ok()) return x.status();
    if (!out.ok()) return out.status();
    auto t = median_seconds(ctx, 3, 10, [&](int) {
      GpuLinearParams p;
      p.x = static_cast<const uint16_t*>(*x);
      p.x_stride = n;
      p.w = *w;
      p.w_stride = n;
      p.out = *out;
      p.out_stride = n;
      p.n_tokens = n;
      p.in_features = n;
      p.out_features = n;
      return cuda::cublaslt_linear(ctx, p);
    });
    if (!t.ok()) return t.status();
    peak = 2.0 * static_cast<double>(n) * n * n / *t;
  }
  j["peak_tflops"] = {{"bf16", peak / 1e12}, {"int8", peak / 1e12}, {"fp8", peak / 1e12}};
  // GEMM curves.
  const int64_t token_counts[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
  const std::pair<const char*, DType> formats[] = {
      {"bf16", DType::kBF16}, {"int8", DType::kI8}, {"fp8", DType::kFP8E4M3}};
  for (const auto& [fname, dtype] : formats) {
    nlohmann::json curve = nlohmann::json::array();
    for (int64_t tokens : token_counts) {
      DeviceBuffers mem;
      auto rate = gemm_curve_point(ctx, mem, dtype, tokens);
      if (!rate.ok()) return rate.status().with_context(std::string("GEMM curve ") + fname);
      curve.push_back({tokens, *rate / 1e12});
    }
    j["gemm_tflops"][fname] = curve;
  }
  // Attention: flash prefill, one sequence of 2048 tokens.
  {
    DeviceBuffers mem;
    const int64_t L = 2048, H = 32, Hkv = 8, D = 128, block = 16, blocks = L / block;
    auto q = random_bf16(ctx, mem, L * H * D, 6, 1.0f);
    auto o = mem.device(static_cast<size_t>(L * H * D) * 2, 0);
    auto k = random_bf16(ctx, mem, blocks * block * Hkv * D, 7, 1.0f);
    auto v = random_bf16(ctx, mem, blocks * block * Hkv * D, 8, 1.0f);
    auto meta = mem.device(static_cast<size_t>(blocks + 3) * sizeof(int32_t), 0);
    if (!q.ok()) return q.status();
    if (!o.ok()) return o.status();
    if (!k.ok()) return k.status();
    if (!v.ok()) return v.status();
    if (!meta.ok()) return meta.status();
    std::vector<int32_t> host(static_cast<size_t>(blocks + 3));
    host[0] = 0;                        // cu_q[0]
    host[1] = static_cast<int32_t>(L);  // cu_q[1]
    host[2] = static_cast<int32_t>(L);  // kv_len[0]
    for (int64_t b = 0; b < blocks; ++b) host[static_cast<size_t>(3 + b)] = static_cast<int32_t>(b);
    STRATA_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(*meta, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    const int32_t* m = static_cast<const int32_t*>(*meta);
    auto t = median_seconds(ctx, 3, 10, [&](int) {
      VarlenAttentionParams p;
      p.q = static_cast<const uint16_t*>(*q);
      p.q_stride = H * D;
      p.out = static_cast<uint16_t*>(*o);
      p.out_stride = H * D;
      p.cu_q = m;
      p.kv_len = m + 2;
      p.n_seqs = 1;
      p.n_heads = H;
      p.max_q_len = L;
      p.max_kv_len = L;
      p.cache.k_cache = static_cast<uint16_t*>(*k);
      p.cache.v_cache = static_cast<uint16_t*>(*v);
      p.cache.block_tables = m + 3;
      p.cache.max_blocks_per_seq = blocks;
      p.cache.n_seqs = 1;
      p.cache.n_blocks = blocks;
      p.cache.block_size = block;
      p.cache.n_heads_kv = Hkv;
      p.cache.head_dim = D;
      p.scale = 0.088f;
      return cuda::varlen_attention(ctx, p);
    });
    if (!t.ok()) return t.status().with_context("attention probe");
    const double flops = 4.0 * static_cast<double>(L) * static_cast<double>(L + 1) / 2.0 *
                         static_cast<double>(H * D);
    j["attention_tflops"] = flops / *t / 1e12;
  }
  {
    // A line through the 16 KB and 32 MB points (planner.h: shared_collective_*): 32 MB is a
    // 2,048-token prefill's all-reduce of f32 rows of 4,096, which moves at about half the rate
    // of 4 MB (an H100, 2026-11-26: the line through 4 MB priced that prefill 21% fast).
    auto pts = probe_shared_device({int64_t{16} << 10, int64_t{32} << 20});
    if (!pts.ok()) {
      // Leave the term out (the cost model then prices these collectives as the interconnect's)
      // and say why, rather than failing the calibration.
      j["shared_device_collective_error"] = pts.status().to_string();
      (void)cudaGetLastError();
    }
    if (pts.ok()) {
      const auto [b0, t0] = pts->front();
      const auto [b1, t1] = pts->back();
      const double bps = static_cast<double>(b1 - b0) / std::max(t1 - t0, 1e-9);
      j["shared_device_collective"] = {
          {"fixed_us", std::max(0.0, t0 - static_cast<double>(b0) / bps) * 1e6},
          {"GBps", bps / 1e9},
          {"points_us", points_json(*pts)},
          {"source",
           "two in-process ranks on GPU 0, the one-shot all-reduce of bf16, per call of a graph of "
           "8 calls"}};
    }
  }
  if (gpus >= 2) {
    STRATA_RETURN_IF_ERROR(calibrate_interconnect(gpus, j));
    // The collective probes select every GPU in turn (NCCL's init among them); the probes below
    // run on ctx's stream, which belongs to GPU 0 (on 4 x H200 the MoE probe's first launch
    // failed with "invalid resource handle" from the last GPU selected).
    STRATA_CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
  } else {
    j["interconnect"] = {{"topology", "switch"}, {"bandwidth_GBps", 450}, {"latency_us", 2}};
  }
  {
    // Decode attention (the cost model's decode attention overhead); a failure leaves the
    // probes measured before it and says why.
    nlohmann::json probes = nlohmann::json::array();
    Status st = ok_status();
    for (int64_t kv : {256, 2048}) {
      for (int64_t seqs : {1, 16, 64}) {
        if (!st.ok()) break;
        auto t = decode_attention_seconds(ctx, seqs, kv);
        if (!t.ok()) {
          st = t.status();
          break;
        }
        probes.push_back(
            {{"seqs", seqs}, {"kv_len", kv}, {"kv_heads", 8}, {"head_dim", 128}, {"us", *t * 1e6}});
      }
    }
    if (!probes.empty()) j["decode_attention_probes"] = probes;
    if (!st.ok()) {
      j["decode_attention_probes_error"] = st.to_string();
      (void)cudaGetLastError();
      (void)cudaStreamSynchronize(ctx.stream);
    }
  }
  {
    // Last, so that a failed MoE probe (even one that leaves the context unusable) costs only its
    // term: the profile then has none and says why, rather than the calibration failing.
    nlohmann::json probes = nlohmann::json::array();
    Status moe_status = ok_status();
    for (const auto& [dt, wname] : {std::pair{DType::kBF16, "bf16"}, std::pair{DType::kI8, "int8"},
                                    std::pair{DType::kFP8E4M3, "fp8"}}) {
      for (const MoeShape& m : kMoeShapes) {
        for (int64_t t : kMoeTokens) {
          if (!moe_status.ok()) break;
          auto s = moe_block_seconds(ctx, m, t, dt);
          if (!s.ok()) {
            moe_status = s.status().with_context(std::string("MoE block, ") + wname);
            break;
          }
          probes.push_back({{"experts", m.experts},
                            {"k", m.k},
                            {"hidden", m.hidden},
                            {"ffn", m.ffn},
                            {"tokens", t},
                            {"weights", wname},
                            {"us", *s * 1e6}});
        }
      }
    }
    // The probes measured before a failure stay (the cost model fits each weight format's own).
    if (!probes.empty()) j["moe_block_probes"] = probes;
    if (!moe_status.ok()) {
      j["moe_block_probes_error"] = moe_status.to_string();
      (void)cudaGetLastError();
      (void)cudaStreamSynchronize(ctx.stream);
    }
  }
  // The curves carry the GEMM efficiency; these apply to the roofline terms (KV streaming). The
  // host link's rate is the probe's pinned copy, the copies weight streaming issues: no
  // discount (0.9 made a 34B model streamed on an H100 17% slow against the engine, 2026-11-26).
  j["efficiency"] = {{"compute", 0.85}, {"memory", 0.86}, {"host_link", 1.0}};
  j["layer_overhead_us"] = 0;
  return j.dump(2) + "\n";
}

}  // namespace strata

#endif  // STRATA_HAS_CUDA
