#include "serving/kv_offload.h"

#include <algorithm>
#include <numeric>

#include "core/log.h"
#include "core/status.h"

namespace strata {

int64_t default_offload_groups(int64_t device_blocks, int64_t host_blocks) {
  const int64_t half = std::max<int64_t>(device_blocks / 2, 1);
  return std::max<int64_t>(2, (host_blocks + half - 1) / half);
}

KvOffloadPlan::KvOffloadPlan(int64_t device_blocks, int64_t host_blocks, int64_t block_size,
                             int64_t groups)
    : block_size_(block_size),
      groups_(groups),
      region_blocks_(device_blocks / 2),
      where_(static_cast<size_t>(host_blocks), -1),
      owner_(static_cast<size_t>(device_blocks), -1),
      keep_(static_cast<size_t>(host_blocks), 0) {}

bool KvOffloadPlan::place(int region, std::span<const int32_t> blocks,
                          std::span<const uint8_t> has_data, KvOffloadCopies* loads) {
  STRATA_CHECK(blocks.size() == has_data.size());
  if (static_cast<int64_t>(blocks.size()) > region_blocks_) return false;
  const auto lo = static_cast<int32_t>(region * region_blocks_);
  const auto hi = static_cast<int32_t>(lo + region_blocks_);
  for (size_t i = 0; i < blocks.size(); ++i) keep_[static_cast<size_t>(blocks[i])] = 1;
  // Drop what the region holds beyond `blocks`.
  for (int32_t slot = lo; slot < hi; ++slot) {
    const int32_t h = owner_[static_cast<size_t>(slot)];
    if (h < 0 || keep_[static_cast<size_t>(h)] != 0) continue;
    owner_[static_cast<size_t>(slot)] = -1;
    if (where_[static_cast<size_t>(h)] == slot) where_[static_cast<size_t>(h)] = -1;
  }
  for (size_t i = 0; i < blocks.size(); ++i) keep_[static_cast<size_t>(blocks[i])] = 0;
  // The blocks to bring in, by host block, into the region's free slots in order: consecutive
  // host blocks land in consecutive slots (one copy per layer for the run).
  std::vector<size_t> fresh;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const int32_t at = where_[static_cast<size_t>(blocks[i])];
    if (at < lo || at >= hi) fresh.push_back(i);
  }
  std::sort(fresh.begin(), fresh.end(), [&](size_t a, size_t b) { return blocks[a] < blocks[b]; });
  int32_t slot = lo;
  for (size_t i : fresh) {
    const int32_t h = blocks[i];
    while (owner_[static_cast<size_t>(slot)] >= 0) ++slot;  // fits: checked above
    const int32_t old = where_[static_cast<size_t>(h)];
    if (old >= 0) owner_[static_cast<size_t>(old)] = -1;  // a copy in the other region
    where_[static_cast<size_t>(h)] = slot;
    owner_[static_cast<size_t>(slot)] = h;
    if (has_data[i] != 0) {
      loads->device.push_back(slot);
      loads->host.push_back(h);
    }
  }
  return true;
}

bool KvOffloadPlan::begin_step(const ScheduledStep& step, KvOffloadCopies* loads) {
  blocks_.clear();
  data_.clear();
  for (const ScheduledSeq& s : step.seqs) {
    const std::vector<int32_t>& table = s.seq->block_table;
    for (size_t b = 0; b < table.size(); ++b) {
      blocks_.push_back(table[b]);
      data_.push_back(static_cast<int64_t>(b) * block_size_ < s.begin ? 1 : 0);
    }
  }
  return place(region_, blocks_, data_, loads);
}

bool KvOffloadPlan::prefetch(std::span<const SchedSequence* const> next, KvOffloadCopies* loads) {
  blocks_.clear();
  for (const SchedSequence* s : next) {
    const int64_t n = (s->n_computed + block_size_ - 1) / block_size_;
    for (int64_t b = 0; b < n; ++b) blocks_.push_back(s->block_table[static_cast<size_t>(b)]);
  }
  data_.assign(blocks_.size(), 1);
  return place(1 - region_, blocks_, data_, loads);
}

void KvOffloadPlan::stores(const ScheduledStep& step, KvOffloadCopies* out) const {
  std::vector<std::pair<int32_t, int32_t>> pairs;  // (host, device)
  for (const ScheduledSeq& s : step.seqs) {
    if (s.end <= s.begin) continue;
    for (int64_t b = s.begin / block_size_; b <= (s.end - 1) / block_size_; ++b) {
      const int32_t h = s.seq->block_table[static_cast<size_t>(b)];
      const int32_t d = where_[static_cast<size_t>(h)];
      STRATA_CHECK(d >= 0);
      pairs.emplace_back(h, d);
    }
  }
  std::sort(pairs.begin(), pairs.end());
  for (auto [h, d] : pairs) {
    out->host.push_back(h);
    out->device.push_back(d);
  }
}

void KvOffloadPlan::advance(bool ran) {
  group_ = static_cast<int32_t>((group_ + 1) % groups_);
  if (ran) region_ = 1 - region_;
}

}  // namespace strata
