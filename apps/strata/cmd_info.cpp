// `strata info`: architecture, parameter count, dtype and memory needed, without loading weights.
#include <cstdio>
#include <memory>

#include "commands.h"
#include "strata/engine.h"

namespace strata::app {

namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) {
    b /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f %s", b, units[u]);
  return buf;
}

std::string human_count(double n) {
  char buf[32];
  if (n >= 1e9)
    std::snprintf(buf, sizeof(buf), "%.2fB", n / 1e9);
  else if (n >= 1e6)
    std::snprintf(buf, sizeof(buf), "%.2fM", n / 1e6);
  else if (n >= 1e3)
    std::snprintf(buf, sizeof(buf), "%.2fK", n / 1e3);
  else
    std::snprintf(buf, sizeof(buf), "%.0f", n);
  return buf;
}

}  // namespace

void add_info_command(CLI::App& app, std::vector<Command>& commands) {
  auto model = std::make_shared<std::string>();
  auto ctx = std::make_shared<int64_t>(0);
  auto preset = std::make_shared<std::string>();
  auto offline = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand("info", "Print a model's architecture, size and memory needs");
  sub->add_option("-m,--model", *model,
                  "Model: a .gguf file, a Hugging Face checkpoint directory, an alias, or a hub "
                  "id org/name[@REVISION][:FILE.gguf]");
  add_offline_flag(sub, *offline);
  sub->add_option(
      "--model-config", *preset,
      "Instead of -m: a named model shape (llama3-8b, qwen3-30b-a3b, mixtral-8x7b, ...)");
  sub->add_option("-c,--ctx-size,--max-model-len", *ctx,
                  "Context length for the KV-cache estimate; 0 = the model's own (default 0)");
  auto engine = std::make_shared<EngineConfig>();
  add_weight_residency_options(sub, *engine);
  sub->add_option_function<std::string>(
      "--quantization",
      [engine](const std::string& v) {
        auto q = parse_quantization(v);
        if (!q.ok()) throw CLI::ValidationError(q.status().message());
        engine->quantization = *q;
      },
      "With --gpu-weight-budget: the weight format of the plan (none, int8, fp8)");
  commands.push_back(
      {sub, [model, ctx, preset, offline, engine]() -> int {
         if (model->empty() == preset->empty()) {
           std::fprintf(stderr, "error: strata info needs one of -m/--model or --model-config\n");
           return 2;
         }
         if (!model->empty()) {
           auto path = resolve_model_arg(*model, *offline);
           if (!path.ok()) return report(path.status());
           *model = *path;
         }
         auto info = inspect_model(preset->empty() ? *model : "dummy:" + *preset);
         if (!info.ok()) return report(info.status());
         const ModelInfo& i = *info;
         const int64_t ctx_len = *ctx > 0 ? *ctx : i.context_length;
         const double kv = static_cast<double>(i.kv_bytes_per_token) * static_cast<double>(ctx_len);
         std::printf("model          %s\n", i.path.c_str());
         std::printf("architecture   %s\n", i.architecture.c_str());
         std::printf("parameters     %s (%lld)\n",
                     human_count(static_cast<double>(i.n_params)).c_str(),
                     static_cast<long long>(i.n_params));
         std::printf("dtype          %s\n", i.dtype.c_str());
         std::printf("layers         %lld\n", static_cast<long long>(i.n_layers));
         std::printf("hidden         %lld\n", static_cast<long long>(i.hidden));
         std::printf("heads          %lld (kv %lld, head_dim %lld)\n",
                     static_cast<long long>(i.n_heads), static_cast<long long>(i.n_heads_kv),
                     static_cast<long long>(i.head_dim));
         std::printf("ffn            %lld\n", static_cast<long long>(i.ffn_dim));
         if (i.n_experts > 0) {
           std::printf(
               "experts        %lld, top-k %lld, expert ffn %lld (%lld of %lld layers sparse)\n",
               static_cast<long long>(i.n_experts), static_cast<long long>(i.n_experts_used),
               static_cast<long long>(i.expert_ffn_dim), static_cast<long long>(i.n_moe_layers),
               static_cast<long long>(i.n_layers));
           if (i.shared_expert_ffn_dim > 0) {
             std::printf("shared expert  ffn %lld, sigmoid-gated\n",
                         static_cast<long long>(i.shared_expert_ffn_dim));
           }
           std::printf("active params  %s per token\n",
                       human_count(static_cast<double>(i.n_active_params)).c_str());
         }
         std::printf("vocab          %lld\n", static_cast<long long>(i.vocab));
         std::printf("context        %lld\n", static_cast<long long>(i.context_length));
         std::printf("weights        %s\n",
                     human_bytes(static_cast<double>(i.weight_bytes)).c_str());
         std::printf("kv cache       %s for %lld tokens (f32)\n", human_bytes(kv).c_str(),
                     static_cast<long long>(ctx_len));
         std::printf("memory needed  %s\n",
                     human_bytes(static_cast<double>(i.weight_bytes) + kv).c_str());
         std::printf("tokenizer      %s\n", i.has_tokenizer ? "yes" : "no");
         std::printf("chat template  %s\n", i.has_chat_template ? "yes" : "no");
         std::printf("cpu kernels    %s\n", cpu_kernel_path().c_str());
         if (engine->gpu_weight_budget > 0 || engine->offload_weights != WeightOffload::kAuto) {
           auto plan =
               describe_weight_residency(preset->empty() ? *model : "dummy:" + *preset, *engine);
           if (!plan.ok()) return report(plan.status());
           for (size_t k = 0; k < plan->size(); ++k) {
             std::printf("%s %s\n", k == 0 ? "residency     " : "              ",
                         (*plan)[k].c_str());
           }
         }
         return 0;
       }});
}

}  // namespace strata::app
