// KV offload's schedule with no model (serving/kv_offload.h): which host blocks sit in which
// device slots, what is loaded and stored at each step, the rotation of the groups, and the
// per-layer-parity copies of the pool; plus the CPU copy streams' event ordering.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <set>

#include "memory/kv_pool.h"
#include "runtime/device_runtime.h"
#include "serving/kv_offload.h"
#include "serving/scheduler.h"

namespace strata {
namespace {

TEST(KvOffloadPlan, DefaultGroupsLetHalfThePoolHoldOne) {
  EXPECT_EQ(default_offload_groups(16, 64), 8);  // regions of 8 blocks
  EXPECT_EQ(default_offload_groups(16, 20), 3);
  EXPECT_EQ(default_offload_groups(16, 8), 2);  // never fewer than 2
}

TEST(KvOffloadPlan, PlaceLoadsOnlyMissingBlocksThatHoldData) {
  KvOffloadPlan plan(/*device_blocks=*/8, /*host_blocks=*/20, /*block_size=*/4, /*groups=*/2);
  ASSERT_EQ(plan.region_blocks(), 4);
  KvOffloadCopies loads;
  const int32_t a[] = {6, 5, 7};
  const uint8_t a_data[] = {1, 1, 0};
  ASSERT_TRUE(plan.place(0, a, a_data, &loads));
  // By host block into the region's slots in order; block 7 holds nothing yet: not loaded.
  EXPECT_EQ(loads.device, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(loads.host, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(plan.device_block(7), 2);

  // 5 leaves, 6 and 7 stay where they are, 9 takes the freed slot.
  loads.clear();
  const int32_t b[] = {6, 7, 9};
  const uint8_t b_data[] = {1, 1, 1};
  ASSERT_TRUE(plan.place(0, b, b_data, &loads));
  EXPECT_EQ(loads.device, (std::vector<int32_t>{0}));
  EXPECT_EQ(loads.host, (std::vector<int32_t>{9}));
  EXPECT_EQ(plan.device_block(5), -1);
  EXPECT_EQ(plan.device_block(6), 1);

  // Into the other region: 6 moves (loaded again from the host pool, which is authoritative).
  loads.clear();
  const int32_t c[] = {6};
  const uint8_t c_data[] = {1};
  ASSERT_TRUE(plan.place(1, c, c_data, &loads));
  EXPECT_EQ(loads.device, (std::vector<int32_t>{4}));
  EXPECT_EQ(plan.device_block(6), 4);

  // More than a region: refused, nothing changed.
  loads.clear();
  const int32_t d[] = {1, 2, 3, 4, 8};
  const uint8_t d_data[] = {1, 1, 1, 1, 1};
  EXPECT_FALSE(plan.place(1, d, d_data, &loads));
  EXPECT_TRUE(loads.empty());
  EXPECT_EQ(plan.device_block(6), 4);
}

// Plays the engine over a Scheduler in offload mode with fake KV contents: each block position
// holds the token id written there, on the "device" and the "host". Every step checks that its
// sequences read exactly their own tokens from the device slots of their block tables (so the
// loads brought everything needed), writes its tokens, and stores; the host must then hold
// every computed token. Also checks the rotation: a running sequence runs at least once in any
// G consecutive steps, and loads after the first round come from the prefetch.
void play_offload(int64_t groups) {
  constexpr int64_t kDevice = 16, kHost = 64, kBs = 4;
  SchedulerConfig c;
  c.num_blocks = kHost;
  c.block_size = kBs;
  c.max_num_seqs = 12;
  c.max_num_batched_tokens = 64;
  c.enable_prefix_caching = false;
  c.preemption_mode = PreemptionMode::kRecompute;
  c.offload_groups = groups;
  c.group_blocks = kDevice / 2;
  Scheduler sched(c);
  KvOffloadPlan plan(kDevice, kHost, kBs, groups);
  std::vector<std::vector<int32_t>> dev(kDevice, std::vector<int32_t>(kBs, -1));
  std::vector<std::vector<int32_t>> host(kHost, std::vector<int32_t>(kBs, -1));
  const int n_seqs = 12;
  for (int i = 0; i < n_seqs; ++i) {
    std::vector<int32_t> prompt(static_cast<size_t>(2 + i % 3));
    std::iota(prompt.begin(), prompt.end(), 100 * i);
    ASSERT_TRUE(sched.add(static_cast<uint64_t>(i), prompt, /*max_new_tokens=*/4).ok());
  }
  std::map<uint64_t, int64_t> last_ran;  // id -> executed step index
  int64_t executed = 0, demand_loads_late = 0, prefetched_total = 0;
  std::set<uint64_t> prefetched_ids;
  for (int iter = 0; iter < 400 && sched.has_work(); ++iter) {
    const int32_t g = plan.group();
    const ScheduledStep step = sched.schedule(0, 0, g);
    if (step.empty()) {
      plan.advance(false);
      continue;
    }
    const int lo = plan.region() * static_cast<int>(plan.region_blocks());
    const int hi = lo + static_cast<int>(plan.region_blocks());
    KvOffloadCopies loads;
    ASSERT_TRUE(plan.begin_step(step, &loads));
    for (size_t i = 0; i < loads.size(); ++i) {
      dev[static_cast<size_t>(loads.device[i])] = host[static_cast<size_t>(loads.host[i])];
    }
    // Sequences prefetched by the previous step need no load now.
    for (size_t i = 0; i < loads.size(); ++i) {
      for (const ScheduledSeq& s : step.seqs) {
        const auto& t = s.seq->block_table;
        if (std::find(t.begin(), t.end(), loads.host[i]) != t.end() &&
            prefetched_ids.count(s.id) != 0) {
          ++demand_loads_late;
        }
      }
    }
    std::set<int32_t> slots;
    for (const ScheduledSeq& s : step.seqs) {
      EXPECT_EQ(s.seq->group, g);
      for (size_t b = 0; b < s.seq->block_table.size(); ++b) {
        const int32_t d = plan.device_block(s.seq->block_table[b]);
        ASSERT_GE(d, lo);
        ASSERT_LT(d, hi);
        EXPECT_TRUE(slots.insert(d).second) << "two blocks in one slot";
      }
      // The forward reads positions [0, begin) through the device slots...
      for (int64_t p = 0; p < s.begin; ++p) {
        const int32_t d = plan.device_block(s.seq->block_table[static_cast<size_t>(p / kBs)]);
        ASSERT_EQ(dev[static_cast<size_t>(d)][static_cast<size_t>(p % kBs)],
                  s.seq->tokens[static_cast<size_t>(p)])
            << "seq " << s.id << " position " << p << " step " << executed;
      }
      // ... and writes [begin, end).
      for (int64_t p = s.begin; p < s.end; ++p) {
        const int32_t d = plan.device_block(s.seq->block_table[static_cast<size_t>(p / kBs)]);
        dev[static_cast<size_t>(d)][static_cast<size_t>(p % kBs)] =
            s.seq->tokens[static_cast<size_t>(p)];
      }
    }
    // The next group's computed blocks go to the other region.
    const auto next = static_cast<int32_t>((g + 1) % groups);
    const std::vector<const SchedSequence*> members = sched.group_members(next);
    KvOffloadCopies pre;
    ASSERT_TRUE(plan.prefetch(members, &pre));
    for (size_t i = 0; i < pre.size(); ++i) {
      EXPECT_TRUE(pre.device[i] < lo || pre.device[i] >= hi) << "prefetch into the running region";
      dev[static_cast<size_t>(pre.device[i])] = host[static_cast<size_t>(pre.host[i])];
    }
    prefetched_total += static_cast<int64_t>(pre.size());
    prefetched_ids.clear();
    for (const SchedSequence* m : members) prefetched_ids.insert(m->id);
    // Stores: exactly the blocks holding [begin, end) of each sequence.
    KvOffloadCopies stores;
    plan.stores(step, &stores);
    std::set<int32_t> want;
    for (const ScheduledSeq& s : step.seqs) {
      for (int64_t b = s.begin / kBs; b <= (s.end - 1) / kBs; ++b) {
        want.insert(s.seq->block_table[static_cast<size_t>(b)]);
      }
    }
    EXPECT_EQ(std::set<int32_t>(stores.host.begin(), stores.host.end()), want);
    for (size_t i = 0; i < stores.size(); ++i) {
      host[static_cast<size_t>(stores.host[i])] = dev[static_cast<size_t>(stores.device[i])];
    }
    // Rotation.
    for (const ScheduledSeq& s : step.seqs) last_ran[s.id] = executed;
    // Complete: token 7 + step for sequences with logits; finish at max length.
    sched.complete_step(step);
    for (const ScheduledSeq& s : step.seqs) {
      if (!s.needs_logits) continue;
      sched.append_token(s.id, static_cast<int32_t>(7 + executed));
      const SchedSequence* q = sched.find(s.id);
      if (static_cast<int64_t>(q->tokens.size()) >= q->max_len) {
        EXPECT_TRUE(sched.finish(s.id));
        last_ran.erase(s.id);
      }
    }
    plan.advance(true);
    ++executed;
    for (const auto& [id, when] : last_ran) {
      const SchedSequence* q = sched.find(id);
      ASSERT_NE(q, nullptr);
      if (q->state != SeqState::kRunning) continue;
      EXPECT_LE(executed - when, groups) << "sequence " << id << " starved at step " << executed;
    }
  }
  EXPECT_FALSE(sched.has_work());
  EXPECT_EQ(sched.stats().preemptions_total, 0);
  EXPECT_EQ(demand_loads_late, 0) << "prefetched sequences loaded again";
  EXPECT_GT(prefetched_total, 0);
  EXPECT_EQ(sched.stats().blocks_used, 0);
}

TEST(KvOffloadSchedule, ThreeGroupsRotateAndTheDeviceAlwaysHoldsWhatIsRead) {
  play_offload(3);
}

TEST(KvOffloadSchedule, FourGroupsRotateAndTheDeviceAlwaysHoldsWhatIsRead) {
  play_offload(4);
}

TEST(KvOffloadSchedule, AGroupNeverHoldsMoreThanARegion) {
  SchedulerConfig c;
  c.num_blocks = 64;
  c.block_size = 4;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 64;
  c.enable_prefix_caching = false;
  c.preemption_mode = PreemptionMode::kRecompute;
  c.offload_groups = 2;
  c.group_blocks = 4;
  Scheduler sched(c);
  // One sequence longer than a region can never run.
  EXPECT_EQ(sched.add(99, std::vector<int32_t>(10, 1), 10).code(), StatusCode::kOutOfRange);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(sched.add(static_cast<uint64_t>(i), std::vector<int32_t>(6, 1 + i), 6).ok());
  }
  for (int iter = 0; iter < 200 && sched.has_work(); ++iter) {
    const int32_t g = iter % 2;
    const ScheduledStep step = sched.schedule(0, 0, g);
    for (int32_t grp = 0; grp < 2; ++grp) EXPECT_LE(sched.group_blocks_used(grp), 4);
    sched.complete_step(step);
    for (const ScheduledSeq& s : step.seqs) {
      if (!s.needs_logits) continue;
      sched.append_token(s.id, 7);
      const SchedSequence* q = sched.find(s.id);
      if (static_cast<int64_t>(q->tokens.size()) >= q->max_len) sched.finish(s.id);
    }
  }
  EXPECT_FALSE(sched.has_work());
}

// Layer parity: the copies of one parity touch only those layers' K and V, runs merged; the
// two parities together move every byte of the blocks, there and back.
TEST(KvOffloadCopies, ByLayerParityMergedRunsRoundTrip) {
  KvPoolConfig kc;
  kc.n_layers = 4;
  kc.n_blocks = 6;
  kc.block_size = 2;
  kc.n_heads_kv = 2;
  kc.head_dim = 3;
  kc.dtype = DType::kF32;
  HostAllocator alloc;
  auto pool = KvPool::create(kc, alloc);
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  const int64_t host_blocks = 9;
  const size_t block = 2 * 2 * 3 * sizeof(float);
  std::vector<uint8_t> host(block * static_cast<size_t>(2 * kc.n_layers * host_blocks), 0);
  const int32_t dev_b[] = {2, 3, 5};
  const int32_t host_b[] = {7, 8, 1};
  for (int parity : {1, 0}) {
    std::vector<KvCopy> copies;
    ASSERT_TRUE(
        pool->offload_copies(host.data(), host_blocks, dev_b, host_b, parity, true, copies).ok());
    // 2 layers x (K, V) x 2 runs ({2,3}->{7,8} merged, {5}->{1}).
    ASSERT_EQ(copies.size(), 8u);
    for (const KvCopy& cp : copies) {
      bool found = false;
      for (int64_t l = 0; l < kc.n_layers; ++l) {
        for (const Tensor* t : {&pool->layers()[static_cast<size_t>(l)].k,
                                &pool->layers()[static_cast<size_t>(l)].v}) {
          const auto* base = static_cast<const uint8_t*>(t->data);
          const auto* src = static_cast<const uint8_t*>(cp.src);
          if (src >= base && src < base + block * 7) {
            EXPECT_EQ(l % 2, parity);
            found = true;
          }
        }
      }
      EXPECT_TRUE(found);
      EXPECT_TRUE(cp.bytes == 2 * block || cp.bytes == block);
    }
  }
  // Round trip: pattern in blocks 2, 3, 5 -> host -> blocks 0, 1, 4.
  for (int64_t l = 0; l < kc.n_layers; ++l) {
    for (Tensor* t :
         {&pool->layers()[static_cast<size_t>(l)].k, &pool->layers()[static_cast<size_t>(l)].v}) {
      auto* f = static_cast<float*>(t->data);
      for (int64_t i = 0; i < 7 * 12; ++i)
        f[i] = static_cast<float>(l * 1000 + i) +
               (t == &pool->layers()[static_cast<size_t>(l)].v ? 0.5f : 0.0f);
    }
  }
  for (int parity : {1, 0}) {
    std::vector<KvCopy> copies;
    ASSERT_TRUE(
        pool->offload_copies(host.data(), host_blocks, dev_b, host_b, parity, true, copies).ok());
    for (const KvCopy& cp : copies) std::memcpy(cp.dst, cp.src, cp.bytes);
  }
  const int32_t dev_back[] = {0, 1, 4};
  for (int parity : {0, 1}) {
    std::vector<KvCopy> copies;
    ASSERT_TRUE(
        pool->offload_copies(host.data(), host_blocks, dev_back, host_b, parity, false, copies)
            .ok());
    for (const KvCopy& cp : copies) std::memcpy(cp.dst, cp.src, cp.bytes);
  }
  for (int64_t l = 0; l < kc.n_layers; ++l) {
    for (Tensor* t :
         {&pool->layers()[static_cast<size_t>(l)].k, &pool->layers()[static_cast<size_t>(l)].v}) {
      const auto* f = static_cast<const float*>(t->data);
      for (int k = 0; k < 3; ++k) {
        EXPECT_EQ(0, std::memcmp(f + dev_back[k] * 12, f + dev_b[k] * 12, block))
            << "layer " << l << " block " << dev_b[k];
      }
    }
  }
  // Bad ids are errors.
  std::vector<KvCopy> copies;
  const int32_t bad_dev[] = {6};
  const int32_t bad_host[] = {9};
  const int32_t ok_one[] = {0};
  EXPECT_FALSE(
      pool->offload_copies(host.data(), host_blocks, bad_dev, ok_one, 0, true, copies).ok());
  EXPECT_FALSE(
      pool->offload_copies(host.data(), host_blocks, ok_one, bad_host, 0, true, copies).ok());
}

// The CPU copy streams: a load that waits for a store's event sees the stored bytes (big
// enough that a missing wait would read them half-written), and the compute waits for loads.
TEST(KvOffloadCopies, CpuStreamsOrderLoadsAfterStores) {
  auto rt = DeviceRuntime::create(Device::cpu(), false);
  ASSERT_TRUE(rt.ok());
  auto copier = (*rt)->make_kv_copier(4);
  ASSERT_TRUE(copier.ok());
  KvCopier& c = **copier;
  const size_t n = size_t{32} << 20;
  for (int round = 0; round < 3; ++round) {
    std::vector<uint8_t> a(n, static_cast<uint8_t>(round + 1)), h(n, 0), b(n, 0);
    ASSERT_TRUE(c.record(KvStream::kCompute, 0).ok());
    ASSERT_TRUE(c.wait(KvStream::kToHost, 0).ok());
    const KvCopier::Copy out[] = {{h.data(), a.data(), n / 2},
                                  {h.data() + n / 2, a.data() + n / 2, n / 2}};
    ASSERT_TRUE(c.copy(KvStream::kToHost, out).ok());
    ASSERT_TRUE(c.record(KvStream::kToHost, 1).ok());
    ASSERT_TRUE(c.wait(KvStream::kToDevice, 1).ok());
    const KvCopier::Copy in[] = {{b.data(), h.data(), n}};
    ASSERT_TRUE(c.copy(KvStream::kToDevice, in).ok());
    ASSERT_TRUE(c.record(KvStream::kToDevice, 2).ok());
    ASSERT_TRUE(c.wait(KvStream::kCompute, 2).ok());  // the host blocks until the load is done
    EXPECT_EQ(b.front(), round + 1);
    EXPECT_EQ(b[n / 2 + 1], round + 1);
    EXPECT_EQ(b.back(), round + 1);
    ASSERT_TRUE(c.synchronize().ok());
  }
  EXPECT_FALSE(c.copy(KvStream::kCompute, {}).ok());
}

}  // namespace
}  // namespace strata
