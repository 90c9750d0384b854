// A small, strict command-line parser: --name value, --name=value and --flag, nothing
// positional. What a command accepts, of which type and in which range, is its rows of the
// flag table (cli/flags.h). Unknown flags and malformed or out-of-range values are errors
// that name the flag.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli/flags.h"
#include "runtime/status.h"

namespace tandem::cli {

class Args {
 public:
  // The flags of `command`. With `rest`, arguments the table does not list for it are kept
  // there in order instead of refused (a bench handing them on to Google Benchmark).
  static Result<Args> parse(int argc, char** argv, Command command, std::vector<char*>* rest = nullptr);

  Command command() const { return command_; }
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  // The last value given for `name`.
  std::optional<std::string> str(const std::string& name) const;
  // Every value given for `name`, in order (for repeatable flags such as --stop).
  std::vector<std::string> all(const std::string& name) const;
  // Each returns an error naming the flag when the value does not parse, is out of the
  // table's range or not one of its choices; `fallback` when the flag is not given.
  Result<int64_t> integer(const std::string& name, int64_t fallback) const;
  Result<double> real(const std::string& name, double fallback) const;
  Result<std::vector<int32_t>> int_list(const std::string& name) const;
  Result<std::string> choice(const std::string& name, const std::string& fallback) const;

 private:
  const Flag& row(const std::string& name) const;

  Command command_ = kRun;
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> repeated_;
};

// Checks one value against its row: "--name: ..." errors, as parse() gives them. The TOML
// loader checks file values with the same rows and words its own messages.
[[nodiscard]] Status check_value(const Flag& flag, const std::string& value);

// The exit code for a failed command after printing "tandem <command>: <status>" on
// stderr: 2 for a usage error (kInvalidArgument), 1 otherwise.
int fail(std::string_view command, const Status& status);

}  // namespace tandem::cli
