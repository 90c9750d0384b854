// #18 item 10: a prefill worker closes its PUSH socket to a decode worker it has not sent KV to
// for --kv-peer-idle-ms. It used to keep one per decode worker it ever met, for good: a decode
// worker that is gone left a socket retrying its connection and holding queued KV.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "tandem/client.h"
#include "tests/e2e/deployment.h"

namespace tandem::test {
namespace {

using namespace std::chrono_literals;

std::string worker_logs(const std::string& dir) {
  std::string all;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().rfind("worker-", 0) == 0) all += slurp(e.path().string());
  return all;
}

TEST(KvPeers, AnIdleKvSocketIsClosed) {
  const std::string logs = temp_dir();
  Deployment d({"--prefill", "1", "--decode", "1", "--threads", "1", "--kv-memory", "67108864", "--kv-peer-idle-ms",
                "300", "--log-dir", logs, "--log-level", "info", "--heartbeat-ms", "100"});
  ASSERT_TRUE(d.ok());
  ClientOptions o;
  o.endpoint = d.endpoint();
  auto client = Client::connect(o);
  ASSERT_TRUE(client) << client.status().to_string();
  GenerateRequest r;
  r.prompt_tokens = {5, 6, 7, 8, 9, 10, 11, 12};
  r.max_tokens = 4;
  r.ignore_eos = true;
  auto s = (*client)->generate(r);
  Event ev;
  for (int i = 0; i < 64 && s->next(ev) && !ev.final; ++i) {
  }
  ASSERT_TRUE(ev.final);
  EXPECT_EQ(ev.fin.reason, FinishReason::kLength) << ev.fin.error_message;
  EXPECT_GE((*client)->status(5s).value().handoffs, 1u);
  bool closed = false;
  for (int i = 0; i < 200 && !closed; ++i) {
    closed = worker_logs(logs).find("closed the KV socket to") != std::string::npos;
    if (!closed) std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(closed) << worker_logs(logs);
}

}  // namespace
}  // namespace tandem::test
