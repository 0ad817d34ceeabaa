// The reference ops (ops/reference.h): shape, dtype and device checks, then the CPU kernel. No
// math here. Every error names the op and the tensors that disagree. Tensors on a GPU get
// kUnimplemented: the GPU runs the fused op set (ops/ops.h).
#include <initializer_list>
#include <string>
#include <utility>

#include "backends/cpu/cpu_kernels.h"
#include "core/status.h"
#include "ops/reference.h"

namespace strata::ops::ref {
namespace {

// A tensor seen as a matrix of `rows` rows of `cols` contiguous elements, `stride` apart.
struct RowView {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;
};

std::string strides_string(const Tensor& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(t.stride[static_cast<size_t>(i)]);
  }
  return s + "]";
}

// The row view of t: its last dim contiguous and its outer dims collapsible into one.
Result<RowView> row_view(const Tensor& t, const char* op, const char* name) {
  if (!t.defined()) return errorf(StatusCode::kInvalidArgument, "{}: {} is undefined", op, name);
  if (t.ndim < 1) {
    return errorf(StatusCode::kInvalidArgument, "{}: {} must have at least 1 dim, not {}", op, name,
                  t.ndim);
  }
  const auto dim = [&](int i) { return t.shape[static_cast<size_t>(i)]; };
  const auto stride = [&](int i) { return t.stride[static_cast<size_t>(i)]; };
  bool ok = dim(t.ndim - 1) <= 1 || stride(t.ndim - 1) == 1;
  for (int i = 0; i + 2 < t.ndim; ++i) {
    if (dim(i) > 1 && stride(i) != stride(i + 1) * dim(i + 1)) ok = false;
  }
  if (!ok) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: {} {} with strides {} is not a matrix of contiguous rows", op, name,
                  t.shape_string(), strides_string(t));
  }
  RowView v;
  v.cols = dim(t.ndim - 1);
  v.rows = 1;
  for (int i = 0; i + 1 < t.ndim; ++i) v.rows *= dim(i);
  v.stride = t.ndim >= 2 ? stride(t.ndim - 2) : v.cols;
  return v;
}

Status check_dtype(const Tensor& t, DType want, const char* op, const char* name) {
  if (t.dtype != want) {
    return errorf(StatusCode::kInvalidArgument, "{}: {} is {} but must be {}", op, name,
                  dtype_name(t.dtype), dtype_name(want));
  }
  return ok_status();
}

Status check_float(const Tensor& t, const char* op, const char* name) {
  if (!dtype_info(t.dtype).is_float) {
    return errorf(StatusCode::kInvalidArgument, "{}: {} is {}, not a float dtype", op, name,
                  dtype_name(t.dtype));
  }
  return ok_status();
}

// A 1-D (or contiguous) float vector of n elements, e.g. a norm weight.
Status check_vector(const Tensor& t, int64_t n, const char* op, const char* name) {
  STRATA_RETURN_IF_ERROR(check_float(t, op, name));
  if (t.numel() != n || !t.is_contiguous()) {
    return errorf(StatusCode::kInvalidArgument, "{}: {} is {} but must be {} contiguous values", op,
                  name, t.shape_string(), n);
  }
  return ok_status();
}

Status check_same_rows(const RowView& a, const Tensor& ta, const char* name_a, const RowView& b,
                       const Tensor& tb, const char* name_b, const char* op) {
  if (a.rows != b.rows || a.cols != b.cols) {
    return errorf(StatusCode::kInvalidArgument, "{}: {} is {} but {} is {}", op, name_a,
                  ta.shape_string(), name_b, tb.shape_string());
  }
  return ok_status();
}

// A 3-D f32 tensor [n, heads, head_dim] whose heads are contiguous (head stride == head_dim).
Status check_heads(const Tensor& t, const char* op, const char* name) {
  if (!t.defined()) return errorf(StatusCode::kInvalidArgument, "{}: {} is undefined", op, name);
  STRATA_RETURN_IF_ERROR(check_dtype(t, DType::kF32, op, name));
  if (t.ndim != 3) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: {} is {} but must be [n_tokens, n_heads, head_dim]", op, name,
                  t.shape_string());
  }
  if (t.stride[2] != 1 || t.stride[1] != t.shape[2]) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: {} {} has strides {}; heads must be contiguous", op, name, t.shape_string(),
                  strides_string(t));
  }
  return ok_status();
}

