// --log-file: a process's spdlog output goes to a rotating file instead of stderr.
#pragma once

#include <string>

#include "cli/args.h"
#include "runtime/status.h"

namespace tandem::cli {

// When --log-file PATH is given, replaces the default logger with one writing to PATH
// (rotated at 16 MiB, 3 old files kept), named `process`. Errors name the path.
[[nodiscard]] Status log_to_file(const Args& args, const std::string& process);

}  // namespace tandem::cli
