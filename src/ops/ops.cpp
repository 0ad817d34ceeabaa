// The fused op set (ops/ops.h): argument checks, then the backend. No math here: the CPU f32
// path composes the reference kernels (cpu::<op>, ops::ref), the bf16 path calls the GPU
// kernels' CPU twins or their CUDA launchers with the same Params.
#include "ops/ops.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/quant.h"
#include "core/env.h"
#include "core/half.h"
#include "core/status.h"
#include "fmt/format.h"
#include "ops/reference.h"
#include "parallel/comm.h"

#if STRATA_HAS_CUDA
#include "backends/cuda/cuda_kernels.h"
#endif

namespace strata::ops {
namespace {

// Most tokens for which the bf16 gated MLP runs as one GEMM with the activation in its epilogue
// (SBI-GeMM); above, a GEMM to bf16 and a separate activation kernel. The CUDA backend asks
// cuda::sbi_max_tokens(); the CPU twins use the same number so they round where the GPU does.
constexpr int64_t kTwinSbiMaxTokens = 16;

Status invalid(const char* op, const std::string& what) {
  return errorf(StatusCode::kInvalidArgument, "{}: {}", op, what);
}

Status no_cuda(const char* op) {
  return errorf(StatusCode::kUnimplemented,
                "{}: this strata was built without CUDA (configure with -DSTRATA_CUDA=ON)", op);
}

// A 2-D view: rows of contiguous elements, `stride` elements apart.
struct Mat {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;
};

Result<Mat> mat(const Tensor& t, const char* op, const char* name) {
  if (!t.defined()) return invalid(op, std::string(name) + " is undefined");
  if (t.ndim < 1) return invalid(op, std::string(name) + " has no dims");
  const auto dim = [&](int i) { return t.shape[static_cast<size_t>(i)]; };
  const auto stride = [&](int i) { return t.stride[static_cast<size_t>(i)]; };
  bool ok = dim(t.ndim - 1) <= 1 || stride(t.ndim - 1) == 1;
  for (int i = 0; i + 2 < t.ndim; ++i) {
    if (dim(i) > 1 && stride(i) != stride(i + 1) * dim(i + 1)) ok = false;
  }
  if (!ok) {
    return invalid(op,
                   fmt::format("{} {} is not a matrix of contiguous rows", name, t.shape_string()));
  }
  Mat m;
  m.cols = dim(t.ndim - 1);
  m.rows = 1;
  for (int i = 0; i + 1 < t.ndim; ++i) m.rows *= dim(i);
  m.stride = t.ndim >= 2 ? stride(t.ndim - 2) : m.cols;
  return m;
}

Status want_dtype(const Tensor& t, DType dt, const char* op, const char* name) {
  if (t.dtype != dt) {
    return invalid(
        op, fmt::format("{} is {} but must be {}", name, dtype_name(t.dtype), dtype_name(dt)));
  }
  return ok_status();
}

Status act_dtype(const Tensor& t, const char* op, const char* name) {
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16) {
    return invalid(op,
                   fmt::format("{} is {}; activations are f32 or bf16", name, dtype_name(t.dtype)));
  }
  return ok_status();
}

Status on_device(const Context& ctx, const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (t->defined() && !(t->device == ctx.device)) {
      return invalid(op, fmt::format("a tensor is on {} but the op runs on {}",
                                     t->device.to_string(), ctx.device.to_string()));
    }
  }
  if (ctx.device.is_cuda() && ctx.cuda == nullptr) return invalid(op, "no CUDA launch context");
  return ok_status();
}

uint16_t* bf16(const Tensor& t) {
  return static_cast<uint16_t*>(t.data);
}
float* f32(const Tensor& t) {
  return static_cast<float*>(t.data);
}

// The f32 scratch of the CPU reference path (accumulating linear layers): grown, never shrunk.
std::vector<float>& cpu_scratch(size_t n) {
  thread_local std::vector<float> s;
  if (s.size() < n) s.resize(n);
  return s;
}

PagedKvBf16Params kv_bf16(const KvLayer& c, const StepArgs& s) {
  PagedKvBf16Params p;
  p.k_cache = bf16(c.k);
  p.v_cache = bf16(c.v);
  p.block_tables = s.block_tables;
  p.max_blocks_per_seq = s.max_blocks_per_seq;
  p.n_seqs = s.n_seqs;
  p.n_blocks = c.k.dim(0);
  p.block_size = c.k.dim(1);
  p.n_heads_kv = c.k.dim(2);
  p.head_dim = c.k.dim(3);
  return p;
}

PagedKvParams kv_f32(const KvLayer& c, const StepArgs& s) {
  PagedKvParams p;
  p.k_cache = f32(c.k);
  p.v_cache = f32(c.v);
  p.block_tables = s.block_tables;
  p.max_blocks_per_seq = s.max_blocks_per_seq;
  p.n_seqs = s.n_seqs;
  p.n_blocks = c.k.dim(0);
  p.block_size = c.k.dim(1);
  p.n_heads_kv = c.k.dim(2);
  p.head_dim = c.k.dim(3);
  return p;
}

Status check_cache(const KvLayer& c, const char* op) {
  for (const Tensor* t : {&c.k, &c.v}) {
    if (!t->defined() || t->ndim != 4 || !t->is_contiguous()) {
      return invalid(op,
                     "the KV cache layer must be contiguous [n_blocks, block_size, "
                     "n_heads_kv, head_dim]");
    }
  }
  if (c.k.shape != c.v.shape || c.k.dtype != c.v.dtype) {
    return invalid(op, "K and V cache layers differ in shape or dtype");
  }
  return ok_status();
}

// The GEMM of one device-layout part through the GPU kernels (CUDA, or the CPU twin), into
// `out` (its first column).
Status gpu_gemm_part(Context& ctx, const Tensor& x, const Mat& xm, const LinearWeight::Part& p,
                     void* out, DType out_dtype, int64_t out_stride, bool accumulate, bool gated,
                     bool bias) {
  if (p.bias.defined() && p.bias.dtype != DType::kF32) {
    return invalid("linear", "device-layout biases must be f32");
  }
  GpuLinearParams g;
  g.x = bf16(x);
  g.x_stride = xm.stride;
  g.w = p.w.data;
  g.w_dtype = p.w.dtype;
  g.w_stride = p.w.row_stride();
  g.w_scale = p.scale.defined() ? f32(p.scale) : nullptr;
  g.bias = bias && p.bias.defined() ? f32(p.bias) : nullptr;
  g.out = out;
  g.out_dtype = out_dtype;
  g.out_stride = out_stride;
  g.n_tokens = xm.rows;
  g.in_features = xm.cols;
  g.out_features = gated ? p.w.dim(0) / 2 : p.w.dim(0);
  g.accumulate = accumulate;
  g.gated_silu = gated;
  if (ctx.device.is_cpu()) {
    // The twin of cuda::linear's routing: int8 weights above the crossover run the A8W8 GEMM
    // (int8 activations) on the GPU, so the twin rounds x the same way.
    if (g.n_tokens > kTwinSbiMaxTokens && a8w8_eligible(g) && !env_config().no_i8_gemm) {
      return cpu::gpu_linear_a8w8(g);
    }
    return cpu::gpu_linear(g);
  }
#if STRATA_HAS_CUDA
  return cuda::linear(*ctx.cuda, g);
#else
  return no_cuda("linear");
#endif
}

// The GEMM of a device-layout weight: one part, or (GGUF weights whose row blocks come in
// different block formats, e.g. Q4_K_M's Q/K in Q4_K and V in Q6_K) one GEMM per part into its
// columns of out. Gated weights are always one part.
Status gpu_gemm(Context& ctx, const Tensor& x, const Mat& xm, const LinearWeight& w, void* out,
                DType out_dtype, int64_t out_stride, bool accumulate, bool gated, bool bias) {
  if (w.n_parts == 1) {
    return gpu_gemm_part(ctx, x, xm, w.parts[0], out, out_dtype, out_stride, accumulate, gated,
                         bias);
  }
  for (int i = 0; i < w.n_parts; ++i) {
    if (gated || !dtype_info(w.parts[static_cast<size_t>(i)].w.dtype).is_quantized) {
      return invalid("linear",
                     "bf16 activations need the weight in the device layout (one part, or GGUF "
                     "row blocks of different formats without gating)");
    }
  }
  const int64_t elem = dtype_bytes(out_dtype, 1);
  int64_t r0 = 0;
  for (int i = 0; i < w.n_parts; ++i) {
    const LinearWeight::Part& p = w.parts[static_cast<size_t>(i)];
    STRATA_RETURN_IF_ERROR(gpu_gemm_part(ctx, x, xm, p, static_cast<char*>(out) + r0 * elem,
                                         out_dtype, out_stride, accumulate, false, bias));
    r0 += p.w.dim(0);
  }
  return ok_status();
}

int64_t sbi_max_tokens(const Context& ctx) {
#if STRATA_HAS_CUDA
  if (ctx.device.is_cuda()) return cuda::sbi_max_tokens();
#endif
  return kTwinSbiMaxTokens;
}

}  // namespace

// ---- embed ----------------------------------------------------------------------------------

Status embed(Context& ctx, const Tensor& table, const int32_t* ids, const EmbedArgs& args,
             Tensor& x) {
  constexpr const char* kOp = "embed";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&table, &x}));
  STRATA_ASSIGN_OR_RETURN(Mat tm, mat(table, kOp, "table"));
  STRATA_ASSIGN_OR_RETURN(Mat xm, mat(x, kOp, "x"));
  STRATA_RETURN_IF_ERROR(want_dtype(x, DType::kF32, kOp, "x"));
  if (tm.cols != xm.cols) {
    return invalid(kOp, fmt::format("table {} and x {} differ in width", table.shape_string(),
                                    x.shape_string()));
  }
  if (xm.rows > 0 && ids == nullptr) return invalid(kOp, "ids is null");
  EmbeddingParams p;
  p.table = table.data;
  p.table_dtype = table.dtype;
  p.table_stride = tm.stride;
  p.ids = ids;
  p.out = f32(x);
  p.out_stride = xm.stride;
  p.n_tokens = xm.rows;
  p.hidden = xm.cols;
  p.vocab_offset = args.vocab_offset;
  p.vocab_shard = tm.rows;
  p.vocab = args.vocab;
  p.scale = args.scale;
  p.accumulate = args.accumulate;
  if (ctx.device.is_cpu()) return cpu::embedding(p);
#if STRATA_HAS_CUDA
  return cuda::embedding(*ctx.cuda, p);
#else
  return no_cuda(kOp);
#endif
}

// ---- norm -----------------------------------------------------------------------------------

