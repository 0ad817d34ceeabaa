// `--plan auto|FILE`: the world layout (tensor- and pipeline-parallel sizes, the FFN layout per
// phase) chosen by the cost model of `strata plan` instead of --tp / --pp / --ffn-layout /
// --ffn-gather-min-tokens. Every layout the engine can run (1D weight-stationary FFN, or 2D /
// weight-gathered with in-process tensor-parallel ranks, or weight-gathered prefill with 1D
// decode; head-sharded attention, serial block, no expert / data parallelism, no host streaming)
// is scored by its predicted prefill phase plus its predicted decode phase for the workload, and
// the fastest one that fits wins (strata/plan.h: choose_engine_layout).
#include <cstdio>
#include <fstream>
#include <sstream>

#include "commands.h"
#include "core/env.h"
#include "core/status.h"
#include "runtime/device_runtime.h"
#include "strata/plan.h"

namespace strata::app {

namespace {

// The profile shipped for this GPU, from its name.
std::string profile_for(const std::string& device_name) {
  if (device_name.find("H200") != std::string::npos) return "h200";
  if (device_name.find("A100") != std::string::npos) return "a100";
  return "h100";
}

}  // namespace

Status apply_plan(EngineConfig& e) {
  if (e.plan.empty()) return ok_status();
  if (e.parallel.tp != 1 || e.parallel.pp != 1) {
    return Status(StatusCode::kInvalidArgument,
                  "--plan chooses the tensor- and pipeline-parallel sizes: drop --tp / --pp");
  }
  if (e.parallel.ffn_layout != "1d" || e.parallel.ffn_gather_min_tokens != 0) {
    return Status(StatusCode::kInvalidArgument,
                  "--plan chooses the FFN layout: drop --ffn-layout / --ffn-gather-min-tokens");
  }
  if (!e.device.is_cuda()) {
    return Status(StatusCode::kInvalidArgument,
                  "--plan needs --device cuda (the planner's profiles are GPUs)");
  }
  const int launched = env_config().launcher_size;  // mpirun -np N: the world is fixed
  PlanReport rep;
  if (e.plan == "auto") {
    PlanRequest req;
    req.model_config = e.model_config;
    if (req.model_config.empty()) req.model = e.model;
    const int visible = cuda_device_count() - e.device.index;
    if (launched <= 1 && visible < 1) {
      return errorf(StatusCode::kNotFound, "--plan auto: no CUDA device at index {}",
                    e.device.index);
    }
    req.gpus = launched > 1 ? launched : visible;
    std::string name;
    if (auto rt = DeviceRuntime::create(Device::cuda(e.device.index), false); rt.ok()) {
      name = (*rt)->name();
    }
    req.profile = profile_for(name);
    req.weights = std::string(to_string(e.quantization));
    if (req.weights == "none") req.weights = "bf16";
    req.batch = e.max_num_seqs > 0 ? e.max_num_seqs : 64;
    req.prompt = 512;
    req.gen = 128;
    if (!e.plan_workload.empty()) {
      STRATA_RETURN_IF_ERROR(parse_plan_workload(e.plan_workload, req));
    }
    req.top = 0;
    STRATA_ASSIGN_OR_RETURN(rep, make_plan(req));
  } else {
    if (!e.plan_workload.empty()) {
      return Status(StatusCode::kInvalidArgument,
                    "--plan-workload goes with --plan auto (a plan file has its workload)");
    }
    std::ifstream in(e.plan);
    if (!in) return errorf(StatusCode::kNotFound, "--plan {}: cannot read the file", e.plan);
    std::stringstream ss;
    ss << in.rdbuf();
    STRATA_ASSIGN_OR_RETURN(rep, plan_from_json(ss.str(), "--plan " + e.plan));
  }
  Result<EngineLayoutChoice> chosen =
      choose_engine_layout(rep, launched > 1 ? launched : 0, e.max_num_batched_tokens);
  if (!chosen.ok()) {
    return Status(chosen.status().code(), "--plan " + e.plan + ": " + chosen.status().message());
  }
  const EngineLayoutChoice& best = *chosen;
  e.parallel.tp = static_cast<int>(best.decode.tp);
  e.parallel.pp = static_cast<int>(best.decode.pp);
  if (best.decode.ffn == "2D-WS") {
    e.parallel.ffn_layout = "2d";
    e.parallel.ffn_2d_x = static_cast<int>(best.decode.x);
  } else if (best.decode.ffn == "WG-XYZ") {
    e.parallel.ffn_layout = "weight-gathered";
  }
  e.parallel.ffn_gather_min_tokens = best.gather_min_tokens;
  const std::string gather = best.gather_min_tokens > 0 ? " --ffn-gather-min-tokens " +
                                                              std::to_string(best.gather_min_tokens)
                                                        : std::string();
  if (env_config().launcher_rank <= 0) {
    std::fprintf(stderr,
                 "strata: --plan %s (%s, %lld GPUs, profile %s): --tp %d --pp %d --ffn-layout "
                 "%s%s; predicted prefill %.1f ms (%s), decode %.2f ms/token (%s)\n",
                 e.plan.c_str(), rep.model.c_str(), static_cast<long long>(rep.gpus),
                 rep.profile.c_str(), e.parallel.tp, e.parallel.pp, e.parallel.ffn_layout.c_str(),
                 gather.c_str(), best.prefill.latency_s * 1e3, best.prefill.layout.c_str(),
                 best.decode.latency_s * 1e3, best.decode.layout.c_str());
  }
  return ok_status();
}

}  // namespace strata::app
