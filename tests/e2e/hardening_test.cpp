// A service other services call must never hang a caller nor lose a request silently:
// stopped (not dead) workers are fenced, cancellation at scale is exact and isolated.
#include <gtest/gtest.h>
#include <signal.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <mutex>
#include <thread>

#include <zmq.hpp>

#include "runtime/wire.h"
#include "tandem/v1/client.pb.h"
#include "tests/e2e/streams.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using test::collect;
using test::Collected;
using test::prompt_of;
using Deployment = test::ClientDeployment;

StatusInfo wait_status(Client& client, const std::function<bool(const StatusInfo&)>& until) {
  StatusInfo st;
  for (int i = 0; i < 200; ++i) {
    st = client.status(5s).value();
    if (until(st)) break;
    std::this_thread::sleep_for(50ms);
  }
  return st;
}

TEST(Hardening, AStoppedWorkerIsDeclaredDeadFencedAndRegistersAgain) {
  // Heartbeats every 200 ms; dead after 3 missed (0.6 s).
  Deployment d({"--workers", "2", "--threads", "1", "--heartbeat-ms", "200", "--kv-memory", "67108864"});
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  auto [streams, want] =
      test::start_greedy(*client, 64, [](uint32_t i) { return test::greedy_request(prompt_of(4 + i % 60, 400 + i), 400); });
  std::vector<Collected> got(64);
  for (uint32_t i = 0; i < 64; ++i) {
    auto ev = streams[i]->next_for(30s);
    ASSERT_TRUE(ev && !ev->final) << "stream " << i;
    got[i].tokens.push_back(ev->token.id);
  }
  const WorkerInfo victim = test::busiest(client->status(5s).value());
  ASSERT_GT(victim.running, 0u);
  ASSERT_EQ(kill(static_cast<pid_t>(victim.pid), SIGSTOP), 0);
  const auto stopped_at = std::chrono::steady_clock::now();
  const StatusInfo dead = wait_status(*client, [](const StatusInfo& s) { return s.workers.size() == 1; });
  const double detected_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped_at).count();
  EXPECT_EQ(dead.workers.size(), 1u);
  std::printf("stopped worker declared dead after %.2f s (bound 3 x 0.2 s + status polling)\n", detected_s);
  // It resumes with a plan in flight: whatever it sends of its old registration is dropped,
  // and it is told to register again.
  ASSERT_EQ(kill(static_cast<pid_t>(victim.pid), SIGCONT), 0);
  for (uint32_t i = 0; i < 64; ++i) {
    Collected rest = collect(*streams[i], 60s);
    ASSERT_EQ(rest.finals, 1) << "stream " << i << " hung";
    EXPECT_EQ(rest.fin.reason, FinishReason::kLength) << "stream " << i << ": " << rest.fin.error_message;
    got[i].tokens.insert(got[i].tokens.end(), rest.tokens.begin(), rest.tokens.end());
    EXPECT_EQ(got[i].tokens, want[i]) << "stream " << i << ": a duplicate or missing token";
  }
  std::printf("every stream ended %.2f s after the stop\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped_at).count());
  const StatusInfo back = wait_status(*client, [](const StatusInfo& s) { return s.workers.size() == 2; });
  ASSERT_EQ(back.workers.size(), 2u) << "the resumed worker registers again";
  bool resumed = false;
  for (const auto& w : back.workers) {
    resumed |= w.pid == victim.pid && w.id != victim.id;
    EXPECT_EQ(test::in_use(w), 0u);
  }
  EXPECT_TRUE(resumed) << "same process, new registration";
  // And it serves again.
  auto again = test::start_greedy(*client, 8, [](uint32_t i) { return test::greedy_request(prompt_of(30, 900 + i), 20); });
  for (uint32_t i = 0; i < 8; ++i) EXPECT_EQ(collect(*again.streams[i]).tokens, again.want[i]);
}