Status norm(Context& ctx, Tensor& x, const NormWeight& w, const NormArgs& args, Tensor& out,
            const Tensor* residual) {
  constexpr const char* kOp = "norm";
  const Tensor none;
  const Tensor& res = residual != nullptr ? *residual : none;
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&x, &w.w, &w.b, &out, &res}));
  STRATA_ASSIGN_OR_RETURN(Mat xm, mat(x, kOp, "x"));
  STRATA_ASSIGN_OR_RETURN(Mat om, mat(out, kOp, "out"));
  STRATA_RETURN_IF_ERROR(want_dtype(x, DType::kF32, kOp, "x"));
  STRATA_RETURN_IF_ERROR(act_dtype(out, kOp, "out"));
  if (om.rows != xm.rows || om.cols != xm.cols) {
    return invalid(kOp, fmt::format("x is {} but out is {}", x.shape_string(), out.shape_string()));
  }
  if (!w.w.defined() || w.w.numel() != xm.cols) {
    return invalid(kOp,
                   fmt::format("weight {} does not match hidden {}", w.w.shape_string(), xm.cols));
  }
  Mat rm;
  if (res.defined()) {
    STRATA_ASSIGN_OR_RETURN(rm, mat(res, kOp, "residual"));
    STRATA_RETURN_IF_ERROR(want_dtype(res, DType::kF32, kOp, "residual"));
    if (rm.rows != xm.rows || rm.cols != xm.cols) return invalid(kOp, "residual shape differs");
  }
  if (out.dtype == DType::kBF16) {
    NormBf16Params p;
    p.kind = args.kind;
    p.x = f32(x);
    p.x_stride = xm.stride;
    p.residual = res.defined() ? f32(res) : nullptr;
    p.residual_stride = rm.stride;
    p.weight = w.w.data;
    p.weight_dtype = w.w.dtype;
    p.bias = w.b.data;
    p.bias_dtype = w.b.dtype;
    p.out = bf16(out);
    p.out_stride = om.stride;
    p.n_tokens = xm.rows;
    p.hidden = xm.cols;
    p.eps = args.eps;
    p.weight_offset = args.weight_offset;
    if (ctx.device.is_cpu()) return cpu::norm_bf16(p);
#if STRATA_HAS_CUDA
    return cuda::norm_bf16(*ctx.cuda, p);
#else
    return no_cuda(kOp);
#endif
  }
  // f32 out: the residual add, then the f32 norm kernel.
  if (res.defined()) STRATA_RETURN_IF_ERROR(add(ctx, x, res, x));
  switch (args.kind) {
    case NormKind::kRms: {
      RmsNormParams p;
      p.x = f32(x);
      p.weight = w.w.data;
      p.weight_dtype = w.w.dtype;
      p.out = f32(out);
      p.n_tokens = xm.rows;
      p.hidden = xm.cols;
      p.x_stride = xm.stride;
      p.out_stride = om.stride;
      p.eps = args.eps;
      p.weight_offset = args.weight_offset;
      if (ctx.device.is_cpu()) return cpu::rms_norm(p);
#if STRATA_HAS_CUDA
      return cuda::rms_norm(*ctx.cuda, p);
#else
      return no_cuda(kOp);
#endif
    }
    case NormKind::kLayer: {
      LayerNormParams p;
      p.x = f32(x);
      p.weight = w.w.data;
      p.weight_dtype = w.w.dtype;
      p.bias = w.b.data;
      p.bias_dtype = w.b.dtype;
      p.out = f32(out);
      p.n_tokens = xm.rows;
      p.hidden = xm.cols;
      p.x_stride = xm.stride;
      p.out_stride = om.stride;
      p.eps = args.eps;
      if (ctx.device.is_cpu()) return cpu::layer_norm(p);
#if STRATA_HAS_CUDA
      return cuda::layer_norm(*ctx.cuda, p);
#else
      return no_cuda(kOp);
#endif
    }
  }
  return invalid(kOp, "unknown norm kind");
}

// ---- linear ---------------------------------------------------------------------------------

// Rows [r0, r0 + rows) of a GGUF block-quantized part as the CPU decode kernels take it (its
// bias too when `bias`); false where those kernels cannot read it (not block-quantized, scaled,
// not whole blocks per row, too few rows).
bool decode_part(const LinearWeight::Part& p, int64_t r0, int64_t rows, bool bias,
                 cpu::DecodePart* d) {
  const DTypeInfo& info = dtype_info(p.w.dtype);
  if (!info.is_quantized || p.scale.defined() || p.w.ndim != 2 || p.w.stride[1] != 1 ||
      p.w.stride[0] % info.block_size != 0 || r0 + rows > p.w.dim(0)) {
    return false;
  }
  d->row_bytes = p.w.stride[0] / info.block_size * info.block_bytes;
  d->weight = static_cast<const uint8_t*>(p.w.data) + r0 * d->row_bytes;
  d->weight_dtype = p.w.dtype;
  d->rows = rows;
  if (bias && p.bias.defined()) {
    d->bias = static_cast<const char*>(p.bias.data) + r0 * dtype_info(p.bias.dtype).block_bytes;
    d->bias_dtype = p.bias.dtype;
  }
  return true;
}

// One token through GGUF block-quantized parts (q/k/v, gate/up; decode of a quantized model on
// the CPU): every part in one OpenMP region with x quantized once, and a residual accumulated in
// place, instead of a region per part plus one for the add; bit-identical to the per-part path.
// False (nothing written) where cpu::quant_decode_parts does not serve the parts.
bool cpu_decode_parts(const Tensor& x, const Mat& xm, const LinearWeight& w, Tensor& out,
                      const LinearArgs& args) {
  if (xm.rows != 1 || w.n_parts < 1 || env_config().cpu_no_fused_parts) return false;
  std::array<cpu::DecodePart, 3> parts{};
  const auto* x0 = static_cast<const char*>(x.data);
  const auto* x1 = x0 + xm.cols * sizeof(float);
  int64_t r0 = 0;
  for (int i = 0; i < w.n_parts; ++i) {
    const LinearWeight::Part& p = w.parts[static_cast<size_t>(i)];
    cpu::DecodePart& d = parts[static_cast<size_t>(i)];
    if (p.w.ndim != 2 || !decode_part(p, 0, p.w.dim(0), args.bias, &d)) return false;
    d.out = static_cast<float*>(out.data) + r0;
    r0 += d.rows;
  }
  const auto* o0 = static_cast<const char*>(out.data);
  const auto* o1 = o0 + r0 * sizeof(float);
  if (o0 < x1 && x0 < o1) return false;  // out overlaps x: the reference path reports it
  return cpu::quant_decode_parts(f32(x), xm.cols, parts.data(), w.n_parts, args.accumulate);
}

Status linear(Context& ctx, const Tensor& x, const LinearWeight& w, Tensor& out,
              const LinearArgs& args) {
  constexpr const char* kOp = "linear";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&x, &out}));
  STRATA_ASSIGN_OR_RETURN(Mat xm, mat(x, kOp, "x"));
  STRATA_ASSIGN_OR_RETURN(Mat om, mat(out, kOp, "out"));
  STRATA_RETURN_IF_ERROR(act_dtype(x, kOp, "x"));
  STRATA_RETURN_IF_ERROR(act_dtype(out, kOp, "out"));
  if (!w.defined()) return invalid(kOp, "the weight is undefined");
  if (w.cols() != xm.cols || om.rows != xm.rows || om.cols != w.rows()) {
    return invalid(kOp, fmt::format("x {} and out {} do not fit a [{}, {}] weight",
                                    x.shape_string(), out.shape_string(), w.rows(), w.cols()));
  }
  if (args.accumulate && out.dtype != DType::kF32) return invalid(kOp, "accumulate needs f32 out");
  if (x.dtype == DType::kBF16) {
    return gpu_gemm(ctx, x, xm, w, out.data, out.dtype, om.stride, args.accumulate, false,
                    args.bias);
  }
  // The f32 reference: each part into its columns of out (through a scratch when accumulating).
  if (!ctx.device.is_cpu()) return invalid(kOp, "f32 activations run on the CPU only");
  STRATA_RETURN_IF_ERROR(want_dtype(out, DType::kF32, kOp, "out"));
  if (cpu_decode_parts(x, xm, w, out, args)) return ok_status();
  Tensor target = out;
  if (args.accumulate) {
    std::vector<float>& s = cpu_scratch(static_cast<size_t>(om.rows * om.cols));
    target = Tensor::make(s.data(), DType::kF32, {om.rows, om.cols});
  }
  int64_t r0 = 0;
  for (int i = 0; i < w.n_parts; ++i) {
    const LinearWeight::Part& p = w.parts[static_cast<size_t>(i)];
    const int64_t r1 = r0 + p.w.dim(0);
    Tensor cols = target.slice_cols(r0, r1);
    if (p.scale.defined()) return invalid(kOp, "scaled (int8/fp8) weights need bf16 activations");
    STRATA_RETURN_IF_ERROR(
        ref::linear(x, p.w, args.bias ? p.bias : Tensor{}, cols).with_context(kOp));
    r0 = r1;
  }
  if (args.accumulate) STRATA_RETURN_IF_ERROR(add(ctx, out, target, out));
  return ok_status();
}

Status linear_act(Context& ctx, const Tensor& x, const LinearWeight& w, Activation act, bool gated,
                  Tensor& scratch, Tensor& out) {
  constexpr const char* kOp = "linear_act";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&x, &scratch, &out}));
  STRATA_ASSIGN_OR_RETURN(Mat xm, mat(x, kOp, "x"));
  STRATA_ASSIGN_OR_RETURN(Mat om, mat(out, kOp, "out"));
  STRATA_ASSIGN_OR_RETURN(Mat sm, mat(scratch, kOp, "scratch"));
  const int64_t F = gated ? w.rows() / 2 : w.rows();
  if ((gated && w.rows() % 2 != 0) || om.cols != F || om.rows != xm.rows) {
    return invalid(kOp, fmt::format("out {} does not fit a {} weight of {} rows",
                                    out.shape_string(), gated ? "gated" : "plain", w.rows()));
  }
  if (sm.rows < xm.rows || sm.cols < w.rows()) {
    return invalid(kOp, fmt::format("scratch {} is smaller than [{}, {}]", scratch.shape_string(),
                                    xm.rows, w.rows()));
  }
  if (x.dtype == DType::kF32) {
    STRATA_RETURN_IF_ERROR(want_dtype(out, DType::kF32, kOp, "out"));
    if (!gated) {
      STRATA_RETURN_IF_ERROR(linear(ctx, x, w, out));
      ActParams p{f32(out), om.stride, om.rows, om.cols, act};
      return cpu::act(p);
    }
    STRATA_RETURN_IF_ERROR(want_dtype(scratch, DType::kF32, kOp, "scratch"));
    Tensor gu = Tensor::make(scratch.data, DType::kF32, {xm.rows, 2 * F}, ctx.device);
    gu.stride[0] = sm.stride;
    STRATA_RETURN_IF_ERROR(linear(ctx, x, w, gu));
    GatedActParams p;
    p.gate = f32(gu);
    p.gate_stride = sm.stride;
    p.up = f32(gu) + F;
    p.up_stride = sm.stride;
    p.out = f32(out);
    p.out_stride = om.stride;
    p.n_tokens = xm.rows;
    p.ffn_dim = F;
    p.act = act;
    return cpu::gated_act(p);
  }
  // bf16: the GPU layout. SiLU-gated MLPs of few tokens run as one SBI-GeMM with the activation in
  // its epilogue; otherwise the GEMM writes bf16 and one kernel applies the activation.
  STRATA_RETURN_IF_ERROR(want_dtype(x, DType::kBF16, kOp, "x"));
  STRATA_RETURN_IF_ERROR(want_dtype(out, DType::kBF16, kOp, "out"));
  if (gated && act == Activation::kSilu && xm.rows <= sbi_max_tokens(ctx)) {
    return gpu_gemm(ctx, x, xm, w, out.data, DType::kBF16, om.stride, false, true, true);
  }
  STRATA_RETURN_IF_ERROR(want_dtype(scratch, DType::kBF16, kOp, "scratch"));
  STRATA_RETURN_IF_ERROR(
      gpu_gemm(ctx, x, xm, w, scratch.data, DType::kBF16, sm.stride, false, false, true));
  GatedActBf16Params p;
  p.gated = gated;
  p.in_bf16 = bf16(scratch);
  p.in_stride = sm.stride;
  p.out = bf16(out);
  p.out_stride = om.stride;
  p.n_tokens = xm.rows;
  p.ffn_dim = F;
  p.act = act;
  if (ctx.device.is_cpu()) return cpu::gated_act_bf16(p);
