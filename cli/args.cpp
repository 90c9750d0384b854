#include "cli/args.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace tandem::cli {

namespace {

Result<int64_t> parse_int(const Flag& f, const std::string& s) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  const std::string flag = "--" + std::string(f.name);
  if (s.empty() || *end != '\0' || errno != 0) return Status::invalid(flag + ": '" + s + "' is not an integer");
  if (v < f.lo || v > f.hi)
    return Status::invalid(flag + ": " + s + " is outside [" + std::to_string(f.lo) + ", " + std::to_string(f.hi) +
                           "]");
  return static_cast<int64_t>(v);
}

Result<std::vector<int32_t>> parse_int_list(const Flag& f, const std::string& s) {
  std::vector<int32_t> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    const std::string item = s.substr(i, j - i);
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno != 0 || v < f.lo || v > f.hi)
      return Status::invalid("--" + std::string(f.name) + ": '" + item + "' is not " +
                             (f.name == "tokens"
                                  ? std::string("a token id")
                                  : "an integer in [" + std::to_string(f.lo) + ", " + std::to_string(f.hi) + "]"));
    out.push_back(static_cast<int32_t>(v));
    i = j + 1;
  }
  return out;
}

}  // namespace

Status check_value(const Flag& f, const std::string& value) {
  const std::string flag = "--" + std::string(f.name);
  switch (f.type) {
    case FlagType::kInt: return parse_int(f, value).status();
    case FlagType::kIntList: return parse_int_list(f, value).status();
    case FlagType::kReal: {
      errno = 0;
      char* end = nullptr;
      std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || errno != 0)
        return Status::invalid(flag + ": '" + value + "' is not a number");
      return Status::ok();
    }
    case FlagType::kChoice: {
      const std::string choices = "|" + std::string(f.choices) + "|";
      if (value.empty() || value.find('|') != std::string::npos || choices.find("|" + value + "|") == std::string::npos)
        return Status::invalid(flag + " must be " + choices_text(f.choices) + ", got '" + value + "'");
      return Status::ok();
    }
    default: return Status::ok();
  }
}

int fail(std::string_view command, const Status& st) {
  std::fprintf(stderr, "tandem %.*s: %s\n", static_cast<int>(command.size()), command.data(), st.to_string().c_str());
  return st.code() == Code::kInvalidArgument ? 2 : 1;
}

Result<Args> Args::parse(int argc, char** argv, Command command, std::vector<char*>* rest) {
  Args args;
  args.command_ = command;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    std::string name = a.rfind("--", 0) == 0 ? a.substr(2) : std::string(), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const Flag* f = find_flag(name, command);
    if (!f) {
      if (rest) {
        rest->push_back(argv[i]);
        continue;
      }
      if (a.rfind("--", 0) != 0) return Status::invalid("unexpected argument '" + a + "'");
      return Status::invalid("unknown flag --" + name);
    }
    if (f->type == FlagType::kSwitch) {
      if (has_value) return Status::invalid("--" + name + " takes no value");
      args.values_[name] = "1";
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) return Status::invalid("--" + name + " needs a value");
      value = argv[++i];
    }
    args.values_[name] = value;
    args.repeated_[name].push_back(value);
  }
  return args;
}

const Flag& Args::row(const std::string& name) const {
  const Flag* f = find_flag(name, command_);
  if (!f) {  // a command reading a flag its rows do not list: a bug in the table, not user input
    std::fprintf(stderr, "tandem: --%s is not in the flag table for this command\n", name.c_str());
    std::abort();
  }
  return *f;
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

Result<int64_t> Args::integer(const std::string& name, int64_t fallback) const {
  const Flag& f = row(name);
  auto s = str(name);
  if (!s) return fallback;
  return parse_int(f, *s);
}

Result<double> Args::real(const std::string& name, double fallback) const {
  const Flag& f = row(name);
  auto s = str(name);
  if (!s) return fallback;
  if (Status st = check_value(f, *s); !st) return st;
  return std::strtod(s->c_str(), nullptr);
}

Result<std::vector<int32_t>> Args::int_list(const std::string& name) const {
  const Flag& f = row(name);
  auto s = str(name);
  if (!s) return std::vector<int32_t>{};
  return parse_int_list(f, *s);
}

Result<std::string> Args::choice(const std::string& name, const std::string& fallback) const {
  const Flag& f = row(name);
  auto s = str(name);
  if (!s) return fallback;
  if (Status st = check_value(f, *s); !st) return st;
  return *s;
}

}  // namespace tandem::cli
