// tandem as a service: `tandem up` starts real processes over ipc://, the client library
// talks to them. Streams must equal the engine alone; cancellation, bad input and dead
// clients must leave the service clean and serving.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <zmq.hpp>

#include "runtime/wire.h"
#include "tandem/client.h"
#include "tandem/v1/client.pb.h"
#include "tandem/v1/worker.pb.h"
#include "tests/e2e/streams.h"
#include "workers/engine/engine.h"
#include "workers/engine/generate.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using test::slurp;
using test::spawn;

using test::collect;
using test::Collected;
using test::prompt_of;
using Deployment = test::ClientDeployment;

// Sixty-four greedy streams against the engine alone: tests/e2e/disagg_test.cpp, with `both`
// workers and with split prefill/decode deployments.

TEST(Serve, CancelAtEveryStageLeavesOthersExactAndBlocksFree) {
  Deployment d({"--workers", "1", "--threads", "1", "--max-running", "2", "--prefill-chunk", "16", "--max-batch-tokens",
                "32", "--kv-memory", "33554432"});
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  auto engine = engine::Engine::load(test::model_file("tiny", 1), {1, engine::GemmBackend::kPacked}).value();
  GenerateRequest keep;
  keep.prompt_tokens = prompt_of(20, 1);
  keep.max_tokens = 60;
  keep.ignore_eos = true;
  auto kept = client->generate(keep);
  GenerateRequest decoding = keep, prefilling = keep, queued = keep;
  decoding.prompt_tokens = prompt_of(10, 2);
  decoding.max_tokens = 400;
  prefilling.prompt_tokens = prompt_of(400, 3);
  queued.prompt_tokens = prompt_of(10, 4);
  auto s_decoding = client->generate(decoding);
  Event ev;
  ASSERT_TRUE(s_decoding->next(ev));  // it is decoding now
  auto s_prefilling = client->generate(prefilling);
  auto s_queued = client->generate(queued);  // max-running 2: waits
  s_queued->cancel();
  s_prefilling->cancel();
  s_decoding->cancel();
  for (auto* s : {s_queued.get(), s_prefilling.get(), s_decoding.get()}) {
    Collected c = collect(*s);
    EXPECT_EQ(c.finals, 1);
    EXPECT_EQ(c.fin.reason, FinishReason::kCancelled) << s->id() << " " << c.fin.error_message;
  }
  Collected k = collect(*kept);
  engine::GenerateOptions opt;
  opt.max_tokens = 60;
  opt.ignore_eos = true;
  EXPECT_EQ(k.tokens, engine::generate(*engine, keep.prompt_tokens, opt).value().tokens);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  StatusInfo st;
  do {
    st = client->status(5s).value();
  } while (st.running > 0 && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(st.running, 0u);
  EXPECT_EQ(test::in_use(st.workers.at(0)), 0u);
}

// The worker sleeps 20 ms before each step: the 480-token request cannot finish by itself
// in under 9.6 s, so a request that ends with fewer tokens was cancelled (client timeout 1 s).
TEST(Serve, AClientKilledWithSigkillHasItsRequestsCancelled) {
  constexpr uint64_t kMaxTokens = 480;
  Deployment d({"--workers", "1", "--threads", "1", "--client-timeout-ms", "1000", "--heartbeat-ms", "200",
                "--test-step-delay-ms", "20"});
  ASSERT_TRUE(d.ok());
  const std::string dir = test::temp_dir();
  const pid_t gen = spawn({TANDEM_TANDEM_BIN, "generate", "--endpoint", d.endpoint(), "--tokens", "1,5,6,7",
                           "--max-tokens", std::to_string(kMaxTokens), "--ignore-eos"},
                          dir + "/gen.out");
  auto client = d.client();
  const auto until_running = std::chrono::steady_clock::now() + 20s;
  while (client->status(5s).value().running == 0 && std::chrono::steady_clock::now() < until_running)
    std::this_thread::sleep_for(10ms);
  ASSERT_GT(client->status(5s).value().running, 0u);
  test::signal_one(gen, SIGKILL);
  waitpid(gen, nullptr, 0);
  const auto killed = std::chrono::steady_clock::now();
  StatusInfo st;
  do {  // bounded wait, not a speed assertion: the token count below tells a cancel from a finish
    st = client->status(5s).value();
    std::this_thread::sleep_for(50ms);
  } while (st.running > 0 && std::chrono::steady_clock::now() < killed + 60s);
  EXPECT_EQ(st.running, 0u);
  EXPECT_LT(st.tokens_generated, kMaxTokens) << "the request ran to its end instead of being cancelled";
  EXPECT_EQ(test::in_use(st.workers.at(0)), 0u);
}

// Each status reply echoes its query's id, so a client can tell a late reply from the
// answer to its current query.
TEST(Serve, StatusRepliesEchoTheQueryId) {
  Deployment d({"--workers", "1", "--threads", "1"});
  ASSERT_TRUE(d.ok());
  zmq::context_t ctx;
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::rcvtimeo, 10000);
  dealer.connect(d.endpoint());
  for (uint64_t id : {uint64_t{7}, uint64_t{0}, uint64_t{1} << 40}) {
    v1::ClientMessage m;
    m.set_version(v1::PROTOCOL_VERSION_CURRENT);
    m.mutable_status()->set_query_id(id);
    ASSERT_TRUE(dealer.send(runtime::to_frame(m), zmq::send_flags::none));
    zmq::message_t frame;
    ASSERT_TRUE(dealer.recv(frame));
    v1::SchedulerReply r;
    ASSERT_TRUE(runtime::parse_frame(frame, r).is_ok());
    ASSERT_TRUE(r.has_status());
    EXPECT_EQ(r.status().query_id(), id);
  }
}

