// tandem-worker: one worker actor as a binary of its own; same flags as `tandem worker`.
#include "cli/commands.h"

int main(int argc, char** argv) { return tandem::cli::worker_command(argc - 1, argv + 1); }
