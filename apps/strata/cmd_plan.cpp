// `strata plan`: rank world layouts (tensor / pipeline / expert / data parallel sizes, FFN and
// attention partitioning) for a model, a hardware profile and a workload with the analytical
// cost model of seed 003. `--calibrate` measures this machine's GPU into a profile JSON.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "commands.h"
#include "strata/plan.h"

namespace strata::app {

namespace {

struct PlanOptions {
  PlanRequest request;
  std::string workload;
  bool json = false;
  std::string calibrate;  // output file
};

}  // namespace

void add_plan_command(CLI::App& app, std::vector<Command>& commands) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* sub = app.add_subcommand(
      "plan", "Rank parallel layouts for a model on a hardware profile (analytical cost model)");
  sub->add_option("--model-config", o->request.model_config,
                  "Model shape by name (llama3-8b, llama3-70b, palm-540b, mixtral-8x7b, ...)");
  sub->add_option("-m,--model", o->request.model,
                  "Model checkpoint: a .gguf file, a Hugging Face directory or an alias");
  sub->add_option("--gpus", o->request.gpus, "Devices to plan for (default 1)");
  sub->add_option("--profile", o->request.profile,
                  "Hardware profile: h100, h200, a100, tpu-v4 or a profile JSON file (default "
                  "h100)");
  sub->add_option("--workload", o->workload,
                  "prompt=N,gen=N,batch=N (default prompt=2048,gen=64,batch=1)");
  sub->add_option("--weights", o->request.weights,
                  "Weight format: bf16, int8 or fp8 (default bf16)");
  sub->add_option("--max-prefill-ms", o->request.max_prefill_ms,
                  "Latency target for the prefill pass; layouts meeting it rank by throughput");
  sub->add_option("--max-decode-ms", o->request.max_decode_ms,
                  "Latency target per generated token; layouts meeting it rank by throughput");
  sub->add_option("--top", o->request.top, "Rows per phase (0 = all; default 10)");
  sub->add_flag("--json", o->json, "Print the plan as JSON");
  sub->add_option("--calibrate", o->calibrate,
                  "Measure this machine's GPU and write a profile JSON to this file (CUDA builds)");
  commands.push_back(
      {sub, [o]() -> int {
         if (!o->calibrate.empty()) {
           auto profile = calibrate_profile(std::filesystem::path(o->calibrate).stem().string());
           if (!profile.ok()) return report(profile.status());
           std::ofstream out(o->calibrate);
           if (!out || !(out << *profile))
             return report(
                 Status(StatusCode::kIoError, "--calibrate: cannot write " + o->calibrate));
           std::printf("wrote %s\n", o->calibrate.c_str());
           return 0;
         }
         if (!o->workload.empty()) {
           Status s = parse_plan_workload(o->workload, o->request);
           if (!s.ok()) return report(s);
         }
         auto plan = make_plan(o->request);
         if (!plan.ok()) return report(plan.status());
         const std::string text = o->json ? plan_to_json(*plan) : format_plan(*plan);
         std::fputs(text.c_str(), stdout);
         return 0;
       }});
}

}  // namespace strata::app
