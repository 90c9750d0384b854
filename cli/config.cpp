#include "cli/config.h"

#include <sched.h>

#include <filesystem>
#include <span>
#include <tuple>
#include <toml++/toml.h>

#include "runtime/security.h"

namespace tandem::cli {

namespace {

std::string where(const toml::source_region& r) { return " (line " + std::to_string(r.begin.line) + ")"; }

Result<int64_t> get_int(const toml::node& n, const std::string& key, int64_t lo, int64_t hi) {
  auto v = n.value<int64_t>();
  if (!n.is_integer() || !v) return Status::invalid(key + ": must be an integer" + where(n.source()));
  if (*v < lo || *v > hi)
    return Status::invalid(key + ": must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                           std::to_string(*v) + where(n.source()));
  return *v;
}

// A file value as the text its flag would take: integers in the row's range, strings among
// its choices, booleans for switches ("1" / ""). Errors name `key`.
Result<std::string> value_text(const Flag& f, const toml::node& n, const std::string& key) {
  switch (f.type) {
    case FlagType::kInt: {
      auto v = get_int(n, key, f.lo, f.hi);
      if (!v) return v.status();
      return std::to_string(*v);
    }
    case FlagType::kSwitch: {
      if (!n.is_boolean()) return Status::invalid(key + ": must be true or false" + where(n.source()));
      return std::string(*n.value<bool>() ? "1" : "");
    }
    case FlagType::kIntList: {
      const toml::array* a = n.as_array();
      if (!a) return Status::invalid(key + ": must be an array of integers" + where(n.source()));
      std::string out;
      for (size_t i = 0; i < a->size(); ++i) {
        auto v = get_int(*a->get(i), key + "[" + std::to_string(i) + "]", f.lo, f.hi);
        if (!v) return v.status();
        out += (i ? "," : "") + std::to_string(*v);
      }
      return out;
    }
    default: {
      if (!n.is_string()) return Status::invalid(key + ": must be a string" + where(n.source()));
      std::string s = *n.value<std::string>();
      if (f.type == FlagType::kChoice && !check_value(f, s))
        return Status::invalid(key + ": must be " + choices_text(f.choices) + ", got '" + s + "'" + where(n.source()));
      return s;
    }
  }
}

// The fields of DeployConfig that top-level keys and [supervisor] keys set, by flag name.
std::string* top_field(DeployConfig& c, std::string_view name) {
  return name == "model"             ? &c.model
         : name == "endpoint"        ? &c.endpoint
         : name == "worker-endpoint" ? &c.worker_endpoint
         : name == "runtime-dir"     ? &c.runtime_dir
         : name == "log-dir"         ? &c.log_dir
         : name == "log-level"       ? &c.log_level
         : name == "curve-keys"      ? &c.curve_keys
                                     : nullptr;
}

uint32_t* supervision_field(Supervision& s, std::string_view name) {
  return name == "max-restarts"             ? &s.max_restarts
         : name == "restart-backoff-ms"     ? &s.restart_backoff_ms
         : name == "restart-backoff-max-ms" ? &s.restart_backoff_max_ms
         : name == "healthy-after-ms"       ? &s.healthy_after_ms
         : name == "drain-timeout-ms"       ? &s.drain_timeout_ms
         : name == "stop-timeout-ms"        ? &s.stop_timeout_ms
         : name == "ready-timeout-ms"       ? &s.ready_timeout_ms
                                            : nullptr;
}

// Sets the setting of row `f` to `value` (flag text) in `c` (top level, [scheduler],
// [supervisor]) or in `g` ([[workers]]).
Status set_setting(const Flag& f, const std::string& value, DeployConfig& c, WorkerGroup* g) {
  const std::string name(f.name);
  switch (f.section) {
    case Section::kTop:
      if (name == "oversubscribe")
        c.oversubscribe = !value.empty();
      else if (std::string* field = top_field(c, name))
        *field = value;
      else
        return Status::error(Code::kInternal, "--" + name + ": no field for this top-level key");
      return Status::ok();
    case Section::kScheduler: c.scheduler[name] = value; return Status::ok();
    case Section::kGateway: c.gateway[name] = value; return Status::ok();
    case Section::kSupervisor:
      if (uint32_t* field = supervision_field(c.supervision, name))
        *field = static_cast<uint32_t>(std::stoul(value));
      else
        return Status::error(Code::kInternal, "--" + name + ": no field for this [supervisor] key");
      return Status::ok();
    case Section::kWorkers:
      if (f.toml_key == "count")
        g->count = static_cast<uint32_t>(std::stoul(value));
      else if (f.toml_key == "threads")
        g->threads = static_cast<uint32_t>(std::stoul(value));
      else if (f.toml_key == "role")
        g->role = value;
      else if (f.toml_key == "cpus") {
        g->cpus.clear();
        for (size_t i = 0; i < value.size();) {
          size_t j = value.find(',', i);
          if (j == std::string::npos) j = value.size();
          g->cpus.push_back(std::stoi(value.substr(i, j - i)));
          i = j + 1;
        }
      } else if (f.type == FlagType::kSwitch) {
        // Forwarded bare when on (an empty value), not at all when off.
        if (value.empty())
          g->flags.erase(name);
        else
          g->flags[name] = "";
      } else {
        g->flags[name] = value;
      }
      return Status::ok();
    case Section::kNone: break;
  }
  return Status::error(Code::kInternal, "--" + name + " is not a deployment setting");
}

Status parse_table(const toml::table& t, Section section, const std::string& prefix, DeployConfig& c, WorkerGroup* g) {
  for (const auto& [k, v] : t) {
    const std::string key = prefix + std::string(k.str());
    const Flag* f = find_toml_key(section, k.str());
    if (!f) return Status::invalid(key + ": unknown key" + where(k.source()));
    auto text = value_text(*f, v, key);
    if (!text) return text.status();
    TANDEM_RETURN_IF_ERROR(set_setting(*f, *text, c, g));
  }
  return Status::ok();
}

Status parse_top(const toml::table& root, DeployConfig& c) {
  bool workers_seen = false;
  for (const auto& [k, v] : root) {
    const std::string key(k.str());
    if (key == "scheduler" || key == "supervisor" || key == "gateway") {
      const toml::table* t = v.as_table();
      if (!t) return Status::invalid(key + ": must be a table ([" + key + "])" + where(v.source()));
      const Section section = key == "scheduler"    ? Section::kScheduler
                              : key == "supervisor" ? Section::kSupervisor
                                                    : Section::kGateway;
      TANDEM_RETURN_IF_ERROR(parse_table(*t, section, key + ".", c, nullptr));
    } else if (key == "workers") {
      const toml::array* a = v.as_array();
      if (!a || !a->is_array_of_tables())
        return Status::invalid("workers: must be an array of tables ([[workers]])" + where(v.source()));
      workers_seen = true;
      c.workers.clear();
      for (size_t i = 0; i < a->size(); ++i) {
        WorkerGroup g;
        TANDEM_RETURN_IF_ERROR(
            parse_table(*a->get(i)->as_table(), Section::kWorkers, "workers[" + std::to_string(i) + "].", c, &g));
        c.workers.push_back(std::move(g));
      }
    } else if (const Flag* f = find_toml_key(Section::kTop, key)) {
      auto text = value_text(*f, v, key);
      if (!text) return text.status();
      TANDEM_RETURN_IF_ERROR(set_setting(*f, *text, c, nullptr));
    } else {
      return Status::invalid(key + ": unknown key" + where(k.source()));
    }
  }
  if (!workers_seen) c.workers = {WorkerGroup{}};
  return Status::ok();
}

}  // namespace

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
    if (!p->empty() && std::filesystem::path(*p).is_relative() && !base.empty())
      *p = (base / *p).lexically_normal().string();
  return c;
}

Status apply_flags(const Args& args, DeployConfig& c) {
  if (args.has("workers") || args.has("prefill") || args.has("decode")) {
    const WorkerGroup like = c.workers.empty() ? WorkerGroup{} : c.workers.front();
    c.workers.clear();
    for (auto [flag, role] : {std::pair{"workers", "both"}, {"prefill", "prefill"}, {"decode", "decode"}}) {
      if (!args.has(flag)) continue;
      auto n = args.integer(flag, 1);
      if (!n) return n.status();
      WorkerGroup g = like;
      g.role = role;
      g.count = static_cast<uint32_t>(*n);
      g.cpus.clear();  // a pinning list is for the file's worker table, not this one
      c.workers.push_back(std::move(g));
    }
  }
  for (const Flag& f : flag_table()) {
    if (!(f.commands & kUp) || f.section == Section::kNone) continue;
    auto value = args.str(std::string(f.name));
    if (!value) continue;
    TANDEM_RETURN_IF_ERROR(check_value(f, *value));
    if (f.section != Section::kWorkers) {
      TANDEM_RETURN_IF_ERROR(set_setting(f, *value, c, nullptr));
      continue;
    }
    for (WorkerGroup& g : c.workers) {
      if (f.name == "threads" && std::to_string(g.threads) != *value && !g.cpus.empty())
        return Status::invalid("--threads " + *value + " does not fit the workers' cpus list of the config");
      TANDEM_RETURN_IF_ERROR(set_setting(f, *value, c, &g));
    }
  }
  return Status::ok();
}

Result<std::string> normalize_endpoint(const std::string& e, const std::string& key) {
  if (e.rfind("ipc://", 0) == 0) {
    if (e.size() == 6) return Status::invalid(key + ": '" + e + "' has no path");
    return e;
  }
  if (e.rfind("tcp://", 0) != 0) return Status::invalid(key + ": '" + e + "' must start with ipc:// or tcp://");
  const std::string rest = e.substr(6);
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos)
    return Status::invalid(key + ": '" + e + "' needs host:port (e.g. tcp://127.0.0.1:5555)");
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
  if (c.model.empty())
    return Status::invalid("model: required (the GGUF file to serve; --model or `model =` in the config)");
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
  if (!c.gateway.empty() && !c.gateway.count("http"))
    return Status::invalid("gateway: settings without an address (--http HOST:PORT or http = in [gateway])");
  const int cores = available_cpus();
  uint32_t threads = 0;
  for (size_t i = 0; i < c.workers.size(); ++i) {
    const WorkerGroup& g = c.workers[i];
    const std::string key = "workers[" + std::to_string(i) + "]";
    threads += g.count * g.threads;
    if (g.cpus.empty()) continue;
    if (g.cpus.size() != size_t{g.count} * g.threads)
      return Status::invalid(key + ".cpus: needs count x threads = " + std::to_string(g.count * g.threads) +
                             " CPUs (each worker is pinned to its threads' share), got " +
                             std::to_string(g.cpus.size()));
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
  for (const WorkerGroup& g : c.workers)
    (g.role == "prefill" ? prefill : g.role == "decode" ? decode : threads) += g.count;
  if ((prefill == 0) != (decode == 0))
    return Status::invalid(std::string("workers: ") +
                           (prefill ? "prefill workers need a decode worker" : "decode workers need a prefill worker") +
                           " (a prefill worker hands every sequence to a decode worker)");
  return Status::ok();
}

}  // namespace tandem::cli
