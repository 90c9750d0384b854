// What the end-to-end tests share: spawning processes with their output in files, and a
// `tandem up` deployment that lives as long as a test.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"

extern char** environ;

namespace tandem::test {

// The heartbeat period of the tests that stop or kill workers: short, so that a death is
// seen fast. Longer under ThreadSanitizer: its 5-15x slowdown, on a 2-core host running two
// deployments, can keep a busy worker off the CPU for more than 3 short periods.
#ifdef TANDEM_TEST_TSAN
inline constexpr int kQuickHeartbeatMs = 500;
#else
inline constexpr int kQuickHeartbeatMs = 200;
#endif
inline const std::string kQuickHeartbeat = std::to_string(kQuickHeartbeatMs);

// A TCP port on loopback that was free a moment ago (the kernel's choice for port 0).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Starts argv[0] with stdout in `out_file` and stderr in `out_file`.err.
inline pid_t spawn(const std::vector<std::string>& argv, const std::string& out_file) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, (out_file + ".err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = -1;
  const int err = posix_spawn(&pid, argv[0].c_str(), &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (err != 0) {
    ADD_FAILURE() << "cannot start " << argv[0] << ": " << std::strerror(err);
    return -1;
  }
  return pid;
}

// kill(2) for one process. A pid of 0 or -1 (a failed spawn, a worker not found in a status)
// would signal this test's process group or every process of this user: refused, as a test
// failure.
inline int signal_one(pid_t pid, int sig) {
  if (pid <= 1) {
    ADD_FAILURE() << "refusing to send signal " << sig << " to pid " << pid;
    errno = ESRCH;
    return -1;
  }
  return ::kill(pid, sig);
}

inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Waits up to `limit` for `pid`; kills it past that. Returns its exit status, or -1 when it
// was killed or died of a signal.
inline int wait_for(pid_t pid, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  signal_one(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

// The scheduler process among `tandem up`'s children (`tandem scheduler ...`); -1 if none.
inline pid_t scheduler_pid(pid_t up) {
  std::ifstream children("/proc/" + std::to_string(up) + "/task/" + std::to_string(up) + "/children");
  for (pid_t p; children >> p;) {
    const std::string cmdline = slurp("/proc/" + std::to_string(p) + "/cmdline");
    if (cmdline.find(std::string("\0scheduler\0", 11)) != std::string::npos) return p;
  }
  return -1;
}

// A memory field of /proc/PID/status in KiB ("VmRSS", "VmHWM"); 0 when absent.
inline uint64_t proc_status_kib(pid_t pid, const std::string& field) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1));
  return 0;
}

// `tandem up` in the background, ready when constructed (or a test failure), stopped
// (SIGTERM, then SIGKILL) when the test ends.
class Deployment {
 public:
  explicit Deployment(std::vector<std::string> flags, const std::string& model = model_file("tiny", 1)) {
    dir_ = temp_dir();
    std::vector<std::string> argv = {TANDEM_TANDEM_BIN, "up",          "--model",     model,
                                     "--runtime-dir",   dir_ + "/run", "--log-level", "warn"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    out_ = dir_ + "/up.out";
    pid_ = spawn(argv, out_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      if (slurp(out_).find("tandem: ready") != std::string::npos) {
        endpoint_ = "ipc://" + dir_ + "/run/client.sock";
        return;
      }
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "tandem up did not become ready:\n" << slurp(out_) << slurp(out_ + ".err");
  }
  ~Deployment() {
    if (pid_ <= 0) return;
    signal_one(pid_, SIGTERM);
    wait_for(pid_, std::chrono::seconds(10));
  }
  Deployment(const Deployment&) = delete;
  Deployment& operator=(const Deployment&) = delete;

  const std::string& endpoint() const { return endpoint_; }
  std::string worker_endpoint() const { return "ipc://" + dir_ + "/run/worker.sock"; }
  std::string admin_endpoint() const { return "ipc://" + dir_ + "/run/admin.sock"; }
  const std::string& dir() const { return dir_; }
  bool ok() const { return !endpoint_.empty(); }
  pid_t pid() const { return pid_; }
  // What `tandem up` printed so far (its "tandem: ..." lines).
  std::string output() const { return slurp(out_); }
  // Waits for `tandem up` to exit (the caller signalled it); its exit code, -1 if killed.
  int wait_exit(std::chrono::milliseconds limit) {
    const int code = wait_for(pid_, limit);
    pid_ = -1;
    return code;
  }

 private:
  std::string dir_, out_, endpoint_;
  pid_t pid_ = -1;
};

}  // namespace tandem::test
