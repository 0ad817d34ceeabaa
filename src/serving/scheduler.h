// Continuous-batching scheduler: decides, step by step, which tokens of which sequences the
// model computes, and manages their KV blocks. Pure bookkeeping (no model, no KV data), so it is
// unit-testable; the engine loop (engine_loop.cpp) executes what it decides.
//
// Sequences go waiting -> running -> finished. A step's token budget (max_num_batched_tokens)
// is filled in this order (DeepSpeed-FastGen's Dynamic SplitFuse):
//   1. one decode token for every running sequence whose prompt is done (arrival order);
//   2. the next prompt chunk of running sequences still in their prompt (chunked prefill);
//   3. swapped sequences are swapped back in (FCFS) when their blocks fit;
//   4. waiting sequences are admitted (FCFS, none skipped) while max_num_seqs allows and their
//      next chunk's blocks fit above the watermark; a chunk is cut to the budget left.
// When a running sequence needs a block and none is free, the most recently arrived running
// sequence not yet scheduled in this step is preempted (possibly the one asking). It is either
// swapped to host slots (its blocks are copied out; swapped back in later) or reset for
// recompute (blocks freed; it re-enters waiting at its arrival position and recomputes prompt +
// generated tokens as a longer prompt). See PreemptionMode for the rule.
//
// KV offload (offload_groups > 0, serving/kv_offload.h): the blocks are host blocks (the host
// pool is authoritative), and every running sequence belongs to one of offload_groups groups.
// schedule(..., group) builds a step of that group only (decodes and prompt chunks of its
// sequences; admitted sequences join it), and a group never holds more than group_blocks blocks
// (half the device pool: the group that runs and the one being loaded). A sequence that needs a
// block its group has no room for preempts the latest sequence of its group (recompute).
//
// KV owners (kv_owners > 1: batch-sharded attention, model/attn_layouts.cpp): the block ids are
// split among the tensor-parallel ranks, block b held by rank b % kv_owners only, and a
// sequence's blocks are all on one rank, its owner (BlockManager). An admitted sequence takes
// the owner with the most free blocks (or its cached prefix's); room, chunk fitting, the
// watermark (split evenly) and swap-in count that owner's blocks, a swapped sequence comes back
// to its owner (its KV is in that rank's host slots), and a sequence short of blocks preempts the
// latest sequence of its own owner. A recomputed sequence picks again.
//
// Prefix caching: full blocks are hashed (parent hash, block token ids) once computed; an
// admitted sequence looks its prompt's full blocks up and starts after the cached ones (at
// least one prompt token is always computed, to get the logits).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "memory/block_manager.h"
#include "strata/serving.h"
#include "strata/status.h"

namespace strata {

// How a preempted sequence gives its blocks back (PreemptionMode, strata/serving.h):
//   kSwap: copy its blocks to host slots (recompute when the swap area is full).
//   kRecompute: drop its blocks; recompute prompt + generated tokens when resumed.
//   kByCost: compare estimated costs and pick the cheaper:
//     recompute_seconds = context_tokens / recompute_tokens_per_s
//     swap_seconds      = 2 * blocks * block_bytes / swap_bytes_per_s   (out now, in later)
//     recompute when recompute_seconds <= swap_seconds (or the swap area is full), else swap.
//   Large models have few KV bytes per token relative to their FLOPs per token, so swapping
//   wins for them; tiny models and short contexts recompute.

struct SchedulerConfig {
  int64_t num_blocks = 0;       // device KV blocks
  int64_t num_swap_blocks = 0;  // host swap slots
  int64_t block_size = 16;
  int64_t max_num_seqs = 64;
  int64_t max_num_batched_tokens = 512;
  int64_t max_model_len = 0;     // 0: no limit beyond the cache size
  int64_t watermark_blocks = 0;  // admission keeps this many blocks free for running decodes
  bool enable_prefix_caching = true;
  PreemptionMode preemption_mode = PreemptionMode::kByCost;
  double recompute_tokens_per_s = 4000.0;  // prefill throughput, for kByCost
  double swap_bytes_per_s = 8e9;           // host <-> device copy bandwidth, for kByCost
  int64_t block_bytes = 0;                 // KV bytes of one block (all layers), for kByCost
  int64_t offload_groups = 0;              // KV offload: groups of running sequences (0: off)
  int64_t group_blocks = 0;                // KV offload: most blocks one group holds
  int kv_owners = 1;  // ranks the block ids are split among (batch-sharded attention)
};

enum class SeqState { kWaiting, kRunning, kSwapped, kFinished };

struct SchedSequence {
  uint64_t id = 0;
  int64_t arrival = 0;          // admission order (FCFS)
  std::vector<int32_t> tokens;  // prompt + generated
  int64_t n_prompt = 0;
  int64_t max_len = 0;          // prompt + max new tokens, capped by max_model_len
  int64_t n_computed = 0;       // tokens whose K/V are in the cache
  int64_t n_cached_prompt = 0;  // prompt tokens found in the prefix cache (first admission)
  bool admitted_once = false;
  SeqState state = SeqState::kWaiting;
  std::vector<int32_t> block_table;    // device blocks
  std::vector<int32_t> swap_slots;     // host slots while swapped
  std::vector<uint64_t> block_hashes;  // hashes of the full computed blocks, in order
  int64_t n_preemptions = 0;
  int32_t group = -1;      // KV offload: its group while running
  int owner = -1;          // kv_owners > 1: the rank holding its blocks (running or swapped)
  bool in_step = false;    // scheduled in the step being built
  bool in_flight = false;  // scheduled in a step not completed yet (pipelined steps)
};

struct ScheduledSeq {
  uint64_t id = 0;
  const SchedSequence* seq = nullptr;  // valid until the next schedule()/finish()
  int64_t begin = 0, end = 0;          // token range [begin, end) of seq->tokens to compute
  bool needs_logits = false;           // the range ends at the last token (a new token follows)
};

struct BlockCopy {
  int32_t device_block = 0;
  int32_t host_slot = 0;
};

struct ScheduledStep {
  std::vector<ScheduledSeq> seqs;   // the batch, in batch order
  std::vector<BlockCopy> swap_out;  // device -> host, before swap_in and the forward
  std::vector<BlockCopy> swap_in;   // host -> device, before the forward
  int64_t num_tokens = 0;
  int64_t num_preempted = 0;  // sequences preempted while building this step
  bool empty() const { return seqs.empty(); }
};

struct SchedulerStats {
  int64_t running = 0, waiting = 0, swapped = 0;
  int64_t blocks_used = 0, blocks_total = 0, blocks_cached_free = 0;
  int64_t swap_slots_used = 0;
  int64_t preemptions_total = 0, swaps_total = 0, recomputes_total = 0;
  int64_t prefix_cache_queries_tokens = 0, prefix_cache_hit_tokens = 0;
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& config);

