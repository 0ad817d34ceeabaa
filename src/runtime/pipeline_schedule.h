// Pipeline parallelism for inference (seed 000, Sec. IV-B): how layers split into stages, and
// the hybrid schedule of micro-batches over them as an explicit, printable object.
//
// Prompt phase: the prompt tokens are cut into M micro-batches, more than there are stages, so
// that the fill and drain bubble ((P - 1) / (M + P - 1) of the stage-ticks) is small; stage s
// runs micro-batch m at tick m + s. Generation phase: as many micro-batches as stages (or more),
// each micro-batch's next token entering stage 0 as soon as its previous token has left the last
// stage; micro-batch m's step j runs on stage s at tick j * max(M, P) + m + s, so with M >= P
// every stage is busy at every tick between fill and drain.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/status.h"

namespace strata {

// Stage boundaries: bounds[s] .. bounds[s + 1] are stage s's layers (bounds.size() == pp + 1).
// `layers` empty: an even split, the first n_layers % pp stages one layer longer (the last stage
// also runs the LM head); else layers[s] layers for stage s (--pp-layers 10,12,10), which must
// be pp positive counts summing to n_layers.
Result<std::vector<int64_t>> pipeline_bounds(int64_t n_layers, int pp,
                                             const std::vector<int64_t>& layers);

// Which stage runs which micro-batch at each tick.
struct PipelineSchedule {
  enum class Phase { kPrompt, kGeneration };
  Phase phase = Phase::kPrompt;
  int stages = 1;
  int micro_batches = 1;
  int steps = 1;  // forward passes per micro-batch (1 for a prompt, tokens for generation)
  // slot[tick][stage] = micro-batch (-1: idle); step[tick][stage] = its step index.
  std::vector<std::vector<int>> slot, step;

  int ticks() const { return static_cast<int>(slot.size()); }
  // Idle stage-ticks over all stage-ticks, every tick costing the same.
  double bubble() const;
  // One line per tick: "t=3 | s0 m1.2 | s1 m0.2 | s2 -", micro-batch m, step j as m<m>.<j>.
  std::string to_string() const;
};

PipelineSchedule prompt_schedule(int stages, int micro_batches);
PipelineSchedule generation_schedule(int stages, int micro_batches, int tokens);

// How many micro-batches a prompt of `tokens` tokens is cut into: enough for a small bubble
// (4 per stage) but none shorter than min_tokens (a GEMM of fewer rows wastes the GPU).
int prompt_micro_batches(int stages, int64_t tokens, int64_t min_tokens);

// The bubble a run measured: 1 - sum(busy seconds of each stage) / (stages * wall seconds).
double measured_bubble(const std::vector<double>& busy_seconds, double wall_seconds);

}  // namespace strata
