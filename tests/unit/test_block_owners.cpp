// Block ids split among owners (batch-sharded attention: block b on rank b % N only): the
// BlockManager's per-owner allocation, release, eviction and lookup, and the scheduler's
// per-owner room, preemption and swap-in.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "memory/block_manager.h"
#include "serving/scheduler.h"

namespace strata {
namespace {

TEST(BlockManagerOwners, OneOwnerIsThePoolAsBefore) {
  BlockManager bm(5, 4, false);
  EXPECT_EQ(bm.n_owners(), 1);
  EXPECT_EQ(bm.num_total(0), 5);
  EXPECT_EQ(bm.min_owner_total(), 5);
  for (int32_t want = 0; want < 5; ++want) EXPECT_EQ(bm.allocate(), want);
  EXPECT_EQ(bm.allocate(), -1);
  bm.release(3);
  EXPECT_EQ(bm.num_free(), 1);
  EXPECT_EQ(bm.allocate(), 3);
}

TEST(BlockManagerOwners, AllocatesFreesAndRunsOutPerOwner) {
  BlockManager bm(12, 4, false, 4);
  for (int o = 0; o < 4; ++o) {
    EXPECT_EQ(bm.num_total(o), 3);
    EXPECT_EQ(bm.num_free(o), 3);
  }
  // Owner 1's ids only, lowest first; then it is out of blocks while the others have room.
  EXPECT_EQ(bm.allocate(1), 1);
  EXPECT_EQ(bm.allocate(1), 5);
  EXPECT_EQ(bm.allocate(1), 9);
  EXPECT_EQ(bm.allocate(1), -1);
  EXPECT_EQ(bm.num_free(1), 0);
  EXPECT_EQ(bm.num_free(), 9);
  EXPECT_EQ(bm.num_used(), 3);
  for (int o : {0, 2, 3}) EXPECT_EQ(bm.num_free(o), 3);
  // The most free owner (lowest index among equals) takes allocate().
  EXPECT_EQ(bm.most_free_owner(), 0);
  EXPECT_EQ(bm.allocate(), 0);
  EXPECT_EQ(bm.most_free_owner(), 2);
  EXPECT_EQ(bm.allocate(), 2);
  EXPECT_EQ(bm.allocate(), 3);
  EXPECT_EQ(bm.allocate(), 4);  // owner 0 again: 0, 2, 3 at 2 free each
  EXPECT_EQ(bm.owner_of(4), 0);
  // A release goes back to its owner.
  bm.release(5);
  EXPECT_EQ(bm.num_free(1), 1);
  EXPECT_EQ(bm.allocate(1), 5);
  EXPECT_EQ(bm.num_free(), 5);
}

TEST(BlockManagerOwners, UnevenCountsAndMinOwnerTotal) {
  BlockManager bm(10, 4, false, 4);  // owners 0, 1: 3 ids; 2, 3: 2 ids
  EXPECT_EQ(bm.num_total(0), 3);
  EXPECT_EQ(bm.num_total(1), 3);
  EXPECT_EQ(bm.num_total(2), 2);
  EXPECT_EQ(bm.num_total(3), 2);
  EXPECT_EQ(bm.min_owner_total(), 2);
}

TEST(BlockManagerOwners, CachedBlocksAreEvictedAndFoundPerOwner) {
  BlockManager bm(4, 2, true, 2);
  const std::vector<int32_t> ta = {1, 2}, tb = {3, 4};
  const uint64_t ha = hash_block(kNoParentHash, ta), hb = hash_block(kNoParentHash, tb);
  const int32_t a = bm.allocate(0), b = bm.allocate(1);
  ASSERT_EQ(a, 0);
  ASSERT_EQ(b, 1);
  bm.register_full(a, ha, kNoParentHash, ta);
  bm.register_full(b, hb, kNoParentHash, tb);
  bm.release(a);
  bm.release(b);
  EXPECT_EQ(bm.num_cached_free(), 2);
  // Owner 0's lookup does not take owner 1's block, nor any owner's when it is asked for 0.
  EXPECT_EQ(bm.lookup(hb, kNoParentHash, tb, 0), -1);
  EXPECT_EQ(bm.lookup(hb, kNoParentHash, tb, 1), b);
  bm.release(b);
  // Owner 1 fills up: its free block first, then it evicts its cached one, never owner 0's.
  EXPECT_EQ(bm.allocate(1), 3);
  EXPECT_EQ(bm.allocate(1), 1);
  EXPECT_EQ(bm.allocate(1), -1);
  EXPECT_EQ(bm.lookup(hb, kNoParentHash, tb), -1);  // evicted
  EXPECT_EQ(bm.lookup(ha, kNoParentHash, ta), a);   // owner 0's still cached
  EXPECT_EQ(bm.num_free(0), 1);
}

std::vector<int32_t> prompt_of(int64_t n, int32_t start = 1) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), start);
  return p;
}

