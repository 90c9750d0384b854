// Starting a child process: the one place tandem forks and execs (`tandem up`'s children,
// the benches' `tandem up`).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace tandem::cli {

struct SpawnOptions {
  std::vector<std::string> argv;  // argv[0] is the executable's path
  std::vector<int> cpus;          // pinned with sched_setaffinity before exec; empty: not pinned
  std::string stdout_path;        // stdout to this file (created or truncated); empty: inherited
  // Own process group (a terminal's Ctrl-C reaches only the parent, which decides) and
  // SIGKILL when the parent dies.
  bool supervised = true;
};

// fork + exec. Returns the child's pid, or -1 with errno set when fork fails; a child whose
// exec fails exits with status 127 (126: the CPUs could not be set).
pid_t spawn(const SpawnOptions& options);

}  // namespace tandem::cli
