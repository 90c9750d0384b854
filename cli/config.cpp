#include "cli/config.h"

#include <sched.h>

#include <filesystem>
#include <span>
#include <tuple>
#include <toml++/toml.h>

#include "runtime/security.h"

namespace tandem::cli {

namespace {

// Integer keys of [scheduler] and [[workers]] (forwarded as flags): TOML key, flag, range.
struct IntKey {
  const char* key;
  const char* flag;
  int64_t lo, hi;
};
constexpr IntKey kSchedulerKeys[] = {
    {"max_batch_tokens", "max-batch-tokens", 1, 1 << 20}, {"prefill_chunk", "prefill-chunk", 1, 1 << 20},
    {"max_queue", "max-queue", 1, 1 << 24},              {"max_running", "max-running", 1, 1 << 16},
    {"pipeline_depth", "pipeline-depth", 1, 8},          {"heartbeat_ms", "heartbeat-ms", 10, 60000},
    {"client_timeout_ms", "client-timeout-ms", 100, 3600000}, {"worker_liveness", "worker-liveness", 1, 100},
};
constexpr IntKey kWorkerKeys[] = {
    {"kv_memory", "kv-memory", 1 << 20, int64_t{1} << 40}, {"kv_blocks", "kv-blocks", 1, 1 << 24},
    {"block_tokens", "block-tokens", 16, 4096},           {"kv_bits", "kv-bits", 0, 8},
    {"kv_group_size", "kv-group-size", 1, 4096},         {"kv_f32_window", "kv-f32-window", 0, 2},
};

std::string where(const toml::source_region& r) {
  return " (line " + std::to_string(r.begin.line) + ")";
}

Result<int64_t> get_int(const toml::node& n, const std::string& key, int64_t lo, int64_t hi) {
  auto v = n.value<int64_t>();
  if (!n.is_integer() || !v) return Status::invalid(key + ": must be an integer" + where(n.source()));
  if (*v < lo || *v > hi)
    return Status::invalid(key + ": must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                           std::to_string(*v) + where(n.source()));
  return *v;
}

Result<std::string> get_string(const toml::node& n, const std::string& key) {
  if (!n.is_string()) return Status::invalid(key + ": must be a string" + where(n.source()));
  return *n.value<std::string>();
}

Status get_u32(const toml::node& n, const std::string& key, int64_t lo, int64_t hi, uint32_t& out) {
  auto v = get_int(n, key, lo, hi);
  if (!v) return v.status();
  out = static_cast<uint32_t>(*v);
  return Status::ok();
}

const IntKey* find_key(std::span<const IntKey> keys, std::string_view key) {
  for (const IntKey& k : keys)
    if (key == k.key) return &k;
  return nullptr;
}

Status parse_scheduler(const toml::table& t, DeployConfig& c) {
  for (const auto& [k, v] : t) {
    const std::string key = "scheduler." + std::string(k.str());
    const IntKey* ik = find_key(kSchedulerKeys, k.str());
    if (!ik) return Status::invalid(key + ": unknown key" + where(k.source()));
    auto n = get_int(v, key, ik->lo, ik->hi);
    if (!n) return n.status();
    c.scheduler[ik->flag] = std::to_string(*n);
  }
  return Status::ok();
}

Status parse_supervisor(const toml::table& t, Supervision& s) {
  const struct {
    const char* key;
    uint32_t* out;
    int64_t lo, hi;
  } keys[] = {
      {"max_restarts", &s.max_restarts, 0, 1000},
      {"restart_backoff_ms", &s.restart_backoff_ms, 0, 3600000},
      {"restart_backoff_max_ms", &s.restart_backoff_max_ms, 0, 3600000},
      {"healthy_after_ms", &s.healthy_after_ms, 0, 86400000},
      {"drain_timeout_ms", &s.drain_timeout_ms, 0, 86400000},
      {"stop_timeout_ms", &s.stop_timeout_ms, 100, 600000},
      {"ready_timeout_ms", &s.ready_timeout_ms, 100, 3600000},
  };
  for (const auto& [k, v] : t) {
    const std::string key = "supervisor." + std::string(k.str());
    bool known = false;
    for (const auto& d : keys) {
      if (k.str() != d.key) continue;
      known = true;
      TANDEM_RETURN_IF_ERROR(get_u32(v, key, d.lo, d.hi, *d.out));
    }
    if (!known) return Status::invalid(key + ": unknown key" + where(k.source()));
  }
  return Status::ok();
}

Status parse_worker(const toml::table& t, const std::string& prefix, WorkerGroup& g) {
  for (const auto& [k, v] : t) {
    const std::string key = prefix + "." + std::string(k.str());
    const std::string_view name = k.str();
    if (name == "role") {
      auto s = get_string(v, key);
      if (!s) return s.status();
      if (*s != "both" && *s != "prefill" && *s != "decode")
        return Status::invalid(key + ": must be both, prefill or decode, got '" + *s + "'" + where(v.source()));
      g.role = *s;
    } else if (name == "count") {
      TANDEM_RETURN_IF_ERROR(get_u32(v, key, 0, 256, g.count));
    } else if (name == "threads") {
      TANDEM_RETURN_IF_ERROR(get_u32(v, key, 1, 256, g.threads));
    } else if (name == "gemm") {
      auto s = get_string(v, key);
      if (!s) return s.status();
      if (*s != "packed" && *s != "openblas")
        return Status::invalid(key + ": must be packed or openblas, got '" + *s + "'" + where(v.source()));
      g.flags["gemm"] = *s;
    } else if (name == "kv_quant_skip_last_layer") {
      if (!v.is_boolean()) return Status::invalid(key + ": must be true or false" + where(v.source()));
      // A switch: forwarded bare when true (an empty value), not at all when false.
      if (*v.value<bool>()) g.flags["kv-quant-skip-last-layer"] = "";
      else g.flags.erase("kv-quant-skip-last-layer");
    } else if (name == "cpus") {
      const toml::array* a = v.as_array();
      if (!a) return Status::invalid(key + ": must be an array of CPU numbers" + where(v.source()));
      g.cpus.clear();
      for (size_t i = 0; i < a->size(); ++i) {
        auto cpu = get_int(*a->get(i), key + "[" + std::to_string(i) + "]", 0, 4095);
        if (!cpu) return cpu.status();
        g.cpus.push_back(static_cast<int>(*cpu));
      }
    } else if (const IntKey* ik = find_key(kWorkerKeys, name)) {
      auto n = get_int(v, key, ik->lo, ik->hi);
      if (!n) return n.status();
      g.flags[ik->flag] = std::to_string(*n);
    } else {
      return Status::invalid(key + ": unknown key" + where(k.source()));
    }
  }
  return Status::ok();
}

Status parse_top(const toml::table& root, DeployConfig& c) {
  bool workers_seen = false;
  for (const auto& [k, v] : root) {
    const std::string key(k.str());
    std::string* str_field = key == "model"             ? &c.model
                             : key == "endpoint"        ? &c.endpoint
                             : key == "worker_endpoint" ? &c.worker_endpoint
                             : key == "runtime_dir"     ? &c.runtime_dir
                             : key == "log_dir"         ? &c.log_dir
                             : key == "log_level"       ? &c.log_level
                             : key == "curve_keys"      ? &c.curve_keys
                                                        : nullptr;
    if (str_field) {
      auto s = get_string(v, key);
      if (!s) return s.status();
      *str_field = *s;
    } else if (key == "oversubscribe") {
      const auto b = v.value<bool>();
      if (!b) return Status::invalid("oversubscribe: must be true or false" + where(v.source()));
      c.oversubscribe = *b;
    } else if (key == "scheduler" || key == "supervisor") {
      const toml::table* t = v.as_table();
      if (!t) return Status::invalid(key + ": must be a table ([" + key + "])" + where(v.source()));
      TANDEM_RETURN_IF_ERROR(key == "scheduler" ? parse_scheduler(*t, c) : parse_supervisor(*t, c.supervision));
    } else if (key == "workers") {
      const toml::array* a = v.as_array();
      if (!a || !a->is_array_of_tables())
        return Status::invalid("workers: must be an array of tables ([[workers]])" + where(v.source()));
      workers_seen = true;
      c.workers.clear();
      for (size_t i = 0; i < a->size(); ++i) {
        WorkerGroup g;
        TANDEM_RETURN_IF_ERROR(parse_worker(*a->get(i)->as_table(), "workers[" + std::to_string(i) + "]", g));
        c.workers.push_back(std::move(g));
      }
    } else {
      return Status::invalid(key + ": unknown key" + where(k.source()));
    }
  }
  if (!workers_seen) c.workers = {WorkerGroup{}};
  return Status::ok();
}

}  // namespace

const std::set<std::string> kUpFlags = {"config",           "model",           "workers",          "prefill",
                                        "decode",           "endpoint",        "worker-endpoint",  "runtime-dir",
                                        "log-dir",          "log-level",       "ready-timeout-ms", "drain-timeout-ms",
                                        "max-restarts",     "restart-backoff-ms", "curve-keys"};

uint32_t DeployConfig::worker_count() const {
  uint32_t n = 0;
  for (const WorkerGroup& g : workers) n += g.count;
  return n;
}

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return CPU_COUNT(&set);
}

Result<DeployConfig> load_config(const std::string& path) {
  if (!std::filesystem::exists(path)) return Status::invalid("--config: " + path + " does not exist");
  DeployConfig c;
  try {
    const toml::table root = toml::parse_file(path);
    if (Status st = parse_top(root, c); !st) return Status::invalid(path + ": " + st.message());
  } catch (const toml::parse_error& e) {
    return Status::invalid(path + ": not valid TOML: " + std::string(e.description()) + where(e.source()));
  }
  // Relative paths in the file are relative to the file's folder.
  const std::filesystem::path base = std::filesystem::path(path).parent_path();
  for (std::string* p : {&c.model, &c.log_dir, &c.runtime_dir, &c.curve_keys})
    if (!p->empty() && std::filesystem::path(*p).is_relative() && !base.empty()) *p = (base / *p).lexically_normal().string();
  return c;
}

Status apply_flags(const Args& args, const std::set<std::string>& scheduler_flags,
                   const std::set<std::string>& worker_flags, DeployConfig& c) {
  for (auto [flag, field] : {std::pair{"model", &c.model}, {"endpoint", &c.endpoint},
                             {"worker-endpoint", &c.worker_endpoint}, {"runtime-dir", &c.runtime_dir},
                             {"log-dir", &c.log_dir}, {"log-level", &c.log_level},
                             {"curve-keys", &c.curve_keys}})
    if (auto v = args.str(flag)) *field = *v;
  for (const std::string& f : scheduler_flags)
    if (auto v = args.str(f)) c.scheduler[f] = *v;
  Supervision& s = c.supervision;
  for (auto [flag, field, lo, hi] : {std::tuple{"ready-timeout-ms", &s.ready_timeout_ms, 100, 3600000},
                                     {"drain-timeout-ms", &s.drain_timeout_ms, 0, 86400000},
                                     {"max-restarts", &s.max_restarts, 0, 1000},
                                     {"restart-backoff-ms", &s.restart_backoff_ms, 0, 3600000}}) {
    auto v = args.integer(flag, *field, lo, hi);
    if (!v) return v.status();
    *field = static_cast<uint32_t>(*v);
  }
  if (args.has("oversubscribe")) c.oversubscribe = true;
  if (args.has("workers") || args.has("prefill") || args.has("decode")) {
    const WorkerGroup like = c.workers.empty() ? WorkerGroup{} : c.workers.front();
    c.workers.clear();
    for (auto [flag, role] : {std::pair{"workers", "both"}, {"prefill", "prefill"}, {"decode", "decode"}}) {
      if (!args.has(flag)) continue;
      auto n = args.integer(flag, 1, 0, 256);
      if (!n) return n.status();
      WorkerGroup g = like;
      g.role = role;
      g.count = static_cast<uint32_t>(*n);
      g.cpus.clear();  // a pinning list is for the file's worker table, not this one
      c.workers.push_back(std::move(g));
    }
  }
  for (WorkerGroup& g : c.workers) {
    auto threads = args.integer("threads", g.threads, 1, 256);
    if (!threads) return threads.status();
    if (threads.value() != g.threads && !g.cpus.empty())
      return Status::invalid("--threads " + std::to_string(*threads) + " does not fit the workers' cpus list of the config");
    g.threads = static_cast<uint32_t>(*threads);
    for (const std::string& f : worker_flags)
      if (f != "threads")
        if (auto v = args.str(f)) g.flags[f] = *v;
    if (args.has("kv-quant-skip-last-layer")) g.flags["kv-quant-skip-last-layer"] = "";
  }
  return Status::ok();
}

Result<std::string> normalize_endpoint(const std::string& e, const std::string& key) {
  if (e.rfind("ipc://", 0) == 0) {
    if (e.size() == 6) return Status::invalid(key + ": '" + e + "' has no path");
    return e;
  }
  if (e.rfind("tcp://", 0) != 0)
    return Status::invalid(key + ": '" + e + "' must start with ipc:// or tcp://");
  const std::string rest = e.substr(6);
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos) return Status::invalid(key + ": '" + e + "' needs host:port (e.g. tcp://127.0.0.1:5555)");
  const std::string host = rest.substr(0, colon), port = rest.substr(colon + 1);
  if (port != "*") {
    char* end = nullptr;
    const long p = std::strtol(port.c_str(), &end, 10);
    if (port.empty() || *end || p < 1 || p > 65535)
      return Status::invalid(key + ": '" + e + "': port must be 1..65535 or *, got '" + port + "'");
  }
  if (host.empty()) return "tcp://127.0.0.1:" + port;
  return e;
}

