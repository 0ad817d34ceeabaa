// The GPU linear layer's dispatch (linear) and its cuBLASLt path (cublaslt_linear), for batches
// above the SBI-GeMM crossover.
//
// Layout: our row-major W [M, K] is cuBLASLt's column-major [K, M], x [n, K] is column-major
// [K, n] and out [n, M] is column-major [M, n], so out^T = op_T(W) * x^T: a TN GEMM, the layout
// fp8 GEMMs require on Hopper and int8 (IMMA) GEMMs require everywhere. Compute in f32
// (CUBLAS_COMPUTE_32F), or in int32 for int8 x int8 (CUBLAS_COMPUTE_32I, int32 scales).
//
// Paths:
//   bf16, direct  - cuBLASLt writes out itself: bias through the BIAS epilogue (f32 out only:
//                   cuBLASLt wants the bias in the output type), accumulate as beta = 1 with C = D.
//   scratch       - cuBLASLt writes an f32 D into the workspace (or into out itself, when out is
//                   f32 and not accumulated into), then linear_epilogue applies
//                   scales, bias, accumulate and the one bf16 rounding: bf16 weights with bf16
//                   out and a bias (or when no direct algorithm exists), and fp8 weights: x is
//                   quantized to fp8 per token (quantize_activations_fp8), the GEMM runs fp8 x
//                   fp8 on the tensor cores, and the epilogue applies x_scale[t] * w_scale[m].
//                   NOTE: fp8 activations cost accuracy (3 mantissa bits: errors up to ~2% of
//                   the largest output on random data); the SBI path keeps x in bf16.
//   fp8, scaled   - fp8 weights without a bias, from 128 tokens, k < 2 m (kFp8ScaledMinTokens):
//                   x quantized per token as above, then one fp8 GEMM with
//                   cuBLASLt's outer-vector scaling (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F:
//                   w_scale per row of W, x_scale per token) that writes out itself, bf16 or f32,
//                   accumulating as beta = 1 with C = D: no f32 round trip through the workspace
//                   and no epilogue kernel. The same arithmetic as the scratch path up to the order
//                   of the two scale multiplications (a last-bit difference).
//                   STRATA_NO_FP8_SCALED_GEMM=1 (A/B) and shapes cuBLASLt has no scaled algorithm
//                   for take the scratch path.
//   int8 (A8W8)   - the scratch path with int8 activations: cuBLASLt has no int8 x bf16 GEMM, so
//                   x is quantized per token to int8 (quantize_activations_i8: symmetric,
//                   max|x| / 127, round to nearest even), the GEMM runs int8 x int8 -> int32 on
//                   the tensor cores (exact integer sums), and linear_epilogue converts the int32
//                   D to f32 and applies x_scale[t] * w_scale[m], bias, accumulate and the one
//                   bf16 rounding. Taken for a8w8_eligible shapes (out_features and in_features
//                   multiples of 4: the IMMA kernels' rule for the regular layout; x rows are
//                   padded to 16 bytes, D rows to 4 elements, W rows are 16-byte aligned by
//                   check_gpu_linear).
//                   NOTE: int8 activations cost accuracy: per token, each x element moves by up
//                   to max|x[t, :]| / 254, so a token with one large outlier loses resolution in
//                   all of its other features (errors 0.4-0.6% of the largest output on the op
//                   table's uniform random data, measured with the CPU twin; more with outlier
//                   features, which LLM activations have: on the llama fixture the CPU twins'
//                   logits move 1.21e-1 of max|logit| from f32 against 7.4e-2 for int8 weights
//                   alone, and 41 of 48 greedy tokens equal bf16's). The
//                   SBI path (up to the crossover) keeps x in bf16, so a sequence's logits can
//                   differ slightly between a small and a large batch. Not yet measured on a GPU.
//   int8 (SBI)    - int8 shapes that are not a8w8_eligible, shapes cuBLASLt has no IMMA
//                   algorithm for, and STRATA_NO_I8_GEMM=1 (A/B of the old path): sbi_gemm in
//                   64-token slices (bf16 activations; correct, but it re-reads W per slice: slow
//                   above the crossover).
// Workspace (ctx.workspace): the direct path gives all of it to cuBLASLt; the scratch paths give
// cuBLASLt a quarter and use the rest for [D f32 / int32 | x_q fp8 / int8 | x_scale], processing
// the tokens in slices that fit (an error if not even one token fits).
//
// Algorithms come from cublasLtMatmulAlgoGetHeuristic once per shape (M, K, n, strides,
// alignments, path) and are cached in a process-wide map; descriptors are built on the stack
// with the *Init functions. So a call allocates no device memory and never synchronizes: it can
// be captured into a CUDA graph.
#include <cublasLt.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/gpu_linear_internal.h"
#include "core/env.h"
#include "core/status.h"

