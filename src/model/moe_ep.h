// The fixed-capacity expert-parallel exchange: the dispatch and combine of a sparse layer's
// rows among the ep ranks of an expert-parallel group (model/moe.cpp) as fixed-size
// all-to-alls, so that nothing is read on the host and a decode step can run in a CUDA graph.
//
// Every rank sends every rank a block of C rows (the capacity: a chunk of at most P tokens
// sends at most P min(k, El) rows to one rank, a token choosing distinct experts), and the
// per-expert counts ride along in a second, small all-to-all of device memory:
//   dispatch  send plan (counts, send_map, back_map from the chunk's expert offsets), the
//             chunk's permuted rows packed into send [ep, C, H] (gather_rows), the counts and
//             rows all-to-all'd, the receive plan (offsets of the rows grouped by local expert,
//             group_map, ungroup_map), the received rows grouped by local expert (gather_rows):
//             the grouped rows and offsets are what ops::moe_experts takes (it reads the
//             offsets on the device and skips the rows past offsets[El]).
//   combine   the expert outputs back to arrival order (gather_rows, ungroup_map), all-to-all'd
//             to their senders, and unpacked into the chunk's permuted order (back_map), ready
//             for ops::moe_combine.
// Row order within an expert is the variable-split path's (sources in rank order, then each
// source's order), so the expert GEMMs see the same rows and the results match it.
// The transport is the group's device all-to-all: the one-shot kernel for in-process ranks
// (peers' staging buffers read directly), NCCL's grouped send/recv for NCCL groups; host
// memory on the CPU (the CPU twin).
// Counted (EpExchange::counted, the default): the rows all-to-alls move only the rows really
// routed (Communicator::all_to_all_rows: the first send_rows[d] rows of each C-row block, the
// counts read on the device when it runs, so addresses and launch shapes stay fixed and a
// captured graph replays with any routing); the plans also give the per-rank row counts
// (send_rows from the send plan, recv_rows from the receive plan, which then runs before the
// rows move), and the packed send rows and the outputs sent back are gathered without zeroing
// their padding (no one reads it). Rows past the counts are never read: the grouping maps
// and back_map only name rows below them, and the grouped rows past offsets[El] are still
// zeroed. Communicators without a counted transport (NCCL, MPI) move whole blocks, with the
// same results. counted = false (STRATA_MOE_EP_NO_COUNTED=1 in the model) is the fixed path.
// Fused (EpExchange::fused, the default with counted): where the communicator has its own
// exchange kernels (Communicator::expert_dispatch / expert_combine: the in-process
// communicator's device path), the dispatch is one kernel that writes each row straight into
// its owner's grouped rows and offsets, and the combine one kernel that writes each output into
// its sender's y_back (ex.y_back, given before the dispatch); the same layout and results as the
// composition, which runs wherever the communicator has none (kUnimplemented).
#pragma once

#include <cstdint>

#include "ops/ops.h"
#include "parallel/comm.h"

namespace strata {

// Views of one exchange's buffers (sized by the caller for ep, El, C, H and the chunk's rows).
struct EpExchange {
  int64_t ep = 0, experts_per_rank = 0, capacity = 0;
  Tensor send_x;       // act [ep C, H]: the packed rows; after the dispatch, the grouped rows
  Tensor recv_x;       // act [ep C, H]: the rows received, source-major
  Tensor offsets;      // i32 [1, El + 1]: the grouped rows of each local expert
  Tensor y;            // f32 [ep C, H]: the experts' outputs (grouped), then the rows back
  Tensor recv_y;       // f32 [ep C, H]: the outputs in arrival order
  Tensor send_counts;  // i32 [1, ep El]
  Tensor recv_counts;  // i32 [1, ep El]
  Tensor send_map, group_map, ungroup_map;  // i32 [1, ep C]
  Tensor back_map;                          // i32 [1, >= the chunk's rows]
  Tensor send_rows, recv_rows;              // i32 [1, ep]: rows per block sent / received
  Tensor fused_counts;                      // i32 [1, ep ep El]: the fused exchange's counts
  Tensor fused_tables;                      // i32 [1, 4 ep]: its buffer addresses (u64)
  Tensor y_back;        // [the chunk's rows, H], y's dtype: the combine's output (set before the
                        // dispatch)
  bool counted = true;  // all_to_all_rows (else whole blocks)
  bool fused = true;    // the communicator's kernels where it has them
  // The grouped rows [ep C, H] (the first offsets[El] valid; the rest zeros).
  Tensor grouped() const { return send_x; }
};

// The i32 entries EpExchange's index views take (carve_ep_index lays them out).
int64_t ep_index_entries(int64_t ep, int64_t experts_per_rank, int64_t capacity, int64_t max_rows);
// Sets ex's index views from one i32 buffer of ep_index_entries() entries on `device`.
void carve_ep_index(EpExchange& ex, int32_t* base, int64_t max_rows, Device device);

// x_perm [n_rows, H] (act) grouped by expert with offsets [1, ep El + 1]; n_rows 0 (an empty
// chunk) sends nothing and leaves offsets unread. Afterwards ex.grouped() and ex.offsets hold
// this rank's rows for its experts. Every rank of `group` calls it with the same capacity.
Status ep_dispatch(ops::Context& ctx, Communicator& group, const Tensor& x_perm,
                   const Tensor& offsets, EpExchange& ex);
// ex.y [ep C, H] (f32 or bf16: the outputs of the grouped rows) back to their senders: y_perm
// [n_rows, H] of the same dtype in x_perm's order (n_rows as at the dispatch).
Status ep_combine(ops::Context& ctx, Communicator& group, EpExchange& ex, Tensor& y_perm);

}  // namespace strata
