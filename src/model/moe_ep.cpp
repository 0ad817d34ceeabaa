// The fixed-capacity expert-parallel exchange (model/moe_ep.h).
#include "model/moe_ep.h"

#include <algorithm>

#include "core/status.h"

namespace strata {

namespace {

Tensor i32_view(int32_t*& p, int64_t n, Device device) {
  Tensor t = Tensor::make(p, DType::kI32, {1, n}, device);
  p += n;
  return t;
}

Tensor rows(const Tensor& t, int64_t n) {
  return Tensor::make(t.data, t.dtype, {n, t.cols()}, t.device);
}

}  // namespace

int64_t ep_index_entries(int64_t ep, int64_t experts_per_rank, int64_t capacity, int64_t max_rows) {
  return 4 * ep + ep * ep * experts_per_rank + 2 * ep * experts_per_rank + 3 * ep * capacity +
         2 * ep + std::max<int64_t>(max_rows, 1);
}

void carve_ep_index(EpExchange& ex, int32_t* base, int64_t max_rows, Device device) {
  const int64_t eel = ex.ep * ex.experts_per_rank, ec = ex.ep * ex.capacity;
  int32_t* p = base;
  ex.fused_tables = i32_view(p, 4 * ex.ep, device);  // first: 8-byte aligned as base is
  ex.fused_counts = i32_view(p, ex.ep * eel, device);
  ex.send_counts = i32_view(p, eel, device);
  ex.recv_counts = i32_view(p, eel, device);
  ex.send_map = i32_view(p, ec, device);
  ex.group_map = i32_view(p, ec, device);
  ex.ungroup_map = i32_view(p, ec, device);
  ex.send_rows = i32_view(p, ex.ep, device);
  ex.recv_rows = i32_view(p, ex.ep, device);
  ex.back_map = i32_view(p, std::max<int64_t>(max_rows, 1), device);
}

// The fused exchange's arguments (Communicator::expert_dispatch / expert_combine).
ExpertExchangeParams fused_args(const EpExchange& ex, const Tensor& x_perm, const Tensor& offsets) {
  ExpertExchangeParams a;
  a.experts = ex.ep * ex.experts_per_rank;
  a.capacity = ex.send_x.rows();
  a.x_row_bytes = dtype_bytes(ex.send_x.dtype, ex.send_x.cols());
  a.y_row_bytes = dtype_bytes(ex.y.dtype, ex.y.cols());
  a.x = x_perm.data;
  a.offsets = x_perm.rows() > 0 ? static_cast<const int32_t*>(offsets.data) : nullptr;
  a.grouped = ex.send_x.data;
  a.grouped_offsets = static_cast<int32_t*>(ex.offsets.data);
  a.counts = static_cast<int32_t*>(ex.fused_counts.data);
  a.tables = static_cast<uint64_t*>(ex.fused_tables.data);
  a.y = ex.y.data;
  a.y_back = ex.y_back.data;
  return a;
}

Status ep_dispatch(ops::Context& ctx, Communicator& group, const Tensor& x_perm,
                   const Tensor& offsets, EpExchange& ex) {
  const int64_t ep = ex.ep, C = ex.capacity, n_rows = x_perm.rows();
  if (group.size() != ep || ex.send_x.rows() != ep * C || ex.recv_x.rows() != ep * C) {
    return errorf(StatusCode::kInvalidArgument,
                  "ep_dispatch: a group of {} ranks, buffers of {} / {} rows for {} x {}",
                  group.size(), ex.send_x.rows(), ex.recv_x.rows(), ep, C);
  }
  const bool counted = ex.counted;
  // Every rank takes the same path (the same communicator, flags and buffers); an empty chunk
  // (n_rows 0) passes no offsets, which the fused dispatch reads as no rows.
  if (counted && ex.fused && ex.y_back.defined() && ex.fused_counts.defined() &&
      !ctx.device.is_cpu() && x_perm.dtype == ex.send_x.dtype &&
      x_perm.cols() == ex.send_x.cols()) {
    Status s = ops::expert_dispatch(ctx, group, fused_args(ex, x_perm, offsets));
    if (s.ok() || s.code() != StatusCode::kUnimplemented) return s;
  }
  ex.fused = false;
  STRATA_RETURN_IF_ERROR(ops::moe_ep_send_plan(ctx, n_rows > 0 ? offsets : Tensor{}, ep, C, n_rows,
                                               ex.send_counts, ex.send_map, ex.back_map,
                                               counted ? &ex.send_rows : nullptr));
  // Counted: the padding is not sent, so it is not zeroed either.
  if (n_rows > 0) {
    STRATA_RETURN_IF_ERROR(ops::gather_rows(ctx, x_perm, ex.send_map, ex.send_x, !counted));
  } else if (!counted) {
    // An empty chunk: every slot is padding (zeros), from a one-row source never read.
    STRATA_RETURN_IF_ERROR(ops::gather_rows(ctx, rows(ex.recv_x, 1), ex.send_map, ex.send_x));
  }
  Tensor sc = Tensor::make(ex.send_counts.data, DType::kI32, {ep, ex.experts_per_rank},
                           ex.send_counts.device);
  Tensor rc = Tensor::make(ex.recv_counts.data, DType::kI32, {ep, ex.experts_per_rank},
                           ex.recv_counts.device);
  STRATA_RETURN_IF_ERROR(ops::all_to_all(ctx, group, sc, rc));
  if (counted) {
    // The receive plan first: it gives the rows to expect from each source.
    STRATA_RETURN_IF_ERROR(ops::moe_ep_recv_plan(ctx, ex.recv_counts, ep, C, ex.offsets,
                                                 ex.group_map, ex.ungroup_map, &ex.recv_rows));
    STRATA_RETURN_IF_ERROR(
        ops::all_to_all_rows(ctx, group, ex.send_x, ex.recv_x, ex.send_rows, ex.recv_rows));
  } else {
    STRATA_RETURN_IF_ERROR(ops::all_to_all(ctx, group, ex.send_x, ex.recv_x));
    STRATA_RETURN_IF_ERROR(ops::moe_ep_recv_plan(ctx, ex.recv_counts, ep, C, ex.offsets,
                                                 ex.group_map, ex.ungroup_map));
  }
  // The packed rows have been sent: their buffer takes the grouped rows.
  return ops::gather_rows(ctx, ex.recv_x, ex.group_map, ex.send_x);
}

Status ep_combine(ops::Context& ctx, Communicator& group, EpExchange& ex, Tensor& y_perm) {
  if (ex.fused) {  // the dispatch ran fused: y_back is y_perm
    if (y_perm.data != ex.y_back.data) {
      return Status(StatusCode::kInvalidArgument, "ep_combine: y_perm is not the y_back given");
    }
    ExpertExchangeParams a = fused_args(ex, Tensor{}, Tensor{});
    return ops::expert_combine(ctx, group, a);
  }
  STRATA_RETURN_IF_ERROR(ops::gather_rows(ctx, ex.y, ex.ungroup_map, ex.recv_y, !ex.counted));
  // The grouped outputs have been ungrouped: their buffer takes the rows back (counted: each
  // source gets back as many rows as it sent).
  if (ex.counted) {
    STRATA_RETURN_IF_ERROR(
        ops::all_to_all_rows(ctx, group, ex.recv_y, ex.y, ex.recv_rows, ex.send_rows));
  } else {
    STRATA_RETURN_IF_ERROR(ops::all_to_all(ctx, group, ex.recv_y, ex.y));
  }
  if (y_perm.rows() == 0) return ok_status();
  Tensor map = Tensor::make(ex.back_map.data, DType::kI32, {1, y_perm.rows()}, ex.back_map.device);
  return ops::gather_rows(ctx, ex.y, map, y_perm);
}

}  // namespace strata
