// `tandem up` for the benchmarks: started in a private folder, ready when constructed
// (endpoint() empty if it did not become ready within two minutes), stopped with SIGTERM
// when destroyed.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/spawn.h"

namespace tandem::bench {

class Deployment {
 public:
  // `workers`: e.g. {"--workers", "1"} or {"--prefill", "1", "--decode", "1"}; `extra` more flags.
  Deployment(const std::string& tandem, const std::string& model, uint32_t threads, std::vector<std::string> workers,
             std::vector<std::string> extra = {}) {
    static int n = 0;
    dir_ = std::filesystem::temp_directory_path() /
           ("tandem-bench-" + std::to_string(getpid()) + "-" + std::to_string(n++));
    std::filesystem::create_directories(dir_);
    const std::string out = dir_ + "/up.out";
    std::vector<std::string> argv = {tandem,
                                     "up",
                                     "--model",
                                     model,
                                     "--threads",
                                     std::to_string(threads),
                                     "--kv-memory",
                                     std::to_string(2ull << 30),
                                     "--runtime-dir",
                                     dir_ + "/run",
                                     "--log-level",
                                     "warn",
                                     "--max-batch-tokens",
                                     "512",
                                     "--prefill-chunk",
                                     "256"};
    argv.insert(argv.end(), workers.begin(), workers.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    pid_ = cli::spawn({argv, {}, out, /*supervised=*/false});
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline) {
      std::ifstream f(out);
      std::stringstream ss;
      ss << f.rdbuf();
      if (ss.str().find("tandem: ready") != std::string::npos) {
        endpoint_ = "ipc://" + dir_ + "/run/client.sock";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~Deployment() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  Deployment(const Deployment&) = delete;
  Deployment& operator=(const Deployment&) = delete;
  const std::string& endpoint() const { return endpoint_; }

 private:
  std::string dir_, endpoint_;
  pid_t pid_ = -1;
};

}  // namespace tandem::bench
