// `tandem up`'s parent role: starts the scheduler and the workers of a DeployConfig as
// child processes and keeps them running. A worker that exits is restarted with
// exponential backoff (it registers again; the scheduler has already re-placed its
// sequences); one that keeps crashing is given up after `max_restarts` tries. The
// scheduler's death stops the deployment. SIGTERM or SIGINT drains (the scheduler stops
// admitting, finishes or cancels what runs, exits); a second signal stops at once.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cli/config.h"

namespace tandem::cli {

// One child process: what it runs and where.
struct ChildSpec {
  std::string name;               // "scheduler", "worker-0", ...
  std::vector<std::string> argv;  // argv[0] is the executable's path
  std::vector<int> cpus;          // pinned with sched_setaffinity before exec; empty: not pinned
  bool worker = true;             // false: the scheduler (first) or the HTTP gateway (last)
};

struct Endpoints {
  std::string client, worker;
  std::string runtime_dir;  // the private folder of the ipc:// sockets (cli/runtime_dir.h)
  std::string admin;        // ipc:// in the runtime folder: where `tandem drain` goes
};

// The children of `config`: the scheduler first, then every worker, then the HTTP gateway
// when [gateway] has an address, running `exe`.
std::vector<ChildSpec> plan_children(const DeployConfig& config, const Endpoints& endpoints, const std::string& exe);

// Runs the deployment until it is drained or stopped. Prints one line per start, stop and
// restart on stdout ("tandem: ..."). Returns the process exit code: 0 after a drain or a
// clean scheduler exit, 1 when the scheduler died, nothing became ready, or every worker
// was given up. `on_hangup`, if given, runs on each SIGHUP before it is passed on to the
// scheduler (to rewrite the files the scheduler re-reads then).
int supervise(const DeployConfig& config, const Endpoints& endpoints, std::vector<ChildSpec> children,
              std::function<void()> on_hangup = {});

}  // namespace tandem::cli
