// Serving: `tandem scheduler`, `tandem worker` (one actor each, what `tandem up` starts)
// and `tandem up` (a one-host deployment: scheduler + N workers as child processes).
#include <signal.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/kv_format_flags.h"
#include "runtime/wire.h"
#include "scheduler/actor.h"
#include "tandem/v1/client.pb.h"
#include "workers/actor.h"

extern char** environ;

namespace tandem::cli {

namespace {

int fail(const char* cmd, const Status& st) {
  std::fprintf(stderr, "tandem %s: %s\n", cmd, st.to_string().c_str());
  return st.code() == Code::kInvalidArgument ? 2 : 1;
}

Status set_log_level(const Args& args) {
  const std::string level = args.str("log-level").value_or("info");
  const auto l = spdlog::level::from_str(level);
  if (l == spdlog::level::off && level != "off")
    return Status::invalid("--log-level must be trace, debug, info, warn, error or off, got '" + level + "'");
  spdlog::set_level(l);
  return Status::ok();
}

// Flags shared by `tandem scheduler` and `tandem up`.
const std::set<std::string> kSchedulerFlags = {"max-batch-tokens", "prefill-chunk", "max-queue", "max-running",
                                               "pipeline-depth", "heartbeat-ms", "client-timeout-ms"};
const std::set<std::string> kWorkerFlags = {"threads", "kv-memory", "kv-blocks", "block-tokens", "gemm",
                                            "kv-bits", "kv-group-size"};
const std::set<std::string>& kWorkerSwitches = kKvFormatSwitches;

Status scheduler_config(const Args& args, scheduler::ActorOptions& o) {
  auto get = [&](const char* flag, uint32_t& out, int64_t lo, int64_t hi) -> Status {
    auto v = args.integer(flag, out, lo, hi);
    if (!v) return v.status();
    out = static_cast<uint32_t>(*v);
    return Status::ok();
  };
  TANDEM_RETURN_IF_ERROR(get("max-batch-tokens", o.core.max_batch_tokens, 1, 1 << 20));
  TANDEM_RETURN_IF_ERROR(get("prefill-chunk", o.core.prefill_chunk, 1, 1 << 20));
  TANDEM_RETURN_IF_ERROR(get("max-queue", o.core.max_queue, 1, 1 << 24));
  TANDEM_RETURN_IF_ERROR(get("max-running", o.core.max_running, 1, 1 << 16));
  TANDEM_RETURN_IF_ERROR(get("pipeline-depth", o.core.pipeline_depth, 1, 8));
  TANDEM_RETURN_IF_ERROR(get("heartbeat-ms", o.heartbeat_ms, 10, 60000));
  TANDEM_RETURN_IF_ERROR(get("client-timeout-ms", o.client_timeout_ms, 100, 3600000));
  return Status::ok();
}

Status worker_config(const Args& args, worker::WorkerOptions& o) {
  auto threads = args.integer("threads", o.threads, 1, 256);
  auto blocks = args.integer("kv-blocks", 0, 0, 1 << 24);
  auto memory = args.integer("kv-memory", static_cast<int64_t>(o.kv_memory), 1 << 20, int64_t{1} << 40);
  auto block_tokens = args.integer("block-tokens", o.block_tokens, 16, 4096);
  for (const Status* st : {&threads.status(), &blocks.status(), &memory.status(), &block_tokens.status()})
    if (!st->is_ok()) return *st;
  o.threads = static_cast<uint32_t>(*threads);
  o.kv_blocks = static_cast<uint32_t>(*blocks);
  o.kv_memory = static_cast<uint64_t>(*memory);
  o.block_tokens = static_cast<uint32_t>(*block_tokens);
  auto kv_format = kv_format_from_flags(args);
  if (!kv_format) return kv_format.status();
  o.kv_format = *kv_format;
  const std::string gemm = args.str("gemm").value_or("packed");
  if (gemm == "openblas") {
    o.gemm = engine::GemmBackend::kOpenBlas;
  } else if (gemm != "packed") {
    return Status::invalid("--gemm must be packed or openblas, got '" + gemm + "'");
  }
  return Status::ok();
}

std::set<std::string> merged(std::initializer_list<std::set<std::string>> sets) {
  std::set<std::string> out;
  for (const auto& s : sets) out.insert(s.begin(), s.end());
  return out;
}

// Asks the scheduler for its status over a short-lived DEALER; nullopt on timeout.
std::optional<v1::StatusReply> query_status(zmq::context_t& ctx, const std::string& endpoint, int timeout_ms) {
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.connect(endpoint);
  v1::ClientMessage m;
  m.set_version(v1::PROTOCOL_VERSION_CURRENT);
  m.mutable_status();
  s.send(runtime::to_frame(m), zmq::send_flags::dontwait);
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms)) <= 0) return std::nullopt;
  zmq::message_t reply;
  if (!s.recv(reply, zmq::recv_flags::dontwait)) return std::nullopt;
  v1::SchedulerReply r;
  if (!runtime::parse_frame(reply, r).is_ok() || !r.has_status()) return std::nullopt;
  return r.status();
}

