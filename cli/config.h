// The deployment `tandem up` runs: parsed from a TOML file (`--config`), from flags, or
// both (flags override the file). Validated completely before anything starts: every
// error names the TOML key or the flag it came from.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cli/args.h"
#include "runtime/status.h"

namespace tandem::cli {

// One `[[workers]]` table: `count` worker processes alike.
struct WorkerGroup {
  std::string role = "both";  // both | prefill | decode
  uint32_t count = 1;
  uint32_t threads = 1;
  std::vector<int> cpus;  // empty: no pinning; else count x threads CPUs, worker k gets its threads' share
  // The other [[workers]] settings, forwarded as flags (flag name without "--" -> value; an
  // empty value is a switch that is on): kv-memory, kv-bits, ... (cli/flags.h).
  std::map<std::string, std::string> flags;
};

struct Supervision {
  uint32_t max_restarts = 5;          // consecutive crashes of one worker before it is given up
  uint32_t restart_backoff_ms = 500;  // delay before the first restart, doubled per consecutive crash
  uint32_t restart_backoff_max_ms = 10000;
  uint32_t healthy_after_ms = 30000;  // a worker up this long has its crash count reset
  uint32_t drain_timeout_ms = 30000;  // SIGTERM: running requests get this long to finish
  uint32_t stop_timeout_ms = 5000;    // then SIGTERM → SIGKILL grace for every child
  uint32_t ready_timeout_ms = 120000;
};

struct DeployConfig {
  std::string model;
  std::string endpoint;         // clients; empty: ipc:// in the runtime folder
  std::string worker_endpoint;  // workers; empty: ipc:// in the runtime folder
  std::string runtime_dir;      // empty: a new $XDG_RUNTIME_DIR (or /tmp)/tandem-<uid>-XXXXXX (cli/runtime_dir.h)
  std::string log_dir;          // empty: children log to this process's stderr
  std::string log_level = "info";
  std::string curve_keys;  // CurveZMQ key folder (tandem keys --out DIR); empty: none
  // The workers' secret key (--worker-key): set by `tandem up` from curve_keys, not a setting.
  std::string worker_key;
  std::map<std::string, std::string> scheduler;  // [scheduler] settings: flag (max-queue, ...) -> value
  // [gateway] settings: `tandem up` flag (http, model-name, ...) -> value; the gateway runs
  // when "http" (its HOST:PORT) is set.
  std::map<std::string, std::string> gateway;
  Supervision supervision;
  std::vector<WorkerGroup> workers = {WorkerGroup{}};
  // More worker threads than cores is refused unless this is set (tests and benchmarks on
  // small machines; compute then time-slices).
  bool oversubscribe = false;

  uint32_t worker_count() const;
};

// Parses a TOML file. Unknown keys, wrong types, out-of-range values, a bad endpoint,
// CPUs this machine does not have: an error naming the key (e.g. "workers[1].threads").
[[nodiscard]] Result<DeployConfig> load_config(const std::string& path);

// Applies `tandem up` flags on top of `config` (flags win). --workers N replaces the
// worker tables by one of N workers of role both; --prefill P / --decode D by P prefill and
// D decode workers; --threads and the worker flags apply to every worker table.
// Every setting is a row of the flag table (cli/flags.h) with its TOML key; a flag is
// checked against its row as the file's value is.
[[nodiscard]] Status apply_flags(const Args& args, DeployConfig& config);

// Checks what only the whole deployment can tell: the model exists, the endpoints are
// valid, the workers' threads fit this machine's cores, pinned CPUs exist.
[[nodiscard]] Status check_deployment(const DeployConfig& config);

// tcp://:PORT (no address) becomes tcp://127.0.0.1:PORT: a service is on the network only
// when an address (or the wildcard *) is given. Errors name `key`: not ipc:// or tcp://, an
// empty ipc path, a tcp endpoint without host:port, a port out of range.
[[nodiscard]] Result<std::string> normalize_endpoint(const std::string& endpoint, const std::string& key);

// CPUs this process may run on (sched_getaffinity).
int available_cpus();

}  // namespace tandem::cli
