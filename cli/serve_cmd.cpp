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
#include "cli/config.h"
#include "cli/log_file.h"
#include "cli/supervisor.h"
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
                                               "pipeline-depth", "heartbeat-ms", "client-timeout-ms", "prefix-cache",
                                               "handoff-timeout-ms", "client-send-queue", "worker-liveness"};
const std::set<std::string> kWorkerFlags = {"threads", "kv-memory", "kv-blocks", "block-tokens", "gemm",
                                            "kv-bits", "kv-group-size", "kv-f32-window", "test-step-delay-ms"};
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
  TANDEM_RETURN_IF_ERROR(get("handoff-timeout-ms", o.core.handoff_timeout_ms, 10, 3600000));
  TANDEM_RETURN_IF_ERROR(get("client-send-queue", o.client_send_queue, 16, 10000000));
  if (auto cache = args.str("prefix-cache")) {
    if (*cache != "on" && *cache != "off") return Status::invalid("--prefix-cache must be on or off, got '" + *cache + "'");
    o.core.prefix_cache = *cache == "on";
  }
  TANDEM_RETURN_IF_ERROR(get("worker-liveness", o.worker_liveness, 1, 100));
  if (args.has("drain-timeout-ms")) TANDEM_RETURN_IF_ERROR(get("drain-timeout-ms", o.drain_timeout_ms, 0, 86400000));
  return Status::ok();
}

Status worker_config(const Args& args, worker::WorkerOptions& o) {
  auto threads = args.integer("threads", o.threads, 1, 256);
  auto blocks = args.integer("kv-blocks", 0, 0, 1 << 24);
  auto memory = args.integer("kv-memory", static_cast<int64_t>(o.kv_memory), 1 << 20, int64_t{1} << 40);
  auto block_tokens = args.integer("block-tokens", o.block_tokens, 16, 4096);
  auto delay = args.integer("test-step-delay-ms", o.test_step_delay_ms, 0, 10000);
  for (const Status* st : {&threads.status(), &blocks.status(), &memory.status(), &block_tokens.status(), &delay.status()})
    if (!st->is_ok()) return *st;
  o.threads = static_cast<uint32_t>(*threads);
  o.kv_blocks = static_cast<uint32_t>(*blocks);
  o.kv_memory = static_cast<uint64_t>(*memory);
  o.block_tokens = static_cast<uint32_t>(*block_tokens);
  o.test_step_delay_ms = static_cast<uint32_t>(*delay);
  if (auto role = args.str("role")) {
    auto r = worker::parse_role(*role);
    if (!r) return r.status();
    o.role = *r;
  }
  if (auto ep = args.str("kv-endpoint")) o.kv_endpoint = *ep;
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

std::string self_exe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("tandem") : p.string();
}

}  // namespace

int scheduler_command(int argc, char** argv) {
  auto args = Args::parse(argc, argv, merged({kSchedulerFlags, {"model", "client-endpoint", "worker-endpoint", "log-level", "log-file",
                                                                  "drain-timeout-ms", "curve-keys"}}),
                          {"help"});
  if (!args) return fail("scheduler", args.status());
  if (args->has("help")) {
    std::puts("usage: tandem scheduler --model FILE --client-endpoint E --worker-endpoint E [--max-batch-tokens N]\n"
              "       [--prefill-chunk N] [--max-queue N] [--max-running N] [--pipeline-depth N] [--heartbeat-ms MS]\n"
              "       [--client-timeout-ms MS] [--worker-liveness N] [--drain-timeout-ms MS] [--prefix-cache on|off]\n"
              "       [--handoff-timeout-ms MS] [--client-send-queue N (messages queued to a client before its requests\n"
              "       are cancelled)] [--log-level L] [--log-file FILE] [--curve-keys DIR]");
    return 0;
  }
  if (Status st = set_log_level(*args); !st) return fail("scheduler", st);
  if (Status st = log_to_file(*args, "scheduler"); !st) return fail("scheduler", st);
  scheduler::ActorOptions o;
  auto model = args->str("model"), ce = args->str("client-endpoint"), we = args->str("worker-endpoint");
  if (!model || !ce || !we) return fail("scheduler", Status::invalid("--model, --client-endpoint and --worker-endpoint are required"));
  o.model_path = *model;
  o.client_endpoint = *ce;
  o.worker_endpoint = *we;
  o.curve_keys_dir = args->str("curve-keys").value_or("");
  if (Status st = scheduler_config(*args, o); !st) return fail("scheduler", st);
  if (Status st = scheduler::run_scheduler(o); !st) return fail("scheduler", st);
  return 0;
}