#if STRATA_HAS_CUDA
  return cuda::gated_act_bf16(*ctx.cuda, p);
#else
  return no_cuda(kOp);
#endif
}

namespace {

// The input RMSNorm of a fused CPU decode block (its weight, eps and offset; the rows are the
// kernel's).
RmsNormParams decode_norm(const NormWeight& w, const NormArgs& args) {
  RmsNormParams n;
  n.weight = w.w.data;
  n.weight_dtype = w.w.dtype;
  n.eps = args.eps;
  n.weight_offset = args.weight_offset;
  return n;
}

// ops::ffn's fused CPU case: f32 activations, one token, a gated MLP whose three weights are
// single GGUF block-quantized parts (gate and up as two parts, or one of 2F rows), RMSNorm.
bool cpu_ffn_decode(const Tensor& x, const FfnArgs& a, Tensor& h, Tensor& act) {
  if (x.dtype != DType::kF32 || x.dim(0) != 1 || !a.gated || a.norm_args.kind != NormKind::kRms ||
      env_config().cpu_no_fused_parts || a.down->n_parts != 1 || h.dtype != DType::kF32 ||
      act.dtype != DType::kF32 || a.norm->w.dtype != DType::kF32 || a.norm->b.defined()) {
    return false;
  }
  const int64_t F = a.w_in->rows() / 2, E = x.dim(1);
  cpu::FfnDecodeArgs f;
  const LinearWeight& w = *a.w_in;
  const bool split = w.n_parts == 2 && w.parts[0].w.dim(0) == F && w.parts[1].w.dim(0) == F;
  const bool joined = w.n_parts == 1;
  if (!(split || joined) || !decode_part(w.parts[0], 0, F, true, &f.gate) ||
      !decode_part(w.parts[split ? 1 : 0], split ? 0 : F, F, true, &f.up) ||
      !decode_part(a.down->parts[0], 0, E, true, &f.down)) {
    return false;
  }
  f.x = f32(x);
  f.hidden = E;
  f.norm = decode_norm(*a.norm, a.norm_args);
  f.h = f32(h);
  f.act = a.act;
  f.act_out = f32(act);
  f.ffn_dim = F;
  return cpu::quant_ffn_decode(f);
}

}  // namespace

Status ffn(Context& ctx, Tensor& x, const FfnArgs& args, Tensor& h, Tensor& scratch, Tensor& act) {
  constexpr const char* kOp = "ffn";
  if (args.norm == nullptr || args.w_in == nullptr || args.down == nullptr ||
      !args.w_in->defined() || !args.down->defined()) {
    return invalid(kOp, "needs its norm, input and down weights");
  }
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&x, &h, &scratch, &act}));
  STRATA_ASSIGN_OR_RETURN(Mat xm, mat(x, kOp, "x"));
  STRATA_ASSIGN_OR_RETURN(Mat am, mat(act, kOp, "act"));
  STRATA_ASSIGN_OR_RETURN(Mat hm, mat(h, kOp, "h"));
  const int64_t F = args.gated ? args.w_in->rows() / 2 : args.w_in->rows();
  if (hm.rows != xm.rows || hm.cols != xm.cols || am.rows != xm.rows || am.cols != F ||
      args.w_in->cols() != xm.cols || args.down->cols() != F || args.down->rows() != xm.cols) {
    return invalid(
        kOp, fmt::format("x {}, h {}, act {} do not fit weights [{}, {}] and [{}, {}]",
                         x.shape_string(), h.shape_string(), act.shape_string(), args.w_in->rows(),
                         args.w_in->cols(), args.down->rows(), args.down->cols()));
  }
  if (ctx.device.is_cpu() && xm.stride == xm.cols && hm.stride == hm.cols && am.stride == am.cols &&
      cpu_ffn_decode(x, args, h, act)) {
    return ok_status();
  }
  section(ctx, "ffn_norm");
  STRATA_RETURN_IF_ERROR(norm(ctx, x, *args.norm, args.norm_args, h));
  section(ctx, "gate_up_act");
  STRATA_RETURN_IF_ERROR(linear_act(ctx, h, *args.w_in, args.act, args.gated, scratch, act));
  section(ctx, "down");
  LinearArgs la;
  la.accumulate = true;
  return linear(ctx, act, *args.down, x, la);
}

// ---- RoPE + KV append -----------------------------------------------------------------------

namespace {

// The fields of rope_kv_append's kernel parameters that do not depend on the dtype (the bf16
// and f32 kernels; q_out and the cache are the caller's): qkv's rows qkv_stride apart, q_out's
// token stride and heads, the step's tokens, the rope arguments.
template <typename P>
void set_rope_kv(P& p, const Tensor& qkv, int64_t qkv_stride, const Tensor& q_out,
                 const StepArgs& step, const RopeArgs& args) {
  const auto weight = [](const NormWeight* w) {
    return w != nullptr && w->defined() ? f32(w->w) : nullptr;
  };
  p.qkv = f32(qkv);
  p.qkv_stride = qkv_stride;
  p.q_out_stride = q_out.stride[0];
  p.token_seq = step.token_seq;
  p.token_pos = step.token_pos;
  p.n_tokens = step.n_tokens;
  p.n_heads = q_out.dim(1);
  p.inv_freq = args.rotary_dim > 0 ? f32(*args.inv_freq) : nullptr;
  p.rotary_dim = args.rotary_dim;
  p.neox_style = args.neox_style;
  p.q_norm = weight(args.q_norm);
  p.k_norm = weight(args.k_norm);
  p.norm_eps = args.norm_eps;
  p.norm_weight_offset = args.norm_weight_offset;
}

}  // namespace

Status rope_kv_append(Context& ctx, const Tensor& qkv, const StepArgs& step, const RopeArgs& args,
                      KvLayer& cache, Tensor& q_out) {
  constexpr const char* kOp = "rope_kv_append";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&qkv, &cache.k, &cache.v, &q_out}));
  STRATA_RETURN_IF_ERROR(check_cache(cache, kOp));
  STRATA_ASSIGN_OR_RETURN(Mat qm, mat(qkv, kOp, "qkv"));
  STRATA_RETURN_IF_ERROR(want_dtype(qkv, DType::kF32, kOp, "qkv"));
  if (q_out.ndim != 3 || q_out.stride[2] != 1 || q_out.stride[1] != q_out.shape[2]) {
    return invalid(kOp, "q_out must be [n_tokens, n_heads, head_dim] with contiguous heads");
  }
  const int64_t n = q_out.dim(0), hq = q_out.dim(1), D = q_out.dim(2);
  const int64_t hkv = cache.k.dim(2);
  if (cache.k.dim(3) != D || qm.cols != (hq + 2 * hkv) * D || qm.rows != n || n != step.n_tokens) {
    return invalid(kOp, fmt::format("qkv {} does not hold {} query and 2 x {} KV heads of {} for "
                                    "{} tokens",
                                    qkv.shape_string(), hq, hkv, D, step.n_tokens));
  }
  if (args.rotary_dim > 0 && (args.inv_freq == nullptr || !args.inv_freq->defined())) {
    return invalid(kOp, "rotary_dim > 0 needs inv_freq");
  }
  for (const NormWeight* nw : {args.q_norm, args.k_norm}) {
    if (nw != nullptr && nw->defined() && (nw->w.dtype != DType::kF32 || nw->w.numel() != D)) {
      return invalid(kOp, "q/k norm weights must be f32 [head_dim]");
    }
  }
  if (q_out.dtype == DType::kBF16) {
    if (cache.k.dtype != DType::kBF16) return invalid(kOp, "bf16 q_out needs a bf16 cache");
    RopeKvAppendParams p;
    set_rope_kv(p, qkv, qm.stride, q_out, step, args);
    p.q_out = bf16(q_out);
    p.cache = kv_bf16(cache, step);
    if (ctx.device.is_cpu()) return cpu::rope_kv_append(p);
#if STRATA_HAS_CUDA
    return cuda::rope_kv_append(*ctx.cuda, p);
#else
    return no_cuda(kOp);
#endif
  }
  // f32 reference: q copied out, per-head norms and rotation (q_out, and k inside the qkv rows),
  // the append, in one kernel.
  if (!ctx.device.is_cpu()) return invalid(kOp, "f32 activations run on the CPU only");
  STRATA_RETURN_IF_ERROR(want_dtype(q_out, DType::kF32, kOp, "q_out"));
  STRATA_RETURN_IF_ERROR(want_dtype(cache.k, DType::kF32, kOp, "cache"));
  RopeKvAppendF32Params p;
  set_rope_kv(p, qkv, qm.stride, q_out, step, args);
  p.q_out = f32(q_out);
  p.cache = kv_f32(cache, step);
  return cpu::rope_kv_append_f32(p);
}

// ---- attention ------------------------------------------------------------------------------

Status attention(Context& ctx, const Tensor& q, const StepArgs& step, const KvLayer& cache,
                 const AttentionArgs& args, Tensor& out) {
  constexpr const char* kOp = "attention";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&q, &cache.k, &cache.v, &out}));
  STRATA_RETURN_IF_ERROR(check_cache(cache, kOp));
  if (q.ndim != 3 || q.stride[2] != 1 || q.stride[1] != q.shape[2]) {
    return invalid(kOp, "q must be [n_tokens, n_heads, head_dim] with contiguous heads");
  }
  STRATA_ASSIGN_OR_RETURN(Mat om, mat(out, kOp, "out"));
  const int64_t n = q.dim(0), hq = q.dim(1), D = q.dim(2);
  if (om.rows != n || om.cols != hq * D || n != step.n_tokens || cache.k.dim(3) != D) {
    return invalid(kOp, fmt::format("q {}, out {} and the cache head_dim {} disagree",
                                    q.shape_string(), out.shape_string(), cache.k.dim(3)));
  }
  if (q.dtype != out.dtype || q.dtype != cache.k.dtype) {
    return invalid(kOp, "q, out and the cache must share one dtype");
  }
  if (q.dtype == DType::kBF16) {
    VarlenAttentionParams p;
    p.q = bf16(q);
    p.q_stride = q.stride[0];
    p.out = bf16(out);
    p.out_stride = om.stride;
    p.cu_q = step.cu_q;
    p.kv_len = step.kv_len;
    p.n_seqs = step.n_seqs;
    p.n_heads = hq;
    p.max_q_len = step.max_q_len;
    p.max_kv_len = step.max_kv_len;
    p.cache = kv_bf16(cache, step);
    p.scale = args.scale;
    p.sliding_window = args.sliding_window;
    p.logit_softcap = args.logit_softcap;
    p.workspace = args.workspace.data;
    p.workspace_bytes = args.workspace.defined() ? static_cast<size_t>(args.workspace.nbytes()) : 0;
    if (ctx.device.is_cpu()) return cpu::varlen_attention(p);
#if STRATA_HAS_CUDA
    return cuda::varlen_attention(*ctx.cuda, p);
#else
    return no_cuda(kOp);
#endif
  }
  if (!ctx.device.is_cpu()) return invalid(kOp, "f32 activations run on the CPU only");
  STRATA_RETURN_IF_ERROR(want_dtype(q, DType::kF32, kOp, "q"));
  AttentionKernelParams p;
  p.q = f32(q);
  p.q_stride = q.stride[0];
  p.out = f32(out);
  p.out_stride = om.stride;
  p.token_seq = step.token_seq;
  p.token_pos = step.token_pos;
  p.n_tokens = n;
  p.n_heads = hq;
  p.cache = kv_f32(cache, step);
  p.scale = args.scale;
  p.sliding_window = args.sliding_window;
  p.logit_softcap = args.logit_softcap;
  return cpu::attention(p);
}

