// `strata run`: generate text from a prompt and stream it to stdout.
#include <cstdio>
#include <memory>

#include "commands.h"
#include "strata/engine.h"

namespace strata::app {

namespace {

struct RunOptions {
  EngineConfig engine;
  GenerateRequest request;
  bool quiet = false;
  bool verbose_prompt = false;
  bool offline = false;
  std::string prompt_file;
};

}  // namespace

int report(const Status& status) {
  std::fprintf(stderr, "strata: error: %s\n", status.message().c_str());
  return 1;
}

void add_run_command(CLI::App& app, std::vector<Command>& commands) {
  auto opt = std::make_shared<RunOptions>();
  CLI::App* sub = app.add_subcommand("run", "Generate text from a prompt");
  sub->add_option("-m,--model", opt->engine.model,
                  "Model: a .gguf file, a Hugging Face checkpoint directory, an alias "
                  "(smollm2), or a hub id org/name[@REVISION][:FILE.gguf]")
      ->required();
  add_offline_flag(sub, opt->offline);
  auto* prompt_opt = sub->add_option("-p,--prompt", opt->request.prompt, "Prompt text");
  sub->add_option("-f,--file", opt->prompt_file, "Read the prompt from FILE")->excludes(prompt_opt);
  sub->add_option("-n,--n-predict,--max-tokens", opt->request.max_tokens,
                  "Maximum number of tokens to generate (default 64)");
  sub->add_option("--temp,--temperature", opt->request.sampling.temperature,
                  "Sampling temperature; 0 = greedy (default 0.8)");
  sub->add_option("--top-k", opt->request.sampling.top_k,
                  "Keep the k most likely tokens; 0 = off (default 40)");
  sub->add_option("--top-p", opt->request.sampling.top_p,
                  "Nucleus sampling threshold; 1 = off (default 0.95)");
  sub->add_option("--min-p", opt->request.sampling.min_p,
                  "Drop tokens with p < min_p * p_max; 0 = off (default 0.05)");
  sub->add_option("--repeat-penalty,--repetition-penalty", opt->request.sampling.repetition_penalty,
                  "Penalty for tokens already in the context; 1 = off (default 1)");
  add_engine_device_options(sub, opt->engine);
  auto* seed_opt = add_seed_option(
      sub, opt->request.sampling.seed,
      "Random seed in [0, 2^64) (default: a random one, printed so it can be repeated)");
  add_threads_option(sub, opt->engine.num_threads);
  sub->add_option("-c,--ctx-size,--max-model-len", opt->engine.max_model_len,
                  "Context length; 0 = the model's own (default 0)");
  sub->add_flag("--ignore-eos", opt->request.ignore_eos, "Keep generating past end-of-sequence");
  sub->add_flag("--chat", opt->request.chat,
                "Send the prompt as a user message through the model's chat template");
  sub->add_flag("-q,--quiet", opt->quiet, "Do not print timing statistics to stderr");
  sub->add_flag("--verbose-prompt", opt->verbose_prompt, "Print the prompt's token ids to stderr");
  opt->request.sampling.temperature = 0.8f;
  opt->request.sampling.top_k = 40;
  opt->request.sampling.top_p = 0.95f;
  opt->request.sampling.min_p = 0.05f;

  commands.push_back(
      {sub, [opt, seed_opt]() -> int {
         if (!opt->prompt_file.empty()) {
           auto text = read_prompt_file(opt->prompt_file);
           if (!text.ok()) return report(text.status());
           opt->request.prompt = std::move(*text);
         }
         if (opt->request.prompt.empty()) {
           return report(
               Status(StatusCode::kInvalidArgument, "a prompt is required: -p TEXT or -f FILE"));
         }
         if (Status s = check_before_load(opt->engine, &opt->request.sampling); !s.ok())
           return report(s);
         auto path = resolve_model_arg(opt->engine.model, opt->offline);
         if (!path.ok()) return report(path.status());
         opt->engine.model = *path;
         const bool random_seed_used = seed_opt->count() == 0;
         if (random_seed_used) opt->request.sampling.seed = random_seed();
         auto engine = Engine::create(opt->engine);
         if (!engine.ok()) return report(engine.status());
         Engine& e = **engine;
         const bool printer = e.rank() == 0;
         auto result = e.generate(opt->request, [&](std::string_view piece) {
           if (printer) {
             std::fwrite(piece.data(), 1, piece.size(), stdout);
             std::fflush(stdout);
           }
           return true;
         });
         if (!result.ok()) return report(result.status());
         if (printer && !opt->quiet && random_seed_used) {  // so that -s can repeat the run
           std::fprintf(stderr, "strata: seed %llu\n",
                        static_cast<unsigned long long>(opt->request.sampling.seed));
         }
         if (printer && opt->verbose_prompt) {
           std::fprintf(stderr, "strata: prompt tokens:");
           for (int32_t t : result->prompt_tokens) std::fprintf(stderr, " %d", t);
           std::fprintf(stderr, "\n");
         }
         if (printer) {
           std::fputc('\n', stdout);
           std::fflush(stdout);
           if (!opt->quiet) {
             const auto& r = *result;
             const double pp =
                 r.prefill_seconds > 0 ? r.prompt_tokens.size() / r.prefill_seconds : 0;
             const double tg = r.decode_seconds > 0 ? r.tokens.size() / r.decode_seconds : 0;
             std::fprintf(
                 stderr,
                 "strata: prompt %zu tokens (%.1f tok/s), generated %zu tokens (%.1f tok/s), "
                 "finish: %s\n",
                 r.prompt_tokens.size(), pp, r.tokens.size(), tg, r.finish_reason.c_str());
           }
         }
         return 0;
       }});
}

}  // namespace strata::app
