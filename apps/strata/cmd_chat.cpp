// `strata chat`: an interactive, streaming, multi-turn conversation in the terminal.
// Each line you type is a user turn; the reply streams back. /reset clears the history;
// Ctrl-D (end of input) or /exit quits.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "commands.h"
#include "strata/engine.h"

namespace strata::app {

namespace {

struct ChatOptions {
  EngineConfig engine;
  GenerateRequest request;
  std::string system;
};

}  // namespace

void add_chat_command(CLI::App& app, std::vector<Command>& commands) {
  auto opt = std::make_shared<ChatOptions>();
  CLI::App* sub = app.add_subcommand("chat", "Talk to a model interactively (Ctrl-D quits)");
  sub->add_option("-m,--model", opt->engine.model,
                  "Model: a .gguf file, a Hugging Face checkpoint directory, or an alias")
      ->required();
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
  add_seed_option(sub, opt->request.sampling.seed, "Random seed (default 0)");
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
      {sub, [opt]() -> int {
         if (Status s = check_before_load(opt->engine, &opt->request.sampling); !s.ok())
           return report(s);
         auto engine = Engine::create(opt->engine);
         if (!engine.ok()) return report(engine.status());
         Engine& e = **engine;
         std::vector<ChatMessage> history;
         auto reset = [&] {
           history.clear();
           if (!opt->system.empty()) history.push_back({"system", opt->system});
         };
         reset();
         std::fprintf(stderr, "strata chat: %s — type a message; /reset clears, Ctrl-D quits\n",
                      e.info().path.c_str());
         std::string line;
         uint64_t turn = 0;
         while (true) {
           std::fputs("> ", stdout);
           std::fflush(stdout);
           if (!std::getline(std::cin, line)) break;
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
             return true;
           });
           std::fputc('\n', stdout);
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