// All defined tensors on one device; that device.
Result<Device> common_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (!t->defined()) continue;
    if (!first) {
      first = t;
    } else if (!(t->device == first->device)) {
      return errorf(StatusCode::kInvalidArgument, "{}: tensors on {} and {}", op,
                    first->device.to_string(), t->device.to_string());
    }
  }
  return first ? first->device : Device::cpu();
}

Status no_cuda_kernel(const char* op) {
  return errorf(StatusCode::kUnimplemented, "{}: no CUDA kernel yet", op);
}

// Run the CPU kernel or report the missing CUDA one.
template <class CpuFn>
Status dispatch(const Device& device, const char* op, CpuFn&& cpu_fn) {
  switch (device.kind) {
    case DeviceKind::kCpu:
      return cpu_fn();
    case DeviceKind::kCuda:
      return no_cuda_kernel(op);
  }
  return no_cuda_kernel(op);
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return false;
  const auto span = [](const Tensor& t) {
    int64_t last = 0;
    for (int i = 0; i < t.ndim; ++i) {
      last += (t.shape[static_cast<size_t>(i)] - 1) * t.stride[static_cast<size_t>(i)];
    }
    const char* begin = static_cast<const char*>(t.data);
    return std::pair{begin, begin + dtype_bytes(t.dtype, last + 1)};
  };
  if (a.numel() == 0 || b.numel() == 0) return false;
  const auto [a0, a1] = span(a);
  const auto [b0, b1] = span(b);
  return a0 < b1 && b0 < a1;
}

PagedKvParams paged_kv_params(const PagedKv& c) {
  return PagedKvParams{
      .k_cache = c.k.ptr<float>(),
      .v_cache = c.v.ptr<float>(),
      .block_tables = c.block_tables,
      .max_blocks_per_seq = c.max_blocks_per_seq,
      .n_seqs = c.n_seqs,
      .n_blocks = c.k.shape[0],
      .block_size = c.k.shape[1],
      .n_heads_kv = c.k.shape[2],
      .head_dim = c.k.shape[3],
  };
}

Status check_paged_kv(const PagedKv& c, const char* op) {
  for (const auto& [t, name] : {std::pair{&c.k, "cache.k"}, std::pair{&c.v, "cache.v"}}) {
    if (!t->defined()) return errorf(StatusCode::kInvalidArgument, "{}: {} is undefined", op, name);
    STRATA_RETURN_IF_ERROR(check_dtype(*t, DType::kF32, op, name));
    if (t->ndim != 4 || !t->is_contiguous()) {
      return errorf(StatusCode::kInvalidArgument,
                    "{}: {} is {} but must be a contiguous [n_blocks, block_size, n_heads_kv, "
                    "head_dim]",
                    op, name, t->shape_string());
    }
  }
  if (c.k.shape != c.v.shape) {
    return errorf(StatusCode::kInvalidArgument, "{}: cache.k is {} but cache.v is {}", op,
                  c.k.shape_string(), c.v.shape_string());
  }
  if (c.k.shape[1] <= 0 || c.k.shape[2] <= 0 || c.k.shape[3] <= 0) {
    return errorf(StatusCode::kInvalidArgument, "{}: cache is {}", op, c.k.shape_string());
  }
  if (!c.block_tables || c.max_blocks_per_seq <= 0 || c.n_seqs <= 0) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: cache needs block_tables, max_blocks_per_seq > 0 (is {}) and n_seqs > 0 "
                  "(is {})",
                  op, c.max_blocks_per_seq, c.n_seqs);
  }
  return ok_status();
}

}  // namespace