namespace strata::cuda {
namespace {

constexpr const char* kOp = "cublaslt_linear";
constexpr size_t kAlign = 256;

enum class LtPath : uint8_t { kBf16Direct, kBf16Scratch, kFp8Scratch, kFp8Scaled, kI8Scratch };

struct PlanKey {
  cublasLtHandle_t handle;
  LtPath path;
  cudaDataType_t d_type;
  bool bias;
  bool beta;
  int64_t m, k, n;
  int64_t lda, ldb, ldd;
  uint32_t align_a, align_b, align_d, align_bias;
  uint64_t workspace;
  bool operator==(const PlanKey&) const = default;
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& key) const {
    size_t h = std::hash<const void*>()(key.handle);
    const auto mix = [&h](uint64_t v) {
      h ^= std::hash<uint64_t>()(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    };
    mix(static_cast<uint64_t>(key.path));
    mix(static_cast<uint64_t>(key.d_type));
    mix(key.bias);
    mix(key.beta);
    mix(static_cast<uint64_t>(key.m));
    mix(static_cast<uint64_t>(key.k));
    mix(static_cast<uint64_t>(key.n));
    mix(static_cast<uint64_t>(key.lda));
    mix(static_cast<uint64_t>(key.ldb));
    mix(static_cast<uint64_t>(key.ldd));
    mix(key.align_a);
    mix(uint64_t{key.align_b} << 32 | key.align_d);
    mix(key.align_bias);
    mix(key.workspace);
    return h;
  }
};

struct Plan {
  bool ok = false;  // false: cuBLASLt has no algorithm for this shape (cached too)
  cublasLtMatmulAlgo_t algo{};
  // Autotuning: the heuristic's candidates are timed on the first call of the shape that is not
  // being captured into a graph; until then (or with one candidate) the heuristic's first pick.
  std::vector<cublasLtMatmulAlgo_t> candidates;
  bool tuned = false;
  bool warmed = false;  // has run once on this device (its kernels are loaded)
};

}  // namespace

// A context's plan cache (references to elements stay valid as it grows).
struct CublasLtPlanCache {
  std::mutex mu;
  std::unordered_map<PlanKey, Plan, PlanKeyHash> plans;
};

std::shared_ptr<CublasLtPlanCache> make_cublaslt_plan_cache() {
  return std::make_shared<CublasLtPlanCache>();
}

namespace {

// Descriptors on the stack: no allocation per call.
struct Descs {
  cublasLtMatmulDescOpaque_t op;
  cublasLtMatrixLayoutOpaque_t a, b, d;
};

size_t lowbit(uint64_t v) {
  return v == 0 ? kAlign : std::min<size_t>(kAlign, static_cast<size_t>(v & (~v + 1)));
}

// The alignment every row start of a strided matrix has (what cuBLASLt may assume).
uint32_t row_align(const void* p, int64_t ld_bytes) {
  return static_cast<uint32_t>(
      std::min(lowbit(reinterpret_cast<uintptr_t>(p)), lowbit(static_cast<uint64_t>(ld_bytes))));
}

// Bytes of one element of D.
int64_t d_elem_bytes(cudaDataType_t t) {
  return t == CUDA_R_32F || t == CUDA_R_32I ? 4 : 2;
}

// alpha = 1 and beta (0 or 1) in the plan's scale type: int32 for the int8 GEMM
// (CUBLAS_COMPUTE_32I with CUDA_R_32I scales), f32 otherwise.
struct Scalars {
  float alpha_f = 1.0f, beta_f = 0.0f;
  int32_t alpha_i = 1, beta_i = 0;
  const void* alpha = nullptr;
  const void* beta = nullptr;
  explicit Scalars(const PlanKey& key) {
    beta_f = key.beta ? 1.0f : 0.0f;
    beta_i = key.beta ? 1 : 0;
    const bool i8 = key.path == LtPath::kI8Scratch;
    alpha = i8 ? static_cast<const void*>(&alpha_i) : &alpha_f;
    beta = i8 ? static_cast<const void*>(&beta_i) : &beta_f;
  }
  Scalars(const Scalars&) = delete;
  Scalars& operator=(const Scalars&) = delete;
};

// The device pointers a descriptor carries besides the operands: the bias (BIAS epilogue) and,
// on the scaled fp8 path, the per-row weight scales and per-token activation scales.
struct Ptrs {
  const float* bias = nullptr;
  const float* a_scale = nullptr;  // [m]: W's rows
  const float* b_scale = nullptr;  // [n]: x's tokens
};

Status build(const PlanKey& key, const Ptrs& ptrs, Descs* s) {
  const bool i8 = key.path == LtPath::kI8Scratch;
  const bool fp8 = key.path == LtPath::kFp8Scratch || key.path == LtPath::kFp8Scaled;
  const cudaDataType_t ab = fp8 ? CUDA_R_8F_E4M3 : i8 ? CUDA_R_8I : CUDA_R_16BF;
  // int8 x int8 -> int32 (IMMA): int32 compute and int32 scales.
  STRATA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescInit(
      &s->op, i8 ? CUBLAS_COMPUTE_32I : CUBLAS_COMPUTE_32F, i8 ? CUDA_R_32I : CUDA_R_32F));
  const cublasOperation_t trans_a = CUBLAS_OP_T;
  const cublasOperation_t trans_b = CUBLAS_OP_N;
  STRATA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(&s->op, CUBLASLT_MATMUL_DESC_TRANSA,
                                                               &trans_a, sizeof(trans_a)));
  STRATA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(&s->op, CUBLASLT_MATMUL_DESC_TRANSB,
                                                               &trans_b, sizeof(trans_b)));
  if (key.bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    STRATA_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(&s->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    STRATA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        &s->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ptrs.bias, sizeof(ptrs.bias)));
  }
  if (key.path == LtPath::kFp8Scaled) {
    // D[i, j] = a_scale[i] * b_scale[j] * sum_k A[i, k] B[k, j] (+ C): both scales applied to
    // the f32 accumulator inside the GEMM, one rounding to D's type.
    const cublasLtMatmulMatrixScale_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    for (const auto attr : {CUBLASLT_MATMUL_DESC_A_SCALE_MODE, CUBLASLT_MATMUL_DESC_B_SCALE_MODE}) {
      STRATA_CUBLAS_RETURN_IF_ERROR(
          cublasLtMatmulDescSetAttribute(&s->op, attr, &vec, sizeof(vec)));
    }
    STRATA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        &s->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ptrs.a_scale, sizeof(ptrs.a_scale)));
    STRATA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        &s->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &ptrs.b_scale, sizeof(ptrs.b_scale)));
  }
  STRATA_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutInit(&s->a, ab, static_cast<uint64_t>(key.k),
                                                         static_cast<uint64_t>(key.m), key.lda));
  STRATA_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutInit(&s->b, ab, static_cast<uint64_t>(key.k),
                                                         static_cast<uint64_t>(key.n), key.ldb));
  STRATA_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutInit(
      &s->d, key.d_type, static_cast<uint64_t>(key.m), static_cast<uint64_t>(key.n), key.ldd));
  return ok_status();
}

