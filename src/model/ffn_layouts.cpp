// The FFN layouts of seed 003 ("Efficiently Scaling Transformer Inference", Sec. 3.2) besides
// 1D (Megatron), as blocks of a layer program. N = the tensor-parallel size, n = the step's
// tokens, E = hidden, F = intermediate size. Attention stays head-sharded (1D) in both; the
// residual stream x is replicated on every rank between layers, as the rest of the program
// expects, so each layout ends with x whole again.
//
// 2D weight-stationary (ffn_2d). The group is an X x Y grid; rank (i, j) holds W_in[F_j, E_i]
// (gate and up) and W_out[E_i, F_j]. With h = ffn_norm(x) replicated:
//   gu_j  = all_reduce_X(h[:, E_i] W_in[F_j, E_i]^T)    partial sums over the hidden split
//   a_j   = act(gu_j) (+ biases first)                  [n, F / Y], the same on the X group
//   y_i   = all_reduce_Y(a_j W_out[E_i, F_j]^T) (+ b_i) [n, E / X], partial over the ffn split
//   x    += all_gather_X(y_i)                           [n, E], columns laid out by i
// The seed's sequence (Figure 2b) keeps x sharded E_xyz: all-gather over YZ before W_in,
// reduce-scatter over X of the partial sums, activation on F / (XY), all-gather over X, then
// reduce-scatter over YZ of the output. all_reduce_X is that reduce-scatter + all-gather (the
// activation then runs on F / Y instead of F / (XY) columns: more arithmetic, the same bytes);
// all_reduce_Y + all_gather_X is the output's reduce-scatter over Y plus the all-gather the
// seed does before the next layer's W_in, extended to the X group so x is replicated for the
// head-sharded attention. Elements each rank sends (ring algorithms, gated MLP): 2 (X - 1) / X
// of [n, 2 F / Y], 2 (Y - 1) / Y of [n, E / X] and (X - 1) / X of [n, E]; 1D: 2 (N - 1) / N of
// [n, E].
//
// Weight-gathered (weight_gathered_ffn). The weights stay stored as the 1D shards; the tokens
// are split instead: rank r runs the FFN for tokens [r P, r P + P), P = ceil(n / N) (the last
// ranks' slices padded):
//   y    = attn W_o[:, heads_r]^T                   partial sums, [N P, E] (rows >= n: stale)
//   x_r  = reduce_scatter(y) (+ b_o) + x[r P ..]    this rank's token slice of the residual
//   h_r  = ffn_norm(x_r)
//   W    = all_gather(W_in shards), all_gather(W_out shards)   the layer's whole FFN, JIT
//   x_r += down(act(h_r W_in^T)) (+ b_down)
//   x    = all_gather(x_r)[0, n)
// The padding rows hold stale values: every op between the reduce-scatter and the final
// all-gather is row-wise, so they never reach a real token, and the gather drops them.
//
// Both: the Llama family, in the CPU reference (f32 activations, the weights as stored, not GGUF
// blocks) and in the device layout (bf16 activations, f32 residual; on the CPU through the GPU
// kernels' twins, or on one GPU with the ranks as threads: the in-process communicator's
// one-shot kernels, including its reduce-scatter and the 2d groups' own registrations,
// runtime/tp_executor.cpp). Weight-gathered keeps its FFN shards bf16 on the device (row scales
// are not gathered) and gathers the fused [gate_r; up_r] matrix as its two halves.
#include <algorithm>

#include "core/status.h"
#include "model/program.h"
#include "parallel/comm.h"