Status embedding(const Tensor& table, const int32_t* ids, int64_t n, int64_t vocab_offset,
                 int64_t vocab, Tensor& out) {
  constexpr const char* kOp = "embedding";
  STRATA_ASSIGN_OR_RETURN(RowView tv, row_view(table, kOp, "table"));
  STRATA_ASSIGN_OR_RETURN(RowView ov, row_view(out, kOp, "out"));
  if (!dtype_info(table.dtype).is_quantized)
    STRATA_RETURN_IF_ERROR(check_float(table, kOp, "table"));
  STRATA_RETURN_IF_ERROR(check_dtype(out, DType::kF32, kOp, "out"));
  if (table.ndim != 2) {
    return errorf(StatusCode::kInvalidArgument, "{}: table is {} but must be [vocab, hidden]", kOp,
                  table.shape_string());
  }
  if (ov.rows != n || ov.cols != tv.cols) {
    return errorf(StatusCode::kInvalidArgument, "{}: out is {} but {} ids and table is {}", kOp,
                  out.shape_string(), n, table.shape_string());
  }
  if (vocab_offset < 0 || vocab_offset + tv.rows > vocab) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: table rows [{}, {}) do not fit a vocabulary of {}", kOp, vocab_offset,
                  vocab_offset + tv.rows, vocab);
  }
  if (n > 0 && !ids) return errorf(StatusCode::kInvalidArgument, "{}: ids is null", kOp);
  STRATA_ASSIGN_OR_RETURN(Device device, common_device(kOp, {&table, &out}));
  return dispatch(device, kOp, [&] {
    return cpu::embedding({.table = table.data,
                           .table_dtype = table.dtype,
                           .table_stride = tv.stride,
                           .ids = ids,
                           .out = out.ptr<float>(),
                           .out_stride = ov.stride,
                           .n_tokens = n,
                           .hidden = tv.cols,
                           .vocab_offset = vocab_offset,
                           .vocab_shard = tv.rows,
                           .vocab = vocab});
  });
}

Status rms_norm(const Tensor& x, const Tensor& weight, float eps, float weight_offset,
                Tensor& out) {
  constexpr const char* kOp = "rms_norm";
  STRATA_ASSIGN_OR_RETURN(RowView xv, row_view(x, kOp, "x"));
  STRATA_ASSIGN_OR_RETURN(RowView ov, row_view(out, kOp, "out"));
  STRATA_RETURN_IF_ERROR(check_dtype(x, DType::kF32, kOp, "x"));
  STRATA_RETURN_IF_ERROR(check_dtype(out, DType::kF32, kOp, "out"));
  STRATA_RETURN_IF_ERROR(check_same_rows(xv, x, "x", ov, out, "out", kOp));
  STRATA_RETURN_IF_ERROR(check_vector(weight, xv.cols, kOp, "weight"));
  STRATA_ASSIGN_OR_RETURN(Device device, common_device(kOp, {&x, &weight, &out}));
  return dispatch(device, kOp, [&] {
    return cpu::rms_norm({.x = x.ptr<float>(),
                          .weight = weight.data,
                          .weight_dtype = weight.dtype,
                          .out = out.ptr<float>(),
                          .n_tokens = xv.rows,
                          .hidden = xv.cols,
                          .x_stride = xv.stride,
                          .out_stride = ov.stride,
                          .eps = eps,
                          .weight_offset = weight_offset});
  });
}

