// `tandem up`: a one-host deployment, the scheduler and its workers as supervised child
// processes, from a deployment file and/or flags.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "workers/draft_model.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/config.h"
#include "cli/gateway_cmd.h"
#include "cli/runtime_dir.h"
#include "cli/scheduler_cmd.h"
#include "cli/supervisor.h"
#include "cli/worker_cmd.h"
#include "runtime/security.h"
#include "scheduler/registration.h"

namespace tandem::cli {

namespace {

constexpr const char* kUsage =
    "usage: tandem up [--config FILE] [--model FILE] [--workers N | --prefill P --decode D] [flags]";
constexpr const char* kNotes =
    "Starts a scheduler and its workers as child processes and supervises them: a worker that exits is\n"
    "restarted with backoff (given up after --max-restarts crashes in a row). Prints the client endpoint\n"
    "and a ready line once every worker has registered. SIGTERM or Ctrl-C drains (no new requests,\n"
    "running ones finish within --drain-timeout-ms, then are cancelled); a second signal stops at once.\n"
    "SIGHUP re-reads kv_endpoint_allow from the config file and passes the signal on to the scheduler,\n"
    "which re-reads its allow-lists (that one, --worker-keys, --client-keys).\n"
    "--http HOST:PORT (or [gateway] http) also starts the OpenAI-compatible HTTP gateway, restarted as a worker is.\n"
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
    const bool is_scheduler = child.argv[1] == "scheduler", is_gateway = child.argv[1] == "gateway";
    auto args = Args::parse(static_cast<int>(argv.size()), argv.data(),
                            is_scheduler ? kScheduler
                            : is_gateway ? kGateway
                                         : kWorker);
    if (!args) return args.status();
    if (is_gateway) {
      gateway::GatewayOptions o;
      TANDEM_RETURN_IF_ERROR(gateway_options_from(*args, o));
    } else if (is_scheduler) {
      scheduler::ActorOptions o;
      TANDEM_RETURN_IF_ERROR(scheduler_options_from(*args, o));
    } else {
      worker::WorkerOptions o;
      TANDEM_RETURN_IF_ERROR(worker_options_from(*args, o));
      if (auto model = args->str("model")) {
        o.model_path = *model;
        TANDEM_RETURN_IF_ERROR(worker::check_model_options(o));
        if (!o.draft_model_path.empty())
          TANDEM_RETURN_IF_ERROR(workers::check_draft_model_file(*model, o.draft_model_path));
      }
    }
  }
  return Status::ok();
}

// Where the deployment's sockets are: the configured endpoints, or sockets in `dir`.
Endpoints endpoints_in(const DeployConfig& config, const std::string& dir) {
  Endpoints ep;
  ep.runtime_dir = dir;
  ep.client =
      config.endpoint.empty() ? "ipc://" + dir + "/client.sock" : *normalize_endpoint(config.endpoint, "endpoint");
  ep.admin = "ipc://" + dir + "/admin.sock";
  ep.worker = config.worker_endpoint.empty() ? "ipc://" + dir + "/worker.sock"
                                             : *normalize_endpoint(config.worker_endpoint, "worker_endpoint");
  return ep;
}

// The file names of the ipc:// sockets the deployment binds in its runtime folder.
std::vector<std::string> runtime_sockets(const Endpoints& ep, const std::vector<ChildSpec>& children) {
  const std::string prefix = "ipc://" + ep.runtime_dir + "/";
  std::vector<std::string> names;
  auto take = [&](const std::string& e) {
    if (e.rfind(prefix, 0) != 0) return;
    const std::string name = e.substr(prefix.size());
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  };
  take(ep.client);
  take(ep.worker);
  take(ep.admin);
  for (const ChildSpec& c : children)
    for (const std::string& arg : c.argv) take(arg);
  return names;
}

// With CurveZMQ the workers need a key the scheduler lists: KEYS/worker.key (made when missing)
// and, unless worker_keys is set, the allow-list KEYS/workers.allow (made when missing, listing
// it; add remote workers' keys there and SIGHUP the scheduler).
Status prepare_worker_credentials(DeployConfig& c) {
  if (c.curve_keys.empty()) return Status::ok();
  const std::string key = c.curve_keys + "/worker.key";
  std::string pub;
  if (!std::filesystem::exists(key)) {
    auto made = runtime::write_named_key_pair(c.curve_keys, "worker");
    if (!made) return Status::invalid("curve_keys: cannot make the workers' key: " + made.status().message());
    pub = *made;
  } else {
    auto pair = runtime::load_key_pair(key);
    if (!pair) return Status::invalid("curve_keys: " + pair.status().message());
    pub = pair->client_public;
  }
  c.worker_key = key;
  if (c.scheduler.count("worker-keys")) return Status::ok();
  const std::string list = c.curve_keys + "/workers.allow";
  if (!std::filesystem::exists(list)) {
    std::ofstream f(list);
    f << "# Workers the scheduler lets in (tandem keys --out DIR --name NAME prints a line); SIGHUP re-reads.\n"
      << pub << " worker\n";
    f.close();
    if (!f) return Status::invalid("curve_keys: cannot write " + list);
  }
  c.scheduler["worker-keys"] = list;
  return Status::ok();
}

