// A small, strict command-line parser: --name value and --flag, nothing positional.
// Unknown flags and malformed numbers are errors that name the flag.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace tandem::cli {

class Args {
 public:
  // `valued` flags take a value, `switches` take none.
  static Result<Args> parse(int argc, char** argv, const std::set<std::string>& valued,
                            const std::set<std::string>& switches);

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  // The last value given for `name`.
  std::optional<std::string> str(const std::string& name) const;
  // Every value given for `name`, in order (for repeatable flags such as --stop).
  std::vector<std::string> all(const std::string& name) const;
  // Each returns an error naming the flag when the value does not parse or is out of range.
  Result<int64_t> integer(const std::string& name, int64_t fallback, int64_t lo, int64_t hi) const;
  Result<double> real(const std::string& name, double fallback) const;
  Result<std::vector<int32_t>> int_list(const std::string& name) const;

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> repeated_;
};

}  // namespace tandem::cli