Status layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                  Tensor& out) {
  constexpr const char* kOp = "layer_norm";
  STRATA_ASSIGN_OR_RETURN(RowView xv, row_view(x, kOp, "x"));
  STRATA_ASSIGN_OR_RETURN(RowView ov, row_view(out, kOp, "out"));
  STRATA_RETURN_IF_ERROR(check_dtype(x, DType::kF32, kOp, "x"));
  STRATA_RETURN_IF_ERROR(check_dtype(out, DType::kF32, kOp, "out"));
  STRATA_RETURN_IF_ERROR(check_same_rows(xv, x, "x", ov, out, "out", kOp));
  STRATA_RETURN_IF_ERROR(check_vector(weight, xv.cols, kOp, "weight"));
  if (bias.defined()) STRATA_RETURN_IF_ERROR(check_vector(bias, xv.cols, kOp, "bias"));
  STRATA_ASSIGN_OR_RETURN(Device device, common_device(kOp, {&x, &weight, &bias, &out}));
  return dispatch(device, kOp, [&] {
    return cpu::layer_norm({.x = x.ptr<float>(),
                            .weight = weight.data,
                            .weight_dtype = weight.dtype,
                            .bias = bias.data,
                            .bias_dtype = bias.dtype,
                            .out = out.ptr<float>(),
                            .n_tokens = xv.rows,
                            .hidden = xv.cols,
                            .x_stride = xv.stride,
                            .out_stride = ov.stride,
                            .eps = eps});
  });
}

Status linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) {
  constexpr const char* kOp = "linear";
  STRATA_ASSIGN_OR_RETURN(RowView xv, row_view(x, kOp, "x"));
  STRATA_ASSIGN_OR_RETURN(RowView ov, row_view(out, kOp, "out"));
  STRATA_ASSIGN_OR_RETURN(RowView wv, row_view(w, kOp, "w"));
  STRATA_RETURN_IF_ERROR(check_dtype(x, DType::kF32, kOp, "x"));
  STRATA_RETURN_IF_ERROR(check_dtype(out, DType::kF32, kOp, "out"));
  if (w.ndim != 2) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: w is {} but must be [out_features, in_features]", kOp, w.shape_string());
  }
  if (!dtype_info(w.dtype).is_float && !dtype_info(w.dtype).is_quantized) {
    return errorf(StatusCode::kInvalidArgument, "{}: w is {}, not a float or quantized dtype", kOp,
                  dtype_name(w.dtype));
  }
  if (xv.cols != wv.cols) {
    return errorf(StatusCode::kInvalidArgument, "{}: x is {} but w is {}", kOp, x.shape_string(),
                  w.shape_string());
  }
  if (ov.rows != xv.rows || ov.cols != wv.rows) {
    return errorf(StatusCode::kInvalidArgument, "{}: out is {} but x is {} and w is {}", kOp,
                  out.shape_string(), x.shape_string(), w.shape_string());
  }
  if (bias.defined()) STRATA_RETURN_IF_ERROR(check_vector(bias, wv.rows, kOp, "bias"));
  if (overlaps(x, out)) {
    return errorf(StatusCode::kInvalidArgument, "{}: out {} overlaps x {}", kOp, out.shape_string(),
                  x.shape_string());
  }
  STRATA_ASSIGN_OR_RETURN(Device device, common_device(kOp, {&x, &w, &bias, &out}));
  return dispatch(device, kOp, [&] {
    return cpu::linear({.x = x.ptr<float>(),
                        .x_stride = xv.stride,
                        .w = w.data,
                        .w_dtype = w.dtype,
                        .w_stride = wv.stride,
                        .bias = bias.data,
                        .bias_dtype = bias.dtype,
                        .out = out.ptr<float>(),
                        .out_stride = ov.stride,
                        .n_tokens = xv.rows,
                        .in_features = xv.cols,
                        .out_features = wv.rows});
  });
}

Status rope(Tensor& x, const int32_t* positions, const RopeParams& params) {
  constexpr const char* kOp = "rope";
  if (!x.defined()) return errorf(StatusCode::kInvalidArgument, "{}: x is undefined", kOp);
  STRATA_RETURN_IF_ERROR(check_dtype(x, DType::kF32, kOp, "x"));
  if (x.ndim != 3 || x.stride[2] != 1) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: x is {} (strides {}) but must be [n_tokens, n_heads, head_dim] with "
                  "contiguous head_dim",
                  kOp, x.shape_string(), strides_string(x));
  }
  const int64_t head_dim = x.shape[2];
  if (params.rotary_dim <= 0 || params.rotary_dim % 2 != 0 || params.rotary_dim > head_dim) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: rotary_dim {} must be even and in (0, head_dim {}] (x is {})", kOp,
                  params.rotary_dim, head_dim, x.shape_string());
  }
  if (!params.inv_freq) return errorf(StatusCode::kInvalidArgument, "{}: inv_freq is null", kOp);
  if (x.shape[0] > 0 && !positions) {
    return errorf(StatusCode::kInvalidArgument, "{}: positions is null", kOp);
  }
  return dispatch(x.device, kOp, [&] {
    return cpu::rope({.x = x.ptr<float>(),
                      .token_stride = x.stride[0],
                      .head_stride = x.stride[1],
                      .n_tokens = x.shape[0],
                      .n_heads = x.shape[1],
                      .head_dim = head_dim,
                      .positions = positions,
                      .inv_freq = params.inv_freq,
                      .rotary_dim = params.rotary_dim,
                      .neox_style = params.neox_style,
                      .attention_factor = params.attention_factor});
  });
}

