// Scheduler unit tests: token budget, chunked prefill, admission, preemption (swap and
// recompute), prefix caching, cancellation and FCFS order, with no model.
#include <gtest/gtest.h>

#include <map>
#include <numeric>

#include "serving/scheduler.h"

namespace strata {
namespace {

std::vector<int32_t> prompt_of(int64_t n, int32_t start = 1) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), start);
  return p;
}

SchedulerConfig small_config() {
  SchedulerConfig c;
  c.num_blocks = 64;
  c.num_swap_blocks = 64;
  c.block_size = 4;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 16;
  c.enable_prefix_caching = false;
  return c;
}

const ScheduledSeq* find_in(const ScheduledStep& step, uint64_t id) {
  for (const ScheduledSeq& s : step.seqs) {
    if (s.seq->id == id) return &s;
  }
  return nullptr;
}

// Plays the engine: computes the step, samples token 7 for every sequence with logits, and
// finishes sequences that reached their max length. Returns the step's copy.
// Everything of run_step after schedule(). NOTE: sequences finished here are freed, so the
// step's pointers to them dangle afterwards: read a step before completing it.
void complete(Scheduler& sched, const ScheduledStep& step,
              std::vector<uint64_t>* finished = nullptr) {
  sched.complete_step(step);
  for (const ScheduledSeq& s : step.seqs) {
    if (!s.needs_logits) continue;
    const uint64_t id = s.seq->id;
    sched.append_token(id, 7);
    const SchedSequence* q = sched.find(id);
    if (static_cast<int64_t>(q->tokens.size()) >= q->max_len) {
      EXPECT_TRUE(sched.finish(id));
      if (finished) finished->push_back(id);
    }
  }
}

ScheduledStep run_step(Scheduler& sched, std::vector<uint64_t>* finished = nullptr) {
  ScheduledStep step = sched.schedule();
  complete(sched, step, finished);
  return step;
}

// Pipelined steps: a step's sequences stay in flight until it completes, so the next step is
// built from the others; max_seqs caps a step; a sequence finished while in flight is skipped
// when its step completes.
TEST(Scheduler, InFlightSequencesAreNotRescheduled) {
  Scheduler sched(small_config());
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(sched.add(id, prompt_of(2), 5).ok());
  // Prompts first: everyone in one step (budget 16 >= 8 tokens), then decode.
  ScheduledStep prefill = sched.schedule();
  ASSERT_EQ(prefill.seqs.size(), 4u);
  EXPECT_TRUE(sched.schedule().empty());  // all four in flight: nothing to build
  complete(sched, prefill);
  const ScheduledStep a = sched.schedule(2);
  ASSERT_EQ(a.seqs.size(), 2u);
  const ScheduledStep b = sched.schedule(2);
  ASSERT_EQ(b.seqs.size(), 2u);
  for (const ScheduledSeq& x : a.seqs) {
    EXPECT_EQ(find_in(b, x.id), nullptr) << "sequence " << x.id << " in two steps in flight";
  }
  EXPECT_TRUE(sched.schedule(2).empty());
  // Cancel one of b's sequences while b is in flight, complete a, then b.
  const uint64_t gone = b.seqs[0].id;
  EXPECT_TRUE(sched.finish(gone));
  complete(sched, a);
  const ScheduledStep a2 = sched.schedule(2);
  EXPECT_EQ(a2.seqs.size(), 2u);  // a's sequences again (b's still in flight)
  for (const ScheduledSeq& x : a2.seqs) EXPECT_NE(find_in(a, x.id), nullptr);
  sched.complete_step(b);  // the cancelled sequence is skipped
  EXPECT_EQ(sched.find(gone), nullptr);
  const SchedSequence* other = sched.find(b.seqs[1].id);
  ASSERT_NE(other, nullptr);
  EXPECT_FALSE(other->in_flight);
  EXPECT_EQ(other->n_computed, 3);
}

// A pipelined step's decode cap splits the running sequences over the steps in flight without
// holding back admissions (else the running set could never grow past a few sequences).
TEST(Scheduler, DecodeCapLeavesRoomForAdmissions) {
  Scheduler sched(small_config());
  for (uint64_t id = 1; id <= 2; ++id) ASSERT_TRUE(sched.add(id, prompt_of(2), 5).ok());
  complete(sched, sched.schedule());  // both prompts: now two decoding sequences
  for (uint64_t id = 3; id <= 5; ++id) ASSERT_TRUE(sched.add(id, prompt_of(2), 5).ok());
  const ScheduledStep step = sched.schedule(/*max_seqs=*/4, /*max_decodes=*/1);
  int decodes = 0, prompts = 0;
  for (const ScheduledSeq& x : step.seqs) (x.id <= 2 ? decodes : prompts) += 1;
  EXPECT_EQ(decodes, 1);
  EXPECT_EQ(prompts, 3);
  EXPECT_EQ(step.seqs.size(), 4u);
}

