// #18 item 10: a worker stopped by a signal from outside tandem up (an operator's kill, the OOM
// killer's SIGTERM-first tools) exits 128 + signal and is restarted; one the scheduler told to
// stop (a drain) exits 0 and stays down. It used to exit 0 on SIGTERM and never come back.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>

#include "tandem/client.h"
#include "tests/e2e/deployment.h"

namespace tandem::test {
namespace {

using namespace std::chrono_literals;

TEST(WorkerExit, ASigtermFromOutsideRestartsTheWorker) {
  Deployment d({"--workers", "1", "--threads", "1", "--restart-backoff-ms", "100", "--kv-memory", "67108864"});
  ASSERT_TRUE(d.ok());
  ClientOptions o;
  o.endpoint = d.endpoint();
  auto client = Client::connect(o);
  ASSERT_TRUE(client) << client.status().to_string();
  const StatusInfo before = (*client)->status(5s).value();
  ASSERT_EQ(before.workers.size(), 1u);
  const pid_t victim = static_cast<pid_t>(before.workers[0].pid);
  ASSERT_EQ(signal_one(victim, SIGTERM), 0);

  bool back = false;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!back && std::chrono::steady_clock::now() < deadline) {
    auto st = (*client)->status(1s);
    back = st && st->workers.size() == 1 && st->workers[0].alive && st->workers[0].pid != static_cast<uint32_t>(victim);
    if (!back) std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(back) << d.output();
  EXPECT_NE(d.output().find("exited (status 143)"), std::string::npos) << d.output();

  // A drain tells the worker to stop: exit 0, not restarted, and tandem up ends with 0.
  ASSERT_EQ(signal_one(d.pid(), SIGTERM), 0);
  EXPECT_EQ(d.wait_exit(30s), 0) << d.output();
  EXPECT_EQ(d.output().find("restart 2 of"), std::string::npos) << d.output();
}

}  // namespace
}  // namespace tandem::test
