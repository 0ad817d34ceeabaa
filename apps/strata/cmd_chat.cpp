// `strata chat`: an interactive, streaming, multi-turn conversation in the terminal.
// Each line you type is a user turn; the reply streams back. /reset clears the history;
// Ctrl-D (end of input) or /exit quits. Ctrl-C during a reply stops the reply and returns to the
// prompt (llama-cli's behaviour); Ctrl-C at the prompt quits.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "commands.h"
#include "strata/engine.h"

namespace strata::app {

namespace {

std::atomic<bool> g_interrupted{false};

extern "C" void on_sigint(int) {
  g_interrupted = true;
}

struct ChatOptions {
  EngineConfig engine;
  GenerateRequest request;
  std::string system;
  bool offline = false;
};

}  // namespace

void add_chat_command(CLI::App& app, std::vector<Command>& commands) {
  auto opt = std::make_shared<ChatOptions>();
  CLI::App* sub = app.add_subcommand("chat", "Talk to a model interactively (Ctrl-D quits)");
  sub->add_option("-m,--model", opt->engine.model,
                  "Model: a .gguf file, a Hugging Face checkpoint directory, an alias, or a hub "
                  "id org/name[@REVISION][:FILE.gguf]")
      ->required();
  add_offline_flag(sub, opt->offline);
  sub->add_option("--system", opt->system, "System prompt (default: the template's own)");
  sub->add_option("-n,--n-predict,--max-tokens", opt->request.max_tokens,
                  "Maximum tokens per reply (default 512)");
  sub->add_option("--temp,--temperature", opt->request.sampling.temperature,
                  "Sampling temperature; 0 = greedy (default 0.7)");
  sub->add_option("--top-k", opt->request.sampling.top_k, "Top-k; 0 = off (default 40)");
  sub->add_option("--top-p", opt->request.sampling.top_p, "Top-p; 1 = off (default 0.95)");
  sub->add_option("--min-p", opt->request.sampling.min_p, "Min-p; 0 = off (default 0.05)");
  sub->add_option("--repeat-penalty,--repetition-penalty", opt->request.sampling.repetition_penalty,
                  "Repetition penalty; 1 = off (default 1.1)");
  add_engine_device_options(sub, opt->engine);
  auto* seed_opt = add_seed_option(
      sub, opt->request.sampling.seed,
      "Random seed in [0, 2^64) (default: a random one, printed so it can be repeated)");
  add_threads_option(sub, opt->engine.num_threads);
  sub->add_option("-c,--ctx-size,--max-model-len", opt->engine.max_model_len,
                  "Context length; 0 = the model's own (default 0)");
  opt->request.max_tokens = 512;
  opt->request.sampling.temperature = 0.7f;
  opt->request.sampling.top_k = 40;
  opt->request.sampling.top_p = 0.95f;
  opt->request.sampling.min_p = 0.05f;
  opt->request.sampling.repetition_penalty = 1.1f;
  opt->request.chat = true;

  commands.push_back(
      {sub, [opt, seed_opt]() -> int {
         if (Status s = check_before_load(opt->engine, &opt->request.sampling); !s.ok())
           return report(s);
         auto path = resolve_model_arg(opt->engine.model, opt->offline);
         if (!path.ok()) return report(path.status());
         opt->engine.model = *path;
         const bool random_seed_used = seed_opt->count() == 0;
         if (random_seed_used) opt->request.sampling.seed = random_seed();
         auto engine = Engine::create(opt->engine);
         if (!engine.ok()) return report(engine.status());
         if (random_seed_used) {  // printed, so that the run can be repeated with -s
           std::fprintf(stderr, "strata: seed %llu\n",
                        static_cast<unsigned long long>(opt->request.sampling.seed));
         }
         Engine& e = **engine;
         std::vector<ChatMessage> history;
         auto reset = [&] {
           history.clear();
           if (!opt->system.empty()) history.push_back({"system", opt->system});
         };
         reset();
         std::fprintf(stderr, "strata chat: %s — type a message; /reset clears, Ctrl-D quits\n",
                      e.info().path.c_str());
         // No SA_RESTART: a Ctrl-C at the prompt interrupts the read.
         struct sigaction sa {};
         sa.sa_handler = on_sigint;
         sigemptyset(&sa.sa_mask);
         sigaction(SIGINT, &sa, nullptr);
         std::string line;
         uint64_t turn = 0;
         while (true) {
           std::fputs("> ", stdout);
           std::fflush(stdout);
           g_interrupted = false;
           if (!std::getline(std::cin, line)) break;  // Ctrl-D, or Ctrl-C at the prompt
           if (line == "/exit" || line == "/quit") break;
           if (line == "/reset") {
             reset();
             std::fputs("(history cleared)\n", stdout);
             continue;
           }
           if (line.empty()) continue;
           GenerateRequest req = opt->request;
           req.messages = history;
           req.prompt = line;
           req.sampling.seed = opt->request.sampling.seed + turn++;
           auto result = e.generate(req, [](std::string_view piece) {
             std::fwrite(piece.data(), 1, piece.size(), stdout);
             std::fflush(stdout);
             return !g_interrupted.load();  // Ctrl-C: stop this reply
           });
           std::fputc('\n', stdout);
           if (g_interrupted.exchange(false)) {
             std::fputs("(reply interrupted)\n", stderr);
           } else if (result.ok() && result->finish_reason == "length") {
             if (static_cast<int64_t>(result->tokens.size()) >= req.max_tokens) {
               std::fprintf(stderr, "(reply stopped at -n %lld tokens)\n",
                            static_cast<long long>(req.max_tokens));
             } else {
               std::fputs("(reply stopped at the context length; /reset starts over)\n", stderr);
             }
           }
           if (!result.ok()) {
             // A turn that no longer fits the context: say so, keep the session.
             std::fprintf(stderr, "strata: error: %s\n", result.status().message().c_str());
             continue;
           }
           history.push_back({"user", line});
           history.push_back({"assistant", result->text});
         }
         std::fputc('\n', stdout);
         return 0;
       }});
}

}  // namespace strata::app