// ---- the attention block ----------------------------------------------------------------------

namespace {

// ops::attention_block's fused CPU case: f32 activations and cache, one token, RMSNorm, Q/K/V and
// O as GGUF block-quantized parts. *done false (nothing written) where it does not apply; the
// caller then composes the ops, which report any shape error.
Status cpu_attention_block_decode(Tensor& x, const StepArgs& step, const AttentionBlockArgs& a,
                                  KvLayer& cache, Tensor& h, Tensor& qkv, Tensor& q, Tensor& attn,
                                  bool* done) {
  *done = false;
  const auto contiguous_f32 = [](const Tensor& t, int64_t numel) {
    return t.dtype == DType::kF32 && t.numel() == numel && t.is_contiguous();
  };
  if (env_config().cpu_no_fused_parts || step.n_tokens != 1 || x.ndim != 2 || x.dim(0) != 1 ||
      a.norm_args.kind != NormKind::kRms || a.norm->w.dtype != DType::kF32 || a.norm->b.defined() ||
      cache.k.dtype != DType::kF32 || cache.k.ndim != 4 || cache.v.dtype != DType::kF32 ||
      q.ndim != 3 || a.o->n_parts != 1 || a.qkv->n_parts > 3) {
    return ok_status();
  }
  const int64_t E = x.dim(1), hq = q.dim(1), D = q.dim(2), hkv = cache.k.dim(2);
  if (!contiguous_f32(x, E) || !contiguous_f32(h, E) || !contiguous_f32(q, hq * D) ||
      !contiguous_f32(attn, hq * D) || !contiguous_f32(qkv, (hq + 2 * hkv) * D) ||
      cache.k.dim(3) != D || a.norm->w.numel() != E || a.qkv->cols() != E ||
      a.o->cols() != hq * D) {
    return ok_status();
  }
  const RopeArgs& r = a.rope;
  if (r.rotary_dim > 0 &&
      (r.inv_freq == nullptr || !r.inv_freq->defined() || r.inv_freq->dtype != DType::kF32)) {
    return ok_status();
  }
  for (const NormWeight* nw : {r.q_norm, r.k_norm}) {
    if (nw != nullptr && nw->defined() && (nw->w.dtype != DType::kF32 || nw->w.numel() != D)) {
      return ok_status();
    }
  }
  cpu::AttnDecodeArgs f;
  f.x = f32(x);
  f.hidden = E;
  f.norm = decode_norm(*a.norm, a.norm_args);
  f.h = f32(h);
  f.n_qkv = a.qkv->n_parts;
  int64_t r0 = 0;
  for (int i = 0; i < f.n_qkv; ++i) {
    const LinearWeight::Part& p = a.qkv->parts[static_cast<size_t>(i)];
    if (p.w.ndim != 2 || !decode_part(p, 0, p.w.dim(0), true, &f.qkv[i])) return ok_status();
    f.qkv[i].out = f32(qkv) + r0;
    r0 += p.w.dim(0);
  }
  if (!decode_part(a.o->parts[0], 0, E, true, &f.o)) return ok_status();
  set_rope_kv(f.rope_kv, qkv, (hq + 2 * hkv) * D, q, step, r);
  f.rope_kv.q_out = f32(q);
  f.rope_kv.cache = kv_f32(cache, step);
  f.attn.out = f32(attn);
  f.attn.q_stride = f.attn.out_stride = hq * D;
  f.attn.token_seq = step.token_seq;
  f.attn.token_pos = step.token_pos;
  f.attn.n_tokens = 1;
  f.attn.n_heads = hq;
  f.attn.cache = f.rope_kv.cache;
  f.attn.scale = a.attn.scale;
  f.attn.sliding_window = a.attn.sliding_window;
  f.attn.logit_softcap = a.attn.logit_softcap;
  return cpu::quant_attn_decode(f, done);
}

}  // namespace

Status attention_block(Context& ctx, Tensor& x, const StepArgs& step,
                       const AttentionBlockArgs& args, KvLayer& cache, Tensor& h, Tensor& qkv,
                       Tensor& q, Tensor& attn) {
  constexpr const char* kOp = "attention_block";
  if (args.norm == nullptr || args.qkv == nullptr || args.o == nullptr || !args.qkv->defined() ||
      !args.o->defined()) {
    return invalid(kOp, "needs its norm, qkv and output weights");
  }
  if (ctx.device.is_cpu()) {
    STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&x, &h, &qkv, &q, &attn, &cache.k, &cache.v}));
    STRATA_RETURN_IF_ERROR(check_cache(cache, kOp));
    bool done = false;
    STRATA_RETURN_IF_ERROR(
        cpu_attention_block_decode(x, step, args, cache, h, qkv, q, attn, &done));
    if (done) return ok_status();
  }
  section(ctx, "attn_norm");
  STRATA_RETURN_IF_ERROR(norm(ctx, x, *args.norm, args.norm_args, h));
  section(ctx, "qkv");
  STRATA_RETURN_IF_ERROR(linear(ctx, h, *args.qkv, qkv));
  section(ctx, "rope_kv");
  STRATA_RETURN_IF_ERROR(rope_kv_append(ctx, qkv, step, args.rope, cache, q));
  section(ctx, "attention");
  STRATA_RETURN_IF_ERROR(attention(ctx, q, step, cache, args.attn, attn));
  section(ctx, "o_proj");
  LinearArgs la;
  la.accumulate = true;
  return linear(ctx, attn, *args.o, x, la);
}

// ---- element-wise ---------------------------------------------------------------------------

Status add(Context& ctx, const Tensor& a, const Tensor& b, Tensor& out) {
  constexpr const char* kOp = "add";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&a, &b, &out}));
  STRATA_ASSIGN_OR_RETURN(Mat am, mat(a, kOp, "a"));
  STRATA_ASSIGN_OR_RETURN(Mat bm, mat(b, kOp, "b"));
  STRATA_ASSIGN_OR_RETURN(Mat om, mat(out, kOp, "out"));
  for (const Tensor* t : std::initializer_list<const Tensor*>{&a, &b, &out}) {
    STRATA_RETURN_IF_ERROR(want_dtype(*t, DType::kF32, kOp, "operand"));
  }
  if (am.rows != bm.rows || am.cols != bm.cols || am.rows != om.rows || am.cols != om.cols) {
    return invalid(
        kOp, fmt::format("{} + {} -> {}", a.shape_string(), b.shape_string(), out.shape_string()));
  }
  AddParams p{f32(a), am.stride, f32(b), bm.stride, f32(out), om.stride, am.rows, am.cols};
  if (ctx.device.is_cpu()) return cpu::add(p);
#if STRATA_HAS_CUDA
  return cuda::add(*ctx.cuda, p);
#else
  return no_cuda(kOp);
#endif
}

Status add_bias(Context& ctx, Tensor& x, const Tensor& bias) {
  constexpr const char* kOp = "add_bias";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&x, &bias}));
  STRATA_ASSIGN_OR_RETURN(Mat xm, mat(x, kOp, "x"));
  STRATA_RETURN_IF_ERROR(want_dtype(x, DType::kF32, kOp, "x"));
  if (!bias.defined() || bias.numel() != xm.cols) return invalid(kOp, "bias width differs from x");
  AddBiasParams p{f32(x), xm.stride, bias.data, bias.dtype, xm.rows, xm.cols};
  if (ctx.device.is_cpu()) return cpu::add_bias(p);
#if STRATA_HAS_CUDA
  return cuda::add_bias(*ctx.cuda, p);
#else
  return no_cuda(kOp);
#endif
}

Status softcap(Context& ctx, Tensor& x, float cap) {
  constexpr const char* kOp = "softcap";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&x}));
  STRATA_ASSIGN_OR_RETURN(Mat xm, mat(x, kOp, "x"));
  STRATA_RETURN_IF_ERROR(want_dtype(x, DType::kF32, kOp, "x"));
  SoftcapParams p{f32(x), xm.stride, xm.rows, xm.cols, cap};
  if (ctx.device.is_cpu()) return cpu::softcap(p);
#if STRATA_HAS_CUDA
  return cuda::softcap(*ctx.cuda, p);
#else
  return no_cuda(kOp);
#endif
}

Status argmax(Context& ctx, const Tensor& x, Tensor& ids) {
  constexpr const char* kOp = "argmax";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&x, &ids}));
  STRATA_ASSIGN_OR_RETURN(Mat xm, mat(x, kOp, "x"));
  STRATA_RETURN_IF_ERROR(want_dtype(x, DType::kF32, kOp, "x"));
  STRATA_RETURN_IF_ERROR(want_dtype(ids, DType::kI32, kOp, "ids"));
  if (ids.numel() < xm.rows) return invalid(kOp, "ids has fewer entries than x has rows");
  ArgmaxParams p{f32(x), xm.stride, xm.rows, xm.cols, static_cast<int32_t*>(ids.data)};
  if (ctx.device.is_cpu()) return cpu::argmax(p);
#if STRATA_HAS_CUDA
  return cuda::argmax(*ctx.cuda, p);
#else
  return no_cuda(kOp);
#endif
}