namespace strata {
namespace blocks {

namespace {

Tensor view(const Tensor& slot, DType dt, std::initializer_list<int64_t> shape) {
  return Tensor::make(slot.data, dt, shape, slot.device);
}

// w's parts all-gathered over comm into `rows` (every rank's shard of part p, rank-major: the
// whole part, as the shards are the rank-ordered row blocks of it); the result has the same
// parts, whole. The device layout's one fused part [gate_r; up_r] of a gated MLP
// (model/device_layout.cpp) is gathered as its two halves, into one fused [gate; up] part.
Status gather_row_shards(ForwardArgs& a, const ops::LinearWeight& w, bool gated, const Tensor& rows,
                         ops::LinearWeight* out) {
  const int n = a.comm.size();
  const bool fused = gated && w.n_parts == 1;
  int64_t r0 = 0;
  for (int i = 0; i < w.n_parts; ++i) {
    const ops::LinearWeight::Part& p = w.parts[static_cast<size_t>(i)];
    if (!p.w.is_contiguous() || p.scale.defined()) {
      return Status(StatusCode::kUnimplemented,
                    "weight-gathered FFN: a gate/up shard is not contiguous, or is quantized with "
                    "row scales (int8 / fp8 weights are not built for this layout yet)");
    }
    const int64_t r1 = r0 + n * p.w.rows();
    if (p.w.dtype != rows.dtype || r1 > rows.rows() || p.w.cols() != rows.cols() ||
        (fused && p.w.rows() % 2 != 0)) {
      return errorf(StatusCode::kInternal,
                    "weight-gathered FFN: gate/up shard {} {} does not fit the scratch {} {}",
                    dtype_name(p.w.dtype), p.w.shape_string(), dtype_name(rows.dtype),
                    rows.shape_string());
    }
    Tensor whole = rows.slice_rows(r0, r1);
    if (fused) {
      const int64_t half = p.w.rows() / 2, F = n * half;
      for (int64_t k = 0; k < 2; ++k) {  // gate, then up
        Tensor dst = whole.slice_rows(k * F, (k + 1) * F);
        STRATA_RETURN_IF_ERROR(
            ops::all_gather(a.ctx, a.comm, p.w.slice_rows(k * half, (k + 1) * half), dst));
      }
    } else {
      STRATA_RETURN_IF_ERROR(ops::all_gather(a.ctx, a.comm, p.w, whole));
    }
    out->add(whole, p.bias);
    r0 = r1;
  }
  return ok_status();
}

// The row-parallel down weight [E, F / N] of every rank gathered into the whole [E, F].
Status gather_col_shards(ForwardArgs& a, const ops::LinearWeight& w, ops::LinearWeight* out) {
  const int n = a.comm.size();
  const ops::LinearWeight::Part& p = w.parts[0];
  const int64_t E = p.w.rows(), Fr = p.w.cols();
  if (w.n_parts != 1 || p.w.dtype != a.ws.ffn_w_out.dtype || p.scale.defined()) {
    return Status(StatusCode::kUnimplemented,
                  "weight-gathered FFN: a down weight of several parts, another dtype than the "
                  "scratch, or row scales (int8 / fp8)");
  }
  Tensor send = view(a.ws.ffn_w_send, p.w.dtype, {E, Fr});
  Tensor recv = view(a.ws.ffn_w_recv, p.w.dtype, {n * E, Fr});
  Tensor whole = view(a.ws.ffn_w_out, p.w.dtype, {E, n * Fr});
  STRATA_RETURN_IF_ERROR(ops::copy(a.ctx, p.w, send));
  STRATA_RETURN_IF_ERROR(ops::all_gather(a.ctx, a.comm, send, recv));
  for (int r = 0; r < n; ++r) {
    Tensor dst = whole.slice_cols(r * Fr, (r + 1) * Fr);
    STRATA_RETURN_IF_ERROR(ops::copy(a.ctx, recv.slice_rows(r * E, (r + 1) * E), dst));
  }
  out->add(whole, p.bias);
  return ok_status();
}

}  // namespace

Status ffn_2d(const Model& m, ForwardArgs& a, int64_t layer) {
  const ModelConfig& c = m.config();
  const ParallelConfig& par = m.parallel();
  const LayerWeights& L = m.weights().layers[static_cast<size_t>(layer)];
  if (a.ffn_x_comm == nullptr || a.ffn_y_comm == nullptr) {
    return Status(StatusCode::kFailedPrecondition, "2D FFN layout without its X and Y groups");
  }
  Communicator& xg = *a.ffn_x_comm;
  Communicator& yg = *a.ffn_y_comm;
  const int64_t n = a.step.n_tokens;
  const int X = par.grid_x();
  const ShardRange hs = par.grid_hidden_shard(c.hidden);
  const int64_t Ex = hs.size();
  const DType act_dt = a.ws.act.dtype;
  ops::section(a.ctx, "gate_up");
  Tensor h = rows(a.ws.h, n).slice_cols(hs.begin, hs.end);
  // f32 partial sums (the device layout's GEMM writes them from bf16 h): one rounding, at the
  // activation, as the 1D layout's fused GEMM + activation.
  Tensor gu = view(a.ws.ffn_ff, DType::kF32, {n, L.gate_up.rows()});
  ops::LinearArgs partial;
  partial.bias = false;
  STRATA_RETURN_IF_ERROR(ops::linear(a.ctx, h, L.gate_up, gu, partial));
  ops::section(a.ctx, "all_reduce_x");
  STRATA_RETURN_IF_ERROR(ops::all_reduce(a.ctx, xg, gu));
  ops::section(a.ctx, "act");
  int64_t c0 = 0;
  for (int i = 0; i < L.gate_up.n_parts; ++i) {
    const ops::LinearWeight::Part& p = L.gate_up.parts[static_cast<size_t>(i)];
    const int64_t c1 = c0 + p.w.rows();
    if (p.bias.defined()) {
      Tensor cols = gu.slice_cols(c0, c1);
      STRATA_RETURN_IF_ERROR(ops::add_bias(a.ctx, cols, p.bias));
    }
    c0 = c1;
  }
  const int64_t F = c.gated_mlp ? L.gate_up.rows() / 2 : L.gate_up.rows();
  Tensor act = view(a.ws.act, act_dt, {n, F});
  STRATA_RETURN_IF_ERROR(ops::activation(a.ctx, gu, c.activation, c.gated_mlp, act));
  ops::section(a.ctx, "down");
  Tensor y = view(a.ws.y, DType::kF32, {n, Ex});
  STRATA_RETURN_IF_ERROR(ops::linear(a.ctx, act, L.down, y, partial));
  ops::section(a.ctx, "all_reduce_y");
  STRATA_RETURN_IF_ERROR(ops::all_reduce(a.ctx, yg, y));
  if (L.down.parts[0].bias.defined()) {
    STRATA_RETURN_IF_ERROR(ops::add_bias(a.ctx, y, L.down.parts[0].bias));
  }
  ops::section(a.ctx, "all_gather_x");
  Tensor g = view(a.ws.ffn_tokens, DType::kF32, {X * n, Ex});
  STRATA_RETURN_IF_ERROR(ops::all_gather(a.ctx, xg, y, g));
  ops::section(a.ctx, "residual_add");
  Tensor x = rows(a.ws.x, n);
  for (int i = 0; i < X; ++i) {
    Tensor xi = x.slice_cols(i * Ex, (i + 1) * Ex);
    STRATA_RETURN_IF_ERROR(ops::add(a.ctx, xi, g.slice_rows(i * n, (i + 1) * n), xi));
  }
  return ok_status();
}

Status weight_gathered_ffn(const Model& m, ForwardArgs& a, int64_t layer) {
  const ModelConfig& c = m.config();
  const LayerWeights& L = m.weights().layers[static_cast<size_t>(layer)];
  const int64_t n = a.step.n_tokens, E = c.hidden;
  const int N = a.comm.size(), r = a.comm.rank();
  const int64_t P = (n + N - 1) / N;
  const int64_t first = std::min<int64_t>(n, r * P);
  const int64_t mine = std::min<int64_t>(n, first + P) - first;  // real tokens; may be 0
  ops::section(a.ctx, "o_proj");
  Tensor y = view(a.ws.ffn_tokens, DType::kF32, {N * P, E});
  Tensor y_real = y.slice_rows(0, n);
  ops::LinearArgs partial;
  partial.bias = false;
  STRATA_RETURN_IF_ERROR(ops::linear(a.ctx, rows(a.ws.attn, n), L.o, y_real, partial));
  ops::section(a.ctx, "reduce_scatter");
  Tensor xr = view(a.ws.ffn_x, DType::kF32, {P, E});
  STRATA_RETURN_IF_ERROR(ops::reduce_scatter(a.ctx, a.comm, y, xr));
  ops::section(a.ctx, "residual_add");
  if (L.o.parts[0].bias.defined()) {
    STRATA_RETURN_IF_ERROR(ops::add_bias(a.ctx, xr, L.o.parts[0].bias));
  }
  if (mine > 0) {
    Tensor xm = xr.slice_rows(0, mine);
    STRATA_RETURN_IF_ERROR(ops::add(a.ctx, xm, a.ws.x.slice_rows(first, first + mine), xm));
  }
  ops::section(a.ctx, "ffn_norm");
  Tensor h = rows(a.ws.h, P);
  STRATA_RETURN_IF_ERROR(ops::norm(a.ctx, xr, L.ffn_norm, norm_args(c), h));
  ops::section(a.ctx, "all_gather_weights");
  ops::LinearWeight w_in, w_out;
  STRATA_RETURN_IF_ERROR(gather_row_shards(a, L.gate_up, c.gated_mlp, a.ws.ffn_w_in, &w_in));
  STRATA_RETURN_IF_ERROR(gather_col_shards(a, L.down, &w_out));
  ops::section(a.ctx, "gate_up_act");
  const DType act_dt = a.ws.act.dtype;
  const int64_t F = c.gated_mlp ? w_in.rows() / 2 : w_in.rows();
  Tensor ff = view(a.ws.ffn_ff, act_dt, {P, w_in.rows()});
  Tensor act = view(a.ws.ffn_act, act_dt, {P, F});
  STRATA_RETURN_IF_ERROR(ops::linear_act(a.ctx, h, w_in, c.activation, c.gated_mlp, ff, act));
  ops::section(a.ctx, "down");
  ops::LinearArgs acc;
  acc.accumulate = true;  // each token on one rank: the bias once
  STRATA_RETURN_IF_ERROR(ops::linear(a.ctx, act, w_out, xr, acc));
  ops::section(a.ctx, "all_gather");
  STRATA_RETURN_IF_ERROR(ops::all_gather(a.ctx, a.comm, xr, y));
  Tensor x = rows(a.ws.x, n);
  return ops::copy(a.ctx, y.slice_rows(0, n), x);
}

}  // namespace blocks
}  // namespace strata
