// The subcommands of `tandem`. Each takes the arguments after its name and returns the
// process exit code (0 ok, 1 failure, 2 usage error).
#pragma once

namespace tandem::cli {

int make_model_command(int argc, char** argv);
int run_command(int argc, char** argv);
int generate_command(int argc, char** argv);
int status_command(int argc, char** argv);
int scheduler_command(int argc, char** argv);
int worker_command(int argc, char** argv);
int up_command(int argc, char** argv);
int bench_command(int argc, char** argv);
int probe_command(int argc, char** argv);
int drain_command(int argc, char** argv);
int keys_command(int argc, char** argv);
int tokenize_command(int argc, char** argv);
int detokenize_command(int argc, char** argv);
int chat_template_command(int argc, char** argv);
int gateway_command(int argc, char** argv);

}  // namespace tandem::cli