std::string self_exe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("tandem") : p.string();
}

pid_t spawn(const std::vector<std::string>& argv) {
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0].c_str(), nullptr, nullptr, cargv.data(), environ) != 0) return -1;
  return pid;
}

void forward_flags(const Args& args, const std::set<std::string>& flags, std::vector<std::string>& argv) {
  for (const std::string& f : flags)
    if (auto v = args.str(f)) {
      argv.push_back("--" + f);
      argv.push_back(*v);
    }
}

volatile sig_atomic_t g_stop = 0;
void on_stop_signal(int) { g_stop = 1; }

}  // namespace

int scheduler_command(int argc, char** argv) {
  auto args = Args::parse(argc, argv, merged({kSchedulerFlags, {"model", "client-endpoint", "worker-endpoint", "log-level"}}),
                          {"help"});
  if (!args) return fail("scheduler", args.status());
  if (args->has("help")) {
    std::puts("usage: tandem scheduler --model FILE --client-endpoint E --worker-endpoint E [--max-batch-tokens N]\n"
              "       [--prefill-chunk N] [--max-queue N] [--max-running N] [--pipeline-depth N] [--heartbeat-ms MS]\n"
              "       [--client-timeout-ms MS] [--log-level L]");
    return 0;
  }
  if (Status st = set_log_level(*args); !st) return fail("scheduler", st);
  scheduler::ActorOptions o;
  auto model = args->str("model"), ce = args->str("client-endpoint"), we = args->str("worker-endpoint");
  if (!model || !ce || !we) return fail("scheduler", Status::invalid("--model, --client-endpoint and --worker-endpoint are required"));
  o.model_path = *model;
  o.client_endpoint = *ce;
  o.worker_endpoint = *we;
  if (Status st = scheduler_config(*args, o); !st) return fail("scheduler", st);
  if (Status st = scheduler::run_scheduler(o); !st) return fail("scheduler", st);
  return 0;
}

int worker_command(int argc, char** argv) {
  auto args = Args::parse(argc, argv, merged({kWorkerFlags, {"model", "scheduler", "name", "log-level"}}),
                          merged({kWorkerSwitches, {"help"}}));
  if (!args) return fail("worker", args.status());
  if (args->has("help")) {
    std::puts("usage: tandem worker --model FILE --scheduler E [--threads N] [--kv-memory BYTES | --kv-blocks N]\n"
              "       [--block-tokens N] [--gemm packed|openblas] [--name NAME] [--log-level L]\n"
              "       [--kv-bits 0|8|4] [--kv-group-size 32|64|128] [--kv-quant-skip-last-layer]");
    return 0;
  }
  if (Status st = set_log_level(*args); !st) return fail("worker", st);
  worker::WorkerOptions o;
  auto model = args->str("model"), sched = args->str("scheduler");
  if (!model || !sched) return fail("worker", Status::invalid("--model and --scheduler are required"));
  o.model_path = *model;
  o.scheduler_endpoint = *sched;
  o.name = args->str("name").value_or("");
  if (Status st = worker_config(*args, o); !st) return fail("worker", st);
  if (Status st = worker::run_worker(o); !st) return fail("worker", st);
  return 0;
}