Status activation(Context& ctx, const Tensor& gu, Activation act, bool gated, Tensor& out) {
  constexpr const char* kOp = "activation";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&gu, &out}));
  STRATA_ASSIGN_OR_RETURN(Mat gm, mat(gu, kOp, "gu"));
  STRATA_ASSIGN_OR_RETURN(Mat om, mat(out, kOp, "out"));
  if (gm.rows != om.rows || gm.cols != (gated ? 2 : 1) * om.cols) {
    return invalid(kOp, fmt::format("gu {} does not fit out {} ({})", gu.shape_string(),
                                    out.shape_string(), gated ? "gated" : "plain"));
  }
  if ((gu.dtype == DType::kBF16 || gu.dtype == DType::kF32) && out.dtype == DType::kBF16) {
    // The device layout: the kernel of linear_act's unfused path, bf16 or f32 in, bf16 out (CPU
    // twin: the same arithmetic in cpu::gated_act_bf16).
    GatedActBf16Params p;
    p.gated = gated;
    if (gu.dtype == DType::kBF16) {
      p.in_bf16 = bf16(gu);
    } else {
      p.in = f32(gu);
    }
    p.in_stride = gm.stride;
    p.out = bf16(out);
    p.out_stride = om.stride;
    p.n_tokens = om.rows;
    p.ffn_dim = om.cols;
    p.act = act;
    if (ctx.device.is_cpu()) return cpu::gated_act_bf16(p);
#if STRATA_HAS_CUDA
    return cuda::gated_act_bf16(*ctx.cuda, p);
#else
    return no_cuda(kOp);
#endif
  }
  if (!ctx.device.is_cpu() || gu.dtype != DType::kF32 || out.dtype != DType::kF32) {
    return errorf(StatusCode::kUnimplemented,
                  "{}: f32 on the CPU or bf16 is built (not {} -> {} on {} yet)", kOp,
                  dtype_name(gu.dtype), dtype_name(out.dtype), ctx.device.to_string());
  }
  if (!gated) {
    STRATA_RETURN_IF_ERROR(copy(ctx, gu, out));
    return cpu::act({f32(out), om.stride, om.rows, om.cols, act});
  }
  GatedActParams p;
  p.gate = f32(gu);
  p.gate_stride = gm.stride;
  p.up = f32(gu) + om.cols;
  p.up_stride = gm.stride;
  p.out = f32(out);
  p.out_stride = om.stride;
  p.n_tokens = om.rows;
  p.ffn_dim = om.cols;
  p.act = act;
  return cpu::gated_act(p);
}

Status copy(Context& ctx, const Tensor& src, Tensor& dst) {
  constexpr const char* kOp = "copy";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&src, &dst}));
  STRATA_ASSIGN_OR_RETURN(Mat sm, mat(src, kOp, "src"));
  STRATA_ASSIGN_OR_RETURN(Mat dm, mat(dst, kOp, "dst"));
  if (src.dtype != dst.dtype || sm.rows != dm.rows || sm.cols != dm.cols) {
    return invalid(kOp, fmt::format("{} {} -> {} {}", dtype_name(src.dtype), src.shape_string(),
                                    dtype_name(dst.dtype), dst.shape_string()));
  }
  CopyRowsParams p;
  p.src = src.data;
  p.src_stride = dtype_bytes(src.dtype, sm.stride);
  p.dst = dst.data;
  p.dst_stride = dtype_bytes(dst.dtype, dm.stride);
  p.row_bytes = dtype_bytes(src.dtype, sm.cols);
  p.rows = sm.rows;
  if (ctx.device.is_cpu()) return cpu::copy_rows(p);
#if STRATA_HAS_CUDA
  return cuda::copy_rows(*ctx.cuda, p);
#else
  return no_cuda(kOp);
#endif
}

// ---- memory ---------------------------------------------------------------------------------

Status upload(Context& ctx, const void* host, Tensor& dst) {
  constexpr const char* kOp = "upload";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&dst}));
  if (!dst.is_contiguous()) return invalid(kOp, "dst must be contiguous");
  const auto bytes = static_cast<size_t>(dst.nbytes());
  if (bytes > 0 && host == nullptr) return invalid(kOp, "null host pointer");
  if (ctx.device.is_cpu()) {
    if (bytes > 0) std::memcpy(dst.data, host, bytes);
    return ok_status();
  }
#if STRATA_HAS_CUDA
  return cuda::copy_h2d(*ctx.cuda, dst.data, host, bytes);
#else
  return no_cuda(kOp);
#endif
}

Status download(Context& ctx, const Tensor& src, void* host) {
  constexpr const char* kOp = "download";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&src}));
  if (!src.is_contiguous()) return invalid(kOp, "src must be contiguous");
  const auto bytes = static_cast<size_t>(src.nbytes());
  if (bytes > 0 && host == nullptr) return invalid(kOp, "null host pointer");
  if (ctx.device.is_cpu()) {
    if (bytes > 0) std::memcpy(host, src.data, bytes);
    return ok_status();
  }
#if STRATA_HAS_CUDA
  return cuda::copy_d2h(*ctx.cuda, host, src.data, bytes);
#else
  return no_cuda(kOp);
#endif
}

Status host_rows_to_bf16(const Tensor& t, uint16_t* dst) {
  constexpr const char* kOp = "host_rows_to_bf16";
  if (!t.device.is_cpu()) return invalid(kOp, "the tensor must be in host memory");
  STRATA_ASSIGN_OR_RETURN(Mat m, mat(t, kOp, "t"));
  const DTypeInfo& info = dtype_info(t.dtype);
  if (!info.is_float && !info.is_quantized) {
    return errorf(StatusCode::kUnimplemented, "weights of dtype {} cannot be converted",
                  dtype_name(t.dtype));
  }
  std::vector<float> row(static_cast<size_t>(m.cols));
  for (int64_t r = 0; r < m.rows; ++r) {
    const void* src = static_cast<const char*>(t.data) + dtype_bytes(t.dtype, r * m.stride);
    if (t.dtype == DType::kFP8E4M3) {
      for (int64_t c = 0; c < m.cols; ++c)
        row[static_cast<size_t>(c)] = cpu::load_as_f32(src, t.dtype, c);
    } else {
      STRATA_RETURN_IF_ERROR(cpu::dequantize_row(t.dtype, src, row.data(), m.cols));
    }
    uint16_t* d = dst + r * m.cols;
    for (int64_t c = 0; c < m.cols; ++c) d[c] = f32_to_bf16(row[static_cast<size_t>(c)]);
  }
  return ok_status();
}

Status host_to_f32(const Tensor& t, float* dst) {
  constexpr const char* kOp = "host_to_f32";
  if (!t.device.is_cpu()) return invalid(kOp, "the tensor must be in host memory");
  if (!t.is_contiguous() || !dtype_info(t.dtype).is_float) {
    return invalid(kOp, fmt::format("{} {} is not a contiguous float tensor", dtype_name(t.dtype),
                                    t.shape_string()));
  }
  for (int64_t i = 0; i < t.numel(); ++i) dst[i] = cpu::load_as_f32(t.data, t.dtype, i);
  return ok_status();
}

Status synchronize(Context& ctx) {
  if (ctx.device.is_cpu()) return ok_status();
#if STRATA_HAS_CUDA
  return cuda::stream_synchronize(*ctx.cuda);
#else
  return no_cuda("synchronize");
#endif
}

Status fill_random(Context& ctx, Tensor& dst, uint64_t seed, float scale) {
  constexpr const char* kOp = "fill_random";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&dst}));
  STRATA_RETURN_IF_ERROR(want_dtype(dst, DType::kBF16, kOp, "dst"));
  if (!dst.is_contiguous()) return invalid(kOp, "dst must be contiguous");
  if (ctx.device.is_cpu()) return cpu::fill_random_bf16(bf16(dst), dst.numel(), seed, scale);
#if STRATA_HAS_CUDA
  return cuda::fill_random_bf16(*ctx.cuda, bf16(dst), dst.numel(), seed, scale);
#else
  return no_cuda(kOp);
#endif
}

Status quantize_rows(Context& ctx, const Tensor& w_bf16, Tensor& q, Tensor& scale) {
  constexpr const char* kOp = "quantize_rows";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&w_bf16, &q, &scale}));
  STRATA_RETURN_IF_ERROR(want_dtype(w_bf16, DType::kBF16, kOp, "w"));
  STRATA_RETURN_IF_ERROR(want_dtype(scale, DType::kF32, kOp, "scale"));
  if (q.dtype != DType::kI8 && q.dtype != DType::kFP8E4M3) {
    return invalid(kOp, fmt::format("q is {}; quantize to i8 or fp8_e4m3", dtype_name(q.dtype)));
  }
  if (w_bf16.ndim != 2 || !w_bf16.is_contiguous() || !q.is_contiguous() ||
      q.shape != w_bf16.shape || scale.numel() != w_bf16.dim(0)) {
    return invalid(kOp, "w, q must be contiguous [rows, cols] and scale [rows]");
  }
  const int64_t rows = w_bf16.dim(0), cols = w_bf16.dim(1);
  if (ctx.device.is_cpu()) {
    return cpu::quantize_rows(bf16(w_bf16), rows, cols, q.dtype, q.data, f32(scale));
  }
#if STRATA_HAS_CUDA
  return cuda::quantize_rows(*ctx.cuda, bf16(w_bf16), rows, cols, q.dtype, q.data, f32(scale));
#else
  return no_cuda(kOp);
#endif
}

// ---- collectives ------------------------------------------------------------------------------

namespace {

CommStream comm_stream(const Context& ctx) {
  CommStream s;
  s.device = ctx.device;
#if STRATA_HAS_CUDA
  if (ctx.cuda != nullptr) s.cuda_stream = ctx.cuda->stream;
#endif
  return s;
}

}  // namespace

Status all_reduce(Context& ctx, Communicator& comm, Tensor& x) {
  constexpr const char* kOp = "all_reduce";
  if (comm.size() == 1) return ok_status();
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&x}));
  if (!x.is_contiguous()) return invalid(kOp, "x must be contiguous");
  if (!comm.supports(ctx.device)) {
    return errorf(StatusCode::kUnimplemented, "{}: the {} communicator takes no {} buffers", kOp,
                  comm.name(), ctx.device.to_string());
  }
  return comm.all_reduce(x.data, x.numel(), x.dtype, comm_stream(ctx)).with_context(kOp);
}

Status all_reduce_add_norm(Context& ctx, Communicator& comm, Tensor& y, const Tensor* bias,
                           Tensor& x, const NormWeight& w, const NormArgs& args, Tensor& h) {
  constexpr const char* kOp = "all_reduce_add_norm";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&y, &x, &h}));
  const bool has_bias = bias != nullptr && bias->defined();
  const bool fusable = comm.size() > 1 && ctx.device.is_cuda() && args.kind == NormKind::kRms &&
                       !w.b.defined() && w.w.defined() && y.dtype == DType::kF32 &&
                       x.dtype == DType::kF32 && h.dtype == DType::kBF16 && y.is_contiguous() &&
                       x.is_contiguous() && h.is_contiguous() && y.rows() == x.rows() &&
                       y.cols() == x.cols() && h.rows() == x.rows() && h.cols() == x.cols() &&
                       w.w.numel() == x.cols() && w.w.is_contiguous() &&
                       (!has_bias || (bias->is_contiguous() && bias->numel() == x.cols()));
  if (fusable && comm.supports(ctx.device) && !env_config().no_fused_allreduce) {
    AllReduceAddNorm a;
    a.y = f32(y);
    if (has_bias) {
      a.bias = bias->data;
      a.bias_dtype = bias->dtype;
    }
    a.x = f32(x);
    a.weight = w.w.data;
    a.weight_dtype = w.w.dtype;
    a.weight_offset = args.weight_offset;
    a.eps = args.eps;
    a.h = bf16(h);
    a.rows = x.rows();
    a.cols = x.cols();
    const Status st = comm.all_reduce_add_norm(a, comm_stream(ctx));
    if (st.code() != StatusCode::kUnimplemented) return st.with_context(kOp);
  }
  STRATA_RETURN_IF_ERROR(all_reduce(ctx, comm, y));
  if (has_bias) STRATA_RETURN_IF_ERROR(add_bias(ctx, y, *bias));
  return norm(ctx, x, w, args, h, &y);
}