TEST(Hardening, AHundredStreamsCancelledAfterTwentyTokensEachGetExactlyTheirTokens) {
  Deployment d({"--workers", "1", "--threads", "1", "--kv-memory", "67108864"});
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  // The engine's tokens first (start_greedy's requests are only used for that), then the
  // same requests with callbacks that cancel each at its 20th token.
  std::vector<std::vector<int32_t>> want;
  auto request = [](uint32_t i) {
    GenerateRequest r = test::greedy_request(prompt_of(10 + i % 50, 600 + i), 400);
    r.ignore_eos = true;
    r.id = "req-" + std::to_string(i);
    return r;
  };
  {
    auto engine = engine::Engine::load(test::model_file("tiny", 1), {1, engine::GemmBackend::kPacked}).value();
    for (uint32_t i = 0; i < 100; ++i) {
      engine::GenerateOptions opt;
      opt.max_tokens = 400;
      opt.ignore_eos = true;
      want.push_back(engine::generate(*engine, request(i).prompt_tokens, opt).value().tokens);
    }
  }
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Collected> got(100);
  uint32_t done = 0;
  for (uint32_t i = 0; i < 100; ++i) {
    Client* c = client.get();
    client->generate(request(i), [&, i, c](const Event& ev) {
      std::lock_guard<std::mutex> lock(mu);
      if (ev.final) {
        got[i].fin = ev.fin;
        ++got[i].finals;
        ++done;
        cv.notify_all();
        return;
      }
      got[i].tokens.push_back(ev.token.id);
      if (got[i].tokens.size() == 20) (void)c->cancel("req-" + std::to_string(i));
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 60s, [&] { return done == 100; })) << done << " of 100 streams ended";
  }
  for (uint32_t i = 0; i < 100; ++i) {
    ASSERT_EQ(got[i].finals, 1) << "stream " << i;
    EXPECT_EQ(got[i].fin.reason, FinishReason::kCancelled) << "stream " << i;
    // Exactly the start of the engine's tokens: the 20 before the cancel plus any that
    // were already on their way.
    ASSERT_GE(got[i].tokens.size(), 20u);
    ASSERT_LT(got[i].tokens.size(), 400u);
    EXPECT_EQ(got[i].fin.completion_tokens, got[i].tokens.size()) << "stream " << i;
    EXPECT_TRUE(std::equal(got[i].tokens.begin(), got[i].tokens.end(), want[i].begin())) << "stream " << i;
  }
  // The ids are free again at once.
  auto reused = test::start_greedy(*client, 100, [&](uint32_t i) {
    GenerateRequest r = request(i);
    r.max_tokens = 4;
    return r;
  });
  for (uint32_t i = 0; i < 100; ++i) {
    Collected c = collect(*reused.streams[i]);
    ASSERT_EQ(c.finals, 1);
    EXPECT_EQ(c.fin.reason, FinishReason::kLength) << c.fin.error_message;
    EXPECT_EQ(c.tokens, reused.want[i]);
  }
  const StatusInfo st = wait_status(*client, [](const StatusInfo& s) { return s.running == 0; });
  EXPECT_EQ(test::in_use(st.workers.at(0)), 0u) << "every block back";
}

TEST(Hardening, CancellingFiveOfFiftyLeavesTheOtherFortyFiveExact) {
  Deployment d({"--workers", "2", "--threads", "1", "--kv-memory", "67108864"});
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  auto [streams, want] =
      test::start_greedy(*client, 50, [](uint32_t i) {
        // The five to cancel would run long: their cancel always lands mid-stream.
        return test::greedy_request(prompt_of(20 + i, 700 + i), i % 10 == 0 ? 400 : 64);
      });
  for (uint32_t i = 0; i < 50; i += 10) {  // 0, 10, 20, 30, 40: after their first token
    auto ev = streams[i]->next_for(30s);
    ASSERT_TRUE(ev && !ev->final);
    streams[i]->cancel();
  }
  for (uint32_t i = 0; i < 50; ++i) {
    Collected c = collect(*streams[i]);
    ASSERT_EQ(c.finals, 1) << "stream " << i;
    if (i % 10 == 0) {
      EXPECT_EQ(c.fin.reason, FinishReason::kCancelled) << "stream " << i;
      continue;
    }
    EXPECT_EQ(c.fin.reason, FinishReason::kLength) << "stream " << i;
    EXPECT_EQ(c.tokens.size(), 64u) << "stream " << i;
    EXPECT_EQ(c.tokens, want[i]) << "stream " << i;
  }
}

