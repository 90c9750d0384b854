// tandem-scheduler: the scheduler actor as a binary of its own; same flags as `tandem scheduler`.
#include "cli/commands.h"

int main(int argc, char** argv) { return tandem::cli::scheduler_command(argc - 1, argv + 1); }
