// #18 item 9: the runtime folder. tandem up never takes over, chmods or deletes a folder that
// is not its own: a symlink, a folder open to others or serving another deployment is refused,
// and on exit only the sockets tandem made go (and the folder, if tandem created it).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "tests/e2e/deployment.h"

namespace tandem::test {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;

// `tandem up` on `runtime_dir`; the caller waits for it.
pid_t start_up(const std::string& runtime_dir, const std::string& out) {
  return spawn(
      {TANDEM_TANDEM_BIN, "up", "--model", model_file("tiny", 1), "--runtime-dir", runtime_dir, "--log-level", "warn"},
      out);
}

bool wait_ready(pid_t pid, const std::string& out) {
  const auto deadline = std::chrono::steady_clock::now() + seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    if (slurp(out).find("tandem: ready") != std::string::npos) return true;
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

int stop(pid_t pid) {
  signal_one(pid, SIGTERM);
  return wait_for(pid, seconds(20));
}

// A refused start: exits 2 (a bad argument) at once and says why on stderr.
void expect_refused(const std::string& runtime_dir, const std::string& why) {
  const std::string out = temp_dir() + "/refused.out";
  const pid_t pid = start_up(runtime_dir, out);
  EXPECT_EQ(wait_for(pid, seconds(30)), 2) << slurp(out) << slurp(out + ".err");
  EXPECT_NE(slurp(out + ".err").find(why), std::string::npos) << slurp(out + ".err");
}

TEST(RuntimeDir, ASymbolicLinkIsRefusedAndItsTargetLeftAlone) {
  const std::string dir = temp_dir();
  fs::create_directory(dir + "/real");
  fs::permissions(dir + "/real", fs::perms::owner_all, fs::perm_options::replace);
  std::ofstream(dir + "/real/keep.txt") << "mine";
  fs::create_directory_symlink(dir + "/real", dir + "/link");
  expect_refused(dir + "/link", "is a symbolic link");
  EXPECT_TRUE(fs::exists(dir + "/real/keep.txt"));
}

TEST(RuntimeDir, AFolderOpenToOthersIsRefusedNotChmoded) {
  // What `--runtime-dir /tmp` used to do: chmod it 0700 and delete it all on exit.
  const std::string dir = temp_dir() + "/shared";
  fs::create_directory(dir);
  fs::permissions(dir, fs::perms::all, fs::perm_options::replace);
  std::ofstream(dir + "/someone-elses.txt") << "theirs";
  expect_refused(dir, "is open to other users");
  struct stat st {};
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0777u);
  EXPECT_TRUE(fs::exists(dir + "/someone-elses.txt"));
}

TEST(RuntimeDir, OnlyTheSocketsTandemMadeAreDeletedFromAFolderItDidNotCreate) {
  const std::string dir = temp_dir() + "/mine";
  fs::create_directory(dir);
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace);
  std::ofstream(dir + "/keep.txt") << "mine";
  const std::string out = temp_dir() + "/up.out";
  const pid_t pid = start_up(dir, out);
  ASSERT_TRUE(wait_ready(pid, out)) << slurp(out) << slurp(out + ".err");
  EXPECT_TRUE(fs::exists(dir + "/client.sock"));
  EXPECT_EQ(stop(pid), 0);
  EXPECT_TRUE(fs::exists(dir + "/keep.txt"));
  EXPECT_FALSE(fs::exists(dir + "/client.sock"));
  EXPECT_FALSE(fs::exists(dir + "/worker.sock"));
}

TEST(RuntimeDir, AFolderTandemCreatedIsPrivateAndGoneAfterExit) {
  const std::string base = temp_dir();
  const std::string dir = base + "/new/run";
  const std::string out = temp_dir() + "/up.out";
  const pid_t pid = start_up(dir, out);
  ASSERT_TRUE(wait_ready(pid, out)) << slurp(out) << slurp(out + ".err");
  struct stat st {};
  ASSERT_EQ(::lstat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(stop(pid), 0);
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_TRUE(fs::exists(base + "/new"));  // parents stay
}

TEST(RuntimeDir, ASecondDeploymentOnTheSameFolderIsRefusedAndTheFirstKeepsServing) {
  const std::string dir = temp_dir() + "/run";
  const std::string out = temp_dir() + "/first.out";
  const pid_t first = start_up(dir, out);
  ASSERT_TRUE(wait_ready(first, out)) << slurp(out) << slurp(out + ".err");
  expect_refused(dir, "is in use: another deployment listens on client.sock");
  const CommandOutput probe = run_command(std::string(TANDEM_TANDEM_BIN) + " probe --ready --endpoint ipc://" + dir +
                                          "/client.sock --timeout-ms 10000");
  EXPECT_EQ(probe.exit_code, 0) << probe.out << probe.err;
  EXPECT_EQ(stop(first), 0);
}

TEST(RuntimeDir, AStaleSocketOfAKilledDeploymentDoesNotBlockARestart) {
  const std::string dir = temp_dir() + "/run";
  const std::string out = temp_dir() + "/first.out";
  pid_t pid = start_up(dir, out);
  ASSERT_TRUE(wait_ready(pid, out)) << slurp(out) << slurp(out + ".err");
  // SIGKILL the supervisor: its children die with it (PR_SET_PDEATHSIG) and leave their
  // socket files behind, with no listener.
  signal_one(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  const auto deadline = std::chrono::steady_clock::now() + seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    const CommandOutput p = run_command(std::string(TANDEM_TANDEM_BIN) + " probe --endpoint ipc://" + dir +
                                        "/client.sock --timeout-ms 300");
    if (p.exit_code != 0) break;
  }
  pid = start_up(dir, out);
  EXPECT_TRUE(wait_ready(pid, out)) << slurp(out) << slurp(out + ".err");
  EXPECT_EQ(stop(pid), 0);
}

}  // namespace
}  // namespace tandem::test