TEST(Hardening, AClientThatStopsReadingIsCancelledAndOthersAreUnaffected) {
  // A small per-client send queue (50 messages) so the test does not wait for 10,000.
  Deployment d({"--workers", "1", "--threads", "1", "--kv-memory", "67108864", "--client-send-queue", "50"});
  ASSERT_TRUE(d.ok());
  // The slow client speaks the wire protocol itself, with a tiny receive queue of its own.
  zmq::context_t ctx;
  zmq::socket_t slow(ctx, zmq::socket_type::dealer);
  slow.set(zmq::sockopt::rcvhwm, 8);
  slow.set(zmq::sockopt::linger, 0);
  slow.connect(d.endpoint());
  auto send = [&](const v1::ClientMessage& m) { (void)slow.send(runtime::to_frame(m), zmq::send_flags::none); };
  for (int i = 0; i < 16; ++i) {
    v1::ClientMessage m;
    m.set_version(1);
    v1::Submit* s = m.mutable_submit();
    s->set_request_id("slow-" + std::to_string(i));
    for (int32_t t : prompt_of(10, 800 + i)) s->mutable_tokens()->add_ids(t);
    s->set_max_tokens(480);
    s->set_ignore_eos(true);
    s->set_stream(true);
    send(m);
  }
  // Meanwhile a client that reads gets exactly its tokens.
  auto client = d.client();
  auto [streams, want] =
      test::start_greedy(*client, 8, [](uint32_t i) { return test::greedy_request(prompt_of(20, 850 + i), 200); });
  for (uint32_t i = 0; i < 8; ++i) {
    Collected c = collect(*streams[i]);
    ASSERT_EQ(c.finals, 1);
    EXPECT_EQ(c.tokens, want[i]) << "stream " << i;
  }
  // The slow client keeps heartbeating (it is alive, just not reading) until the scheduler
  // has given up on its requests.
  StatusInfo st;
  for (int i = 0; i < 200; ++i) {
    v1::ClientMessage hb;
    hb.set_version(1);
    hb.mutable_heartbeat();
    send(hb);
    st = client->status(5s).value();
    if (st.running == 0 && st.requests_finished >= 24) break;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(st.running, 0u) << "the slow client's requests were cancelled, not left running";
  EXPECT_EQ(test::in_use(st.workers.at(0)), 0u);
  // Reading again, it gets every request's one final event, saying why.
  std::map<std::string, int> finals;
  std::map<std::string, std::string> why;
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (finals.size() < 16 && std::chrono::steady_clock::now() < deadline) {
    zmq::message_t frame;
    if (!slow.recv(frame, zmq::recv_flags::dontwait)) {
      std::this_thread::sleep_for(10ms);
      continue;
    }
    v1::SchedulerReply r;
    ASSERT_TRUE(runtime::parse_frame(frame, r).is_ok());
    for (const auto& ev : r.events().requests())
      if (ev.has_final()) {
        ++finals[ev.request_id()];
        why[ev.request_id()] = ev.final().error_message();
        EXPECT_EQ(ev.final().finish_reason(), v1::FINISH_REASON_CANCELLED) << ev.request_id();
      }
  }
  ASSERT_EQ(finals.size(), 16u) << "every request of the slow client ends with a final event";
  for (const auto& [id, n] : finals) {
    EXPECT_EQ(n, 1) << id;
    EXPECT_NE(why[id].find("stopped reading"), std::string::npos) << why[id];
  }
}

// The inodes of every TCP socket in LISTEN state on this host (IPv4 and IPv6).
std::set<std::string> tcp_listen_inodes() {
  std::set<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream f(table);
    std::string line;
    std::getline(f, line);  // header
    while (std::getline(f, line)) {
      std::istringstream in(line);
      std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
      in >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (state == "0A") out.insert(inode);  // TCP_LISTEN
    }
  }
  return out;
}

