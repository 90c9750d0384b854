#include "workers/memory_budget.h"

#include <charconv>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string_view>

namespace tandem::worker {

namespace {

// v1 reports "no limit" as the largest page-aligned signed value, about 2^63.
constexpr uint64_t kUnlimited = uint64_t{1} << 62;

std::optional<std::string> read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

Result<uint64_t> parse_bytes(const std::string& path, std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size())
    return Status::error(Code::kInternal, path + ": '" + std::string(text) + "' is not a byte count");
  return v;
}

// The limit and usage of one cgroup folder; nullopt when it sets no limit.
Result<std::optional<CgroupMemory>> read_level(const std::string& dir, const std::string& path, bool v2) {
  const std::string limit_file = dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes");
  const std::string used_file = dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes");
  std::optional<std::string> limit_text = read_text(limit_file);
  if (!limit_text || limit_text->starts_with("max")) return std::optional<CgroupMemory>();
  auto limit = parse_bytes(limit_file, *limit_text);
  if (!limit) return limit.status();
  if (*limit >= kUnlimited) return std::optional<CgroupMemory>();
  std::optional<std::string> used_text = read_text(used_file);
  if (!used_text) return Status::error(Code::kInternal, used_file + " is missing beside " + limit_file);
  auto used = parse_bytes(used_file, *used_text);
  if (!used) return used.status();
  return std::optional<CgroupMemory>(CgroupMemory{path, *limit, *used});
}

// The process's memory cgroup: (path, v2). v1's line names the memory controller; v2's is "0::".
std::optional<std::pair<std::string, bool>> own_cgroup(const std::string& proc) {
  std::optional<std::string> text = read_text(proc + "/self/cgroup");
  if (!text) return std::nullopt;
  std::optional<std::pair<std::string, bool>> v2;
  std::istringstream lines(*text);
  for (std::string line; std::getline(lines, line);) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = "," + line.substr(a + 1, b - a - 1) + ",";
    if (controllers.find(",memory,") != std::string::npos) return std::pair(line.substr(b + 1), false);
    if (controllers == ",," && line.starts_with("0:")) v2 = std::pair(line.substr(b + 1), true);
  }
  return v2;
}

Result<std::optional<CgroupMemory>> read_cgroup(const std::string& proc, const std::string& root) {
  auto own = own_cgroup(proc);
  if (!own) return std::optional<CgroupMemory>();
  auto [path, v2] = *own;
  const std::string mount = v2 ? root : root + "/memory";
  std::optional<CgroupMemory> tightest;
  for (std::string p = path;; p = p.substr(0, p.find_last_of('/'))) {
    if (p.empty()) p = "/";
    auto level = read_level(p == "/" ? mount : mount + p, p, v2);
    if (!level) return level.status();
    if (*level && (!tightest || (*level)->left() < tightest->left())) tightest = *level;
    if (p == "/") break;
  }
  return tightest;
}

}  // namespace

Result<HostMemory> read_host_memory(const std::string& proc, const std::string& cgroup_root) {
  const std::string meminfo = proc + "/meminfo";
  std::optional<std::string> text = read_text(meminfo);
  if (!text) return Status::error(Code::kInternal, meminfo + " cannot be read");
  const size_t at = text->find("MemAvailable:");
  if (at == std::string::npos) return Status::error(Code::kInternal, meminfo + " has no MemAvailable line");
  unsigned long long kib = 0;
  if (std::sscanf(text->c_str() + at, "MemAvailable: %llu kB", &kib) != 1)
    return Status::error(Code::kInternal, meminfo + ": MemAvailable does not parse");
  HostMemory host;
  host.available = uint64_t{kib} * 1024;
  auto cgroup = read_cgroup(proc, cgroup_root);
  if (!cgroup) return cgroup.status();
  host.cgroup = *cgroup;
  return host;
}

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

std::string HostMemory::to_string() const {
  std::string s = "MemAvailable " + human_bytes(available);
  if (cgroup) {
    s += "; cgroup " + cgroup->path + ": " + human_bytes(cgroup->used) + " of " + human_bytes(cgroup->limit) + " used";
  }
  return s;
}

std::string KvBudget::to_string() const {
  return "KV " + human_bytes(kv_bytes()) + " = (" + human_bytes(usable) + " usable - " + human_bytes(weights) +
         " weights - " + human_bytes(reserve) + " reserve) / " + std::to_string(share) +
         (share == 1 ? " worker" : " workers") + (states > 0 ? " - " + human_bytes(states) + " state slots" : "");
}

}  // namespace tandem::worker
