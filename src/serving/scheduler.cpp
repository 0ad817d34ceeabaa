#include "serving/scheduler.h"

#include <algorithm>

#include "core/log.h"
#include "core/status.h"

namespace strata {

namespace {

void insert_by_arrival(std::vector<SchedSequence*>& list, SchedSequence* seq) {
  auto it = std::upper_bound(
      list.begin(), list.end(), seq,
      [](const SchedSequence* a, const SchedSequence* b) { return a->arrival < b->arrival; });
  list.insert(it, seq);
}

}  // namespace

Scheduler::Scheduler(const SchedulerConfig& config)
    // KV offload keeps no prefix cache: a cached block of another group is not on the device.
    : config_(config),
      blocks_(config.num_blocks, config.block_size,
              config.enable_prefix_caching && config.offload_groups == 0,
              std::max(config.kv_owners, 1)) {
  free_slots_.reserve(static_cast<size_t>(config.num_swap_blocks));
  for (int64_t i = config.num_swap_blocks - 1; i >= 0; --i) {
    free_slots_.push_back(static_cast<int32_t>(i));
  }
  step_.seqs.reserve(static_cast<size_t>(config.max_num_seqs));
  if (config.offload_groups > 0) {
    group_used_.assign(static_cast<size_t>(config.offload_groups), 0);
    group_seqs_.assign(static_cast<size_t>(config.offload_groups), 0);
  }
}

int64_t Scheduler::group_seq_cap() const {
  const int64_t g = std::max<int64_t>(config_.offload_groups, 1);
  return std::max<int64_t>(1, (config_.max_num_seqs + g - 1) / g);
}

std::vector<const SchedSequence*> Scheduler::group_members(int32_t group) const {
  std::vector<const SchedSequence*> out;
  for (const SchedSequence* s : running_) {
    if (s->group == group) out.push_back(s);
  }
  return out;
}

Status Scheduler::add(uint64_t id, std::span<const int32_t> prompt, int64_t max_new_tokens) {
  if (prompt.empty()) return errorf(StatusCode::kInvalidArgument, "request {}: empty prompt", id);
  if (seqs_.count(id) != 0) {
    return errorf(StatusCode::kInvalidArgument, "request {}: duplicate id", id);
  }
  const auto n_prompt = static_cast<int64_t>(prompt.size());
  int64_t max_len = n_prompt + std::max<int64_t>(max_new_tokens, 0);
  if (config_.max_model_len > 0) {
    if (n_prompt >= config_.max_model_len) {
      return errorf(StatusCode::kOutOfRange,
                    "request {}: the prompt is {} tokens, the context length is {}", id, n_prompt,
                    config_.max_model_len);
    }
    max_len = std::min(max_len, config_.max_model_len);
  }
  if (blocks_for(max_len) > blocks_.min_owner_total()) {
    return errorf(StatusCode::kOutOfRange,
                  "request {}: {} tokens need {} KV blocks, the cache has {}{}", id, max_len,
                  blocks_for(max_len), blocks_.min_owner_total(),
                  blocks_.n_owners() > 1 ? " per rank" : "");
  }
  if (config_.offload_groups > 0 && blocks_for(max_len) > config_.group_blocks) {
    return errorf(StatusCode::kOutOfRange,
                  "request {}: {} tokens need {} KV blocks, half the device pool (what one KV "
                  "offload group may hold) is {}",
                  id, max_len, blocks_for(max_len), config_.group_blocks);
  }
  auto seq = std::make_unique<SchedSequence>();
  seq->id = id;
  seq->arrival = next_arrival_++;
  seq->tokens.reserve(static_cast<size_t>(max_len));
  seq->tokens.assign(prompt.begin(), prompt.end());
  seq->n_prompt = n_prompt;
  seq->max_len = max_len;
  seq->block_table.reserve(static_cast<size_t>(blocks_for(max_len)));
  SchedSequence* raw = seq.get();
  seqs_.emplace(id, std::move(seq));
  insert_by_arrival(waiting_, raw);
  return ok_status();
}

int64_t Scheduler::room_blocks(const SchedSequence& seq) const {
  int64_t room = blocks_.num_free(owner_of(seq));
  if (seq.group >= 0) {
    room = std::min(room, config_.group_blocks - group_used_[static_cast<size_t>(seq.group)]);
  }
  return std::max<int64_t>(room, 0);
}

bool Scheduler::grow(SchedSequence& seq, int64_t n_tokens) {
  const int64_t need = blocks_for(n_tokens) - static_cast<int64_t>(seq.block_table.size());
  if (need > room_blocks(seq)) return false;
  for (int64_t i = 0; i < need; ++i) {
    const int32_t b = blocks_.allocate(owner_of(seq));
    STRATA_CHECK(b >= 0);
    seq.block_table.push_back(b);
  }
  if (seq.group >= 0 && need > 0) group_used_[static_cast<size_t>(seq.group)] += need;
  return true;
}

int64_t Scheduler::fit_chunk(const SchedSequence& seq, int64_t want, int64_t reserve) const {
  const int64_t free =
      std::max<int64_t>(std::min(blocks_.num_free(owner_of(seq)) - reserve, room_blocks(seq)), 0);
  const int64_t room =
      (static_cast<int64_t>(seq.block_table.size()) + free) * config_.block_size - seq.n_computed;
  return std::max<int64_t>(std::min(want, room), 0);
}

void Scheduler::release_blocks(SchedSequence& seq) {
  if (seq.group >= 0) {
    group_used_[static_cast<size_t>(seq.group)] -= static_cast<int64_t>(seq.block_table.size());
  }
  // Tail first, so the LRU evicts a prefix's last blocks before its first ones.
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) {
    blocks_.release(*it);
  }
  seq.block_table.clear();
}