// The cached plan of a shape, asking the heuristic the first time (up to kCandidates algorithms,
// best first).
constexpr int kCandidates = 8;

Status get_plan(const LaunchCtx& ctx, const PlanKey& key, const Ptrs& ptrs, Plan** plan) {
  if (ctx.lt_plans == nullptr) {
    return Status(StatusCode::kInvalidArgument,
                  "cublaslt_linear: the launch context has no cuBLASLt plan cache (make the "
                  "context with CudaDevice)");
  }
  auto& plans = ctx.lt_plans->plans;
  {
    std::lock_guard<std::mutex> lock(ctx.lt_plans->mu);
    const auto it = plans.find(key);
    if (it != plans.end()) {
      *plan = &it->second;
      return ok_status();
    }
  }
  Descs s;
  STRATA_RETURN_IF_ERROR(build(key, ptrs, &s));
  cublasLtMatmulPreferenceOpaque_t pref;
  STRATA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceInit(&pref));
  const uint64_t ws = key.workspace;
  STRATA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      &pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_d},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d}};
  for (const auto& [attr, value] : aligns) {
    STRATA_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulPreferenceSetAttribute(&pref, attr, &value, sizeof(value)));
  }
  cublasLtMatmulHeuristicResult_t results[kCandidates]{};
  int count = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      key.handle, &s.op, &s.a, &s.b, &s.d, &s.d, &pref, kCandidates, results, &count);
  Plan found;
  if (st == CUBLAS_STATUS_SUCCESS) {
    for (int i = 0; i < count; ++i) {
      if (results[i].state == CUBLAS_STATUS_SUCCESS) found.candidates.push_back(results[i].algo);
    }
  }
  found.ok = !found.candidates.empty();
  if (found.ok) found.algo = found.candidates[0];
  found.tuned = found.candidates.size() <= 1;
  std::lock_guard<std::mutex> lock(ctx.lt_plans->mu);
  *plan = &plans.emplace(key, std::move(found)).first->second;
  return ok_status();
}