Status all_gather(Context& ctx, Communicator& comm, const Tensor& send, Tensor& recv) {
  constexpr const char* kOp = "all_gather";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&send, &recv}));
  if (send.dtype != recv.dtype) return invalid(kOp, "send and recv dtypes differ");
  if (!send.is_contiguous() || !recv.is_contiguous() ||
      recv.numel() != send.numel() * comm.size()) {
    return invalid(kOp, "recv must hold size() contiguous copies of send");
  }
  if (comm.size() == 1) return copy(ctx, send, recv);
  if (!comm.supports(ctx.device)) {
    return errorf(StatusCode::kUnimplemented, "{}: the {} communicator takes no {} buffers", kOp,
                  comm.name(), ctx.device.to_string());
  }
  return comm.all_gather(send.data, send.numel(), send.dtype, recv.data, comm_stream(ctx))
      .with_context(kOp);
}

Status reduce_scatter(Context& ctx, Communicator& comm, const Tensor& send, Tensor& recv) {
  constexpr const char* kOp = "reduce_scatter";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&send, &recv}));
  if (send.dtype != recv.dtype) return invalid(kOp, "send and recv dtypes differ");
  if (!send.is_contiguous() || !recv.is_contiguous() ||
      send.numel() != recv.numel() * comm.size()) {
    return invalid(kOp, "send must hold size() contiguous blocks of recv's size");
  }
  if (comm.size() == 1) return copy(ctx, send, recv);
  if (!comm.supports(ctx.device)) {
    return errorf(StatusCode::kUnimplemented, "{}: the {} communicator takes no {} buffers", kOp,
                  comm.name(), ctx.device.to_string());
  }
  return comm.reduce_scatter(send.data, recv.numel(), send.dtype, recv.data, comm_stream(ctx))
      .with_context(kOp);
}

Status all_to_all_v(Context& ctx, Communicator& comm, const Tensor& send, const int64_t* send_rows,
                    Tensor& recv, const int64_t* recv_rows) {
  constexpr const char* kOp = "all_to_all_v";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&send, &recv}));
  if (send.dtype != recv.dtype || send.ndim != 2 || recv.ndim != 2 || send.cols() != recv.cols() ||
      !send.is_contiguous() || !recv.is_contiguous()) {
    return invalid(kOp, "send and recv must be contiguous 2-D tensors of one dtype and width");
  }
  const int n = comm.size();
  const int64_t cols = send.cols();
  std::vector<int64_t> sc(static_cast<size_t>(n)), so(static_cast<size_t>(n)),
      rc(static_cast<size_t>(n)), ro(static_cast<size_t>(n));
  int64_t s_total = 0, r_total = 0;
  for (int r = 0; r < n; ++r) {
    const auto i = static_cast<size_t>(r);
    if (send_rows[i] < 0 || recv_rows[i] < 0) return invalid(kOp, "negative row counts");
    so[i] = s_total * cols;
    sc[i] = send_rows[i] * cols;
    ro[i] = r_total * cols;
    rc[i] = recv_rows[i] * cols;
    s_total += send_rows[i];
    r_total += recv_rows[i];
  }
  if (s_total > send.rows() || r_total > recv.rows()) {
    return invalid(kOp, fmt::format("{} rows to send of {}, {} to receive into {}", s_total,
                                    send.rows(), r_total, recv.rows()));
  }
  if (n > 1 && !comm.supports(ctx.device)) {
    return errorf(StatusCode::kUnimplemented, "{}: the {} communicator takes no {} buffers", kOp,
                  comm.name(), ctx.device.to_string());
  }
  return comm
      .all_to_all_v(send.data, sc.data(), so.data(), recv.data, rc.data(), ro.data(), send.dtype,
                    comm_stream(ctx))
      .with_context(kOp);
}

namespace {

// all_to_all's and all_to_all_rows' buffers: contiguous 2-D tensors of one dtype and shape whose
// rows are n blocks (one per rank).
Status check_all_to_all_buffers(const char* op, const Tensor& send, const Tensor& recv, int n) {
  if (send.dtype != recv.dtype || send.ndim != 2 || recv.ndim != 2 || send.rows() != recv.rows() ||
      send.cols() != recv.cols() || !send.is_contiguous() || !recv.is_contiguous() ||
      send.rows() % n != 0) {
    return invalid(op,
                   "send and recv must be contiguous 2-D tensors of one dtype and shape, "
                   "rows a multiple of the ranks");
  }
  return ok_status();
}

}  // namespace

Status all_to_all(Context& ctx, Communicator& comm, const Tensor& send, Tensor& recv) {
  constexpr const char* kOp = "all_to_all";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&send, &recv}));
  const int n = comm.size();
  STRATA_RETURN_IF_ERROR(check_all_to_all_buffers(kOp, send, recv, n));
  if (n == 1) return copy(ctx, send, recv);
  if (!comm.supports(ctx.device)) {
    return errorf(StatusCode::kUnimplemented, "{}: the {} communicator takes no {} buffers", kOp,
                  comm.name(), ctx.device.to_string());
  }
  return comm.all_to_all(send.data, send.numel() / n, send.dtype, recv.data, comm_stream(ctx))
      .with_context(kOp);
}

}  // namespace strata::ops

// ---- mixture of experts ---------------------------------------------------------------------

namespace strata::ops {
namespace {

// The experts' matrices of one kind (gate/up or down) as one stacked array: every expert one
// part of the same dtype and shape [rows, cols] with contiguous rows, expert e's weights (and
// scales) at e times a fixed stride from expert 0's. The device layout uploads them this way.
struct Stacked {
  const void* w = nullptr;
  const float* scale = nullptr;
  int64_t stride = 0;  // elements from one expert's matrix to the next
  DType dtype = DType::kBF16;
};

bool stacked(const LinearWeight* ws, int64_t E, int64_t rows, int64_t cols, Stacked* out) {
  const LinearWeight::Part& p0 = ws[0].parts[0];
  for (int64_t e = 0; e < E; ++e) {
    const LinearWeight& w = ws[e];
    if (w.n_parts != 1) return false;
    const LinearWeight::Part& p = w.parts[0];
    if (p.w.dtype != p0.w.dtype || p.w.ndim != 2 || p.w.dim(0) != rows || p.w.dim(1) != cols ||
        !p.w.is_contiguous() || p.bias.defined() || p.scale.defined() != p0.scale.defined()) {
      return false;
    }
  }
  out->w = p0.w.data;
  out->dtype = p0.w.dtype;
  out->scale = p0.scale.defined() ? static_cast<const float*>(p0.scale.data) : nullptr;
  out->stride = rows * cols;
  for (int64_t e = 1; e < E; ++e) {
    const LinearWeight::Part& p = ws[e].parts[0];
    if (static_cast<const char*>(p.w.data) !=
        static_cast<const char*>(out->w) + dtype_bytes(out->dtype, e * out->stride)) {
      return false;
    }
    if (out->scale != nullptr &&
        (!p.scale.is_contiguous() ||
         static_cast<const float*>(p.scale.data) != out->scale + e * rows)) {
      return false;
    }
  }
  return true;
}

Status want_shape(const Tensor& t, const char* op, const char* name, int64_t rows, int64_t cols,
                  DType dt) {
  if (!t.defined() || !t.is_contiguous() || t.dtype != dt || t.numel() != rows * cols ||
      t.cols() != cols) {
    return invalid(
        op,
        fmt::format("{} must be a contiguous {} [{}, {}], got {} {}", name, dtype_name(dt), rows,
                    cols, t.defined() ? dtype_name(t.dtype) : "undefined", t.shape_string()));
  }
  return ok_status();
}

// The device layout's grouped expert MLP (bf16 x_perm; backends/moe_params.h,
// MoeExpertsParams): the CUDA kernels, or their CPU twin. The experts must be stacked
// (Stacked above) for CUDA; the CPU twin also runs unstacked experts one group at a time.
Status moe_experts_bf16(Context& ctx, const Tensor& x_perm, const Tensor& offsets,
                        const MoeExperts& experts, Activation act_fn, Tensor& act, Tensor& y_perm) {
  constexpr const char* kOp = "moe_experts";
  const int64_t E = experts.n_experts, n_rows = x_perm.rows(), H = x_perm.cols();
  if (act_fn != Activation::kSilu) {
    return errorf(StatusCode::kUnimplemented,
                  "{}: the device layout's experts are SiLU-gated only (activation {})", kOp,
                  static_cast<int>(act_fn));
  }
  const LinearWeight& gu0 = experts.gate_up[0];
  const LinearWeight& d0 = experts.down[0];
  if (gu0.n_parts != 1 || d0.n_parts != 1 || gu0.rows() % 2 != 0 || gu0.cols() != H ||
      d0.rows() != H || d0.cols() != gu0.rows() / 2) {
    return invalid(kOp, fmt::format("bf16 activations need each expert in the device layout: "
                                    "gate/up [2F, {}] and down [{}, F] as one part each",
                                    H, H));
  }
  const int64_t F = gu0.rows() / 2;
  STRATA_RETURN_IF_ERROR(want_shape(act, kOp, "act", n_rows, F, DType::kBF16));
  STRATA_RETURN_IF_ERROR(want_shape(x_perm, kOp, "x_perm", n_rows, H, DType::kBF16));
  const DType y_dtype = y_perm.dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
  STRATA_RETURN_IF_ERROR(want_shape(y_perm, kOp, "y_perm", n_rows, H, y_dtype));
  MoeExpertsParams p;
  p.x_perm = bf16(x_perm);
  p.offsets = static_cast<const int32_t*>(offsets.data);
  p.act = bf16(act);
  p.y_perm = y_perm.data;
  p.y_dtype = y_dtype;
  p.n_rows = n_rows;
  p.max_rows_per_expert =
      experts.max_rows_per_expert > 0 ? std::min(experts.max_rows_per_expert, n_rows) : n_rows;
  p.n_experts = E;
  p.hidden = H;
  p.ffn = F;
  Stacked gu, dn;
  const bool is_stacked = stacked(experts.gate_up, E, 2 * F, H, &gu) &&
                          stacked(experts.down, E, H, F, &dn) && gu.dtype == dn.dtype &&
                          (gu.scale == nullptr) == (dn.scale == nullptr);
  if (is_stacked) {
    p.gate_up = gu.w;
    p.gate_up_scale = gu.scale;
    p.gate_up_expert_stride = gu.stride;
    p.down = dn.w;
    p.down_scale = dn.scale;
    p.down_expert_stride = dn.stride;
    p.w_dtype = gu.dtype;
    if (ctx.device.is_cpu()) return cpu::moe_experts(p);
#if STRATA_HAS_CUDA
    return cuda::moe_experts(*ctx.cuda, p);
#else
    return no_cuda(kOp);
#endif
  }
  if (!ctx.device.is_cpu()) {
    return invalid(kOp,
                   "the experts' weights are not stacked (one array per layer, as the "
                   "device layout uploads them)");
  }
  // CPU twin, experts stored apart: each non-empty group as a one-expert launch.
  const int32_t* off = p.offsets;
  if (off[0] != 0 || off[E] > n_rows) {
    return invalid(kOp, fmt::format("offsets cover {} rows, x_perm has {}", off[E], n_rows));
  }
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = off[e], r1 = off[e + 1];
    if (r1 < r0 || r1 > n_rows) return invalid(kOp, "offsets are not a prefix sum");
    if (r1 == r0) continue;
    Stacked g1, d1;
    if (!stacked(&experts.gate_up[e], 1, 2 * F, H, &g1) ||
        !stacked(&experts.down[e], 1, H, F, &d1) || g1.dtype != d1.dtype) {
      return invalid(kOp, fmt::format("expert {} is not in the device layout", e));
    }
    const int32_t one[2] = {0, static_cast<int32_t>(r1 - r0)};
    MoeExpertsParams q = p;
    q.x_perm = p.x_perm + r0 * H;
    q.offsets = one;
    q.act = p.act + r0 * F;
    q.y_perm = static_cast<char*>(p.y_perm) + dtype_bytes(y_dtype, r0 * H);
    q.n_rows = r1 - r0;
    q.n_experts = 1;
    q.gate_up = g1.w;
    q.gate_up_scale = g1.scale;
    q.down = d1.w;
    q.down_scale = d1.scale;
    q.w_dtype = g1.dtype;
    STRATA_RETURN_IF_ERROR(cpu::moe_experts(q));
  }
  return ok_status();
}

}  // namespace