// Every block of every live sequence is its owner's.
void expect_blocks_on_owner(const Scheduler& sched, std::initializer_list<uint64_t> ids) {
  for (uint64_t id : ids) {
    const SchedSequence* s = sched.find(id);
    if (s == nullptr) continue;
    for (int32_t b : s->block_table) {
      EXPECT_EQ(b % sched.config().kv_owners, s->owner) << "sequence " << id << " block " << b;
    }
  }
}

void complete_all(Scheduler& sched, const ScheduledStep& step) {
  sched.complete_step(step);
  for (const ScheduledSeq& s : step.seqs) {
    if (!s.needs_logits) continue;
    const uint64_t id = s.seq->id;
    sched.append_token(id, 7);
    const SchedSequence* q = sched.find(id);
    if (static_cast<int64_t>(q->tokens.size()) >= q->max_len) sched.finish(id);
  }
}

TEST(SchedulerOwners, SpreadsPreemptsAndSwapsPerOwner) {
  SchedulerConfig c;
  c.num_blocks = 12;  // 6 per owner
  c.num_swap_blocks = 16;
  c.block_size = 4;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 64;
  c.enable_prefix_caching = false;
  c.preemption_mode = PreemptionMode::kSwap;
  c.kv_owners = 2;
  Scheduler sched(c);
  // A request needs its blocks on one owner: 7 blocks never fit 6 per owner (12 in all).
  EXPECT_EQ(sched.add(99, prompt_of(25), 3).code(), StatusCode::kOutOfRange);
  ASSERT_TRUE(sched.add(1, prompt_of(12), 4).ok());  // 3 blocks, then a 4th when decoding
  ASSERT_TRUE(sched.add(2, prompt_of(12), 4).ok());
  ASSERT_TRUE(sched.add(3, prompt_of(12), 4).ok());
  ASSERT_TRUE(sched.add(4, prompt_of(2), 2).ok());  // 1 block, enough to the end
  ScheduledStep s1 = sched.schedule();
  ASSERT_EQ(s1.seqs.size(), 4u);
  // Each goes to the owner with the most free blocks (the lowest among equals).
  EXPECT_EQ(sched.find(1)->owner, 0);
  EXPECT_EQ(sched.find(2)->owner, 1);
  EXPECT_EQ(sched.find(3)->owner, 0);
  EXPECT_EQ(sched.find(4)->owner, 1);
  expect_blocks_on_owner(sched, {1, 2, 3, 4});
  EXPECT_EQ(sched.blocks().num_free(0), 0);
  EXPECT_EQ(sched.blocks().num_free(1), 2);
  complete_all(sched, s1);
  // Decodes: 1 needs a block of owner 0, which is full while owner 1 has two free. It preempts
  // 3, the latest of owner 0, and not 4 (the latest of all, on owner 1: its blocks would not
  // help). 2 takes one of owner 1's blocks.
  ScheduledStep s2 = sched.schedule();
  EXPECT_EQ(s2.num_preempted, 1);
  EXPECT_EQ(sched.find(3)->state, SeqState::kSwapped);
  EXPECT_EQ(sched.find(3)->owner, 0);  // kept while swapped
  EXPECT_EQ(sched.find(4)->state, SeqState::kRunning);
  EXPECT_EQ(s2.seqs.size(), 3u);
  EXPECT_EQ(sched.blocks().num_free(1), 1);
  expect_blocks_on_owner(sched, {1, 2, 4});
  complete_all(sched, s2);
  // Run to the end: swapped sequences come back to their owner's blocks.
  bool swapped_in_3 = false;
  for (int i = 0; i < 40 && sched.has_work(); ++i) {
    const ScheduledStep& st = sched.schedule();
    for (const BlockCopy& bc : st.swap_in) {
      const SchedSequence* q = sched.find(3);
      ASSERT_NE(q, nullptr);
      EXPECT_NE(std::find(q->block_table.begin(), q->block_table.end(), bc.device_block),
                q->block_table.end());
      EXPECT_EQ(bc.device_block % 2, 0);
      swapped_in_3 = true;
    }
    expect_blocks_on_owner(sched, {1, 2, 3, 4});
    ScheduledStep copy = st;
    complete_all(sched, copy);
  }
  EXPECT_FALSE(sched.has_work());
  EXPECT_TRUE(swapped_in_3);
  EXPECT_EQ(sched.blocks().num_free(), 12);
}

