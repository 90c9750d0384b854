// #18 item 8: a worker that keeps heart-beating but never answers a plan (a failed send, an
// exception in its handler, a hostile peer) used to hold its sequences "in flight" forever:
// their requests hung and a drain never ended. Past its per-step deadline (the liveness timeout
// until it has a step history) the worker is fenced as a dead one is: its sequences fail over to
// the other workers, every request ends with exactly one final event, a drain finishes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "model/gguf.h"
#include "model/model_config.h"
#include "runtime/wire.h"
#include "tandem/client.h"
#include "tandem/v1/worker.pb.h"
#include "tests/e2e/deployment.h"

namespace tandem::test {
namespace {

using namespace std::chrono_literals;

// A worker speaking the real protocol over the real socket that registers with the right model,
// heartbeats on time, and swallows every plan it is sent. Stops at stop() or after 90 s.
class SwallowingWorker {
 public:
  SwallowingWorker(const std::string& endpoint, const std::string& fingerprint)
      : thread_([this, endpoint, fingerprint] { run(endpoint, fingerprint); }) {}
  ~SwallowingWorker() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  bool registered() const { return registered_; }
  int plans() const { return plans_; }
  bool fenced() const { return fenced_; }  // told "unknown worker: register first"

 private:
  void send(zmq::socket_t& s, const v1::WorkerMessage& m) { (void)s.send(runtime::to_frame(m), zmq::send_flags::none); }

  void run(const std::string& endpoint, const std::string& fingerprint) {
    zmq::context_t ctx;
    zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::linger, 0);
    dealer.set(zmq::sockopt::rcvtimeo, 50);
    dealer.connect(endpoint);
    v1::WorkerMessage reg;
    reg.set_version(v1::PROTOCOL_VERSION_CURRENT);
    v1::Register& r = *reg.mutable_register_();
    r.set_role(v1::WORKER_ROLE_BOTH);
    r.set_model_fingerprint(fingerprint);
    r.set_kv_blocks(256);
    r.set_block_tokens(16);
    r.set_block_bytes(16 * 1024);
    r.set_threads(1);
    r.set_pid(static_cast<uint32_t>(::getpid()));
    r.set_name("swallower");
    r.set_kv_endpoint("ipc:///nonexistent/swallower-kv");
    send(dealer, reg);
    uint64_t epoch = 0;
    auto last_beat = std::chrono::steady_clock::now();
    const auto end = last_beat + 90s;
    while (!stop_ && std::chrono::steady_clock::now() < end) {
      zmq::message_t frame;
      if (dealer.recv(frame)) {
        v1::SchedulerCommand c;
        if (!runtime::parse_frame(frame, c).is_ok()) continue;
        if (c.has_register_reply() && c.register_reply().accepted()) {
          epoch = c.register_reply().epoch();
          registered_ = true;
        } else if (c.has_register_reply() && c.register_reply().reason() == v1::REFUSAL_REASON_UNKNOWN_WORKER) {
          fenced_ = true;
          return;  // gone for good: a fenced worker that came back would be a new registration
        } else if (c.has_plan()) {
          ++plans_;  // swallowed
        }
      }
      if (epoch && std::chrono::steady_clock::now() - last_beat >= std::chrono::milliseconds(kQuickHeartbeatMs)) {
        v1::WorkerMessage hb;
        hb.set_version(v1::PROTOCOL_VERSION_CURRENT);
        hb.mutable_heartbeat()->set_epoch(epoch);
        send(dealer, hb);
        last_beat = std::chrono::steady_clock::now();
      }
    }
  }