namespace {

Result<MoeRouteParams> route_params(const Tensor& logits, const MoeRouteArgs& args,
                                    Tensor& topk_ids, Tensor& topk_w) {
  constexpr const char* kOp = "moe_route";
  STRATA_ASSIGN_OR_RETURN(Mat lm, mat(logits, kOp, "logits"));
  STRATA_RETURN_IF_ERROR(want_dtype(logits, DType::kF32, kOp, "logits"));
  if (args.k < 1 || args.k > lm.cols) {
    return invalid(kOp, fmt::format("top-k {} must be in [1, {} experts]", args.k, lm.cols));
  }
  STRATA_RETURN_IF_ERROR(want_shape(topk_ids, kOp, "topk_ids", lm.rows, args.k, DType::kI32));
  STRATA_RETURN_IF_ERROR(want_shape(topk_w, kOp, "topk_w", lm.rows, args.k, DType::kF32));
  MoeRouteParams p;
  p.logits = f32(logits);
  p.logits_stride = lm.stride;
  p.topk_ids = static_cast<int32_t*>(topk_ids.data);
  p.topk_w = f32(topk_w);
  p.n_tokens = lm.rows;
  p.n_experts = lm.cols;
  p.k = args.k;
  p.renormalize = args.renormalize;
  return p;
}

Result<MoeOffsetsParams> offsets_params(const Tensor& topk_ids, int64_t n_experts,
                                        Tensor& offsets) {
  constexpr const char* kOp = "moe_offsets";
  if (!topk_ids.defined() || !topk_ids.is_contiguous() || topk_ids.dtype != DType::kI32) {
    return invalid(kOp, "topk_ids must be contiguous i32");
  }
  if (n_experts < 1) return invalid(kOp, "n_experts must be >= 1");
  STRATA_RETURN_IF_ERROR(want_shape(offsets, kOp, "offsets", 1, n_experts + 1, DType::kI32));
  MoeOffsetsParams p;
  p.topk_ids = static_cast<const int32_t*>(topk_ids.data);
  p.n_slots = topk_ids.numel();
  p.n_experts = n_experts;
  p.offsets = static_cast<int32_t*>(offsets.data);
  return p;
}

Result<MoePermuteParams> permute_params(const Tensor& x, const Tensor& topk_ids,
                                        const Tensor& offsets, Tensor& x_perm, Tensor& perm) {
  constexpr const char* kOp = "moe_permute";
  STRATA_ASSIGN_OR_RETURN(Mat xm, mat(x, kOp, "x"));
  STRATA_RETURN_IF_ERROR(act_dtype(x, kOp, "x"));
  if (topk_ids.ndim != 2 || topk_ids.dim(0) != xm.rows) {
    return invalid(kOp,
                   fmt::format("topk_ids {} must be [{}, k]", topk_ids.shape_string(), xm.rows));
  }
  const int64_t k = topk_ids.dim(1), n_experts = offsets.numel() - 1;
  STRATA_RETURN_IF_ERROR(want_shape(topk_ids, kOp, "topk_ids", xm.rows, k, DType::kI32));
  if (n_experts < 1) return invalid(kOp, "offsets must hold n_experts + 1 >= 2 entries");
  STRATA_RETURN_IF_ERROR(want_shape(offsets, kOp, "offsets", 1, n_experts + 1, DType::kI32));
  STRATA_RETURN_IF_ERROR(want_shape(x_perm, kOp, "x_perm", xm.rows * k, xm.cols, x.dtype));
  STRATA_RETURN_IF_ERROR(want_shape(perm, kOp, "perm", 1, xm.rows * k, DType::kI32));
  MoePermuteParams p;
  p.x = x.data;
  p.x_stride = xm.stride;
  p.dtype = x.dtype;
  p.topk_ids = static_cast<const int32_t*>(topk_ids.data);
  p.offsets = static_cast<const int32_t*>(offsets.data);
  p.n_tokens = xm.rows;
  p.k = k;
  p.n_experts = n_experts;
  p.hidden = xm.cols;
  p.x_perm = x_perm.data;
  p.perm = static_cast<int32_t*>(perm.data);
  return p;
}

}  // namespace

Status moe_route(Context& ctx, const Tensor& logits, const MoeRouteArgs& args, Tensor& topk_ids,
                 Tensor& topk_w) {
  constexpr const char* kOp = "moe_route";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&logits, &topk_ids, &topk_w}));
  STRATA_ASSIGN_OR_RETURN(MoeRouteParams p, route_params(logits, args, topk_ids, topk_w));
  if (ctx.device.is_cpu()) return cpu::moe_route(p);
#if STRATA_HAS_CUDA
  return cuda::moe_route(*ctx.cuda, p);
#else
  return no_cuda(kOp);
#endif
}

Status moe_offsets(Context& ctx, const Tensor& topk_ids, int64_t n_experts, Tensor& offsets) {
  constexpr const char* kOp = "moe_offsets";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&topk_ids, &offsets}));
  STRATA_ASSIGN_OR_RETURN(MoeOffsetsParams p, offsets_params(topk_ids, n_experts, offsets));
  if (ctx.device.is_cpu()) return cpu::moe_offsets(p);
#if STRATA_HAS_CUDA
  return cuda::moe_offsets(*ctx.cuda, p);
#else
  return no_cuda(kOp);
#endif
}

Status moe_permute(Context& ctx, const Tensor& x, const Tensor& topk_ids, const Tensor& offsets,
                   Tensor& x_perm, Tensor& perm) {
  constexpr const char* kOp = "moe_permute";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&x, &topk_ids, &offsets, &x_perm, &perm}));
  STRATA_ASSIGN_OR_RETURN(MoePermuteParams p, permute_params(x, topk_ids, offsets, x_perm, perm));
  if (ctx.device.is_cpu()) return cpu::moe_permute(p);
#if STRATA_HAS_CUDA
  return cuda::moe_permute(*ctx.cuda, p);
#else
  return no_cuda(kOp);
#endif
}

Status moe_dispatch(Context& ctx, const Tensor& logits, const MoeRouteArgs& args, const Tensor& x,
                    Tensor& topk_ids, Tensor& topk_w, Tensor& offsets, Tensor& x_perm,
                    Tensor& perm) {
  constexpr const char* kOp = "moe_dispatch";
  STRATA_RETURN_IF_ERROR(
      on_device(ctx, kOp, {&logits, &x, &topk_ids, &topk_w, &offsets, &x_perm, &perm}));
  STRATA_ASSIGN_OR_RETURN(MoeRouteParams r, route_params(logits, args, topk_ids, topk_w));
  STRATA_ASSIGN_OR_RETURN(MoeOffsetsParams o, offsets_params(topk_ids, r.n_experts, offsets));
  STRATA_ASSIGN_OR_RETURN(MoePermuteParams q, permute_params(x, topk_ids, offsets, x_perm, perm));
  if (ctx.device.is_cpu()) {
    STRATA_RETURN_IF_ERROR(cpu::moe_route(r));
    STRATA_RETURN_IF_ERROR(cpu::moe_offsets(o));
    return cpu::moe_permute(q);
  }
#if STRATA_HAS_CUDA
  return cuda::moe_dispatch(*ctx.cuda, r, q, o.offsets);
#else
  return no_cuda(kOp);
#endif
}

Status moe_experts(Context& ctx, const Tensor& x_perm, const Tensor& offsets,
                   const MoeExperts& experts, Activation act_fn, Tensor& scratch, Tensor& act,
                   Tensor& y_perm) {
  constexpr const char* kOp = "moe_experts";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&x_perm, &offsets, &scratch, &act, &y_perm}));
  STRATA_ASSIGN_OR_RETURN(Mat xm, mat(x_perm, kOp, "x_perm"));
  STRATA_ASSIGN_OR_RETURN(Mat ym, mat(y_perm, kOp, "y_perm"));
  // bf16 y_perm: the device layout only (bf16 x_perm); f32 otherwise.
  if (!(y_perm.dtype == DType::kBF16 && x_perm.dtype == DType::kBF16)) {
    STRATA_RETURN_IF_ERROR(want_dtype(y_perm, DType::kF32, kOp, "y_perm"));
  }
  const int64_t E = experts.n_experts;
  if (E < 1 || experts.gate_up == nullptr || experts.down == nullptr) {
    return invalid(kOp, "no experts");
  }
  STRATA_RETURN_IF_ERROR(want_shape(offsets, kOp, "offsets", 1, E + 1, DType::kI32));
  if (ym.rows != xm.rows || ym.cols != xm.cols) {
    return invalid(kOp, fmt::format("x_perm {} and y_perm {} differ in shape",
                                    x_perm.shape_string(), y_perm.shape_string()));
  }
  if (x_perm.dtype == DType::kBF16)
    return moe_experts_bf16(ctx, x_perm, offsets, experts, act_fn, act, y_perm);
  if (!ctx.device.is_cpu()) return invalid(kOp, "f32 activations run on the CPU only");
  // NOTE: the f32 reference reads the group sizes on the host and runs each non-empty group as
  // its own GEMMs; the device layout's kernels read them on the device (no host sync in a graph).
  const int32_t* off = static_cast<const int32_t*>(offsets.data);
  if (off[0] != 0 || off[E] > xm.rows) {
    return invalid(kOp, fmt::format("offsets cover {} rows, x_perm has {}", off[E], xm.rows));
  }
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = off[e], r1 = off[e + 1];
    if (r1 < r0 || r1 > xm.rows) return invalid(kOp, "offsets are not a prefix sum");
    if (r1 == r0) continue;
    const LinearWeight& gu = experts.gate_up[e];
    const int64_t F = gu.rows() / 2;
    Tensor xe = x_perm.slice_rows(r0, r1);
    Tensor se = scratch.slice_rows(r0, r1);
    Tensor ae = act.slice_rows(r0, r1).slice_cols(0, F);
    Tensor ye = y_perm.slice_rows(r0, r1);
    STRATA_RETURN_IF_ERROR(
        linear_act(ctx, xe, gu, act_fn, /*gated=*/true, se, ae).with_context(kOp));
    STRATA_RETURN_IF_ERROR(linear(ctx, ae, experts.down[e], ye).with_context(kOp));
  }
  return ok_status();
}

