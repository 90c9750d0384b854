// A process's logging from its flags: --log-level, and --log-file (a rotating file instead
// of stderr).
#pragma once

#include <string>

#include "cli/args.h"
#include "runtime/status.h"

namespace tandem::cli {

// Sets spdlog's level from --log-level; when --log-file PATH is given, replaces the default
// logger with one writing to PATH (rotated at 16 MiB, 3 old files kept), named `process`.
// Errors name the flag.
[[nodiscard]] Status set_up_logging(const Args& args, const std::string& process);

}  // namespace tandem::cli