TEST(Hardening, TheDefaultDeploymentListensOnNothingButIpcInAPrivateFolder) {
  Deployment d({"--workers", "2", "--threads", "1"});
  ASSERT_TRUE(d.ok());
  // tandem up and its children: the scheduler and the workers.
  std::vector<pid_t> pids = {d.pid()};
  std::ifstream children("/proc/" + std::to_string(d.pid()) + "/task/" + std::to_string(d.pid()) + "/children");
  for (pid_t p; children >> p;) pids.push_back(p);
  ASSERT_EQ(pids.size(), 4u) << "tandem up, the scheduler and two workers";
  const std::set<std::string> listening = tcp_listen_inodes();
  size_t sockets = 0;
  for (pid_t p : pids) {
    const std::string fd_dir = "/proc/" + std::to_string(p) + "/fd";
    for (const auto& fd : std::filesystem::directory_iterator(fd_dir)) {
      std::error_code ec;
      const std::string target = std::filesystem::read_symlink(fd.path(), ec).string();
      if (ec || target.rfind("socket:[", 0) != 0) continue;
      ++sockets;
      const std::string inode = target.substr(8, target.size() - 9);
      EXPECT_EQ(listening.count(inode), 0u) << "process " << p << " listens on TCP (" << target << ")";
    }
  }
  EXPECT_GT(sockets, 0u) << "the processes' sockets were seen";
  // The ipc:// endpoints live in a folder only this user can enter.
  const std::string endpoint = d.endpoint();
  ASSERT_EQ(endpoint.rfind("ipc://", 0), 0u) << endpoint;
  const auto folder = std::filesystem::path(endpoint.substr(6)).parent_path();
  const auto perms = std::filesystem::status(folder).permissions();
  EXPECT_EQ(perms & std::filesystem::perms::all, std::filesystem::perms::owner_all) << folder;
}

// `tandem probe --ready`'s exit status against this deployment.
int probe_ready(const std::string& endpoint) {
  const std::string dir = test::temp_dir();
  const pid_t p = test::spawn({TANDEM_TANDEM_BIN, "probe", "--endpoint", endpoint, "--ready", "--quiet",
                               "--timeout-ms", "1000"},
                              dir + "/probe.out");
  return test::wait_for(p, 10s);
}

TEST(Hardening, ReadinessFollowsTheDecodeWorkerThroughASegfaultAndItsRestart) {
  // Heartbeats every 200 ms (dead after 0.6 s); restarts after 1.5 s, so there is a window
  // with no decode worker.
  Deployment d({"--prefill", "1", "--decode", "1", "--threads", "1", "--heartbeat-ms", "200",
                "--restart-backoff-ms", "1500", "--kv-memory", "67108864"});
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  EXPECT_EQ(probe_ready(d.endpoint()), 0);
  auto run = test::start_greedy(*client, 8, [](uint32_t i) { return test::greedy_request(prompt_of(20, 950 + i), 400); });
  for (auto& s : run.streams) ASSERT_TRUE(s->next_for(30s).has_value());
  pid_t decode = 0;
  const StatusInfo before = client->status(5s).value();  // (a range-for over a temporary's member would dangle)
  for (const auto& w : before.workers)
    if (w.role == "decode") decode = static_cast<pid_t>(w.pid);
  ASSERT_GT(decode, 0);
  ASSERT_EQ(kill(decode, SIGSEGV), 0);
  // Its streams end (no decode worker left: an error, within the heartbeat timeout), never hang.
  for (auto& s : run.streams) {
    Collected c = collect(*s, 20s);
    ASSERT_EQ(c.finals, 1) << "a stream hung";
  }
  const StatusInfo down = wait_status(*client, [](const StatusInfo& s) { return !s.ready; });
  EXPECT_FALSE(down.ready) << "no decode worker: not ready";
  EXPECT_EQ(probe_ready(d.endpoint()), 1);
  const StatusInfo up = wait_status(*client, [](const StatusInfo& s) { return s.ready; });
  EXPECT_TRUE(up.ready) << "the restarted decode worker registered again";
  EXPECT_EQ(probe_ready(d.endpoint()), 0);
  auto again = test::start_greedy(*client, 4, [](uint32_t i) { return test::greedy_request(prompt_of(30, 990 + i), 12); });
  for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ(collect(*again.streams[i]).tokens, again.want[i]);
}

}  // namespace
}  // namespace tandem
