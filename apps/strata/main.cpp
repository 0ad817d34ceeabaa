// strata: the command-line front end. One binary, one subcommand per job; each lives in
// cmd_<name>.cpp and registers its options here.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "commands.h"

namespace {

// --tp / --tensor-parallel-size or --ep / --expert-parallel-size N > 1 in one process (not under
// mpirun) may put every rank on one GPU, whose collectives need CUDA's kernels loaded eagerly (and
// plan --calibrate runs two ranks on GPU 0); CUDA
// reads the setting only when it starts, so it is set before anything else (an explicit
// CUDA_MODULE_LOADING wins).
void prefer_eager_kernel_loading_for_tp(int argc, char** argv) {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
    if (std::getenv(v) != nullptr) return;
  }
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], value;
    // plan --calibrate probes a collective between two ranks sharing GPU 0.
    if (a == "--calibrate" || a.rfind("--calibrate=", 0) == 0) value = "2";
    for (const char* flag : {"--tp", "--tensor-parallel-size", "--ep", "--expert-parallel-size",
                             "--dp", "--data-parallel-size"}) {
      const size_t n = std::strlen(flag);
      if (a == flag && i + 1 < argc) value = argv[i + 1];
      if (a.size() > n && a.compare(0, n, flag) == 0 && a[n] == '=') value = a.substr(n + 1);
    }
    if (!value.empty() && std::atoi(value.c_str()) > 1) {
      setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
      return;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  prefer_eager_kernel_loading_for_tp(argc, argv);
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
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string names;
    for (const auto& cmd : commands) {
      known = known || cmd.sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + cmd.sub->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "strata: error: unknown command '%s' (commands: %s)\n", argv[1],
                   names.c_str());
      return 1;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);  // --help: the usage text, exit 0
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Every other command-line error (an unknown flag, a missing value, a value of the wrong
    // type, a flag value strata parsed itself) in the house style: one line, exit 1.
    std::string message = e.what();
    if (const size_t nl = message.find('\n'); nl != std::string::npos) message.resize(nl);
    std::fprintf(stderr, "strata: error: %s\n", message.c_str());
    return 1;
  }
  for (auto& cmd : commands) {
    if (cmd.sub->parsed()) return cmd.run();
  }
  return 1;
}