// A prompt whose prefix is cached goes to the owner holding it (its K/V are there), even with
// more free blocks elsewhere; one without a cached prefix goes to the owner with the most.
TEST(SchedulerOwners, CachedPrefixDecidesTheOwner) {
  SchedulerConfig c;
  c.num_blocks = 8;  // 4 per owner
  c.block_size = 4;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 64;
  c.enable_prefix_caching = true;
  c.kv_owners = 2;
  Scheduler sched(c);
  ASSERT_TRUE(sched.add(1, prompt_of(9), 1).ok());  // 2 full blocks + 1 token: 3 blocks
  ScheduledStep s1 = sched.schedule();
  ASSERT_EQ(s1.seqs.size(), 1u);
  EXPECT_EQ(sched.find(1)->owner, 0);
  const std::vector<int32_t> a_blocks = sched.find(1)->block_table;
  complete_all(sched, s1);  // publishes the 2 full blocks; 1 finishes
  ASSERT_EQ(sched.find(1), nullptr);
  EXPECT_EQ(sched.blocks().num_free(0), 4);  // 2 of them cached
  EXPECT_EQ(sched.blocks().num_cached_free(), 2);
  ASSERT_TRUE(sched.add(2, prompt_of(3, 100), 1).ok());  // no cached prefix: owner 0 (4 = 4)
  ASSERT_TRUE(sched.add(3, prompt_of(9), 4).ok());       // 1's prompt; runs on
  ScheduledStep s2 = sched.schedule();
  ASSERT_EQ(s2.seqs.size(), 2u);
  EXPECT_EQ(sched.find(2)->owner, 0);
  // 3 finds 1's two blocks on owner 0 (3 free there vs 4 on owner 1) and stays with them.
  const SchedSequence* q = sched.find(3);
  EXPECT_EQ(q->owner, 0);
  ASSERT_GE(q->block_table.size(), 2u);
  EXPECT_EQ(q->block_table[0], a_blocks[0]);
  EXPECT_EQ(q->block_table[1], a_blocks[1]);
  EXPECT_EQ(q->n_cached_prompt, 8);
  expect_blocks_on_owner(sched, {2, 3});
  complete_all(sched, s2);
  // With 3 holding owner 0's blocks, a fresh prompt goes to owner 1 (the most free).
  ASSERT_TRUE(sched.add(4, prompt_of(3, 200), 1).ok());
  ScheduledStep s3 = sched.schedule();
  ASSERT_NE(sched.find(4), nullptr);
  EXPECT_EQ(sched.find(4)->owner, 1);
}

// The same requests fit at once when the blocks per owner are N times as many ids (the point of
// the split pool: a rank holds only its own sequences' blocks).
TEST(SchedulerOwners, FourOwnersServeFourTimesTheSequencesOfOnePoolPerRank) {
  auto peak_running = [](int owners, int64_t blocks) {
    SchedulerConfig c;
    c.num_blocks = blocks;
    c.block_size = 4;
    c.max_num_seqs = 64;
    c.max_num_batched_tokens = 512;
    c.enable_prefix_caching = false;
    c.preemption_mode = PreemptionMode::kRecompute;
    c.kv_owners = owners;
    Scheduler sched(c);
    for (uint64_t id = 0; id < 16; ++id) EXPECT_TRUE(sched.add(id, prompt_of(6), 2).ok());
    int64_t peak = 0;
    for (int i = 0; i < 100 && sched.has_work(); ++i) {
      ScheduledStep st = sched.schedule();
      peak = std::max(peak, sched.stats().running);
      complete_all(sched, st);
    }
    EXPECT_FALSE(sched.has_work());
    return peak;
  };
  // 16 sequences of 2 blocks: 8 blocks per rank hold 4 of them in one replicated pool, and 16
  // when each of 4 ranks holds its own 8 (32 ids).
  EXPECT_EQ(peak_running(1, 8), 4);
  EXPECT_EQ(peak_running(4, 32), 16);
}

}  // namespace
}  // namespace strata
