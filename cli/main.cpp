// tandem: one binary, one subcommand per capability.
#include <cstdio>
#include <cstring>

#include "cli/commands.h"

namespace {

constexpr const char* kUsage =
    "usage: tandem <command> [flags]\n"
    "\n"
    "commands:\n"
    "  make-model  write a GGUF with deterministic random weights (--preset tiny|small --seed N --out FILE)\n"
    "  run         run a model in-process and print the continuation (--model FILE --prompt TEXT | --tokens 1,2,3)\n"
    "\n"
    "`tandem <command> --help` describes each command's flags.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const char* cmd = argv[1];
  if (!std::strcmp(cmd, "make-model")) return tandem::cli::make_model_command(argc - 2, argv + 2);
  if (!std::strcmp(cmd, "run")) return tandem::cli::run_command(argc - 2, argv + 2);
  std::fprintf(stderr, "tandem: unknown command '%s'\n\n%s", cmd, kUsage);
  return 2;
}