TEST(Scheduler, DecodesFirstThenPromptChunksFillTheBudget) {
  Scheduler sched(small_config());
  ASSERT_TRUE(sched.add(1, prompt_of(3), 10).ok());
  ASSERT_TRUE(sched.add(2, prompt_of(3), 10).ok());
  ScheduledStep s0 = run_step(sched);  // both prompts in one step
  ASSERT_EQ(s0.seqs.size(), 2u);
  EXPECT_EQ(s0.num_tokens, 6);
  ASSERT_TRUE(sched.add(3, prompt_of(40), 4).ok());
  ScheduledStep s1 = run_step(sched);
  ASSERT_EQ(s1.seqs.size(), 3u);
  // Decodes first, one token each, in arrival order; then the long prompt takes the rest.
  EXPECT_EQ(s1.seqs[0].seq->id, 1u);
  EXPECT_EQ(s1.seqs[0].end - s1.seqs[0].begin, 1);
  EXPECT_TRUE(s1.seqs[0].needs_logits);
  EXPECT_EQ(s1.seqs[1].seq->id, 2u);
  EXPECT_EQ(s1.seqs[2].seq->id, 3u);
  EXPECT_EQ(s1.seqs[2].begin, 0);
  EXPECT_EQ(s1.seqs[2].end, 14);
  EXPECT_FALSE(s1.seqs[2].needs_logits);
  EXPECT_EQ(s1.num_tokens, 16);
}

TEST(Scheduler, ChunkedPrefillSplitsALongPromptAcrossSteps) {
  Scheduler sched(small_config());
  ASSERT_TRUE(sched.add(1, prompt_of(40), 2).ok());
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int i = 0; i < 3; ++i) {
    ScheduledStep s = run_step(sched);
    ASSERT_EQ(s.seqs.size(), 1u);
    ranges.emplace_back(s.seqs[0].begin, s.seqs[0].end);
    EXPECT_EQ(s.seqs[0].needs_logits, i == 2);
  }
  EXPECT_EQ(ranges, (std::vector<std::pair<int64_t, int64_t>>{{0, 16}, {16, 32}, {32, 40}}));
  ScheduledStep decode = run_step(sched);
  ASSERT_EQ(decode.seqs.size(), 1u);
  EXPECT_EQ(decode.seqs[0].begin, 40);
  EXPECT_EQ(decode.seqs[0].end, 41);
}

TEST(Scheduler, MaxNumSeqsLimitsRunning) {
  SchedulerConfig c = small_config();
  c.max_num_seqs = 2;
  c.max_num_batched_tokens = 100;
  Scheduler sched(c);
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(sched.add(id, prompt_of(2), 3).ok());
  ScheduledStep s = run_step(sched);
  EXPECT_EQ(s.seqs.size(), 2u);
  EXPECT_EQ(sched.stats().running, 2);
  EXPECT_EQ(sched.stats().waiting, 2);
}

TEST(Scheduler, AdmissionWaitsForBlocksAboveTheWatermark) {
  SchedulerConfig c = small_config();
  c.num_blocks = 6;
  c.watermark_blocks = 1;
  c.max_num_batched_tokens = 64;
  Scheduler sched(c);
  ASSERT_TRUE(sched.add(1, prompt_of(16), 4).ok());  // 4 blocks for the prompt
  ASSERT_TRUE(sched.add(2, prompt_of(8), 4).ok());   // 2 blocks, only 1 above the watermark
  ScheduledStep s = run_step(sched);
  ASSERT_EQ(s.seqs.size(), 2u);
  // The second prompt is cut to what fits above the watermark: one block.
  EXPECT_EQ(s.seqs[1].end - s.seqs[1].begin, 4);
  EXPECT_EQ(sched.blocks().num_free(), 1);
  ASSERT_TRUE(sched.add(3, prompt_of(4), 1).ok());
  ScheduledStep s2 = run_step(sched);
  EXPECT_EQ(find_in(s2, 3), nullptr);  // no block above the watermark
  EXPECT_EQ(sched.stats().waiting, 1);
}