// Times every candidate of `plan` on the real operands (the first call of a shape outside graph
// capture; STRATA_NO_AUTOTUNE=1 keeps the heuristic's pick) and keeps the fastest. With beta = 1
// the timing runs would add into d, so d is saved first and restored after.
Status autotune(const LaunchCtx& ctx, const PlanKey& key, Plan& plan, Descs& s, const void* a,
                const void* b, void* d, void* workspace) {
  const bool disabled = env_config().no_autotune;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(ctx.stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return ok_status();
  // Only token counts that are powers of two are tuned: CUDA-graph decode buckets and the usual
  // benchmark sizes repeat, while a serving engine's mixed steps take hundreds of distinct sizes,
  // each of which would pay a tuning run (~10 ms) for a few percent (measured: offline throughput
  // fell from 13,979 to 11,795 tok/s with every size tuned). The rest keep the heuristic's pick.
  const bool pow2 = key.n > 0 && (key.n & (key.n - 1)) == 0;
  if (disabled || !pow2) {
    plan.tuned = true;
    return ok_status();
  }
  const auto elem = static_cast<size_t>(d_elem_bytes(key.d_type));
  const size_t d_bytes = static_cast<size_t>(key.ldd) * static_cast<size_t>(key.n - 1) * elem +
                         static_cast<size_t>(key.m) * elem;
  // Stream-ordered allocation: cudaMalloc / cudaFree can wait for the whole device, which
  // deadlocks in-process tensor-parallel ranks on one GPU (a peer's one-shot kernel waits for
  // this rank's next collective).
  void* saved = nullptr;
  if (key.beta) {
    STRATA_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&saved, d_bytes, ctx.stream));
    STRATA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(saved, d, d_bytes, cudaMemcpyDeviceToDevice, ctx.stream));
  }
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  (void)cudaEventCreate(&e0);
  (void)cudaEventCreate(&e1);
  const Scalars sc(key);
  float best = 1e30f;
  size_t best_i = 0;
  for (size_t i = 0; i < plan.candidates.size(); ++i) {
    const cublasLtMatmulAlgo_t& algo = plan.candidates[i];
    auto once = [&] {
      return cublasLtMatmul(key.handle, &s.op, sc.alpha, a, &s.a, b, &s.b, sc.beta, d, &s.d, d,
                            &s.d, &algo, workspace, key.workspace, ctx.stream);
    };
    if (once() != CUBLAS_STATUS_SUCCESS) continue;  // warm-up; an algorithm that fails is skipped
    (void)cudaEventRecord(e0, ctx.stream);
    constexpr int kReps = 3;
    bool ok = true;
    for (int r = 0; r < kReps && ok; ++r) ok = once() == CUBLAS_STATUS_SUCCESS;
    (void)cudaEventRecord(e1, ctx.stream);
    float ms = 0.0f;
    if (!ok || cudaEventSynchronize(e1) != cudaSuccess ||
        cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) {
      continue;
    }
    if (ms < best) {
      best = ms;
      best_i = i;
    }
  }
  (void)cudaEventDestroy(e0);
  (void)cudaEventDestroy(e1);
  (void)cudaGetLastError();
  if (saved != nullptr) {
    STRATA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(d, saved, d_bytes, cudaMemcpyDeviceToDevice, ctx.stream));
    STRATA_CUDA_RETURN_IF_ERROR(cudaFreeAsync(saved, ctx.stream));
  }
  std::lock_guard<std::mutex> lock(ctx.lt_plans->mu);
  plan.algo = plan.candidates[best_i];
  plan.tuned = true;
  return ok_status();
}

// Outside a capture: drains ctx's stream (always with drain_alone, else only when there is a
// first-use barrier) and meets the process's other ranks at LaunchCtx::first_use_barrier, if
// any. `what`: how far the ranks got, for the message when they were aborted.
Status drain_and_meet(const LaunchCtx& ctx, bool drain_alone, const char* what) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(ctx.stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return ok_status();
  if (ctx.first_use_barrier == nullptr && !drain_alone) return ok_status();
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
  if (ctx.first_use_barrier != nullptr && !(*ctx.first_use_barrier)()) {
    return Status(
        StatusCode::kCancelled,
        std::string("cuBLASLt first use: the process's ranks were aborted before all ") + what);
  }
  return ok_status();
}