Status kv_append(const Tensor& k, const Tensor& v, const int32_t* token_seq,
                 const int32_t* token_pos, PagedKv& cache) {
  constexpr const char* kOp = "kv_append";
  STRATA_RETURN_IF_ERROR(check_heads(k, kOp, "k"));
  STRATA_RETURN_IF_ERROR(check_heads(v, kOp, "v"));
  STRATA_RETURN_IF_ERROR(check_paged_kv(cache, kOp));
  if (k.shape != v.shape) {
    return errorf(StatusCode::kInvalidArgument, "{}: k is {} but v is {}", kOp, k.shape_string(),
                  v.shape_string());
  }
  if (k.shape[1] != cache.k.shape[2] || k.shape[2] != cache.k.shape[3]) {
    return errorf(StatusCode::kInvalidArgument, "{}: k is {} but cache.k is {}", kOp,
                  k.shape_string(), cache.k.shape_string());
  }
  if (k.shape[0] > 0 && (!token_seq || !token_pos)) {
    return errorf(StatusCode::kInvalidArgument, "{}: token_seq or token_pos is null", kOp);
  }
  STRATA_ASSIGN_OR_RETURN(Device device, common_device(kOp, {&k, &v, &cache.k, &cache.v}));
  return dispatch(device, kOp, [&] {
    return cpu::kv_append({.k = k.ptr<float>(),
                           .k_stride = k.stride[0],
                           .v = v.ptr<float>(),
                           .v_stride = v.stride[0],
                           .token_seq = token_seq,
                           .token_pos = token_pos,
                           .n_tokens = k.shape[0],
                           .cache = paged_kv_params(cache)});
  });
}

Status attention(const Tensor& q, const PagedKv& cache, const AttentionParams& params,
                 Tensor& out) {
  constexpr const char* kOp = "attention";
  STRATA_RETURN_IF_ERROR(check_heads(q, kOp, "q"));
  STRATA_RETURN_IF_ERROR(check_heads(out, kOp, "out"));
  STRATA_RETURN_IF_ERROR(check_paged_kv(cache, kOp));
  if (q.shape != out.shape) {
    return errorf(StatusCode::kInvalidArgument, "{}: q is {} but out is {}", kOp, q.shape_string(),
                  out.shape_string());
  }
  const int64_t n_heads_kv = cache.k.shape[2];
  if (q.shape[2] != cache.k.shape[3] || q.shape[1] % n_heads_kv != 0) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: q is {} but cache.k is {} (n_heads must be a multiple of n_heads_kv and "
                  "head_dims must match)",
                  kOp, q.shape_string(), cache.k.shape_string());
  }
  if (params.sliding_window < 0 || params.logit_softcap < 0.0f) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: sliding_window {} and logit_softcap {} must not be negative", kOp,
                  params.sliding_window, params.logit_softcap);
  }
  if (q.shape[0] > 0 && (!params.token_seq || !params.token_pos)) {
    return errorf(StatusCode::kInvalidArgument, "{}: token_seq or token_pos is null", kOp);
  }
  STRATA_ASSIGN_OR_RETURN(Device device, common_device(kOp, {&q, &cache.k, &cache.v, &out}));
  return dispatch(device, kOp, [&] {
    return cpu::attention({.q = q.ptr<float>(),
                           .q_stride = q.stride[0],
                           .out = out.ptr<float>(),
                           .out_stride = out.stride[0],
                           .token_seq = params.token_seq,
                           .token_pos = params.token_pos,
                           .n_tokens = q.shape[0],
                           .n_heads = q.shape[1],
                           .cache = paged_kv_params(cache),
                           .scale = params.scale,
                           .sliding_window = params.sliding_window,
                           .logit_softcap = params.logit_softcap});
  });
}