Status moe_combine(Context& ctx, const Tensor& y_perm, const Tensor& perm, const Tensor& topk_w,
                   Tensor& out, bool accumulate) {
  constexpr const char* kOp = "moe_combine";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&y_perm, &perm, &topk_w, &out}));
  STRATA_ASSIGN_OR_RETURN(Mat om, mat(out, kOp, "out"));
  STRATA_RETURN_IF_ERROR(want_dtype(out, DType::kF32, kOp, "out"));
  if (topk_w.ndim != 2 || topk_w.dim(0) != om.rows) {
    return invalid(kOp, fmt::format("topk_w {} must be [{}, k]", topk_w.shape_string(), om.rows));
  }
  const int64_t k = topk_w.dim(1);
  STRATA_RETURN_IF_ERROR(want_shape(topk_w, kOp, "topk_w", om.rows, k, DType::kF32));
  STRATA_RETURN_IF_ERROR(want_shape(perm, kOp, "perm", 1, om.rows * k, DType::kI32));
  const DType y_dtype = y_perm.dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
  STRATA_RETURN_IF_ERROR(want_shape(y_perm, kOp, "y_perm", om.rows * k, om.cols, y_dtype));
  MoeCombineParams p;
  p.y_perm = y_perm.data;
  p.y_dtype = y_dtype;
  p.perm = static_cast<const int32_t*>(perm.data);
  p.topk_w = f32(topk_w);
  p.out = f32(out);
  p.out_stride = om.stride;
  p.n_tokens = om.rows;
  p.k = k;
  p.hidden = om.cols;
  p.accumulate = accumulate;
  if (ctx.device.is_cpu()) return cpu::moe_combine(p);
#if STRATA_HAS_CUDA
  return cuda::moe_combine(*ctx.cuda, p);
#else
  return no_cuda(kOp);
#endif
}

Status sigmoid_gate_add(Context& ctx, const Tensor& y, const Tensor& gate, Tensor& out) {
  constexpr const char* kOp = "sigmoid_gate_add";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&y, &gate, &out}));
  STRATA_ASSIGN_OR_RETURN(Mat ym, mat(y, kOp, "y"));
  STRATA_ASSIGN_OR_RETURN(Mat om, mat(out, kOp, "out"));
  STRATA_ASSIGN_OR_RETURN(Mat gm, mat(gate, kOp, "gate"));
  STRATA_RETURN_IF_ERROR(want_dtype(y, DType::kF32, kOp, "y"));
  STRATA_RETURN_IF_ERROR(want_dtype(gate, DType::kF32, kOp, "gate"));
  STRATA_RETURN_IF_ERROR(want_dtype(out, DType::kF32, kOp, "out"));
  if (ym.rows != om.rows || ym.cols != om.cols || gm.rows != om.rows || gm.cols != 1) {
    return invalid(kOp, fmt::format("y {}, gate {} and out {} do not fit [n, H], [n, 1], [n, H]",
                                    y.shape_string(), gate.shape_string(), out.shape_string()));
  }
  SigmoidGateAddParams p;
  p.y = f32(y);
  p.y_stride = ym.stride;
  p.gate = f32(gate);
  p.gate_stride = gm.stride;
  p.out = f32(out);
  p.out_stride = om.stride;
  p.n_tokens = om.rows;
  p.hidden = om.cols;
  if (ctx.device.is_cpu()) return cpu::sigmoid_gate_add(p);
#if STRATA_HAS_CUDA
  return cuda::sigmoid_gate_add(*ctx.cuda, p);
#else
  return no_cuda(kOp);
#endif
}

namespace {

Status want_i32(const Tensor& t, const char* op, const char* name, int64_t min_numel) {
  if (!t.defined() || t.dtype != DType::kI32 || !t.is_contiguous() || t.numel() < min_numel) {
    return invalid(
        op, fmt::format("{} must be contiguous i32 of at least {} entries", name, min_numel));
  }
  return ok_status();
}

}  // namespace

Status moe_ep_send_plan(Context& ctx, const Tensor& offsets, int64_t ep, int64_t capacity,
                        int64_t n_rows, Tensor& counts, Tensor& send_map, Tensor& back_map,
                        Tensor* rows) {
  constexpr const char* kOp = "moe_ep_send_plan";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&offsets, &counts, &send_map, &back_map}));
  if (ep < 1 || capacity < 0 || n_rows < 0 || counts.numel() % ep != 0 || counts.numel() < ep) {
    return invalid(kOp, "counts must hold ep x El entries");
  }
  const int64_t El = counts.numel() / ep;
  STRATA_RETURN_IF_ERROR(want_i32(counts, kOp, "counts", ep * El));
  STRATA_RETURN_IF_ERROR(want_i32(send_map, kOp, "send_map", ep * capacity));
  if (n_rows > 0) {
    STRATA_RETURN_IF_ERROR(want_i32(offsets, kOp, "offsets", ep * El + 1));
    STRATA_RETURN_IF_ERROR(want_i32(back_map, kOp, "back_map", n_rows));
  }
  MoeEpSendPlanParams p;
  p.offsets = n_rows > 0 ? static_cast<const int32_t*>(offsets.data) : nullptr;
  p.ep = ep;
  p.experts_per_rank = El;
  p.capacity = capacity;
  p.n_rows = n_rows;
  p.counts = static_cast<int32_t*>(counts.data);
  p.send_map = static_cast<int32_t*>(send_map.data);
  p.back_map = n_rows > 0 ? static_cast<int32_t*>(back_map.data) : nullptr;
  if (rows != nullptr) {
    STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {rows}));
    STRATA_RETURN_IF_ERROR(want_i32(*rows, kOp, "rows", ep));
    p.rows = static_cast<int32_t*>(rows->data);
  }
  if (ctx.device.is_cpu()) return cpu::moe_ep_send_plan(p);
#if STRATA_HAS_CUDA
  return cuda::moe_ep_send_plan(*ctx.cuda, p);
#else
  return no_cuda(kOp);
#endif
}

Status moe_ep_recv_plan(Context& ctx, const Tensor& counts, int64_t ep, int64_t capacity,
                        Tensor& offsets, Tensor& group_map, Tensor& ungroup_map, Tensor* rows) {
  constexpr const char* kOp = "moe_ep_recv_plan";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&counts, &offsets, &group_map, &ungroup_map}));
  if (ep < 1 || capacity < 0 || counts.numel() % ep != 0 || counts.numel() < ep) {
    return invalid(kOp, "counts must hold ep x El entries");
  }
  const int64_t El = counts.numel() / ep;
  STRATA_RETURN_IF_ERROR(want_i32(counts, kOp, "counts", ep * El));
  STRATA_RETURN_IF_ERROR(want_i32(offsets, kOp, "offsets", El + 1));
  STRATA_RETURN_IF_ERROR(want_i32(group_map, kOp, "group_map", ep * capacity));
  STRATA_RETURN_IF_ERROR(want_i32(ungroup_map, kOp, "ungroup_map", ep * capacity));
  MoeEpRecvPlanParams p;
  p.counts = static_cast<const int32_t*>(counts.data);
  p.ep = ep;
  p.experts_per_rank = El;
  p.capacity = capacity;
  p.offsets = static_cast<int32_t*>(offsets.data);
  p.group_map = static_cast<int32_t*>(group_map.data);
  p.ungroup_map = static_cast<int32_t*>(ungroup_map.data);
  if (rows != nullptr) {
    STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {rows}));
    STRATA_RETURN_IF_ERROR(want_i32(*rows, kOp, "rows", ep));
    p.rows = static_cast<int32_t*>(rows->data);
  }
  if (ctx.device.is_cpu()) return cpu::moe_ep_recv_plan(p);
#if STRATA_HAS_CUDA
  return cuda::moe_ep_recv_plan(*ctx.cuda, p);
#else
  return no_cuda(kOp);
#endif
}

Status gather_rows(Context& ctx, const Tensor& src, const Tensor& map, Tensor& dst,
                   bool zero_unmapped) {
  constexpr const char* kOp = "gather_rows";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&src, &map, &dst}));
  if (src.dtype != dst.dtype || src.ndim != 2 || dst.ndim != 2 || src.cols() != dst.cols() ||
      !src.is_contiguous() || !dst.is_contiguous()) {
    return invalid(kOp, "src and dst must be contiguous 2-D tensors of one dtype and width");
  }
  STRATA_RETURN_IF_ERROR(want_i32(map, kOp, "map", dst.rows()));
  GatherRowsParams p;
  p.src = src.data;
  p.src_rows = src.rows();
  p.map = static_cast<const int32_t*>(map.data);
  p.dst = dst.data;
  p.n_rows = dst.rows();
  p.row_bytes = dtype_bytes(dst.dtype, dst.cols());
  p.zero_unmapped = zero_unmapped;
  if (ctx.device.is_cpu()) return cpu::gather_rows(p);
#if STRATA_HAS_CUDA
  return cuda::gather_rows(*ctx.cuda, p);
#else
  return no_cuda(kOp);
#endif
}

Status all_to_all_rows(Context& ctx, Communicator& comm, const Tensor& send, Tensor& recv,
                       const Tensor& send_rows, const Tensor& recv_rows) {
  constexpr const char* kOp = "all_to_all_rows";
  STRATA_RETURN_IF_ERROR(on_device(ctx, kOp, {&send, &recv, &send_rows, &recv_rows}));
  const int n = comm.size();
  STRATA_RETURN_IF_ERROR(check_all_to_all_buffers(kOp, send, recv, n));
  STRATA_RETURN_IF_ERROR(want_i32(send_rows, kOp, "send_rows", n));
  STRATA_RETURN_IF_ERROR(want_i32(recv_rows, kOp, "recv_rows", n));
  if (n == 1) return copy(ctx, send, recv);
  if (!comm.supports(ctx.device)) {
    return errorf(StatusCode::kUnimplemented, "{}: the {} communicator takes no {} buffers", kOp,
                  comm.name(), ctx.device.to_string());
  }
  return comm
      .all_to_all_rows(send.data, send.rows() / n, send.cols(), send.dtype, recv.data,
                       static_cast<const int32_t*>(send_rows.data),
                       static_cast<const int32_t*>(recv_rows.data), comm_stream(ctx))
      .with_context(kOp);
}

Status expert_dispatch(Context& ctx, Communicator& comm, const ExpertExchangeParams& a) {
  if (ctx.device.is_cpu() || comm.size() == 1 || !comm.supports(ctx.device)) {
    return Status(StatusCode::kUnimplemented, "expert_dispatch: no fused exchange here");
  }
  return comm.expert_dispatch(a, comm_stream(ctx));
}

Status expert_combine(Context& ctx, Communicator& comm, const ExpertExchangeParams& a) {
  if (ctx.device.is_cpu() || comm.size() == 1 || !comm.supports(ctx.device)) {
    return Status(StatusCode::kUnimplemented, "expert_combine: no fused exchange here");
  }
  return comm.expert_combine(a, comm_stream(ctx));
}

}  // namespace strata::ops
