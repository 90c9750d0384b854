// `tandem up` as a supervisor and its drain, with real processes over ipc://: a killed
// worker comes back and serves, a crash loop is stopped, the scheduler's death ends the
// deployment, SIGTERM drains to exit 0 with every stream ended and no process left.
#include <gtest/gtest.h>
#include <signal.h>

#include <cerrno>
#include <chrono>
#include <regex>
#include <set>
#include <thread>

#include "tandem/client.h"
#include "tests/e2e/deployment.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<Client> connect(const std::string& endpoint) {
  ClientOptions o;
  o.endpoint = endpoint;
  auto c = Client::connect(o);
  EXPECT_TRUE(c) << c.status().to_string();
  return c ? std::move(c.value()) : nullptr;
}

GenerateRequest request(uint32_t i, uint32_t max_tokens) {
  GenerateRequest r;
  for (uint32_t k = 0; k < 8 + i % 5; ++k) r.prompt_tokens.push_back(3 + static_cast<int32_t>((k * 31 + i * 17) % 250));
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

// Takes events until the final one (bounded); returns how many final events came (0 or 1).
int finish(Stream& s, FinalEvent& fin, std::chrono::milliseconds limit = 60s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    auto ev = s.next_for(100ms);
    if (ev && ev->final) {
      fin = ev->fin;
      return 1;
    }
  }
  return 0;
}

// The pids of every "started NAME (pid P" line of `tandem up`, in order.
std::vector<std::pair<std::string, pid_t>> started(const std::string& out) {
  std::vector<std::pair<std::string, pid_t>> v;
  static const std::regex re("started ([a-z0-9-]+) \\(pid ([0-9]+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
    v.emplace_back((*it)[1].str(), static_cast<pid_t>(std::stoi((*it)[2].str())));
  return v;
}

bool gone(pid_t pid) { return test::signal_one(pid, 0) != 0 && errno == ESRCH; }

template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return pred();
}

TEST(Supervise, AKilledWorkerIsRestartedRegistersAndServes) {
  test::Deployment d({"--workers", "2", "--threads", "1", "--heartbeat-ms", "200", "--restart-backoff-ms", "100",
                      "--kv-memory", "67108864"});
  ASSERT_TRUE(d.ok());
  auto client = connect(d.endpoint());
  std::vector<std::shared_ptr<Stream>> load;
  for (uint32_t i = 0; i < 8; ++i) load.push_back(client->generate(request(i, 200)));
  Event ev;
  for (auto& s : load) ASSERT_TRUE(s->next(ev));  // under load
  const StatusInfo before = client->status(5s).value();
  ASSERT_EQ(before.workers.size(), 2u);
  const pid_t victim = static_cast<pid_t>(before.workers[0].pid);
  ASSERT_EQ(test::signal_one(victim, SIGKILL), 0);

  // Every stream still ends (on the survivor or re-placed), and the worker comes back.
  for (auto& s : load) {
    FinalEvent fin;
    ASSERT_EQ(finish(*s, fin), 1) << "a stream hung after the kill";
    EXPECT_EQ(fin.reason, FinishReason::kLength) << fin.error_message;
  }
  pid_t fresh = 0;
  ASSERT_TRUE(eventually(
      [&] {
        auto st = client->status(1s);
        if (!st || st->workers.size() != 2) return false;
        for (const WorkerInfo& w : st->workers)
          if (w.pid != static_cast<uint32_t>(victim) && w.pid != before.workers[1].pid)
            fresh = static_cast<pid_t>(w.pid);
        return fresh != 0;
      },
      60s))
      << d.output();
  EXPECT_NE(d.output().find("restart 1 of 5"), std::string::npos) << d.output();
  EXPECT_TRUE(eventually([&] { return d.output().find("registered again as worker 3") != std::string::npos; }, 10s))
      << d.output();

  // New requests are served, some of them by the restarted worker.
  std::vector<std::shared_ptr<Stream>> fresh_load;
  for (uint32_t i = 0; i < 8; ++i) fresh_load.push_back(client->generate(request(100 + i, 16)));
  for (auto& s : fresh_load) {
    FinalEvent fin;
    ASSERT_EQ(finish(*s, fin), 1);
    EXPECT_EQ(fin.reason, FinishReason::kLength) << fin.error_message;
  }
  const StatusInfo after = client->status(5s).value();
  bool served = false;
  for (const WorkerInfo& w : after.workers) served |= w.pid == static_cast<uint32_t>(fresh) && w.steps > 0;
  EXPECT_TRUE(served) << "the restarted worker took no step";
}

