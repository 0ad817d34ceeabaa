// KV-cache offload (--kv-offload; seed 000, DeepSpeed Inference Sec. IV-C2/C3): the running
// sequences may hold more KV blocks than the device pool has. The host pool (pinned host memory
// on a GPU) is authoritative; the running sequences are split into G >= 2 groups (micro-batches)
// and each engine step runs one group, in turn. The device pool is cut into two regions of
// half its blocks: the group that runs sits in one, the next group is loaded into the other.
//
// One step t of group k in region r (engine_loop.cpp):
//   1. place k's scheduled blocks in region r; load those not there yet (normally none: step
//      t - 1 prefetched them), and make the forward pass wait for the loads;
//   2. prefetch: place group k + 1's computed blocks in region 1 - r and load them (host ->
//      device), while
//   3. the forward pass of step t runs on region r;
//   4. store the blocks step t wrote (only those: the appended tail, or a prompt chunk's
//      blocks) device -> host, after the forward pass.
// Ordering (Executor::kv_offload_*): the forward waits for the loads (1); a store waits for the
// forward; a load waits for the last store of the same layer parity, since the slots it fills
// may be the ones that store reads (step t + 1's prefetch fills region r, which step t's store
// is reading). The prefetch transfer is issued every step, even with nothing to load, because
// the forward pass of step t + 2 writes region r too (a new sequence's fresh blocks, or the tail
// block) and is ordered after step t's store only through it. Both transfers move the odd layers
// first, then the even ones, on one stream per direction: the odd layers of a load then come in
// while the even layers of the store go out, so both directions of the PCIe link are busy (the seed
// splits odd and even layers between the two GPUs sharing a link; the issue asks for the split
// between the two directions). The pool keeps each layer's K and V apart, so a layer's blocks are
// one batch of copies.
//
// This file is the bookkeeping (which host block sits in which device slot), free of any device:
// the unit tests check the copies of each step.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "serving/scheduler.h"

namespace strata {

// Pairs to copy: device[i] <-> host[i], sorted by host block.
struct KvOffloadCopies {
  std::vector<int32_t> device, host;
  size_t size() const { return device.size(); }
  bool empty() const { return device.empty(); }
  void clear() {
    device.clear();
    host.clear();
  }
};

// Groups for --kv-offload-groups 0: enough that the device pool holds two groups' blocks when
// the host pool is full, at least 2.
int64_t default_offload_groups(int64_t device_blocks, int64_t host_blocks);

class KvOffloadPlan {
 public:
  // The device pool's blocks [0, device_blocks) form regions [0, R) and [R, 2R), R =
  // device_blocks / 2; host blocks are [0, host_blocks).
  KvOffloadPlan(int64_t device_blocks, int64_t host_blocks, int64_t block_size, int64_t groups);

  int64_t groups() const { return groups_; }
  int64_t region_blocks() const { return region_blocks_; }
  int32_t group() const { return group_; }  // the group the next step runs
  int region() const { return region_; }    // where it runs

  // Makes `region` hold exactly `blocks` (the others there are dropped). A block not there yet
  // gets a free slot of the region; those with has_data[i] are appended to `loads`. False,
  // nothing changed, when they do not fit.
  bool place(int region, std::span<const int32_t> blocks, std::span<const uint8_t> has_data,
             KvOffloadCopies* loads);
  // The device slot of a host block, or -1.
  int32_t device_block(int32_t host_block) const { return where_[static_cast<size_t>(host_block)]; }

  // Step 1: the step's sequences' blocks into the current region; `loads` gets the blocks that
  // hold data before the step and are not there.
  bool begin_step(const ScheduledStep& step, KvOffloadCopies* loads);
  // Step 2: the computed blocks of `next` (the next group's members) into the other region.
  bool prefetch(std::span<const SchedSequence* const> next, KvOffloadCopies* loads);
  // Step 4: the blocks the step wrote (positions [begin, end) of each sequence).
  void stores(const ScheduledStep& step, KvOffloadCopies* out) const;
  // After a step: the next group runs next, in the other region when this step ran.
  void advance(bool ran);

 private:
  int64_t block_size_, groups_, region_blocks_;
  int32_t group_ = 0;
  int region_ = 0;
  std::vector<int32_t> where_;  // host block -> device slot, or -1
  std::vector<int32_t> owner_;  // device slot -> host block, or -1
  // Scratch.
  std::vector<int32_t> blocks_;
  std::vector<uint8_t> data_, keep_;
};

}  // namespace strata
