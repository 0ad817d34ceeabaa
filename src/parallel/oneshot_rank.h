// One rank's view of the one-shot device collectives (backends/cuda/kernels/oneshot.cu), shared
// by the communicators that use them: the in-process one (ranks are threads; peers' buffers
// reached by peer access) and the CUDA IPC one (ranks are processes; peers' buffers opened from
// IPC handles). Once the tables exist, a collective is the same kernel launch in both.
// Compiled with CUDA only.
#pragma once

#include <cstdint>

#include "parallel/comm.h"

namespace strata {

struct OneShotRank {
  int n_ranks = 0;
  int rank = 0;
  void** staging_table = nullptr;  // device [n_ranks]: every rank's staging buffer, as mapped here
  uint32_t** flags_table = nullptr;  // device [n_ranks]: every rank's flags
  uint32_t* counters = nullptr;      // device [3]: this rank's epoch, done, error
  int64_t staging_bytes = 0;         // of each staging buffer (two halves)
  bool ready() const { return staging_table != nullptr; }
};

// data (in place) = the sum over ranks; or recv = every rank's send, rank-major (gather). Larger
// all-reduces than half the staging buffer go in pieces; a larger all-gather is kUnimplemented.
Status oneshot_collective(const OneShotRank& v, const void* in, void* out, int64_t count, DType dt,
                          void* stream, bool gather);
// recv block q (count elements) = rank q's send block rank(); the whole send (n_ranks blocks)
// must fit half the staging buffer (kUnimplemented above it; the bytes per rank a multiple of 4).
// The reduce-scatter (cuda::oneshot_reduce_scatter): send holds n_ranks blocks of count
// elements; recv [count] = the rank-ordered sum of every rank's block rank. The whole send must
// fit half the staging buffer (kUnimplemented otherwise).
Status oneshot_reduce_scatter(const OneShotRank& v, const void* send, void* recv, int64_t count,
                              DType dt, void* stream);
Status oneshot_all_to_all(const OneShotRank& v, const void* send, void* recv, int64_t count,
                          DType dt, void* stream);
// Communicator::all_to_all_rows: the first send_rows[r] of the n_ranks blocks of `capacity`
// rows (cols elements of dt) to rank r, recv_rows[q] rows from rank q (device i32 [n_ranks],
// read by the kernel); the whole send must fit half the staging buffer, rows whole 4-byte words.
Status oneshot_all_to_all_rows(const OneShotRank& v, const void* send, int64_t capacity,
                               int64_t cols, DType dt, void* recv, const int32_t* send_rows,
                               const int32_t* recv_rows, void* stream);
// Communicator::expert_dispatch / expert_combine (cuda::oneshot_expert_*): peers' buffers as
// raw device pointers, so for ranks in one address space only.
Status oneshot_expert_exchange(const OneShotRank& v, const ExpertExchangeParams& a, bool combine,
                               void* stream);
// The fused all-reduce + bias + residual add + RMSNorm (decode-sized: at most 32 rows).
Status oneshot_collective_add_norm(const OneShotRank& v, const AllReduceAddNorm& a, void* stream);
// kDeadlineExceeded when a one-shot kernel of this rank gave up waiting for a peer.
Status oneshot_health(const OneShotRank& v, const char* who);

}  // namespace strata