TEST(Supervise, ACrashLoopIsStoppedAfterMaxRestarts) {
  test::Deployment d({"--workers", "2", "--threads", "1", "--max-restarts", "2", "--restart-backoff-ms", "50"});
  ASSERT_TRUE(d.ok());
  // Kill worker-0 each time it is (re)started: 1 start + 2 restarts, then it is given up.
  std::set<pid_t> killed;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < deadline && killed.size() < 10 &&
         d.output().find("crash loop") == std::string::npos) {
    for (const auto& [name, pid] : started(d.output()))
      if (name == "worker-0" && !killed.count(pid)) {
        test::signal_one(pid, SIGKILL);
        killed.insert(pid);
      }
    std::this_thread::sleep_for(20ms);
  }
  const std::string out = d.output();
  EXPECT_NE(out.find("worker-0"), std::string::npos);
  EXPECT_NE(out.find("3 crashes in a row, a crash loop: not restarting it"), std::string::npos) << out;
  EXPECT_EQ(killed.size(), 3u) << out;
  std::this_thread::sleep_for(500ms);  // no further start follows
  size_t starts = 0;
  for (const auto& [name, pid] : started(d.output())) starts += name == "worker-0";
  EXPECT_EQ(starts, 3u) << d.output();
  // The rest of the deployment still serves.
  auto client = connect(d.endpoint());
  auto s = client->generate(request(1, 4));
  FinalEvent fin;
  ASSERT_EQ(finish(*s, fin), 1);
  EXPECT_EQ(fin.reason, FinishReason::kLength) << fin.error_message;
}

TEST(Supervise, TheSchedulersDeathStopsTheDeploymentClearly) {
  test::Deployment d({"--workers", "1", "--threads", "1"});
  ASSERT_TRUE(d.ok());
  const auto children = started(d.output());
  ASSERT_EQ(children.size(), 2u);
  ASSERT_EQ(children[0].first, "scheduler");
  test::signal_one(children[0].second, SIGKILL);
  EXPECT_EQ(d.wait_exit(30s), 1);
  EXPECT_NE(d.output().find("the scheduler (pid " + std::to_string(children[0].second) + ") died (signal 9"),
            std::string::npos)
      << d.output();
  for (const auto& [name, pid] : children) EXPECT_TRUE(gone(pid)) << name << " (pid " << pid << ") is left over";
}

TEST(Supervise, EveryProcessLogsToItsOwnFileUnderTheLogFolder) {
  const std::string logs = test::temp_dir() + "/logs";
  test::Deployment d({"--workers", "2", "--threads", "1", "--log-dir", logs, "--log-level", "info"});
  ASSERT_TRUE(d.ok());
  EXPECT_NE(test::slurp(logs + "/scheduler.log").find("worker 2 registered"), std::string::npos);
  // A worker logs its registration when the scheduler's answer arrives, which can be after the
  // deployment says it is ready (the scheduler's side): wait for it, at most 10 s.
  for (const char* w : {"worker-0", "worker-1"}) {
    bool logged = false;
    for (int i = 0; i < 100 && !logged; ++i) {
      logged = test::slurp(logs + "/" + w + ".log").find("registered as worker") != std::string::npos;
      if (!logged) std::this_thread::sleep_for(100ms);
    }
    EXPECT_TRUE(logged) << w << ": " << test::slurp(logs + "/" + w + ".log");
  }
}

// Under 16 streams, SIGTERM: every stream ends with its final event (finished, or cancelled
// at the drain timeout), a new submit gets UNAVAILABLE, `tandem up` exits 0, and no
// process of the deployment is left.
TEST(Drain, SigtermUnderSixteenStreams) {
  // Two running per worker: most of the 16 are queued or running when the drain starts.
  test::Deployment d({"--workers", "2", "--threads", "1", "--drain-timeout-ms", "20000", "--max-running", "2",
                      "--kv-memory", "67108864"});
  ASSERT_TRUE(d.ok());
  const auto children = started(d.output());
  auto client = connect(d.endpoint());
  std::vector<std::shared_ptr<Stream>> streams;
  for (uint32_t i = 0; i < 16; ++i) streams.push_back(client->generate(request(i, 480)));
  std::vector<Event> first(16);
  ASSERT_TRUE(streams[0]->next(first[0]));  // streaming has begun
  ASSERT_EQ(test::signal_one(d.pid(), SIGTERM), 0);
  // Draining (or, on a fast machine, already drained and gone): a new submit is refused.
  ASSERT_TRUE(eventually(
      [&] {
        auto st = client->status(1s);
        return !st || st->draining;
      },
      10s))
      << d.output();
  auto refused = client->generate(request(99, 4));
  FinalEvent rf;
  ASSERT_EQ(finish(*refused, rf), 1);
  EXPECT_EQ(rf.reason, FinishReason::kError);
  EXPECT_EQ(rf.code, Code::kUnavailable) << rf.error_message;

  int length = 0, cancelled = 0;
  for (auto& s : streams) {
    FinalEvent fin;
    ASSERT_EQ(finish(*s, fin, 30s), 1) << "a stream got no final event";
    length += fin.reason == FinishReason::kLength;
    cancelled += fin.reason == FinishReason::kCancelled;
  }
  EXPECT_EQ(length + cancelled, 16) << "streams end finished or cancelled, nothing else";
  EXPECT_GE(length, 1) << "what ran when the drain began finishes";
  EXPECT_EQ(d.wait_exit(30s), 0) << d.output();
  EXPECT_NE(d.output().find("draining"), std::string::npos);
  for (const auto& [name, pid] : children) EXPECT_TRUE(gone(pid)) << name << " (pid " << pid << ") is left over";
}