TEST(Serve, EveryBadFieldGetsItsErrorAndTheServiceKeepsServing) {
  Deployment d({"--workers", "1", "--threads", "1"});
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  struct Case {
    std::function<void(GenerateRequest&)> edit;
    std::string needle;
  };
  std::vector<Case> cases = {
      {[](GenerateRequest& r) {
         r.prompt_tokens = {};
         r.prompt_text = "";
       },
       "prompt"},
      {[](GenerateRequest& r) { r.prompt_tokens = prompt_of(600, 1); }, "context length"},
      {[](GenerateRequest& r) { r.max_tokens = 0; }, "max_tokens"},
      {[](GenerateRequest& r) { r.max_tokens = 100000; }, "max_tokens"},
      {[](GenerateRequest& r) { r.temperature = -1; }, "temperature"},
      {[](GenerateRequest& r) { r.top_p = 1.5f; }, "top_p"},
      {[](GenerateRequest& r) { r.top_k = -2; }, "top_k"},
      {[](GenerateRequest& r) {
         r.prompt_tokens = {1, 99999};
       },
       "outside the vocabulary"},
      {[](GenerateRequest& r) { r.stop_strings.assign(17, "x"); }, "stop_strings"},
      {[](GenerateRequest& r) { r.stop_token_sequences.assign(17, {5}); }, "stop"},
  };
  for (auto& c : cases) {
    GenerateRequest r;
    r.prompt_tokens = {1, 2, 3};
    r.max_tokens = 4;
    c.edit(r);
    auto s = client->generate(r);
    Collected got = collect(*s, 10s);
    EXPECT_EQ(got.finals, 1) << c.needle;
    EXPECT_EQ(got.fin.reason, FinishReason::kError) << c.needle;
    EXPECT_NE(got.fin.error_message.find(c.needle), std::string::npos) << c.needle << ": " << got.fin.error_message;
  }
  // Garbage and a wrong protocol version, straight on the socket.
  zmq::context_t ctx;
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.set(zmq::sockopt::rcvtimeo, 5000);
  raw.connect(d.endpoint());
  raw.send(zmq::buffer(std::string("\xff\xff garbage")), zmq::send_flags::none);
  zmq::message_t reply;
  ASSERT_TRUE(raw.recv(reply));
  v1::SchedulerReply r;
  ASSERT_TRUE(runtime::parse_frame(reply, r).is_ok());
  EXPECT_TRUE(r.has_error());
  EXPECT_NE(r.error().message().find("malformed"), std::string::npos) << r.error().message();
  v1::ClientMessage m;
  m.set_version(99);
  m.mutable_heartbeat();
  raw.send(runtime::to_frame(m), zmq::send_flags::none);
  ASSERT_TRUE(raw.recv(reply));
  ASSERT_TRUE(runtime::parse_frame(reply, r).is_ok());
  EXPECT_NE(r.error().message().find("protocol version 99"), std::string::npos) << r.error().message();
  // Still serving.
  GenerateRequest ok;
  ok.prompt_text = "hello";
  ok.max_tokens = 5;
  ok.ignore_eos = true;
  auto s = client->generate(ok);
  Collected c = collect(*s);
  EXPECT_EQ(c.fin.reason, FinishReason::kLength) << c.fin.error_message;
  EXPECT_EQ(c.tokens.size(), 5u);
}

