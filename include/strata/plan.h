// `strata plan`: the analytical cost model of seed 003 over a model, a hardware profile and a
// workload, as a ranked list of world layouts per phase. The model itself lives in src/planner/
// (no GPU needed); this is the small surface the apps layer uses.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/status.h"

namespace strata {

struct PlanRequest {
  std::string model_config;  // a shape preset (llama3-8b, palm-540b, mixtral-8x7b, ...)
  std::string model;         // or a checkpoint: HF directory, .gguf file or alias
  int64_t gpus = 1;
  std::string profile = "h100";  // h100 | h200 | a100 | tpu-v4 | a profile JSON file
  int64_t batch = 1;
  int64_t prompt = 2048;
  int64_t gen = 64;
  std::string weights = "bf16";  // bf16 | int8 | fp8
  double max_prefill_ms = 0;     // latency targets; 0 = none
  double max_decode_ms = 0;      // per generated token
  int64_t top = 10;              // rows per phase (0 = all)
};

struct PlanRow {
  std::string layout;  // e.g. "tp8 2D-WS attn:batch"
  int64_t tp = 1, pp = 1, ep = 1, dp = 1;
  std::string ffn;        // 1D-WS, 2D-WS, WG-X, WG-XY, WG-XYZ
  std::string attention;  // heads | batch
  bool parallel_block = false;
  bool host_streamed = false;
  int64_t x = 1, yz = 1;  // the 2D split of the tp group (E over X, F over YZ)
  double latency_s = 0;   // prefill: the pass; decode: per token (one step)
  double phase_s = 0;     // the whole phase (decode: all gen steps)
  double tokens_per_s = 0;
  double mfu = 0;
  double memory_per_device = 0;  // bytes: weights + KV + activations
  double weight_bytes = 0, kv_bytes = 0;
  double compute_s = 0, memory_s = 0, comm_s = 0, host_s = 0;  // per step, critical path
  double bubble = 0;                                           // pipeline bubble fraction
  std::string bottleneck;  // compute | memory | communication | host link
  bool fits = true;
  bool meets_target = true;
  // Weight-gathered prefill rows (WG-XYZ): the fewest tokens in one step at which this layout's
  // FFN is predicted faster than 1D weight-stationary's on the same ranks (0: at no size up to
  // 2^20), the engine's --ffn-gather-min-tokens when it runs 1D decode and this prefill.
  int64_t gather_min_tokens = 0;
};

struct PhasePlan {
  std::string phase;  // "prefill" | "decode"
  int64_t considered = 0;
  std::vector<PlanRow> rows;
};

struct PlanReport {
  std::string model;
  double n_params = 0, n_active_params = 0;
  std::string profile, profile_source;
  int64_t gpus = 1, batch = 1, prompt = 0, gen = 0;
  std::string weights;
  std::vector<PhasePlan> phases;
  double plan_seconds = 0;  // time the search took
  // make_plan: what `--plan` would run with ranks in one process (choose_engine_layout over
  // every row, before --top cuts them), as flags and predictions; empty when none runs.
  std::string engine_layout;
};

Result<PlanReport> make_plan(const PlanRequest& request);
std::string format_plan(const PlanReport& report);  // the ranked tables, for a terminal
std::string plan_to_json(const PlanReport& report);

// A plan read back from plan_to_json's text (`what` names it in errors: "--plan FILE").
Result<PlanReport> plan_from_json(const std::string& text, const std::string& what);

// The layout the engine runs for a plan (`--plan`): head-sharded attention, tensor and pipeline
// parallel, no expert / data parallelism and no host streaming, with 1D weight-stationary FFNs,
// or (dense models, bf16 weights, tensor parallel only, ranks in one process) the 2D
// weight-stationary or weight-gathered FFN in both phases, or the seed's pair: weight-gathered
// prefill and 1D decode (--ffn-gather-min-tokens). Among those that fit, the (tp, pp, FFN
// layouts) whose best prefill row plus best decode row predict the shortest phases wins; one
// with another FFN than 1D in both phases only when at least 5% shorter than the best 1D one.
// world > 0: an mpirun world of that many GPU processes (tp x pp = world; 1D only).
// max_step_tokens > 0: the engine's largest step (--max-num-batched-tokens); the pair is taken
// only when its weight-gathered prefill starts at a step size the engine reaches.
struct EngineLayoutChoice {
  PlanRow prefill, decode;        // the rows the choice rests on (same tp and pp)
  int64_t gather_min_tokens = 0;  // > 0: 1D decode, weight-gathered prefill from this step size
};
Result<EngineLayoutChoice> choose_engine_layout(const PlanReport& report, int world,
                                                int64_t max_step_tokens = 0);

// `--workload prompt=2048,gen=64,batch=64`: keys prompt, gen, batch in any order (each optional).
Status parse_plan_workload(const std::string& text, PlanRequest& request);

// Measure this machine's GPU (GEMMs of several shapes, HBM and host-to-device copies, attention)
// and return a profile JSON with measured curves. kUnimplemented without the CUDA backend.
Result<std::string> calibrate_profile(const std::string& name);

}  // namespace strata
