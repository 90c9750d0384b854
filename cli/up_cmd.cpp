// `tandem up`: a one-host deployment, the scheduler and its workers as supervised child
// processes, from a deployment file and/or flags.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/config.h"
#include "cli/scheduler_cmd.h"
#include "cli/supervisor.h"
#include "cli/worker_cmd.h"

namespace tandem::cli {

namespace {

constexpr const char* kUsage =
    "usage: tandem up [--config FILE] [--model FILE] [--workers N | --prefill P --decode D] [flags]";
constexpr const char* kNotes =
    "Starts a scheduler and its workers as child processes and supervises them: a worker that exits is\n"
    "restarted with backoff (given up after --max-restarts crashes in a row). Prints the client endpoint\n"
    "and a ready line once every worker has registered. SIGTERM or Ctrl-C drains (no new requests,\n"
    "running ones finish within --drain-timeout-ms, then are cancelled); a second signal stops at once.\n"
    "Flags override the config file (see deploy/local.toml); every setting has a key there.\n";

std::string self_exe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("tandem") : p.string();
}

// Every child's argv parsed and checked as that child will, before anything starts: a bad
// value fails here whether it came from a flag or from the file.
Status check_children(const std::vector<ChildSpec>& children) {
  for (const ChildSpec& child : children) {
    std::vector<char*> argv;
    for (size_t i = 2; i < child.argv.size(); ++i) argv.push_back(const_cast<char*>(child.argv[i].c_str()));
    const bool is_scheduler = child.argv[1] == "scheduler";
    auto args = Args::parse(static_cast<int>(argv.size()), argv.data(), is_scheduler ? kScheduler : kWorker);
    if (!args) return args.status();
    if (is_scheduler) {
      scheduler::ActorOptions o;
      TANDEM_RETURN_IF_ERROR(scheduler_options_from(*args, o));
    } else {
      worker::WorkerOptions o;
      TANDEM_RETURN_IF_ERROR(worker_options_from(*args, o));
    }
  }
  return Status::ok();
}

}  // namespace

int up_command(int argc, char** argv) {
  auto args = Args::parse(argc, argv, kUp);
  if (!args) return fail("up", args.status());
  if (args->has("help")) {
    std::fputs(help_text(kUp, kUsage, kNotes).c_str(), stdout);
    return 0;
  }
  DeployConfig config;
  if (auto path = args->str("config")) {
    auto loaded = load_config(*path);
    if (!loaded) return fail("up", loaded.status());
    config = std::move(loaded.value());
  }
  if (Status st = apply_flags(*args, config); !st) return fail("up", st);
  if (Status st = check_deployment(config); !st) return fail("up", st);
  if (Status st =
          check_children(plan_children(config, Endpoints{"ipc://client", "ipc://worker", "runtime"}, self_exe()));
      !st)
    return fail("up", st);

  // Runtime folder for ipc:// endpoints: private to this user (0700).
  Endpoints ep;
  std::string dir = config.runtime_dir;
  if (dir.empty()) {
    const char* base = std::getenv("XDG_RUNTIME_DIR");
    dir = std::string(base && *base ? base : "/tmp") + "/tandem-" + std::to_string(getuid()) + "-" +
          std::to_string(getpid());
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || chmod(dir.c_str(), 0700) != 0) return fail("up", Status::invalid("cannot create runtime folder " + dir));
  ep.runtime_dir = dir;
  ep.client =
      config.endpoint.empty() ? "ipc://" + dir + "/client.sock" : *normalize_endpoint(config.endpoint, "endpoint");
  ep.worker = config.worker_endpoint.empty() ? "ipc://" + dir + "/worker.sock"
                                             : *normalize_endpoint(config.worker_endpoint, "worker_endpoint");
  if (!config.log_dir.empty()) {
    std::filesystem::create_directories(config.log_dir, ec);
    if (ec) return fail("up", Status::invalid("log_dir: cannot create " + config.log_dir + ": " + ec.message()));
  }
  return supervise(config, ep, plan_children(config, ep, self_exe()));
}

}  // namespace tandem::cli