Status run_matmul(const LaunchCtx& ctx, const PlanKey& key, Plan& plan, const Ptrs& ptrs,
                  const void* a, const void* b, void* d, void* workspace) {
  Descs s;
  STRATA_RETURN_IF_ERROR(build(key, ptrs, &s));
  bool warmed = false;
  {
    std::lock_guard<std::mutex> lock(ctx.lt_plans->mu);
    warmed = plan.warmed;
  }
  if (!warmed) {
    // The first run of a plan on a device may make cuBLASLt load a kernel library
    // (cuLibraryLoadData), which waits for the device to go idle while holding a lock that every
    // cublasLtMatmul of the process takes. With a collective in flight on this stream that is a
    // deadlock between tensor-parallel ranks: this GPU's all-reduce waits for a peer GPU, whose
    // host thread waits for the lock (seen with NCCL on two H200s: one rank in
    // cuLibraryLoadData, the other in cublasLtMatmul's mutex). So the stream is drained first,
    // once per plan (never inside a capture: a captured shape has run eagerly before).
    // Ranks whose GPUs could otherwise sit in a collective waiting for this one meet here
    // first, every stream drained (LaunchCtx::first_use_barrier).
    STRATA_RETURN_IF_ERROR(drain_and_meet(ctx, /*drain_alone=*/true, "arrived"));
  }
  if (!plan.tuned) STRATA_RETURN_IF_ERROR(autotune(ctx, key, plan, s, a, b, d, workspace));
  const Scalars sc(key);
  STRATA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(key.handle, &s.op, sc.alpha, a, &s.a, b, &s.b,
                                               sc.beta, d, &s.d, d, &s.d, &plan.algo, workspace,
                                               key.workspace, ctx.stream));
  if (!warmed) {
    {
      std::lock_guard<std::mutex> lock(ctx.lt_plans->mu);
      plan.warmed = true;
    }
    // And meet again once this first run (its autotuning included) is done, so that no rank
    // launches a collective that spins for a peer still in its first use: the peer's autotuning
    // may load another kernel library, which waits for the spinning kernel on a shared GPU
    // (Llama-3-8B at in-process TP = 2 on one H100 stopped at its first batch-64 step).
    STRATA_RETURN_IF_ERROR(drain_and_meet(ctx, /*drain_alone=*/false, "finished"));
  }
  return ok_status();
}

// bf16 weights, cuBLASLt writes out directly. *done = false when cuBLASLt has no algorithm.
// With launch = false only the plan is looked up.
Status bf16_direct(const LaunchCtx& ctx, const GpuLinearParams& p, bool launch, bool* done) {
  const bool f32_out = p.out_dtype == DType::kF32;
  const int64_t out_elem = f32_out ? 4 : 2;
  const PlanKey key{.handle = ctx.cublaslt,
                    .path = LtPath::kBf16Direct,
                    .d_type = f32_out ? CUDA_R_32F : CUDA_R_16BF,
                    .bias = p.bias != nullptr,
                    .beta = p.accumulate,
                    .m = p.out_features,
                    .k = p.in_features,
                    .n = p.n_tokens,
                    .lda = p.w_stride,
                    .ldb = p.x_stride,
                    .ldd = p.out_stride,
                    .align_a = row_align(p.w, p.w_stride * 2),
                    .align_b = row_align(p.x, p.x_stride * 2),
                    .align_d = row_align(p.out, p.out_stride * out_elem),
                    .align_bias = p.bias ? row_align(p.bias, 0) : 0,
                    .workspace = ctx.workspace_bytes};
  Plan* plan = nullptr;
  const Ptrs ptrs{.bias = p.bias};
  STRATA_RETURN_IF_ERROR(get_plan(ctx, key, ptrs, &plan));
  *done = plan->ok;
  if (!plan->ok || !launch) return ok_status();
  return run_matmul(ctx, key, *plan, ptrs, p.w, p.x, p.out, ctx.workspace);
}

// Where the scaled fp8 GEMM is taken. Measured on an H100 (bench_gpu_linear, Llama-3-8B shapes,
// bench/results/2026-11-27-h100-s11/): from 128 tokens it beats the scratch path on every
// projection whose k is below 2 m (qkv, o, gate/up, lm_head: 1.1-1.4x at 128-2,048 tokens);
// on down (k = 3.5 m) it loses at 17-256 tokens and at 2,048 (cuBLASLt's scaled kernels for a
// long k and a short m are slower than its plain fp8 ones), and in the model's decode step at
// 64 sequences the all-scaled step was 7% slower than the scratch path.
constexpr int64_t kFp8ScaledMinTokens = 128;