Status check_deployment(const DeployConfig& c) {
  if (c.model.empty()) return Status::invalid("model: required (the GGUF file to serve; --model or `model =` in the config)");
  if (!std::filesystem::is_regular_file(c.model)) return Status::invalid("model: " + c.model + " does not exist");
  for (auto [key, value] : {std::pair{"endpoint", &c.endpoint}, {"worker_endpoint", &c.worker_endpoint}})
    if (!value->empty())
      if (auto e = normalize_endpoint(*value, key); !e) return e.status();
  const auto level = c.log_level;
  if (level != "trace" && level != "debug" && level != "info" && level != "warn" && level != "error" && level != "off")
    return Status::invalid("log_level: must be trace, debug, info, warn, error or off, got '" + level + "'");
  if (!c.curve_keys.empty())
    if (auto keys = runtime::load_curve_keys(c.curve_keys, /*need_secret=*/true); !keys)
      return Status::invalid("curve_keys: " + keys.status().message());
  if (c.worker_count() == 0) return Status::invalid("workers: at least one worker is needed");
  const int cores = available_cpus();
  uint32_t threads = 0;
  for (size_t i = 0; i < c.workers.size(); ++i) {
    const WorkerGroup& g = c.workers[i];
    const std::string key = "workers[" + std::to_string(i) + "]";
    threads += g.count * g.threads;
    if (g.cpus.empty()) continue;
    if (g.cpus.size() != size_t{g.count} * g.threads)
      return Status::invalid(key + ".cpus: needs count x threads = " + std::to_string(g.count * g.threads) +
                             " CPUs (each worker is pinned to its threads' share), got " + std::to_string(g.cpus.size()));
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) CPU_SET(0, &allowed);
    for (int cpu : g.cpus)
      if (cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &allowed))
        return Status::invalid(key + ".cpus: CPU " + std::to_string(cpu) + " is not one this process may use (" +
                               std::to_string(cores) + " available)");
  }
  if (threads > static_cast<uint32_t>(cores) && !c.oversubscribe)
    return Status::invalid("workers.threads: the workers ask for " + std::to_string(threads) +
                           " threads in all (count x threads), more than the " + std::to_string(cores) +
                           " cores this process may use (--oversubscribe or oversubscribe = true allows it)");
  uint32_t prefill = 0, decode = 0;
  for (const WorkerGroup& g : c.workers) (g.role == "prefill" ? prefill : g.role == "decode" ? decode : threads) += g.count;
  if ((prefill == 0) != (decode == 0))
    return Status::invalid(std::string("workers: ") + (prefill ? "prefill workers need a decode worker" : "decode workers need a prefill worker") +
                           " (a prefill worker hands every sequence to a decode worker)");
  return Status::ok();
}

}  // namespace tandem::cli
