#include "cli/log_file.h"

#include <spdlog/sinks/rotating_file_sink.h>
#include <spdlog/spdlog.h>

namespace tandem::cli {

Status set_up_logging(const Args& args, const std::string& process) {
  auto level = args.choice("log-level", "info");
  if (!level) return level.status();
  spdlog::set_level(spdlog::level::from_str(*level));
  auto path = args.str("log-file");
  if (!path) return Status::ok();
  constexpr size_t kMaxBytes = size_t{16} << 20, kFiles = 3;
  try {
    auto logger = spdlog::rotating_logger_mt(process, *path, kMaxBytes, kFiles);
    logger->set_level(spdlog::get_level());
    logger->flush_on(spdlog::level::info);
    spdlog::set_default_logger(logger);
  } catch (const spdlog::spdlog_ex& e) {
    return Status::invalid("--log-file " + *path + ": " + e.what());
  }
  return Status::ok();
}

}  // namespace tandem::cli