bool Scheduler::should_swap(const SchedSequence& seq) const {
  const int64_t n_blocks = blocks_for(seq.n_computed);
  if (n_blocks == 0 || n_blocks > static_cast<int64_t>(free_slots_.size())) return false;
  switch (config_.preemption_mode) {
    case PreemptionMode::kSwap:
      return true;
    case PreemptionMode::kRecompute:
      return false;
    case PreemptionMode::kByCost: {
      const double recompute_s =
          static_cast<double>(seq.n_computed) / std::max(config_.recompute_tokens_per_s, 1e-9);
      const double swap_s = 2.0 * static_cast<double>(n_blocks * config_.block_bytes) /
                            std::max(config_.swap_bytes_per_s, 1e-9);
      return recompute_s > swap_s;
    }
  }
  return false;
}

void Scheduler::preempt(SchedSequence& seq) {
  // Leaves its offload group: its blocks are given back below, its turn ends.
  const int32_t group = seq.group;
  ++counters_.preemptions_total;
  ++seq.n_preemptions;
  ++step_.num_preempted;
  if (should_swap(seq)) {
    ++counters_.swaps_total;
    const int64_t n_blocks = blocks_for(seq.n_computed);
    for (int64_t i = 0; i < n_blocks; ++i) {
      const int32_t slot = free_slots_.back();
      free_slots_.pop_back();
      step_.swap_out.push_back({seq.block_table[static_cast<size_t>(i)], slot});
      seq.swap_slots.push_back(slot);
    }
    release_blocks(seq);
    if (group >= 0) --group_seqs_[static_cast<size_t>(group)];
    seq.group = -1;
    seq.state = SeqState::kSwapped;
    insert_by_arrival(swapped_, &seq);
    return;
  }
  ++counters_.recomputes_total;
  release_blocks(seq);
  if (group >= 0) --group_seqs_[static_cast<size_t>(group)];
  seq.group = -1;
  seq.owner = -1;  // picks again when readmitted
  seq.n_computed = 0;
  seq.block_hashes.clear();
  seq.state = SeqState::kWaiting;
  insert_by_arrival(waiting_, &seq);
}

SchedSequence* Scheduler::preempt_for(const SchedSequence& seq, int64_t n_tokens) {
  const int64_t need = blocks_for(n_tokens) - static_cast<int64_t>(seq.block_table.size());
  const bool group_full =
      seq.group >= 0 && group_used_[static_cast<size_t>(seq.group)] + need > config_.group_blocks;
  // Only blocks of seq's owner make room for it.
  return preempt_latest(group_full ? seq.group : -1, blocks_.n_owners() > 1 ? seq.owner : -1);
}

SchedSequence* Scheduler::preempt_latest(int32_t group, int owner) {
  for (size_t j = running_.size(); j-- > 0;) {
    SchedSequence* victim = running_[j];
    if (victim->in_step || victim->in_flight) continue;
    if (group >= 0 && victim->group != group) continue;
    if (owner >= 0 && victim->owner != owner) continue;
    running_.erase(running_.begin() + static_cast<int64_t>(j));
    preempt(*victim);
    return victim;
  }
  return nullptr;
}

void Scheduler::match_prefix(SchedSequence& seq) {
  if (!blocks_.prefix_caching()) return;
  const int64_t bs = config_.block_size;
  // Always leave at least one token to compute: its logits give the next token.
  const int64_t n_full = (static_cast<int64_t>(seq.tokens.size()) - 1) / bs;
  uint64_t parent = kNoParentHash;
  for (int64_t b = 0; b < n_full; ++b) {
    const std::span<const int32_t> toks(seq.tokens.data() + b * bs, static_cast<size_t>(bs));
    const uint64_t h = hash_block(parent, toks);
    // Several owners: the first cached block decides the owner, and the prefix ends at a block
    // of another (sequences of two owners may have published its blocks).
    const int32_t blk = blocks_.lookup(h, parent, toks, seq.owner);
    if (blk < 0) break;
    seq.owner = blocks_.owner_of(blk);
    seq.block_table.push_back(blk);
    seq.block_hashes.push_back(h);
    parent = h;
  }
  seq.n_computed = static_cast<int64_t>(seq.block_table.size()) * bs;
}