TEST(Serve, ALongPromptNeverStallsRunningStreams) {
  Deployment d({"--workers", "1", "--threads", "1", "--prefill-chunk", "32", "--max-batch-tokens", "64"});
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  std::vector<std::shared_ptr<Stream>> running;
  for (uint32_t i = 0; i < 4; ++i) {
    GenerateRequest r;
    r.prompt_tokens = prompt_of(8, i);
    r.max_tokens = 150;
    r.ignore_eos = true;
    running.push_back(client->generate(r));
    Event ev;
    ASSERT_TRUE(running.back()->next(ev));
  }
  GenerateRequest big;
  big.prompt_tokens = prompt_of(8 * 32, 9);
  big.max_tokens = 4;
  big.ignore_eos = true;
  auto s = client->generate(big);
  Collected c = collect(*s);
  EXPECT_EQ(c.fin.reason, FinishReason::kLength);
  for (auto& r : running) collect(*r);
  auto st = client->status(5s).value();
  // The step composition, from the scheduler's own counters: no step carried more than
  // one chunk of prompt, and no decoding stream was ever left out of a step.
  EXPECT_LE(st.max_step_prefill_tokens, 32u);
  EXPECT_EQ(st.decode_stalls, 0u);
}

// The workers sleep 10 ms before each step: 300 tokens take over 3 s, so the victim still runs
// streams when it is killed, however fast the machine.
TEST(Serve, StreamsOfAKilledWorkerContinueExactlyOnTheOther) {
  Deployment d({"--workers", "2", "--threads", "1", "--heartbeat-ms", test::kQuickHeartbeat, "--kv-memory", "67108864",
                "--max-restarts", "0", "--test-step-delay-ms", "10"});  // no restart: the survivor alone serves
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  auto [streams, want] = test::start_greedy(
      *client, 16, [](uint32_t i) { return test::greedy_request(prompt_of(5 + i * 7, 100 + i), 300); });
  std::vector<Collected> got(16);
  for (uint32_t i = 0; i < 16; ++i) {  // everyone has started streaming
    Event ev;
    ASSERT_TRUE(streams[i]->next(ev));
    got[i].tokens.push_back(ev.token.id);
  }
  auto st = client->status(5s).value();
  ASSERT_EQ(st.workers.size(), 2u);
  const WorkerInfo victim = st.workers[0].running > 0 ? st.workers[0] : st.workers[1];
  ASSERT_GT(victim.running, 0u);
  test::signal_one(static_cast<pid_t>(victim.pid), SIGKILL);
  // The scheduler declares it dead after 3 silent heartbeats and re-places its sequences on
  // the survivor (recompute of prompt + tokens so far): every stream completes, exactly,
  // with no token duplicated or missing.
  for (uint32_t i = 0; i < 16; ++i) {
    Collected rest = collect(*streams[i], 60s);
    ASSERT_EQ(rest.finals, 1) << "stream " << i << " hung";
    EXPECT_EQ(rest.fin.reason, FinishReason::kLength) << "stream " << i << ": " << rest.fin.error_message;
    got[i].tokens.insert(got[i].tokens.end(), rest.tokens.begin(), rest.tokens.end());
    EXPECT_EQ(got[i].tokens, want[i]) << "stream " << i;
  }
  auto after = client->status(5s).value();
  ASSERT_EQ(after.workers.size(), 1u);
  EXPECT_EQ(test::in_use(after.workers[0]), 0u);
}