  // Queue a sequence. kInvalidArgument for an empty prompt or a duplicate id; kOutOfRange when
  // prompt + max_new_tokens can never fit in the cache (or max_model_len).
  Status add(uint64_t id, std::span<const int32_t> prompt, int64_t max_new_tokens);
  // Build the next step, of at most max_seqs sequences (0: max_num_seqs). The reference stays
  // valid until the next call. Its sequences are in flight until complete_step(): a pipelined
  // engine schedules further steps from the others (seed 000's generation schedule keeps as
  // many steps of different sequences in flight as there are pipeline stages).
  // max_decodes (0: no cap) caps the decode tokens of running sequences: a pipelined engine
  // splits the running sequences evenly over its steps in flight, while prompt chunks and
  // admissions may still fill a step up to max_seqs.
  // group >= 0 (KV offload): only that group's sequences run, and admitted ones join it.
  const ScheduledStep& schedule(int64_t max_seqs = 0, int64_t max_decodes = 0, int32_t group = -1);
  // The step's tokens were computed: advance each sequence and publish its newly full blocks
  // (sequences finished in the meantime are skipped; `step` may be a copy).
  void complete_step(const ScheduledStep& step);
  // A token was sampled for `id` (it will be computed as the next decode token).
  void append_token(uint64_t id, int32_t token);
  // Finished or cancelled: free its blocks and swap slots at once and forget it.
  // Returns false when the id is unknown.
  bool finish(uint64_t id);

  const SchedSequence* find(uint64_t id) const;
  // KV offload: the running sequences of `group`, in arrival order; blocks the group holds.
  std::vector<const SchedSequence*> group_members(int32_t group) const;
  int64_t group_blocks_used(int32_t group) const {
    return group_used_.empty() ? 0 : group_used_[static_cast<size_t>(group)];
  }
  // Most sequences one offload group admits: max_num_seqs spread over the groups.
  int64_t group_seq_cap() const;
  bool has_work() const { return !running_.empty() || !waiting_.empty() || !swapped_.empty(); }
  SchedulerStats stats() const;
  const BlockManager& blocks() const { return blocks_; }
  const SchedulerConfig& config() const { return config_; }

 private:
  int64_t blocks_for(int64_t n_tokens) const {
    return (n_tokens + config_.block_size - 1) / config_.block_size;
  }
  // Grow seq's table to hold `n_tokens` positions; false (nothing taken) when short of blocks
  // (or, with KV offload, its group is).
  bool grow(SchedSequence& seq, int64_t n_tokens);
  // Blocks seq may still take: free ones, and with KV offload its group's room.
  int64_t room_blocks(const SchedSequence& seq) const;
  // Preempt the latest running sequence that is not scheduled yet (of `group` when >= 0, of
  // `owner` when >= 0); returns it.
  SchedSequence* preempt_latest(int32_t group = -1, int owner = -1);
  // The owner seq's blocks come from (0 with one owner).
  int owner_of(const SchedSequence& seq) const { return seq.owner >= 0 ? seq.owner : 0; }
  // Watermark blocks kept free on one owner.
  int64_t watermark() const { return config_.watermark_blocks / blocks_.n_owners(); }
  // The victim preempt_latest picks when seq needs blocks: of its group when the group is full.
  SchedSequence* preempt_for(const SchedSequence& seq, int64_t n_tokens);
  void preempt(SchedSequence& seq);
  bool should_swap(const SchedSequence& seq) const;
  void release_blocks(SchedSequence& seq);
  void match_prefix(SchedSequence& seq);
  void insert_waiting(SchedSequence* seq);
  void remove_from(std::vector<SchedSequence*>& list, const SchedSequence* seq);
  void push_scheduled(SchedSequence& seq, int64_t n_tokens);
  // Tokens of the next chunk (at most `want`) whose blocks fit now without preemption.
  int64_t fit_chunk(const SchedSequence& seq, int64_t want, int64_t reserve) const;

  SchedulerConfig config_;
  BlockManager blocks_;
  std::vector<int32_t> free_slots_;  // host swap slots
  std::unordered_map<uint64_t, std::unique_ptr<SchedSequence>> seqs_;
  std::vector<SchedSequence*> waiting_, running_, swapped_;  // each sorted by arrival
  ScheduledStep step_;
  int64_t next_arrival_ = 0;
  int64_t budget_ = 0;
  SchedulerStats counters_;
  std::vector<int64_t> group_used_, group_seqs_;  // KV offload: blocks and sequences per group
};

}  // namespace strata
