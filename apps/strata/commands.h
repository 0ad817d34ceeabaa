// Subcommand registry for the strata binary. Each add_<name>_command adds a CLI11 subcommand
// and a callback that runs it and returns the process exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "strata/status.h"

namespace strata::app {

struct Command {
  CLI::App* sub = nullptr;
  std::function<int()> run;
};

void add_run_command(CLI::App& app, std::vector<Command>& commands);
void add_info_command(CLI::App& app, std::vector<Command>& commands);
void add_chat_command(CLI::App& app, std::vector<Command>& commands);
void add_bench_command(CLI::App& app, std::vector<Command>& commands);
void add_serve_command(CLI::App& app, std::vector<Command>& commands);
void add_bench_serve_command(CLI::App& app, std::vector<Command>& commands);

// Print "strata: error: <message>" to stderr and return exit code 1.
int report(const Status& status);

}  // namespace strata::app
