#include "cli/args.h"

#include <cerrno>
#include <cstdlib>

namespace tandem::cli {

Result<Args> Args::parse(int argc, char** argv, const std::set<std::string>& valued,
                         const std::set<std::string>& switches) {
  Args args;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) return Status::invalid("unexpected argument '" + a + "'");
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (switches.count(name)) {
      if (has_value) return Status::invalid("--" + name + " takes no value");
      args.values_[name] = "1";
    } else if (valued.count(name)) {
      if (!has_value) {
        if (i + 1 >= argc) return Status::invalid("--" + name + " needs a value");
        value = argv[++i];
      }
      args.values_[name] = value;
      args.repeated_[name].push_back(value);
    } else {
      return Status::invalid("unknown flag --" + name);
    }
  }
  return args;
}

std::optional<std::string> Args::str(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> Args::all(const std::string& name) const {
  auto it = repeated_.find(name);
  return it == repeated_.end() ? std::vector<std::string>{} : it->second;
}

Result<int64_t> Args::integer(const std::string& name, int64_t fallback, int64_t lo, int64_t hi) const {
  auto s = str(name);
  if (!s) return fallback;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s->c_str(), &end, 10);
  if (s->empty() || *end != '\0' || errno != 0) return Status::invalid("--" + name + ": '" + *s + "' is not an integer");
  if (v < lo || v > hi)
    return Status::invalid("--" + name + ": " + *s + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return static_cast<int64_t>(v);
}

Result<double> Args::real(const std::string& name, double fallback) const {
  auto s = str(name);
  if (!s) return fallback;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s->c_str(), &end);
  if (s->empty() || *end != '\0' || errno != 0) return Status::invalid("--" + name + ": '" + *s + "' is not a number");
  return v;
}

Result<std::vector<int32_t>> Args::int_list(const std::string& name) const {
  std::vector<int32_t> out;
  auto s = str(name);
  if (!s) return out;
  size_t i = 0;
  while (i <= s->size()) {
    size_t j = s->find(',', i);
    if (j == std::string::npos) j = s->size();
    const std::string item = s->substr(i, j - i);
    errno = 0;
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno != 0 || v < INT32_MIN || v > INT32_MAX)
      return Status::invalid("--" + name + ": '" + item + "' is not a token id");
    out.push_back(static_cast<int32_t>(v));
    i = j + 1;
  }
  return out;
}

}  // namespace tandem::cli