void Scheduler::push_scheduled(SchedSequence& seq, int64_t n_tokens) {
  ScheduledSeq s;
  s.id = seq.id;
  s.seq = &seq;
  s.begin = seq.n_computed;
  s.end = seq.n_computed + n_tokens;
  s.needs_logits = s.end == static_cast<int64_t>(seq.tokens.size());
  seq.in_step = true;
  seq.in_flight = true;
  step_.seqs.push_back(s);
  step_.num_tokens += n_tokens;
  budget_ -= n_tokens;
}

const ScheduledStep& Scheduler::schedule(int64_t max_seqs, int64_t max_decodes, int32_t group) {
  STRATA_CHECK(group < 0 || (config_.offload_groups > 0 && group < config_.offload_groups));
  const auto cap = static_cast<size_t>(max_seqs > 0 ? max_seqs : config_.max_num_seqs);
  auto room = [&] { return budget_ > 0 && step_.seqs.size() < cap; };
  step_.seqs.clear();
  step_.swap_out.clear();
  step_.swap_in.clear();
  step_.num_tokens = 0;
  step_.num_preempted = 0;
  budget_ = config_.max_num_batched_tokens;
  for (SchedSequence* s : running_) s->in_step = false;

  // 1. Decodes (one token each), in arrival order. A sequence whose recomputed prompt has one
  //    token left is scheduled the same way.
  const auto decode_cap = static_cast<size_t>(max_decodes > 0 ? max_decodes : max_seqs);
  for (size_t i = 0;
       i < running_.size() && room() && (max_decodes <= 0 || step_.seqs.size() < decode_cap);) {
    SchedSequence* s = running_[i];
    if (s->in_flight || static_cast<int64_t>(s->tokens.size()) - s->n_computed != 1 ||
        (group >= 0 && s->group != group)) {
      ++i;
      continue;
    }
    bool self_preempted = false;
    while (!grow(*s, s->n_computed + 1)) {
      SchedSequence* victim = preempt_for(*s, s->n_computed + 1);
      STRATA_CHECK(victim != nullptr);
      if (victim == s) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) continue;  // running_[i] is now the next sequence (or none)
    push_scheduled(*s, 1);
    ++i;
  }

  // 2. Prompt chunks of running sequences, in arrival order.
  for (size_t i = 0; i < running_.size() && room();) {
    SchedSequence* s = running_[i];
    const int64_t remaining = static_cast<int64_t>(s->tokens.size()) - s->n_computed;
    if (s->in_step || s->in_flight || remaining <= 1 || (group >= 0 && s->group != group)) {
      ++i;
      continue;
    }
    const int64_t want = std::min(remaining, budget_);
    int64_t chunk = fit_chunk(*s, want, 0);
    bool self_preempted = false;
    while (chunk == 0) {
      SchedSequence* victim = preempt_for(*s, s->n_computed + 1);
      STRATA_CHECK(victim != nullptr);
      if (victim == s) {
        self_preempted = true;
        break;
      }
      chunk = fit_chunk(*s, want, 0);
    }
    if (self_preempted) continue;
    STRATA_CHECK(grow(*s, s->n_computed + chunk));
    push_scheduled(*s, chunk);
    ++i;
  }

  const bool preempted = step_.num_preempted > 0;
  // 3. Swap sequences back in (FCFS), not in a step that had to preempt.
  while (!preempted && !swapped_.empty() && room() &&
         static_cast<int64_t>(running_.size()) < config_.max_num_seqs) {
    SchedSequence* s = swapped_.front();
    const int64_t remaining = static_cast<int64_t>(s->tokens.size()) - s->n_computed;
    // With nothing running the watermark protects no one: waiving it avoids a stall.
    const int64_t reserve = running_.empty() ? 0 : watermark();
    const int64_t n_slots = static_cast<int64_t>(s->swap_slots.size());
    // Back to its owner: its KV is in that rank's host slots.
    const int64_t free = blocks_.num_free(owner_of(*s)) - reserve;
    const int64_t room = std::max<int64_t>(free, 0) * config_.block_size - s->n_computed;
    const int64_t chunk = std::min({remaining, budget_, room});
    if (n_slots > free || chunk <= 0) break;
    swapped_.erase(swapped_.begin());
    for (int32_t slot : s->swap_slots) {
      const int32_t b = blocks_.allocate(owner_of(*s));
      STRATA_CHECK(b >= 0);
      s->block_table.push_back(b);
      step_.swap_in.push_back({b, slot});
      free_slots_.push_back(slot);
    }
    s->swap_slots.clear();
    s->block_hashes.clear();  // complete_step republishes the copied-in blocks
    STRATA_CHECK(grow(*s, s->n_computed + chunk));
    s->state = SeqState::kRunning;
    insert_by_arrival(running_, s);
    push_scheduled(*s, chunk);
  }

  // 4. Admit waiting sequences (FCFS) while nothing is swapped out.
  while (!preempted && swapped_.empty() && !waiting_.empty() && room() &&
         static_cast<int64_t>(running_.size()) < config_.max_num_seqs &&
         (group < 0 || group_seqs_[static_cast<size_t>(group)] < group_seq_cap())) {
    SchedSequence* s = waiting_.front();
    s->group = group;  // counts against the group's room from here
    s->owner = -1;
    match_prefix(*s);
    if (s->owner < 0) s->owner = blocks_.most_free_owner();
    const int64_t remaining = static_cast<int64_t>(s->tokens.size()) - s->n_computed;
    const int64_t reserve = running_.empty() ? 0 : watermark();
    const int64_t chunk = fit_chunk(*s, std::min(remaining, budget_), reserve);
    if (chunk == 0) {
      release_blocks(*s);
      s->group = -1;
      s->owner = -1;
      s->n_computed = 0;
      s->block_hashes.clear();
      break;
    }
    if (group >= 0) ++group_seqs_[static_cast<size_t>(group)];
    counters_.prefix_cache_queries_tokens += static_cast<int64_t>(s->tokens.size());
    counters_.prefix_cache_hit_tokens += s->n_computed;
    if (!s->admitted_once) s->n_cached_prompt = std::min(s->n_computed, s->n_prompt);
    s->admitted_once = true;
    waiting_.erase(waiting_.begin());
    STRATA_CHECK(grow(*s, s->n_computed + chunk));
    s->state = SeqState::kRunning;
    insert_by_arrival(running_, s);
    push_scheduled(*s, chunk);
  }
  return step_;
}