  std::atomic<bool> stop_{false}, registered_{false}, fenced_{false};
  std::atomic<int> plans_{0};
  std::thread thread_;
};

std::string fingerprint_of(const std::string& model) {
  auto file = model::GgufFile::open(model);
  if (!file) return "";
  return model::model_fingerprint(**file, model::read_model_config(**file).value());
}

// `n` requests of 8 tokens at once, prompts of `prompt` tokens differing in their last from `first` on.
std::vector<std::shared_ptr<Stream>> start_requests(Client& client, int n, int32_t first,
                                                    std::chrono::milliseconds timeout, int prompt = 4) {
  std::vector<std::shared_ptr<Stream>> streams;
  for (int i = 0; i < n; ++i) {
    GenerateRequest r;
    for (int t = 0; t + 1 < prompt; ++t) r.prompt_tokens.push_back(5 + (t * (first + i)) % 200);
    r.prompt_tokens.push_back(first + i);
    r.max_tokens = 8;
    r.ignore_eos = true;
    r.timeout = timeout;
    streams.push_back(client.generate(r));
  }
  return streams;
}

std::unique_ptr<Client> connect(const Deployment& d) {
  ClientOptions o;
  o.endpoint = d.endpoint();
  auto client = Client::connect(o);
  EXPECT_TRUE(client) << client.status().to_string();
  return client ? std::move(client.value()) : nullptr;
}

// A worker that swallows plans, registered beside the deployment's one real worker.
std::unique_ptr<SwallowingWorker> swallower(const Deployment& d, const std::string& model) {
  auto fake = std::make_unique<SwallowingWorker>(d.worker_endpoint(), fingerprint_of(model));
  for (int i = 0; i < 200 && !fake->registered(); ++i) std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(fake->registered());
  return fake;
}

TEST(StuckPlans, AWorkerThatNeverAnswersIsFencedAndItsSequencesFailOver) {
  const std::string model = model_file("tiny", 1);
  Deployment d({"--workers", "1", "--threads", "1", "--heartbeat-ms", kQuickHeartbeat, "--kv-memory", "67108864"},
               model);
  ASSERT_TRUE(d.ok());
  auto fake = swallower(d, model);

  std::unique_ptr<Client> client = connect(d);
  ASSERT_TRUE(client);
  // A 20 s deadline each: a request stuck on the swallowing worker ends, as a failure.
  auto streams = start_requests(*client, 6, 8, 20s);
  const auto start = std::chrono::steady_clock::now();
  for (auto& s : streams) {
    Event ev;
    int tokens = 0, finals = 0;
    for (int i = 0; i < 64 && s->next(ev); ++i) {
      if (ev.final) {
        ++finals;
        EXPECT_EQ(ev.fin.reason, FinishReason::kLength) << s->id() << ": " << ev.fin.error_message;
      } else {
        ++tokens;
      }
    }
    EXPECT_EQ(finals, 1) << s->id();
    EXPECT_EQ(tokens, 8) << s->id();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // It hears it was fenced at its next heartbeat.
  for (int i = 0; i < 100 && !fake->fenced(); ++i) std::this_thread::sleep_for(20ms);
  EXPECT_GT(fake->plans(), 0) << "no plan went to the swallowing worker: the test shows nothing";
  EXPECT_TRUE(fake->fenced()) << "the worker that never answered was not fenced";
  EXPECT_LT(seconds, 15.0) << "the sequences waited for their deadline instead of failing over";
  const std::string log = d.output() + slurp(d.dir() + "/up.out.err");
  EXPECT_NE(log.find("fenced: step"), std::string::npos) << "the fence is not logged: " << log;
}

TEST(StuckPlans, ADrainEndsWhileAWorkerSitsOnAPlan) {
  const std::string model = model_file("tiny", 1);
  Deployment d({"--workers", "1", "--threads", "1", "--heartbeat-ms", kQuickHeartbeat, "--kv-memory", "67108864",
                "--drain-timeout-ms", "60000"},
               model);
  ASSERT_TRUE(d.ok());
  auto fake = swallower(d, model);
  std::unique_ptr<Client> client = connect(d);
  ASSERT_TRUE(client);
  auto streams = start_requests(*client, 4, 20, 0ms);
  for (int i = 0; i < 100 && fake->plans() == 0; ++i) std::this_thread::sleep_for(20ms);
  ASSERT_GT(fake->plans(), 0);
  const std::string dir = temp_dir();
  const auto start = std::chrono::steady_clock::now();
  const pid_t drain =
      spawn({TANDEM_TANDEM_BIN, "drain", "--endpoint", d.admin_endpoint(), "--wait"}, dir + "/drain.out");
  int ended = 0;
  for (auto& s : streams) {
    Event ev;
    for (int i = 0; i < 64 && s->next(ev) && !ev.final; ++i) {
    }
    ASSERT_TRUE(ev.final) << s->id();
    EXPECT_EQ(ev.fin.reason, FinishReason::kLength) << s->id() << ": " << ev.fin.error_message;
    ++ended;
  }
  EXPECT_EQ(ended, 4);
  EXPECT_EQ(wait_for(drain, 30s), 0) << slurp(dir + "/drain.out") << slurp(dir + "/drain.out.err");
  EXPECT_EQ(d.wait_exit(30s), 0) << d.output();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 20.0) << "the drain waited for its timeout: a plan stayed in flight";
}

// The deadline's other side: healthy workers, with two CPU hogs (stress-ng --cpu 2) beside a
// loaded deployment of two workers, are never fenced. Short heartbeats (a 600 ms floor) make it
// harder; 60 s of streams, bounded by count and time.
TEST(StuckPlans, NoHealthyWorkerIsFencedUnderCpuLoad) {
  if (run_command("command -v stress-ng").exit_code != 0)
    GTEST_SKIP() << "stress-ng is not installed (scripts/install-deps.sh)";
  Deployment d({"--workers", "2", "--threads", "1", "--heartbeat-ms", kQuickHeartbeat, "--kv-memory", "67108864"});
  ASSERT_TRUE(d.ok());
  const std::string dir = temp_dir();
  const pid_t hog = spawn({"/usr/bin/stress-ng", "--cpu", "2", "--timeout", "60", "--quiet"}, dir + "/stress.out");
  ASSERT_GT(hog, 0);
  std::unique_ptr<Client> client = connect(d);
  ASSERT_TRUE(client);
  const auto end = std::chrono::steady_clock::now() + 55s;
  int rounds = 0, served = 0, failed = 0;
  for (; rounds < 100000 && std::chrono::steady_clock::now() < end; ++rounds) {
    // 300-token prompts: prefill chunks of 256 as well as decodes, in every step-size bucket.
    auto streams = start_requests(*client, 8, 30 + rounds % 50, 0ms, 300);
    for (auto& s : streams) {
      Event ev;
      for (int i = 0; i < 64 && s->next(ev) && !ev.final; ++i) {
      }
      const bool ok = ev.final && ev.fin.reason == FinishReason::kLength;
      served += ok;
      failed += !ok;
      EXPECT_TRUE(ok) << s->id() << ": " << ev.fin.error_message;
    }
  }
  const StatusInfo st = client->status(5s).value();
  std::string steps;
  for (const auto& w : st.workers)
    steps += " worker " + std::to_string(w.id) + ": " + std::to_string(w.steps) + " steps, mean " +
             std::to_string(w.steps ? double(w.compute_us) / double(w.steps) / 1e3 : 0.0) + " ms;";
  std::printf("under stress-ng --cpu 2: %d rounds of 8 streams, %d served, %d failed;%s\n", rounds, served, failed,
              steps.c_str());
  EXPECT_EQ(wait_for(hog, 30s), 0);
  EXPECT_EQ(st.workers.size(), 2u);
  for (const auto& w : st.workers) EXPECT_GT(w.steps, 0u) << "worker " << w.id << " served nothing";
  const std::string log = d.output() + slurp(d.dir() + "/up.out.err");
  EXPECT_EQ(log.find("fenced"), std::string::npos) << log;
  EXPECT_EQ(log.find("declared dead"), std::string::npos) << log;
}

}  // namespace
}  // namespace tandem::test