Status gated_act(const Tensor& gate, const Tensor& up, Activation act, Tensor& out) {
  constexpr const char* kOp = "gated_act";
  STRATA_ASSIGN_OR_RETURN(RowView gv, row_view(gate, kOp, "gate"));
  STRATA_ASSIGN_OR_RETURN(RowView uv, row_view(up, kOp, "up"));
  STRATA_ASSIGN_OR_RETURN(RowView ov, row_view(out, kOp, "out"));
  STRATA_RETURN_IF_ERROR(check_dtype(gate, DType::kF32, kOp, "gate"));
  STRATA_RETURN_IF_ERROR(check_dtype(up, DType::kF32, kOp, "up"));
  STRATA_RETURN_IF_ERROR(check_dtype(out, DType::kF32, kOp, "out"));
  STRATA_RETURN_IF_ERROR(check_same_rows(gv, gate, "gate", uv, up, "up", kOp));
  STRATA_RETURN_IF_ERROR(check_same_rows(gv, gate, "gate", ov, out, "out", kOp));
  STRATA_ASSIGN_OR_RETURN(Device device, common_device(kOp, {&gate, &up, &out}));
  return dispatch(device, kOp, [&] {
    return cpu::gated_act({.gate = gate.ptr<float>(),
                           .gate_stride = gv.stride,
                           .up = up.ptr<float>(),
                           .up_stride = uv.stride,
                           .out = out.ptr<float>(),
                           .out_stride = ov.stride,
                           .n_tokens = gv.rows,
                           .ffn_dim = gv.cols,
                           .act = act});
  });
}

Status act(Tensor& x, Activation act) {
  constexpr const char* kOp = "act";
  STRATA_ASSIGN_OR_RETURN(RowView xv, row_view(x, kOp, "x"));
  STRATA_RETURN_IF_ERROR(check_dtype(x, DType::kF32, kOp, "x"));
  return dispatch(x.device, kOp, [&] {
    return cpu::act(
        {.x = x.ptr<float>(), .stride = xv.stride, .rows = xv.rows, .cols = xv.cols, .act = act});
  });
}

Status add(const Tensor& a, const Tensor& b, Tensor& out) {
  constexpr const char* kOp = "add";
  STRATA_ASSIGN_OR_RETURN(RowView av, row_view(a, kOp, "a"));
  STRATA_ASSIGN_OR_RETURN(RowView bv, row_view(b, kOp, "b"));
  STRATA_ASSIGN_OR_RETURN(RowView ov, row_view(out, kOp, "out"));
  STRATA_RETURN_IF_ERROR(check_dtype(a, DType::kF32, kOp, "a"));
  STRATA_RETURN_IF_ERROR(check_dtype(b, DType::kF32, kOp, "b"));
  STRATA_RETURN_IF_ERROR(check_dtype(out, DType::kF32, kOp, "out"));
  STRATA_RETURN_IF_ERROR(check_same_rows(av, a, "a", bv, b, "b", kOp));
  STRATA_RETURN_IF_ERROR(check_same_rows(av, a, "a", ov, out, "out", kOp));
  STRATA_ASSIGN_OR_RETURN(Device device, common_device(kOp, {&a, &b, &out}));
  return dispatch(device, kOp, [&] {
    return cpu::add({.a = a.ptr<float>(),
                     .a_stride = av.stride,
                     .b = b.ptr<float>(),
                     .b_stride = bv.stride,
                     .out = out.ptr<float>(),
                     .out_stride = ov.stride,
                     .rows = av.rows,
                     .cols = av.cols});
  });
}