int worker_command(int argc, char** argv) {
  auto args = Args::parse(argc, argv, merged({kWorkerFlags, {"model", "scheduler", "name", "log-level", "log-file", "curve-keys",
                                                               "role", "kv-endpoint"}}),
                          merged({kWorkerSwitches, {"help"}}));
  if (!args) return fail("worker", args.status());
  if (args->has("help")) {
    std::puts("usage: tandem worker --model FILE --scheduler E [--threads N] [--kv-memory BYTES | --kv-blocks N]\n"
              "       [--block-tokens N] [--gemm packed|openblas] [--name NAME] [--log-level L] [--log-file FILE]\n"
              "       [--curve-keys DIR] [--role both|prefill|decode] [--kv-endpoint E (decode: where prefill workers\n"
              "       push KV; default tcp://127.0.0.1:*)] [--kv-bits 0|8|4] [--kv-group-size 32|64|128]\n"
              "       [--kv-quant-skip-last-layer] [--kv-f32-window 0|1|2]\n"
              "       [--test-step-delay-ms MS (tests only: sleep before each step, as a slower machine)]");
    return 0;
  }
  if (Status st = set_log_level(*args); !st) return fail("worker", st);
  if (Status st = log_to_file(*args, "worker"); !st) return fail("worker", st);
  worker::WorkerOptions o;
  auto model = args->str("model"), sched = args->str("scheduler");
  if (!model || !sched) return fail("worker", Status::invalid("--model and --scheduler are required"));
  o.model_path = *model;
  o.scheduler_endpoint = *sched;
  o.name = args->str("name").value_or("");
  o.curve_keys_dir = args->str("curve-keys").value_or("");
  if (Status st = worker_config(*args, o); !st) return fail("worker", st);
  if (Status st = worker::run_worker(o); !st) return fail("worker", st);
  return 0;
}

int up_command(int argc, char** argv) {
  auto args = Args::parse(argc, argv, merged({kSchedulerFlags, kWorkerFlags, kUpFlags}), merged({kWorkerSwitches, {"help", "oversubscribe"}}));
  if (!args) return fail("up", args.status());
  if (args->has("help")) {
    std::puts("usage: tandem up [--config FILE] [--model FILE] [--workers N | --prefill P --decode D] [--threads T]\n"
              "       [--kv-memory BYTES] [--endpoint E] [--worker-endpoint E] [--runtime-dir DIR] [--log-dir DIR]\n"
              "       [--drain-timeout-ms MS] [--max-restarts N] [--restart-backoff-ms MS] [--ready-timeout-ms MS]\n"
              "       [--curve-keys DIR (CurveZMQ: DIR/server.key and server.pub, from tandem keys)]\n"
              "       [--oversubscribe (allow more worker threads than cores)]\n"
              "       [worker flags: --kv-bits 0|8|4 --kv-group-size N --kv-quant-skip-last-layer --kv-f32-window N ...]\n"
              "       [scheduler flags: --max-batch-tokens --prefill-chunk --max-queue ...]\n"
              "Starts a scheduler and its workers as child processes and supervises them: a worker that exits is\n"
              "restarted with backoff (given up after --max-restarts crashes in a row). Prints the client endpoint\n"
              "and a ready line once every worker has registered. SIGTERM or Ctrl-C drains (no new requests,\n"
              "running ones finish within --drain-timeout-ms, then are cancelled); a second signal stops at once.\n"
              "Flags override the config file (see deploy/local.toml).");
    return 0;
  }
  DeployConfig config;
  if (auto path = args->str("config")) {
    auto loaded = load_config(*path);
    if (!loaded) return fail("up", loaded.status());
    config = std::move(loaded.value());
  }
  if (Status st = apply_flags(*args, kSchedulerFlags, kWorkerFlags, config); !st) return fail("up", st);
  if (Status st = check_deployment(config); !st) return fail("up", st);
  {  // validate the worker and scheduler flags here, before anything starts
    scheduler::ActorOptions so;
    worker::WorkerOptions wo;
    if (Status st = scheduler_config(*args, so); !st) return fail("up", st);
    if (Status st = worker_config(*args, wo); !st) return fail("up", st);
  }

  // Runtime folder for ipc:// endpoints: private to this user (0700).
  Endpoints ep;
  std::string dir = config.runtime_dir;
  if (dir.empty()) {
    const char* base = std::getenv("XDG_RUNTIME_DIR");
    dir = std::string(base && *base ? base : "/tmp") + "/tandem-" + std::to_string(getuid()) + "-" + std::to_string(getpid());
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || chmod(dir.c_str(), 0700) != 0) return fail("up", Status::invalid("cannot create runtime folder " + dir));
  ep.runtime_dir = dir;
  ep.client = config.endpoint.empty() ? "ipc://" + dir + "/client.sock" : *normalize_endpoint(config.endpoint, "endpoint");
  ep.worker = config.worker_endpoint.empty() ? "ipc://" + dir + "/worker.sock"
                                             : *normalize_endpoint(config.worker_endpoint, "worker_endpoint");
  if (!config.log_dir.empty()) {
    std::filesystem::create_directories(config.log_dir, ec);
    if (ec) return fail("up", Status::invalid("log_dir: cannot create " + config.log_dir + ": " + ec.message()));
  }
  return supervise(config, ep, plan_children(config, ep, self_exe()));
}

}  // namespace tandem::cli
