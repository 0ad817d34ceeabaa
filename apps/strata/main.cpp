// strata: the command-line front end. Subcommands live in cmd_<name>.cpp.
#include <cstdio>

int main(int argc, char** argv) {
  std::fprintf(stderr, "strata: no subcommands yet\n");
  return 1;
}