// fp8 weights without a bias: x quantized per token into the workspace, then one cuBLASLt fp8
// GEMM that applies x_scale[t] * w_scale[m] to its f32 accumulator and writes out itself (bf16
// or f32, accumulating as beta = 1 with C = D): no f32 scratch, no epilogue kernel. *done =
// false when cuBLASLt has no algorithm (then nothing was launched; the caller takes the
// scratch path). With launch = false only the plans are looked up.
Status fp8_scaled(const LaunchCtx& ctx, const GpuLinearParams& p, bool launch, bool* done) {
  *done = false;
  const int64_t m = p.out_features;
  const int64_t k = p.in_features;
  const int64_t n = p.n_tokens;
  const bool f32_out = p.out_dtype == DType::kF32;
  const int64_t out_elem = f32_out ? 4 : 2;
  const size_t lt_bytes = ctx.workspace_bytes / 4 / kAlign * kAlign;
  const int64_t ldq = (k + 15) / 16 * 16;  // fp8 x rows: 16-byte aligned
  const int64_t per_token = ldq + 4;
  const int64_t avail = static_cast<int64_t>(ctx.workspace_bytes - lt_bytes) - 2 * kAlign;
  const int64_t slice = std::min<int64_t>(n, avail / per_token);
  if (ctx.workspace == nullptr || slice < 1) return ok_status();  // the scratch path says why
  char* base = static_cast<char*>(ctx.workspace);
  uint8_t* xq = reinterpret_cast<uint8_t*>(base + lt_bytes);
  float* xs =
      reinterpret_cast<float*>(base + lt_bytes + (slice * ldq + kAlign - 1) / kAlign * kAlign);
  const auto key_for = [&](int64_t ns) {
    return PlanKey{.handle = ctx.cublaslt,
                   .path = LtPath::kFp8Scaled,
                   .d_type = f32_out ? CUDA_R_32F : CUDA_R_16BF,
                   .bias = false,
                   .beta = p.accumulate,
                   .m = m,
                   .k = k,
                   .n = ns,
                   .lda = p.w_stride,
                   .ldb = ldq,
                   .ldd = p.out_stride,
                   .align_a = row_align(p.w, p.w_stride),
                   .align_b = row_align(xq, ldq),
                   .align_d = row_align(p.out, p.out_stride * out_elem),
                   .align_bias = 0,
                   .workspace = lt_bytes};
  };
  const Ptrs ptrs{.a_scale = p.w_scale, .b_scale = xs};
  const PlanKey full_key = key_for(slice);
  Plan* full_plan = nullptr;
  STRATA_RETURN_IF_ERROR(get_plan(ctx, full_key, ptrs, &full_plan));
  if (!full_plan->ok) return ok_status();
  const int64_t rest = n % slice;
  const PlanKey rest_key = key_for(rest > 0 ? rest : slice);
  Plan* rest_plan = full_plan;
  if (rest > 0) {
    STRATA_RETURN_IF_ERROR(get_plan(ctx, rest_key, ptrs, &rest_plan));
    if (!rest_plan->ok) return ok_status();
  }
  *done = true;
  if (!launch) return ok_status();
  for (int64_t t0 = 0; t0 < n; t0 += slice) {
    const int64_t ns = std::min(slice, n - t0);
    STRATA_RETURN_IF_ERROR(
        quantize_activations_fp8(ctx, p.x + t0 * p.x_stride, p.x_stride, ns, k, xq, ldq, xs));
    const bool full = ns == slice;
    STRATA_RETURN_IF_ERROR(
        run_matmul(ctx, full ? full_key : rest_key, full ? *full_plan : *rest_plan, ptrs, p.w, xq,
                   static_cast<char*>(p.out) + t0 * p.out_stride * out_elem, base));
  }
  return ok_status();
}

