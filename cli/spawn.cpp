#include "cli/spawn.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

namespace tandem::cli {

pid_t spawn(const SpawnOptions& o) {
  std::vector<char*> argv;
  for (const std::string& a : o.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : o.cpus) CPU_SET(cpu, &set);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid != 0) return pid;
  // Child: async-signal-safe calls only until exec.
  if (o.supervised) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
  }
  if (!o.cpus.empty() && sched_setaffinity(0, sizeof(set), &set) != 0) _exit(126);
  if (!o.stdout_path.empty()) {
    const int fd = open(o.stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || dup2(fd, 1) < 0) _exit(127);
  }
  execv(argv[0], argv.data());
  _exit(127);
}

}  // namespace tandem::cli
