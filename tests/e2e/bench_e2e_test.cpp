// `tandem bench` against `tandem up` with the tiny model: 50 requests complete and the JSON
// has the documented schema.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/test_util.h"

extern char** environ;

namespace tandem {
namespace {

using namespace std::chrono_literals;

pid_t spawn(const std::vector<std::string>& argv, const std::string& out_file) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, (out_file + ".err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = -1;
  posix_spawn(&pid, argv[0].c_str(), &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Waits up to `limit` for `pid`; kills it past that. Returns its exit status or -1.
int wait_for(pid_t pid, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::this_thread::sleep_for(20ms);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

// `tandem up` in the background, stopped (SIGTERM, then SIGKILL) when the test ends.
class Deployment {
 public:
  explicit Deployment(std::vector<std::string> flags) {
    dir_ = test::temp_dir();
    std::vector<std::string> argv = {TANDEM_TANDEM_BIN, "up", "--model", test::model_file("tiny", 1), "--runtime-dir",
                                     dir_ + "/run", "--log-level", "warn"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    out_ = dir_ + "/up.out";
    pid_ = spawn(argv, out_);
    const auto deadline = std::chrono::steady_clock::now() + 60s;
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
      std::this_thread::sleep_for(20ms);
    }
    ADD_FAILURE() << "tandem up did not become ready:\n" << slurp(out_) << slurp(out_ + ".err");
  }
  ~Deployment() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    if (wait_for(pid_, 10s) == -1) return;
  }
  const std::string& endpoint() const { return endpoint_; }
  const std::string& dir() const { return dir_; }
  bool ok() const { return !endpoint_.empty(); }

 private:
  std::string dir_, out_, endpoint_;
  pid_t pid_ = -1;
};

TEST(BenchE2E, FiftyRequestsCompleteWithTheJsonSchema) {
  Deployment d({"--workers", "1", "--threads", "1"});
  ASSERT_TRUE(d.ok());
  const std::string json_path = d.dir() + "/bench.json", out = d.dir() + "/bench.out";
  const pid_t pid = spawn({TANDEM_TANDEM_BIN, "bench", "--endpoint", d.endpoint(), "--num-requests", "50",
                           "--concurrency", "8", "--input-len", "16", "--output-len", "8", "--ignore-eos", "--out",
                           json_path},
                          out);
  ASSERT_EQ(wait_for(pid, 120s), 0) << slurp(out) << slurp(out + ".err");
  const std::string table = slurp(out);
  std::printf("%s", table.c_str());
  EXPECT_NE(table.find("50 completed, 0 failed, 0 cancelled"), std::string::npos) << table;
  const std::string json = slurp(json_path);
  for (const char* key : {"\"requests\":{\"completed\":50,\"failed\":0,\"cancelled\":0", "\"throughput\":{",
                          "\"requests_per_s\":", "\"input_tokens_per_s\":", "\"output_tokens_per_s\":",
                          "\"tokens\":{\"input\":800,\"output\":400}", "\"records\":["})
    EXPECT_NE(json.find(key), std::string::npos) << key << "\n" << json.substr(0, 800);
  for (const char* dist : {"ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"}) {
    const size_t at = json.find(std::string("\"") + dist + "\":{");
    ASSERT_NE(at, std::string::npos) << dist;
    const std::string obj = json.substr(at, json.find('}', at) - at);
    for (const char* stat : {"\"mean\":", "\"p50\":", "\"p90\":", "\"p99\":", "\"max\":"})
      EXPECT_NE(obj.find(stat), std::string::npos) << dist << " " << stat;
  }
  size_t records = 0;
  for (size_t at = json.find("\"index\":"); at != std::string::npos; at = json.find("\"index\":", at + 1)) ++records;
  EXPECT_EQ(records, 50u);
}

TEST(BenchE2E, CancellationsAgainstTandemAreCounted) {
  Deployment d({"--workers", "1", "--threads", "1"});
  ASSERT_TRUE(d.ok());
  const std::string json_path = d.dir() + "/bench.json", out = d.dir() + "/bench.out";
  const pid_t pid = spawn({TANDEM_TANDEM_BIN, "bench", "--endpoint", d.endpoint(), "--num-requests", "10",
                           "--rate", "50", "--concurrency", "4", "--input-len", "8:16", "--output-len", "64",
                           "--ignore-eos", "--cancel-fraction", "1", "--cancel-after", "2", "--out", json_path},
                          out);
  ASSERT_EQ(wait_for(pid, 120s), 0) << slurp(out) << slurp(out + ".err");
  const std::string json = slurp(json_path);
  EXPECT_NE(json.find("\"requests\":{\"completed\":0,\"failed\":0,\"cancelled\":10"), std::string::npos)
      << json.substr(0, 800);
}

}  // namespace
}  // namespace tandem
