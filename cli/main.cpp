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
    "  generate    send one request to a running service and stream the tokens (--endpoint E --prompt TEXT)\n"
    "  status      show a running service's workers, queue and totals (--endpoint E)\n"
    "  bench       load-test tandem or an OpenAI-compatible server (--endpoint E | --openai-url URL --model M)\n"
    "  up          start a supervised one-host deployment: scheduler + workers (--config FILE | --model FILE)\n"
    "  drain       stop a service gracefully: no new requests, finish or cancel the running ones (--endpoint E)\n"
    "  keys        make a CurveZMQ key pair for tcp:// across hosts (--out DIR)\n"
    "  probe       liveness / readiness check for scripts: exit 0 or 1 (--endpoint E [--ready])\n"
    "  tokenize    text -> token ids with a model's vocabulary (--model FILE --text T [--json])\n"
    "  detokenize  token ids -> text, exactly (--model FILE --ids 1,2,3)\n"
    "  chat-template  render a conversation with a chat template (--model FILE | --template F --messages JSON)\n"
    "  gateway     serve the OpenAI API over HTTP in front of a running service (--endpoint E --model FILE)\n"
    "  scheduler   run the scheduler actor alone (what `up` starts)\n"
    "  worker      run one worker actor alone (what `up` starts)\n"
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
  if (!std::strcmp(cmd, "generate")) return tandem::cli::generate_command(argc - 2, argv + 2);
  if (!std::strcmp(cmd, "status")) return tandem::cli::status_command(argc - 2, argv + 2);
  if (!std::strcmp(cmd, "bench")) return tandem::cli::bench_command(argc - 2, argv + 2);
  if (!std::strcmp(cmd, "up")) return tandem::cli::up_command(argc - 2, argv + 2);
  if (!std::strcmp(cmd, "drain")) return tandem::cli::drain_command(argc - 2, argv + 2);
  if (!std::strcmp(cmd, "keys")) return tandem::cli::keys_command(argc - 2, argv + 2);
  if (!std::strcmp(cmd, "probe")) return tandem::cli::probe_command(argc - 2, argv + 2);
  if (!std::strcmp(cmd, "tokenize")) return tandem::cli::tokenize_command(argc - 2, argv + 2);
  if (!std::strcmp(cmd, "detokenize")) return tandem::cli::detokenize_command(argc - 2, argv + 2);
  if (!std::strcmp(cmd, "chat-template")) return tandem::cli::chat_template_command(argc - 2, argv + 2);
  if (!std::strcmp(cmd, "gateway")) return tandem::cli::gateway_command(argc - 2, argv + 2);
  if (!std::strcmp(cmd, "scheduler")) return tandem::cli::scheduler_command(argc - 2, argv + 2);
  if (!std::strcmp(cmd, "worker")) return tandem::cli::worker_command(argc - 2, argv + 2);
  std::fprintf(stderr, "tandem: unknown command '%s'\n\n%s", cmd, kUsage);
  return 2;
}