TEST(Drain, PastTheDrainTimeoutTheRestIsCancelledWithAFinalEvent) {
  test::Deployment d({"--workers", "1", "--threads", "1", "--drain-timeout-ms", "1", "--max-running", "2"});
  ASSERT_TRUE(d.ok());
  auto client = connect(d.endpoint());
  std::vector<std::shared_ptr<Stream>> streams;
  for (uint32_t i = 0; i < 8; ++i) streams.push_back(client->generate(request(i, 480)));
  Event ev;
  ASSERT_TRUE(streams[0]->next(ev));
  ASSERT_EQ(test::signal_one(d.pid(), SIGTERM), 0);
  int cancelled = 0;
  for (auto& s : streams) {
    FinalEvent fin;
    ASSERT_EQ(finish(*s, fin, 30s), 1) << "a stream got no final event";
    if (fin.reason == FinishReason::kCancelled) {
      ++cancelled;
      EXPECT_NE(fin.error_message.find("drain"), std::string::npos) << fin.error_message;
    }
  }
  EXPECT_GE(cancelled, 1) << "8 x 480 tokens cannot all finish within 1 ms";
  EXPECT_EQ(d.wait_exit(30s), 0) << d.output();
}

TEST(Drain, SigintTwiceStopsAtOnce) {
  // A drain that would wait a minute for these streams; the second SIGINT does not.
  test::Deployment d({"--workers", "1", "--threads", "1", "--drain-timeout-ms", "60000", "--max-running", "1"});
  ASSERT_TRUE(d.ok());
  const auto children = started(d.output());
  auto client = connect(d.endpoint());
  std::vector<std::shared_ptr<Stream>> streams;
  for (uint32_t i = 0; i < 16; ++i) streams.push_back(client->generate(request(i, 480)));
  Event ev;
  ASSERT_TRUE(streams[0]->next(ev));
  ASSERT_EQ(test::signal_one(d.pid(), SIGINT), 0);
  ASSERT_TRUE(eventually([&] { return d.output().find("draining") != std::string::npos; }, 10s));
  ASSERT_EQ(test::signal_one(d.pid(), SIGINT), 0);
  EXPECT_EQ(d.wait_exit(20s), 0) << d.output();
  EXPECT_NE(d.output().find("second signal: stopping at once"), std::string::npos) << d.output();
  for (const auto& [name, pid] : children) EXPECT_TRUE(gone(pid)) << name << " (pid " << pid << ") is left over";
  for (auto& s : streams) {  // the client library still ends every stream
    FinalEvent fin;
    EXPECT_EQ(finish(*s, fin, 30s), 1);
  }
}

TEST(Drain, TheDrainCommandStopsTheDeploymentWithExitZero) {
  test::Deployment d({"--workers", "1", "--threads", "1"});
  ASSERT_TRUE(d.ok());
  const std::string dir = test::temp_dir();
  auto probe = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {TANDEM_TANDEM_BIN, "probe", "--endpoint", d.endpoint(), "--timeout-ms", "1000"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return test::wait_for(test::spawn(argv, dir + "/probe.out"), 30s);
  };
  EXPECT_EQ(probe({}), 0);
  EXPECT_EQ(probe({"--ready"}), 0);
  const pid_t status =
      test::spawn({TANDEM_TANDEM_BIN, "status", "--endpoint", d.endpoint(), "--json"}, dir + "/status.out");
  ASSERT_EQ(test::wait_for(status, 30s), 0);
  const std::string json = test::slurp(dir + "/status.out");
  for (const char* field : {"\"draining\":false",
                            "\"tokens_per_s_last_minute\":", "\"requests_finished_last_minute\":", "\"role\":\"both\"",
                            "\"alive\":true", "\"last_heard_ms\":", "\"kv_blocks_free\":", "\"queued\":0"})
    EXPECT_NE(json.find(field), std::string::npos) << field << " in " << json;
  const pid_t drain =
      test::spawn({TANDEM_TANDEM_BIN, "drain", "--endpoint", d.admin_endpoint(), "--wait"}, dir + "/drain.out");
  EXPECT_EQ(test::wait_for(drain, 60s), 0) << test::slurp(dir + "/drain.out") << test::slurp(dir + "/drain.out.err");
  EXPECT_EQ(d.wait_exit(30s), 0) << d.output();
  EXPECT_EQ(probe({}), 1) << "nothing answers after the drain";
}

}  // namespace
}  // namespace tandem