Status add_bias(Tensor& x, const Tensor& bias) {
  constexpr const char* kOp = "add_bias";
  STRATA_ASSIGN_OR_RETURN(RowView xv, row_view(x, kOp, "x"));
  STRATA_RETURN_IF_ERROR(check_dtype(x, DType::kF32, kOp, "x"));
  if (bias.numel() != xv.cols || !bias.is_contiguous() || !dtype_info(bias.dtype).is_float) {
    return errorf(StatusCode::kInvalidArgument, "{}: bias is {} {} but x has {} columns", kOp,
                  dtype_name(bias.dtype), bias.shape_string(), xv.cols);
  }
  STRATA_ASSIGN_OR_RETURN(Device device, common_device(kOp, {&x, &bias}));
  return dispatch(device, kOp, [&] {
    return cpu::add_bias({.x = x.ptr<float>(),
                          .stride = xv.stride,
                          .bias = bias.data,
                          .bias_dtype = bias.dtype,
                          .rows = xv.rows,
                          .cols = xv.cols});
  });
}

Status scale(Tensor& x, float s) {
  constexpr const char* kOp = "scale";
  STRATA_ASSIGN_OR_RETURN(RowView xv, row_view(x, kOp, "x"));
  STRATA_RETURN_IF_ERROR(check_dtype(x, DType::kF32, kOp, "x"));
  return dispatch(x.device, kOp, [&] {
    return cpu::scale(
        {.x = x.ptr<float>(), .stride = xv.stride, .rows = xv.rows, .cols = xv.cols, .s = s});
  });
}

Status softcap(Tensor& x, float cap) {
  constexpr const char* kOp = "softcap";
  STRATA_ASSIGN_OR_RETURN(RowView xv, row_view(x, kOp, "x"));
  STRATA_RETURN_IF_ERROR(check_dtype(x, DType::kF32, kOp, "x"));
  if (!(cap > 0.0f)) {
    return errorf(StatusCode::kInvalidArgument, "{}: cap {} must be positive", kOp, cap);
  }
  return dispatch(x.device, kOp, [&] {
    return cpu::softcap(
        {.x = x.ptr<float>(), .stride = xv.stride, .rows = xv.rows, .cols = xv.cols, .cap = cap});
  });
}

Status softmax(Tensor& x) {
  constexpr const char* kOp = "softmax";
  STRATA_ASSIGN_OR_RETURN(RowView xv, row_view(x, kOp, "x"));
  STRATA_RETURN_IF_ERROR(check_dtype(x, DType::kF32, kOp, "x"));
  return dispatch(x.device, kOp, [&] {
    return cpu::softmax(
        {.x = x.ptr<float>(), .stride = xv.stride, .rows = xv.rows, .cols = xv.cols});
  });
}

Status argmax(const Tensor& x, Tensor& out) {
  constexpr const char* kOp = "argmax";
  STRATA_ASSIGN_OR_RETURN(RowView xv, row_view(x, kOp, "x"));
  STRATA_RETURN_IF_ERROR(check_dtype(x, DType::kF32, kOp, "x"));
  if (!out.defined()) return errorf(StatusCode::kInvalidArgument, "{}: out is undefined", kOp);
  STRATA_RETURN_IF_ERROR(check_dtype(out, DType::kI32, kOp, "out"));
  if (out.numel() != xv.rows || !out.is_contiguous() || xv.cols == 0) {
    return errorf(StatusCode::kInvalidArgument, "{}: x is {} but out is {}", kOp, x.shape_string(),
                  out.shape_string());
  }
  STRATA_ASSIGN_OR_RETURN(Device device, common_device(kOp, {&x, &out}));
  return dispatch(device, kOp, [&] {
    return cpu::argmax({.x = x.ptr<float>(),
                        .stride = xv.stride,
                        .rows = xv.rows,
                        .cols = xv.cols,
                        .out = out.ptr<int32_t>()});
  });
}

}  // namespace strata::ops::ref