// [scheduler] kv_endpoint_allow (with tandem up's own KV sockets) reaches the scheduler through
// a file in the runtime folder, which SIGHUP rewrites from the config file before the scheduler
// re-reads it: the list reloads with the key allow-lists. Its first line marks it as tandem's:
// a file of that name that is not is never overwritten.
constexpr const char* kKvAllowFile = "kv-endpoint.allow";
constexpr const char* kKvAllowHeader =
    "# tandem up: [scheduler] kv_endpoint_allow and its own KV sockets; rewritten on SIGHUP\n";

// Moves the scheduler's --kv-endpoint-allow (in `argv`) into the file at `path` and gives the
// scheduler --kv-endpoint-allow-file instead.
Status write_kv_allow(const std::string& path, std::vector<std::string>& argv) {
  std::string list;
  if (auto it = std::find(argv.begin(), argv.end(), "--kv-endpoint-allow"); it != argv.end()) {
    list = *(it + 1);
    argv.erase(it, it + 2);
  }
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    std::ifstream in(path);
    std::string first;
    std::getline(in, first);
    if (!S_ISREG(st.st_mode) || first + "\n" != kKvAllowHeader)
      return Status::invalid(path + " exists and is not tandem up's: remove it or use another runtime folder");
  }
  std::ofstream f(path, std::ios::trunc);
  f << kKvAllowHeader;
  for (const std::string& entry : scheduler::split_list(list)) f << entry << "\n";
  f.close();
  if (!f) return Status::invalid("cannot write " + path);
  argv.insert(argv.end(), {"--kv-endpoint-allow-file", path});
  return Status::ok();
}

// The deployment as the config file and the flags describe it now (for SIGHUP).
Result<DeployConfig> reload_config(const Args& args) {
  DeployConfig config;
  if (auto path = args.str("config")) {
    auto loaded = load_config(*path);
    if (!loaded) return loaded.status();
    config = std::move(loaded.value());
  }
  TANDEM_RETURN_IF_ERROR(apply_flags(args, config));
  TANDEM_RETURN_IF_ERROR(check_deployment(config));
  return config;
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
  if (Status st = prepare_worker_credentials(config); !st) return fail("up", st);
  if (Status st = check_children(
          plan_children(config, Endpoints{"ipc://client", "ipc://worker", "runtime", "ipc://admin"}, self_exe()));
      !st)
    return fail("up", st);

  if (!config.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(config.log_dir, ec);
    if (ec) return fail("up", Status::invalid("log_dir: cannot create " + config.log_dir + ": " + ec.message()));
  }
  const Endpoints probe = endpoints_in(config, config.runtime_dir);
  auto runtime = RuntimeDir::open(config.runtime_dir, runtime_sockets(probe, plan_children(config, probe, self_exe())));
  if (!runtime) return fail("up", runtime.status());
  const Endpoints ep = endpoints_in(config, runtime->path());
  std::vector<ChildSpec> children = plan_children(config, ep, self_exe());
  const std::vector<std::string> sockets = runtime_sockets(ep, children);
  const std::string kv_allow = runtime->path() + "/" + kKvAllowFile;
  if (Status st = write_kv_allow(kv_allow, children[0].argv); !st) {
    runtime->remove(sockets);
    return fail("up", st);
  }
  const int code = supervise(config, ep, std::move(children), [&] {
    auto fresh = reload_config(*args);
    std::vector<ChildSpec> now = fresh ? plan_children(*fresh, ep, self_exe()) : std::vector<ChildSpec>{};
    Status st = fresh ? write_kv_allow(kv_allow, now[0].argv) : fresh.status();
    if (!st)
      std::fprintf(stderr, "tandem: SIGHUP: %s; the kv_endpoint allow-list in force stays\n", st.message().c_str());
  });
  ::unlink(kv_allow.c_str());
  runtime->remove(sockets);
  return code;
}

}  // namespace tandem::cli
