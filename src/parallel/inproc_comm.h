// The in-process communicator's shared state (parallel/inproc_comm.cpp): n ranks are n threads of
// one process. Host collectives publish each rank's pointers, meet at a barrier, read the peers'
// buffers directly and meet again before anyone may overwrite them. Device collectives (CUDA:
// all-reduce, all-gather, reduce-scatter, all-to-all) go through the one-shot kernels
// (backends/cuda/kernels/oneshot.cu): every rank registers a staging buffer and a flag array
// once (init_in_process_device), and each collective is one kernel per rank that copies its input
// to its staging buffer, raises its flags, waits for its peers' flags and reads their staging
// buffers — no host synchronization, so it can be captured in a CUDA graph. all_to_all_v on
// device buffers is eager instead: each rank waits for its stream, meets its peers and copies its
// blocks straight from their send buffers (cudaMemcpyAsync, one address space).
//
// Ranks sharing one GPU share its CUDA context: a rank must not wait for the whole device
// (cudaDeviceSynchronize, cudaFree, a lazy kernel load, a cudaMemcpy on the legacy default
// stream) while a peer may be inside a device collective. That wait includes the peer's kernel,
// which spins until this rank's kernel raises its flags, which it cannot launch until the wait
// returns: the peer gives up after ~10 s (health() reports kDeadlineExceeded) and its
// collective's results are stale staging data. Wait on streams (cudaStreamSynchronize,
// ops::synchronize), or meet at a barrier first.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "parallel/comm.h"

namespace strata {

struct InProcessDeviceState;  // the CUDA part (inproc_comm_cuda.cpp)

struct InProcessGroup {
  explicit InProcessGroup(int n);
  ~InProcessGroup();

  // Blocks until all n ranks have arrived (generation-counted, reusable). kDeadlineExceeded
  // after `timeout` (a rank that died or took another code path), naming the ranks missing.
  Status barrier(int rank);
  // Wakes every rank waiting in the group (and its split children) with kCancelled.
  void abort();

  int n;
  std::chrono::seconds timeout;  // STRATA_COLLECTIVE_TIMEOUT (default 300 s)
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  std::vector<bool> present;  // ranks in the current barrier

  // Per-rank slots of the collective in flight (written before the first barrier).
  std::vector<const void*> in;
  std::vector<void*> out;
  std::vector<const int64_t*> counts, offsets;
  std::vector<const int32_t*> rows;  // all_to_all_rows: each rank's send_rows
  std::vector<int> color, key;
  std::vector<std::shared_ptr<InProcessGroup>> children;  // split(): the group per leader rank

  // Point to point: a mailbox per (src, dst) holding the bytes sent and not yet received.
  std::vector<std::deque<std::vector<uint8_t>>> mailbox;  // [src * n + dst]
  std::condition_variable mail_cv;
  bool aborted = false;  // abort(): every wait returns kCancelled (under mu)

  InProcessDeviceState* device = nullptr;  // set by init_in_process_device, owned
};

// Registers rank `c`'s device buffers for device collectives of up to `max_bytes` per call on
// CUDA device `device_index` (every rank of the group must call it, from its own thread, with
// the same max_bytes). kUnimplemented without CUDA; kInvalidArgument for a communicator that is
// not in-process.
Status init_in_process_device(Communicator& c, int device_index, int64_t max_bytes);

// The largest device message of one collective after init_in_process_device (half the staging
// buffer: an all-to-all's whole send buffer must fit it); 0 before it, or for other kinds.
int64_t in_process_device_max_bytes(Communicator& c);

// The group behind an in-process communicator, or null for other kinds.
InProcessGroup* in_process_group(Communicator& c);

}  // namespace strata