// The scratch paths (see the file comment). *done = false when cuBLASLt has no algorithm; then
// nothing was launched. With launch = false only the plans are looked up.
Status via_scratch(const LaunchCtx& ctx, const GpuLinearParams& p, bool launch, bool* done) {
  *done = false;
  const bool fp8 = p.w_dtype == DType::kFP8E4M3;
  const bool i8 = p.w_dtype == DType::kI8;  // the A8W8 GEMM: int8 x, int32 D
  const bool q8 = fp8 || i8;                // x quantized per token into the scratch
  const int64_t m = p.out_features;
  const int64_t k = p.in_features;
  const int64_t n = p.n_tokens;
  const size_t lt_bytes = ctx.workspace_bytes / 4 / kAlign * kAlign;
  const int64_t ldq = (k + 15) / 16 * 16;  // 8-bit x rows: 16-byte aligned
  // f32 out that is overwritten holds D itself (the epilogue then runs in place; an int32 D has
  // the f32's size): no D scratch, so the token slices are only limited by the 8-bit copy of x.
  const bool d_in_out =
      p.out_dtype == DType::kF32 && !p.accumulate && row_align(p.out, p.out_stride * 4) >= 16;
  const int64_t ldd = d_in_out ? p.out_stride : (m + 3) / 4 * 4;  // scratch rows 16-byte aligned
  const int64_t per_token = (d_in_out ? 0 : ldd * 4) + (q8 ? ldq + 4 : 0);
  const int64_t avail = static_cast<int64_t>(ctx.workspace_bytes - lt_bytes) - 3 * kAlign;
  const int64_t slice = per_token == 0 ? n : std::min<int64_t>(n, avail / per_token);
  if (ctx.workspace == nullptr || slice < 1) {
    return errorf(StatusCode::kFailedPrecondition,
                  "{}: workspace of {} bytes holds no token of the f32 / int32 scratch for "
                  "out_features {} "
                  "(needs {} bytes per token beyond cuBLASLt's quarter)",
                  kOp, ctx.workspace_bytes, m, per_token);
  }
  char* base = static_cast<char*>(ctx.workspace);
  char* scratch = base + lt_bytes;
  float* d = d_in_out ? static_cast<float*>(p.out) : reinterpret_cast<float*>(scratch);
  char* after_d = scratch + (d_in_out ? 0 : (slice * ldd * 4 + kAlign - 1) / kAlign * kAlign);
  uint8_t* xq = reinterpret_cast<uint8_t*>(after_d);
  float* xs = reinterpret_cast<float*>(after_d + (slice * ldq + kAlign - 1) / kAlign * kAlign);

  const auto key_for = [&](int64_t ns) {
    return PlanKey{.handle = ctx.cublaslt,
                   .path = fp8  ? LtPath::kFp8Scratch
                           : i8 ? LtPath::kI8Scratch
                                : LtPath::kBf16Scratch,
                   .d_type = i8 ? CUDA_R_32I : CUDA_R_32F,
                   .bias = false,
                   .beta = false,
                   .m = m,
                   .k = k,
                   .n = ns,
                   .lda = p.w_stride,
                   .ldb = q8 ? ldq : p.x_stride,
                   .ldd = ldd,
                   .align_a = row_align(p.w, p.w_stride * (q8 ? 1 : 2)),
                   .align_b = q8 ? row_align(xq, ldq) : row_align(p.x, p.x_stride * 2),
                   .align_d = row_align(d, ldd * 4),
                   .align_bias = 0,
                   .workspace = lt_bytes};
  };
  // Both slice sizes' plans before launching anything, so a missing algorithm leaves out intact.
  const PlanKey full_key = key_for(slice);
  Plan* full_plan = nullptr;
  STRATA_RETURN_IF_ERROR(get_plan(ctx, full_key, Ptrs{}, &full_plan));
  if (!full_plan->ok) return ok_status();
  const int64_t rest = n % slice;
  const PlanKey rest_key = key_for(rest > 0 ? rest : slice);
  Plan* rest_plan = full_plan;
  if (rest > 0) {
    STRATA_RETURN_IF_ERROR(get_plan(ctx, rest_key, Ptrs{}, &rest_plan));
    if (!rest_plan->ok) return ok_status();
  }
  if (!launch) {
    *done = true;
    return ok_status();
  }

  const int64_t out_elem = p.out_dtype == DType::kF32 ? 4 : 2;
  for (int64_t t0 = 0; t0 < n; t0 += slice) {
    const int64_t ns = std::min(slice, n - t0);
    const uint16_t* x = p.x + t0 * p.x_stride;
    if (fp8) {
      STRATA_RETURN_IF_ERROR(quantize_activations_fp8(ctx, x, p.x_stride, ns, k, xq, ldq, xs));
    } else if (i8) {
      STRATA_RETURN_IF_ERROR(quantize_activations_i8(ctx, x, p.x_stride, ns, k,
                                                     reinterpret_cast<int8_t*>(xq), ldq, xs));
    }
    const bool full = ns == slice;
    float* d_slice = d_in_out ? d + t0 * ldd : d;
    STRATA_RETURN_IF_ERROR(run_matmul(ctx, full ? full_key : rest_key,
                                      full ? *full_plan : *rest_plan, Ptrs{}, p.w,
                                      q8 ? static_cast<const void*>(xq) : x, d_slice, base));
    LinearEpilogueArgs e;
    e.d = i8 ? nullptr : d_slice;
    e.d_i32 = i8 ? reinterpret_cast<const int32_t*>(d_slice) : nullptr;
    e.d_stride = ldd;
    e.x_scale = q8 ? xs : nullptr;
    e.w_scale = p.w_scale;
    e.bias = p.bias;
    e.out = static_cast<char*>(p.out) + t0 * p.out_stride * out_elem;
    e.out_stride = p.out_stride;
    e.out_bf16 = p.out_dtype == DType::kBF16;
    e.accumulate = p.accumulate;
    e.n_tokens = ns;
    e.m = m;
    STRATA_RETURN_IF_ERROR(linear_epilogue(ctx, e));
  }
  *done = true;
  return ok_status();
}

