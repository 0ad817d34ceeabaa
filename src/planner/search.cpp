// Layout search: every way to split `devices` chips into tp x pp x ep x dp, each FFN layout and
// attention sharding the tp group allows, costed and ranked per phase.
#include <algorithm>
#include <string>
#include <vector>

#include "core/status.h"
#include "planner/planner.h"

namespace strata::planner {

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

}  // namespace

Result<std::vector<RankedLayout>> rank_layouts(const ModelShape& s, const HardwareProfile& hw,
                                               int64_t devices, const PhaseWorkload& work,
                                               const SearchOptions& options) {
  if (devices < 1 || devices > 4096)
    return errorf(StatusCode::kInvalidArgument, "--gpus {}: expected 1..4096", devices);
  std::vector<RankedLayout> out;
  const BlockKind block = s.parallel_block ? BlockKind::kParallel : BlockKind::kSerial;
  for (int64_t tp : divisors(devices)) {
    for (int64_t pp : divisors(devices / tp)) {
      if (pp > s.n_layers) continue;
      for (int64_t ep : divisors(devices / tp / pp)) {
        if (ep > 1 && (!s.is_moe() || s.n_experts % ep != 0)) continue;
        const int64_t dp = devices / tp / pp / ep;
        std::vector<FfnLayout> ffns = {FfnLayout::k1DWeightStationary};
        if (tp > 1) {
          if (has_2d_split(tp)) ffns.push_back(FfnLayout::k2DWeightStationary);
          ffns.push_back(FfnLayout::kWeightGatheredXYZ);
          if (tp >= 8) {
            ffns.push_back(FfnLayout::kWeightGatheredX);
            ffns.push_back(FfnLayout::kWeightGatheredXY);
          }
        }
        std::vector<AttentionSharding> attns = {AttentionSharding::kHeads};
        if (tp > 1) attns.push_back(AttentionSharding::kBatch);
        for (FfnLayout ffn : ffns) {
          for (AttentionSharding attn : attns) {
            if (attn == AttentionSharding::kHeads && s.n_heads % tp != 0) continue;
            for (WeightResidency res : {WeightResidency::kDevice, WeightResidency::kHostStreamed}) {
              if (res == WeightResidency::kHostStreamed && !options.allow_host_streaming) continue;
              Layout l;
              l.tp = tp;
              l.pp = pp;
              l.ep = ep;
              l.dp = dp;
              l.ffn = ffn;
              l.attention = attn;
              l.block = block;
              l.residency = res;
              auto e = estimate(s, hw, l, work);
              if (!e.ok()) return e.status();
              RankedLayout r{l, *e, true};
              const double latency = work.phase == Phase::kPrefill ? e->seconds : e->step_seconds;
              r.meets_target = options.max_latency_s <= 0.0 || latency <= options.max_latency_s;
              out.push_back(r);
            }
          }
        }
      }
    }
  }
  // Host streaming is listed only where the weights do not fit on the devices.
  std::vector<RankedLayout> kept;
  for (const RankedLayout& r : out) {
    if (r.layout.residency == WeightResidency::kHostStreamed) {
      bool device_fits = false;
      for (const RankedLayout& o : out) {
        if (o.layout.residency == WeightResidency::kDevice && o.layout.tp == r.layout.tp &&
            o.layout.pp == r.layout.pp && o.layout.ep == r.layout.ep &&
            o.layout.ffn == r.layout.ffn && o.layout.attention == r.layout.attention &&
            o.estimate.fits)
          device_fits = true;
      }
      if (device_fits) continue;
    }
    kept.push_back(r);
  }
  const bool by_throughput = options.max_latency_s > 0.0;
  auto latency = [&](const RankedLayout& r) {
    return work.phase == Phase::kPrefill ? r.estimate.seconds : r.estimate.step_seconds;
  };
  std::stable_sort(kept.begin(), kept.end(), [&](const RankedLayout& a, const RankedLayout& b) {
    if (a.estimate.fits != b.estimate.fits) return a.estimate.fits;
    if (a.meets_target != b.meets_target) return a.meets_target;
    if (by_throughput && a.estimate.tokens_per_s != b.estimate.tokens_per_s)
      return a.estimate.tokens_per_s > b.estimate.tokens_per_s;
    return latency(a) < latency(b);
  });
  return kept;
}

}  // namespace strata::planner