TEST(Scheduler, RejectsRequestsThatCanNeverFit) {
  SchedulerConfig c = small_config();
  c.num_blocks = 4;
  Scheduler sched(c);
  EXPECT_EQ(sched.add(1, prompt_of(10), 10).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(sched.add(2, {}, 10).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(sched.add(3, prompt_of(2), 2).ok());
  EXPECT_EQ(sched.add(3, prompt_of(2), 2).code(), StatusCode::kInvalidArgument);
}

// Two sequences that together outgrow a 6-block cache: the later one is preempted.
void check_preemption(PreemptionMode mode) {
  SchedulerConfig c = small_config();
  c.num_blocks = 6;
  c.num_swap_blocks = 8;
  c.preemption_mode = mode;
  Scheduler sched(c);
  ASSERT_TRUE(sched.add(1, prompt_of(8), 12).ok());      // grows to 5 blocks
  ASSERT_TRUE(sched.add(2, prompt_of(8, 100), 8).ok());  // grows to 4 blocks
  std::vector<uint64_t> finished;
  bool saw_swap_out = false, saw_swap_in = false;
  int64_t preempted = 0;
  std::map<uint64_t, std::vector<int32_t>> tokens_before;
  for (int i = 0; i < 100 && sched.has_work(); ++i) {
    ScheduledStep s = run_step(sched, &finished);
    saw_swap_out |= !s.swap_out.empty();
    saw_swap_in |= !s.swap_in.empty();
    preempted += s.num_preempted;
    // Every scheduled range continues where the sequence's cache ends.
    for (const ScheduledSeq& q : s.seqs) EXPECT_LT(q.begin, q.end);
  }
  EXPECT_FALSE(sched.has_work());
  EXPECT_GE(preempted, 1);
  EXPECT_EQ(finished, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(saw_swap_out, mode == PreemptionMode::kSwap);
  EXPECT_EQ(saw_swap_in, mode == PreemptionMode::kSwap);
  const SchedulerStats st = sched.stats();
  EXPECT_EQ(st.preemptions_total, preempted);
  EXPECT_EQ(mode == PreemptionMode::kSwap ? st.swaps_total : st.recomputes_total, preempted);
  EXPECT_EQ(st.blocks_used, 0);
  EXPECT_EQ(st.swap_slots_used, 0);
}

TEST(Scheduler, PreemptionBySwapResumes) {
  check_preemption(PreemptionMode::kSwap);
}
TEST(Scheduler, PreemptionByRecomputeResumes) {
  check_preemption(PreemptionMode::kRecompute);
}

TEST(Scheduler, RecomputeReplaysPromptAndGeneratedTokens) {
  SchedulerConfig c = small_config();
  c.num_blocks = 4;
  c.preemption_mode = PreemptionMode::kRecompute;
  Scheduler sched(c);
  ASSERT_TRUE(sched.add(1, prompt_of(4), 8).ok());      // up to 3 blocks
  ASSERT_TRUE(sched.add(2, prompt_of(4, 50), 8).ok());  // up to 3 blocks
  bool recomputed = false;
  for (int i = 0; i < 50 && sched.has_work(); ++i) {
    const ScheduledStep s = sched.schedule();
    const ScheduledSeq* q = find_in(s, 2);
    // A recomputed sequence comes back with begin 0 and more than its prompt.
    if (q && q->begin == 0 && q->seq->n_preemptions > 0) {
      recomputed = true;
      EXPECT_GT(q->seq->tokens.size(), 4u);  // prompt + generated tokens are replayed
    }
    complete(sched, s);
  }
  EXPECT_TRUE(recomputed);
  EXPECT_EQ(sched.stats().blocks_used, 0);
}

TEST(Scheduler, ByCostRecomputesShortContextsAndSwapsLongOnes) {
  SchedulerConfig c = small_config();
  c.num_blocks = 6;
  c.preemption_mode = PreemptionMode::kByCost;
  c.block_bytes = 1 << 20;
  c.swap_bytes_per_s = 1e9;
  // Recompute is cheap: 4 tokens at 1e6 tok/s = 4 us; swapping 1 MiB twice = 2 ms.
  c.recompute_tokens_per_s = 1e6;
  {
    Scheduler sched(c);
    ASSERT_TRUE(sched.add(1, prompt_of(8), 12).ok());
    ASSERT_TRUE(sched.add(2, prompt_of(8, 100), 8).ok());
    for (int i = 0; i < 100 && sched.has_work(); ++i) run_step(sched);
    EXPECT_GT(sched.stats().recomputes_total, 0);
    EXPECT_EQ(sched.stats().swaps_total, 0);
  }
  c.recompute_tokens_per_s = 100;  // recompute is expensive: swap
  {
    Scheduler sched(c);
    ASSERT_TRUE(sched.add(1, prompt_of(8), 12).ok());
    ASSERT_TRUE(sched.add(2, prompt_of(8, 100), 8).ok());
    for (int i = 0; i < 100 && sched.has_work(); ++i) run_step(sched);
    EXPECT_GT(sched.stats().swaps_total, 0);
    EXPECT_EQ(sched.stats().recomputes_total, 0);
  }
}

TEST(Scheduler, PrefixCacheSharesFullBlocksAndEvictsLru) {
  SchedulerConfig c = small_config();
  c.enable_prefix_caching = true;
  c.num_blocks = 8;
  Scheduler sched(c);
  std::vector<int32_t> a = prompt_of(10);  // 2 full blocks + 2 tokens
  ASSERT_TRUE(sched.add(1, a, 5).ok());
  run_step(sched);  // prompt computed, blocks 0 and 1 published
  std::vector<int32_t> b = a;
  b[9] = 99;  // same first 2 blocks, different tail
  ASSERT_TRUE(sched.add(2, b, 5).ok());
  ScheduledStep s = run_step(sched);
  const ScheduledSeq* q = find_in(s, 2);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->begin, 8);  // two cached blocks skipped
  EXPECT_EQ(q->seq->n_cached_prompt, 8);
  const SchedSequence* s1 = sched.find(1);
  const SchedSequence* s2 = sched.find(2);
  ASSERT_NE(s1, nullptr);
  ASSERT_NE(s2, nullptr);
  EXPECT_EQ(s2->block_table[0], s1->block_table[0]);
  EXPECT_EQ(s2->block_table[1], s1->block_table[1]);
  EXPECT_EQ(sched.blocks().ref_count(s1->block_table[0]), 2);
  EXPECT_EQ(sched.stats().prefix_cache_hit_tokens, 8);
  const int32_t shared0 = s1->block_table[0];
  // Both finish: the shared blocks stay cached (unreferenced, reusable).
  ASSERT_TRUE(sched.finish(1));
  ASSERT_TRUE(sched.finish(2));
  EXPECT_EQ(sched.blocks().num_used(), 0);
  EXPECT_EQ(sched.blocks().num_free(), 8);
  EXPECT_GE(sched.blocks().num_cached_free(), 2);
  // A third request with the same prefix hits the cache without any running owner.
  ASSERT_TRUE(sched.add(3, a, 2).ok());
  ScheduledStep s3 = run_step(sched);
  EXPECT_EQ(find_in(s3, 3)->begin, 8);
  EXPECT_EQ(sched.find(3)->block_table[0], shared0);
  ASSERT_TRUE(sched.finish(3));
  // A prompt that needs the whole cache evicts the cached blocks (LRU).
  ASSERT_TRUE(sched.add(4, prompt_of(32, 200), 0).ok());
  std::vector<uint64_t> finished;
  for (int i = 0; i < 4 && sched.has_work(); ++i) run_step(sched, &finished);
  EXPECT_EQ(finished, (std::vector<uint64_t>{4}));
  EXPECT_EQ(sched.blocks().num_cached_free(), 8);  // request 4's own full blocks
  ASSERT_TRUE(sched.add(6, a, 2).ok());
  ScheduledStep s6 = run_step(sched);
  EXPECT_EQ(find_in(s6, 6)->begin, 0);  // evicted: no hit
}

TEST(Scheduler, CancellationFreesEverything) {
  SchedulerConfig c = small_config();
  c.enable_prefix_caching = true;
  c.num_blocks = 10;
  c.preemption_mode = PreemptionMode::kSwap;
  Scheduler sched(c);
  ASSERT_TRUE(sched.add(1, prompt_of(12), 20).ok());
  ASSERT_TRUE(sched.add(2, prompt_of(12, 40), 20).ok());
  ASSERT_TRUE(sched.add(3, prompt_of(12, 80), 20).ok());
  for (int i = 0; i < 8; ++i) run_step(sched);
  const SchedulerStats mid = sched.stats();
  EXPECT_GT(mid.blocks_used, 0);
  EXPECT_TRUE(sched.finish(1));
  EXPECT_TRUE(sched.finish(2));
  EXPECT_TRUE(sched.finish(3));
  EXPECT_FALSE(sched.finish(3));
  const SchedulerStats st = sched.stats();
  EXPECT_EQ(st.blocks_used, 0);
  EXPECT_EQ(st.swap_slots_used, 0);
  EXPECT_EQ(st.running + st.waiting + st.swapped, 0);
  EXPECT_EQ(sched.blocks().num_free(), 10);
  EXPECT_FALSE(sched.has_work());
}

TEST(Scheduler, FcfsAdmissionOrder) {
  SchedulerConfig c = small_config();
  c.max_num_seqs = 1;
  Scheduler sched(c);
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(sched.add(id, prompt_of(3), 2).ok());
  std::vector<uint64_t> finished;
  for (int i = 0; i < 40 && sched.has_work(); ++i) run_step(sched, &finished);
  EXPECT_EQ(finished, (std::vector<uint64_t>{1, 2, 3, 4}));
}

}  // namespace
}  // namespace strata