void Scheduler::complete_step(const ScheduledStep& step) {
  const int64_t bs = config_.block_size;
  for (const ScheduledSeq& sched : step.seqs) {
    auto it = seqs_.find(sched.id);
    if (it == seqs_.end()) continue;
    SchedSequence& s = *it->second;
    s.in_flight = false;
    s.n_computed = sched.end;
    if (!blocks_.prefix_caching()) continue;
    // Publish blocks that became full (a swapped-in sequence republishes its copied blocks).
    while (static_cast<int64_t>(s.block_hashes.size()) < s.n_computed / bs) {
      const int64_t b = static_cast<int64_t>(s.block_hashes.size());
      const uint64_t parent = b == 0 ? kNoParentHash : s.block_hashes[static_cast<size_t>(b - 1)];
      const std::span<const int32_t> toks(s.tokens.data() + b * bs, static_cast<size_t>(bs));
      const uint64_t h = hash_block(parent, toks);
      blocks_.register_full(s.block_table[static_cast<size_t>(b)], h, parent, toks);
      s.block_hashes.push_back(h);
    }
  }
}

void Scheduler::append_token(uint64_t id, int32_t token) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  it->second->tokens.push_back(token);
}

void Scheduler::remove_from(std::vector<SchedSequence*>& list, const SchedSequence* seq) {
  auto it = std::find(list.begin(), list.end(), seq);
  if (it != list.end()) list.erase(it);
}

bool Scheduler::finish(uint64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  SchedSequence* s = it->second.get();
  switch (s->state) {
    case SeqState::kWaiting:
      remove_from(waiting_, s);
      break;
    case SeqState::kRunning:
      remove_from(running_, s);
      if (s->group >= 0) --group_seqs_[static_cast<size_t>(s->group)];
      break;
    case SeqState::kSwapped:
      remove_from(swapped_, s);
      break;
    case SeqState::kFinished:
      break;
  }
  release_blocks(*s);
  for (int32_t slot : s->swap_slots) free_slots_.push_back(slot);
  s->swap_slots.clear();
  s->state = SeqState::kFinished;
  seqs_.erase(it);
  return true;
}

const SchedSequence* Scheduler::find(uint64_t id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats st = counters_;
  st.running = static_cast<int64_t>(running_.size());
  st.waiting = static_cast<int64_t>(waiting_.size());
  st.swapped = static_cast<int64_t>(swapped_.size());
  st.blocks_used = blocks_.num_used();
  st.blocks_total = blocks_.num_total();
  st.blocks_cached_free = blocks_.num_cached_free();
  st.swap_slots_used = config_.num_swap_blocks - static_cast<int64_t>(free_slots_.size());
  return st;
}

}  // namespace strata
