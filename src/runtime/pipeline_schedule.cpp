#include "runtime/pipeline_schedule.h"

#include <algorithm>
#include <numeric>

#include "core/status.h"

namespace strata {

Result<std::vector<int64_t>> pipeline_bounds(int64_t n_layers, int pp,
                                             const std::vector<int64_t>& layers) {
  if (pp < 1) return errorf(StatusCode::kInvalidArgument, "--pipeline-parallel-size {}", pp);
  if (pp > n_layers) {
    return errorf(StatusCode::kInvalidArgument,
                  "--pipeline-parallel-size {} is more stages than the model's {} layers", pp,
                  n_layers);
  }
  std::vector<int64_t> bounds(static_cast<size_t>(pp) + 1, 0);
  if (layers.empty()) {
    const int64_t per = n_layers / pp, extra = n_layers % pp;
    for (int s = 0; s < pp; ++s) bounds[s + 1] = bounds[s] + per + (s < extra ? 1 : 0);
    return bounds;
  }
  if (static_cast<int64_t>(layers.size()) != pp) {
    return errorf(StatusCode::kInvalidArgument,
                  "--pp-layers has {} entries for --pipeline-parallel-size {}", layers.size(), pp);
  }
  for (int s = 0; s < pp; ++s) {
    if (layers[s] < 1) {
      return errorf(StatusCode::kInvalidArgument, "--pp-layers: stage {} has {} layers (need >= 1)",
                    s, layers[s]);
    }
    bounds[s + 1] = bounds[s] + layers[s];
  }
  if (bounds.back() != n_layers) {
    return errorf(StatusCode::kInvalidArgument,
                  "--pp-layers sums to {} layers but the model has {}", bounds.back(), n_layers);
  }
  return bounds;
}

namespace {

PipelineSchedule make_schedule(PipelineSchedule::Phase phase, int stages, int micro_batches,
                               int steps) {
  PipelineSchedule s;
  s.phase = phase;
  s.stages = std::max(1, stages);
  s.micro_batches = std::max(0, micro_batches);
  s.steps = std::max(0, steps);
  if (s.micro_batches == 0 || s.steps == 0) return s;
  const int round = std::max(s.micro_batches, s.stages);
  const int ticks = (s.steps - 1) * round + (s.micro_batches - 1) + (s.stages - 1) + 1;
  s.slot.assign(static_cast<size_t>(ticks), std::vector<int>(static_cast<size_t>(s.stages), -1));
  s.step = s.slot;
  for (int j = 0; j < s.steps; ++j) {
    for (int m = 0; m < s.micro_batches; ++m) {
      for (int st = 0; st < s.stages; ++st) {
        const size_t t = static_cast<size_t>(j * round + m + st);
        s.slot[t][static_cast<size_t>(st)] = m;
        s.step[t][static_cast<size_t>(st)] = j;
      }
    }
  }
  return s;
}

}  // namespace

double PipelineSchedule::bubble() const {
  if (slot.empty()) return 0.0;
  int64_t idle = 0;
  for (const auto& row : slot) idle += std::count(row.begin(), row.end(), -1);
  return static_cast<double>(idle) / static_cast<double>(slot.size() * slot[0].size());
}

std::string PipelineSchedule::to_string() const {
  std::string out;
  for (size_t t = 0; t < slot.size(); ++t) {
    out += "t=" + std::to_string(t);
    for (size_t s = 0; s < slot[t].size(); ++s) {
      out += " | s" + std::to_string(s) + " ";
      out += slot[t][s] < 0 ? std::string("-")
                            : "m" + std::to_string(slot[t][s]) + "." + std::to_string(step[t][s]);
    }
    out += "\n";
  }
  return out;
}

PipelineSchedule prompt_schedule(int stages, int micro_batches) {
  return make_schedule(PipelineSchedule::Phase::kPrompt, stages, micro_batches, 1);
}

PipelineSchedule generation_schedule(int stages, int micro_batches, int tokens) {
  return make_schedule(PipelineSchedule::Phase::kGeneration, stages, micro_batches, tokens);
}

int prompt_micro_batches(int stages, int64_t tokens, int64_t min_tokens) {
  if (tokens <= 0) return 0;
  const int64_t by_size = std::max<int64_t>(1, tokens / std::max<int64_t>(1, min_tokens));
  return static_cast<int>(std::min<int64_t>(by_size, int64_t{4} * std::max(1, stages)));
}

double measured_bubble(const std::vector<double>& busy_seconds, double wall_seconds) {
  if (busy_seconds.empty() || wall_seconds <= 0.0) return 0.0;
  const double busy = std::accumulate(busy_seconds.begin(), busy_seconds.end(), 0.0);
  return std::clamp(1.0 - busy / (static_cast<double>(busy_seconds.size()) * wall_seconds), 0.0,
                    1.0);
}

}  // namespace strata