int up_command(int argc, char** argv) {
  auto args = Args::parse(argc, argv,
                          merged({kSchedulerFlags, kWorkerFlags, {"model", "workers", "endpoint", "runtime-dir", "log-level",
                                                                 "ready-timeout-ms"}}),
                          merged({kWorkerSwitches, {"help"}}));
  if (!args) return fail("up", args.status());
  if (args->has("help")) {
    std::puts("usage: tandem up --model FILE [--workers N] [--endpoint E] [--threads T] [--kv-memory BYTES]\n"
              "       [--runtime-dir DIR] [scheduler flags: --max-batch-tokens --prefill-chunk --max-queue ...]\n"
              "       [worker flags: --kv-bits 0|8|4 --kv-group-size N --kv-quant-skip-last-layer ...]\n"
              "Starts a scheduler and N workers (role both) as child processes, prints the client endpoint and a\n"
              "ready line once every worker has registered, and stops all of it on Ctrl-C or SIGTERM.");
    return 0;
  }
  auto model = args->str("model");
  if (!model) return fail("up", Status::invalid("--model FILE is required"));
  if (!std::filesystem::exists(*model)) return fail("up", Status::invalid("--model: " + *model + " does not exist"));
  auto workers = args->integer("workers", 1, 1, 256);
  auto ready_timeout = args->integer("ready-timeout-ms", 120000, 100, 3600000);
  if (!workers) return fail("up", workers.status());
  if (!ready_timeout) return fail("up", ready_timeout.status());
  {  // validate the worker and scheduler flags here, before anything starts
    scheduler::ActorOptions so;
    worker::WorkerOptions wo;
    if (Status st = scheduler_config(*args, so); !st) return fail("up", st);
    if (Status st = worker_config(*args, wo); !st) return fail("up", st);
  }

  // Runtime folder for ipc:// endpoints: private to this user (0700).
  std::string dir = args->str("runtime-dir").value_or("");
  if (dir.empty()) {
    const char* base = std::getenv("XDG_RUNTIME_DIR");
    dir = std::string(base && *base ? base : "/tmp") + "/tandem-" + std::to_string(getuid()) + "-" + std::to_string(getpid());
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || chmod(dir.c_str(), 0700) != 0) return fail("up", Status::invalid("cannot create runtime folder " + dir));
  const std::string client_ep = args->str("endpoint").value_or("ipc://" + dir + "/client.sock");
  const std::string worker_ep = "ipc://" + dir + "/worker.sock";
  const std::string exe = self_exe(), level = args->str("log-level").value_or("info");

  std::vector<std::string> sargv = {exe, "scheduler", "--model", *model, "--client-endpoint", client_ep,
                                    "--worker-endpoint", worker_ep, "--log-level", level};
  forward_flags(*args, kSchedulerFlags, sargv);
  std::vector<pid_t> children;
  const pid_t sched = spawn(sargv);
  if (sched < 0) return fail("up", Status::error(Code::kInternal, "cannot start the scheduler (" + exe + ")"));
  children.push_back(sched);
  for (int64_t i = 0; i < *workers; ++i) {
    std::vector<std::string> wargv = {exe, "worker", "--model", *model, "--scheduler", worker_ep,
                                      "--name", "worker-" + std::to_string(i), "--log-level", level};
    forward_flags(*args, kWorkerFlags, wargv);
    for (const std::string& f : kWorkerSwitches)
      if (args->has(f)) wargv.push_back("--" + f);
    const pid_t w = spawn(wargv);
    if (w < 0) break;
    children.push_back(w);
  }

  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  auto stop_all = [&](int code) {
    for (pid_t p : children) kill(p, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (pid_t p : children) {
      while (waitpid(p, nullptr, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > deadline) {
          kill(p, SIGKILL);
          waitpid(p, nullptr, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    std::filesystem::remove_all(dir, ec);
    std::printf("tandem: stopped\n");
    std::fflush(stdout);
    return code;
  };

  zmq::context_t ctx;
  std::printf("tandem: endpoint %s\n", client_ep.c_str());
  std::fflush(stdout);
  const auto ready_deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(*ready_timeout);
  bool ready = false;
  while (!g_stop) {
    // A worker that exits is reported and the others carry on (the scheduler re-places its
    // sequences); the scheduler exiting, or the last worker, ends the deployment. Restarts
    // with backoff come with supervision (deploy/).
    for (size_t i = 0; i < children.size(); ++i) {
      const pid_t p = children[i];
      int status = 0;
      if (waitpid(p, &status, WNOHANG) != p) continue;
      const bool scheduler_died = p == sched;
      children.erase(children.begin() + static_cast<long>(i));
      std::fprintf(stderr, "tandem up: %s (pid %d) exited (%s %d); %zu workers left\n",
                   scheduler_died ? "the scheduler" : "a worker", p, WIFSIGNALED(status) ? "signal" : "status",
                   WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status),
                   children.size() - (scheduler_died ? 0 : 1));
      if (scheduler_died || children.size() <= 1) return stop_all(1);
      break;
    }
    if (!ready) {
      auto st = query_status(ctx, client_ep, 200);
      if (st && st->workers_size() >= *workers) {
        ready = true;
        std::printf("tandem: ready: %d workers, endpoint %s\n", st->workers_size(), client_ep.c_str());
        std::fflush(stdout);
      } else if (std::chrono::steady_clock::now() > ready_deadline) {
        std::fprintf(stderr, "tandem up: not ready after %lld ms; stopping\n", static_cast<long long>(*ready_timeout));
        return stop_all(1);
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  return stop_all(0);
}

}  // namespace tandem::cli