// cublaslt_linear's choice among its paths; with launch = false nothing runs (cublaslt_route).
Status cublaslt_dispatch(const LaunchCtx& ctx, const GpuLinearParams& p, bool launch,
                         LtRoute* route) {
  STRATA_RETURN_IF_ERROR(check_gpu_linear(kOp, p));
  if (dtype_info(p.w_dtype).is_quantized) {  // GGUF blocks: dequantized tiles, then bf16 GEMMs
    *route = LtRoute::kScratch;
    return launch ? gguf_linear(ctx, p) : ok_status();
  }
  if (p.gated_silu) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: gated_silu is SBI-only (sbi_gemm / linear up to 64 tokens)", kOp);
  }
  *route = LtRoute::kSbi;
  if (p.n_tokens == 0) return ok_status();
  // int8 shapes IMMA does not take (m or k not a multiple of 4), and STRATA_NO_I8_GEMM=1 (A/B):
  // SBI slices, slow (see top).
  if (p.w_dtype == DType::kI8 && (!a8w8_eligible(p) || env_config().no_i8_gemm)) {
    return launch ? sbi_gemm(ctx, p) : ok_status();
  }
  if (ctx.cublaslt == nullptr) {
    return errorf(StatusCode::kInvalidArgument, "{}: no cuBLASLt handle in the LaunchCtx", kOp);
  }
  bool done = false;
  if (p.w_dtype == DType::kBF16 && (p.out_dtype == DType::kF32 || p.bias == nullptr)) {
    *route = LtRoute::kDirect;
    STRATA_RETURN_IF_ERROR(bf16_direct(ctx, p, launch, &done));
    if (done) return ok_status();
  }
  if (p.w_dtype == DType::kFP8E4M3 && p.bias == nullptr && p.n_tokens >= kFp8ScaledMinTokens &&
      p.in_features < 2 * p.out_features && !env_config().no_fp8_scaled_gemm) {
    *route = LtRoute::kFp8Scaled;
    STRATA_RETURN_IF_ERROR(fp8_scaled(ctx, p, launch, &done));
    if (done) return ok_status();
  }
  *route = LtRoute::kScratch;
  STRATA_RETURN_IF_ERROR(via_scratch(ctx, p, launch, &done));
  if (done) return ok_status();
  // No cuBLASLt algorithm for this shape (e.g. fp8 with k not a multiple of 16, or an int8 shape
  // the IMMA kernels reject): SBI slices.
  *route = LtRoute::kSbi;
  return launch ? sbi_gemm(ctx, p) : ok_status();
}

}  // namespace

Status cublaslt_route(const LaunchCtx& ctx, const GpuLinearParams& p, LtRoute* route) {
  return cublaslt_dispatch(ctx, p, false, route);
}

Status cublaslt_linear(const LaunchCtx& ctx, const GpuLinearParams& p) {
  LtRoute route;
  return cublaslt_dispatch(ctx, p, true, &route);
}

Status linear(const LaunchCtx& ctx, const GpuLinearParams& p) {
  if (p.gated_silu && p.n_tokens > sbi::kMaxLaunchTokens) {
    return errorf(StatusCode::kInvalidArgument,
                  "linear: gated_silu with {} tokens (at most {}; run the GEMM and "
                  "gated_act_bf16 instead)",
                  p.n_tokens, sbi::kMaxLaunchTokens);
  }
  if (dtype_info(p.w_dtype).is_quantized) return gguf_linear(ctx, p);
  if (p.gated_silu || p.n_tokens <= sbi_max_tokens()) return sbi_gemm(ctx, p);
  return cublaslt_linear(ctx, p);
}

}  // namespace strata::cuda