TEST(Serve, AWorkerWithAnotherModelIsRefusedWithAClearError) {
  Deployment d({"--workers", "1", "--threads", "1"});
  ASSERT_TRUE(d.ok());
  const std::string bin = std::string(TANDEM_TANDEM_BIN) + "-worker";  // build/cli/tandem-worker
  const std::string dir = test::temp_dir();
  const pid_t w =
      spawn({bin, "--model", test::model_file("tiny", 2), "--scheduler", d.worker_endpoint(), "--threads", "1"},
            dir + "/w.out");
  int status = 0;
  for (int i = 0; i < 3000 && waitpid(w, &status, WNOHANG) == 0; ++i)
    std::this_thread::sleep_for(20ms);  // 60 s: sanitizers
  if (waitpid(w, &status, WNOHANG) == 0) {
    test::signal_one(w, SIGKILL);
    waitpid(w, &status, 0);
    FAIL() << "the mismatched worker was not refused";
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0);
  const std::string err = slurp(dir + "/w.out.err");
  EXPECT_NE(err.find("model fingerprint"), std::string::npos) << err;
  // The deployment is unaffected.
  auto client = d.client();
  EXPECT_EQ(client->status(5s).value().workers.size(), 1u);
}

// Refusals carry a typed reason, which is what a worker decides on (never the message text):
// a message from a worker the scheduler does not know asks it to register again; a
// registration with another model is final.
TEST(Serve, WorkerRefusalsCarryTheirReason) {
  Deployment d({"--workers", "1", "--threads", "1"});
  ASSERT_TRUE(d.ok());
  zmq::context_t ctx;
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::rcvtimeo, 10000);
  dealer.connect(d.worker_endpoint());
  auto refusal = [&](const v1::WorkerMessage& m) {
    EXPECT_TRUE(dealer.send(runtime::to_frame(m), zmq::send_flags::none));
    zmq::message_t frame;
    v1::SchedulerCommand c;
    EXPECT_TRUE(dealer.recv(frame));
    EXPECT_TRUE(runtime::parse_frame(frame, c).is_ok());
    EXPECT_TRUE(c.has_register_reply()) << c.DebugString();
    EXPECT_FALSE(c.register_reply().accepted());
    return c.register_reply().reason();
  };
  v1::WorkerMessage beat;
  beat.set_version(v1::PROTOCOL_VERSION_CURRENT);
  beat.mutable_heartbeat();
  EXPECT_EQ(refusal(beat), v1::REFUSAL_REASON_UNKNOWN_WORKER);
  v1::WorkerMessage reg;
  reg.set_version(v1::PROTOCOL_VERSION_CURRENT);
  reg.mutable_register_()->set_role(v1::WORKER_ROLE_BOTH);
  reg.mutable_register_()->set_model_fingerprint("another model");
  EXPECT_EQ(refusal(reg), v1::REFUSAL_REASON_MODEL_FINGERPRINT);
}

}  // namespace
}  // namespace tandem
