// strata: the command-line front end. One binary, one subcommand per job; each lives in
// cmd_<name>.cpp and registers its options here.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"strata: a transformer inference engine"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "strata 0.1.0");
  std::vector<strata::app::Command> commands;
  strata::app::add_run_command(app, commands);
  strata::app::add_chat_command(app, commands);
  strata::app::add_info_command(app, commands);
  strata::app::add_bench_command(app, commands);
  strata::app::add_serve_command(app, commands);
  strata::app::add_bench_serve_command(app, commands);
  strata::app::add_bench_throughput_command(app, commands);
  strata::app::add_plan_command(app, commands);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ValidationError& e) {
    // A flag value strata parsed itself (--device, --quantization, ...): its one-line message.
    std::fprintf(stderr, "strata: error: %s\n", e.what());
    return 1;
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& cmd : commands) {
    if (cmd.sub->parsed()) return cmd.run();
  }
  return 1;
}
