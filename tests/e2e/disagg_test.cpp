// Disaggregated prefill and decode as real processes: `tandem up --prefill P --decode D`.
// Every stream equals the engine alone (and so the `both` deployment); cancellation in the
// middle of a KV transfer and a decode worker killed under load leave no stream hanging and
// every surviving worker's blocks free.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <thread>

#include "tests/e2e/streams.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using test::collect;
using test::Collected;
using test::prompt_of;
using Deployment = test::ClientDeployment;

// Polls status until every worker's blocks are free again (bounded).
StatusInfo settled(Client& client) {
  StatusInfo st;
  for (int i = 0; i < 100; ++i) {
    st = client.status(5s).value();
    bool all_free = true;
    for (const auto& w : st.workers) all_free &= test::in_use(w) == 0;
    if (all_free && st.running == 0) break;
    std::this_thread::sleep_for(50ms);
  }
  return st;
}

class SixtyFourStreams : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(SixtyFourStreams, EqualTheEngineAlone) {
  std::vector<std::string> flags = GetParam();
  flags.insert(flags.end(), {"--threads", "1", "--kv-memory", "67108864", "--prefill-chunk", "64"});
  Deployment d(flags);
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  ASSERT_TRUE(client);
  // max_tokens 1 ends on the prefill worker: no handoff. A third of the requests with presence
  // and frequency penalties, which count only the generated tokens (the prompt's length travels
  // with the first plan and with the KV handoff), a sixth with a logit_bias.
  auto [streams, want] = test::start_greedy(*client, 64, [](uint32_t i) {
    GenerateRequest r = test::greedy_request(prompt_of(1 + (i * 13) % 150, i), 1 + i % 24);
    if (i % 3 == 1) {
      r.presence_penalty = 1.5f;
      r.frequency_penalty = 0.75f;
    }
    if (i % 6 == 2) r.logit_bias = {{static_cast<int32_t>(3 + i), 2.5f}, {7, -100.0f}};
    return r;
  });
  const uint32_t handed_off = 64 - 3;  // i % 24 == 0 for i = 0, 24, 48
  for (uint32_t i = 0; i < 64; ++i) {
    Collected c = collect(*streams[i]);
    ASSERT_EQ(c.finals, 1) << "stream " << i;
    EXPECT_EQ(c.fin.reason, FinishReason::kLength) << c.fin.error_message;
    EXPECT_EQ(c.tokens, want[i]) << "stream " << i;
  }
  const StatusInfo st = settled(*client);
  const bool split = std::find(flags.begin(), flags.end(), "--prefill") != flags.end();
  EXPECT_EQ(st.handoffs, split ? handed_off : 0u);
  EXPECT_EQ(st.handoff_failures, 0u);
  if (split) {
    EXPECT_GT(st.handoff_bytes, 0u);
  }
  for (const auto& w : st.workers) {
    EXPECT_GT(w.steps, 0u) << "worker " << w.id << " (" << w.role << ") takes part";
    EXPECT_EQ(test::in_use(w), 0u) << "worker " << w.id;
  }
}

// The same 64 requests on `both` workers and on split deployments: the same tokens (each
// equals the engine alone).
INSTANTIATE_TEST_SUITE_P(Deployments, SixtyFourStreams,
                         ::testing::Values(std::vector<std::string>{"--workers", "2"},
                                           std::vector<std::string>{"--prefill", "1", "--decode", "1"},
                                           std::vector<std::string>{"--prefill", "1", "--decode", "2",
                                                                    "--oversubscribe"}),
                         [](const auto& info) {
                           return info.param[0] == "--workers" ? std::string("Both2")
                                                               : "Prefill1Decode" + info.param[3];
                         });

TEST(Disagg, CancelMidTransferFreesBothSides) {
  Deployment d({"--prefill", "1", "--decode", "1", "--threads", "1", "--kv-memory", "67108864"});
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  const auto decode_pid = static_cast<pid_t>(test::worker_pid(client->status(5s).value(), "decode"));
  ASSERT_GT(decode_pid, 0);
  // With the decode worker stopped, every handoff stays in the middle of its transfer: the
  // KV is on its way (or queued) and no acknowledgement can come.
  ASSERT_EQ(test::signal_one(decode_pid, SIGSTOP), 0);
  std::vector<std::shared_ptr<Stream>> streams;
  for (uint32_t i = 0; i < 8; ++i) {
    GenerateRequest r;
    r.prompt_tokens = prompt_of(100 + i * 20, i);
    r.max_tokens = 50;
    r.ignore_eos = true;
    streams.push_back(client->generate(r));
  }
  for (auto& s : streams) {  // the first token comes from the prefill worker
    auto ev = s->next_for(10s);
    ASSERT_TRUE(ev && !ev->final);
  }
  const StatusInfo mid = client->status(5s).value();
  EXPECT_EQ(mid.handoffs, 0u) << "no transfer could complete";
  for (auto& s : streams) s->cancel();
  for (auto& s : streams) {
    Collected c = collect(*s, 10s);
    ASSERT_EQ(c.finals, 1);
    EXPECT_EQ(c.fin.reason, FinishReason::kCancelled);
  }
  ASSERT_EQ(test::signal_one(decode_pid, SIGCONT), 0);  // well inside the heartbeat timeout
  const StatusInfo after = settled(*client);
  ASSERT_EQ(after.workers.size(), 2u);
  for (const auto& w : after.workers) EXPECT_EQ(test::in_use(w), 0u) << w.role;
  // The late transfers are dropped, not written into blocks that are free or reused: a
  // new request still gets exactly the engine's tokens.
  auto fresh = test::start_greedy(*client, 1, [](uint32_t) { return test::greedy_request(prompt_of(120, 99), 30); });
  Collected c = collect(*fresh.streams[0]);
  ASSERT_EQ(c.finals, 1);
  EXPECT_EQ(c.tokens, fresh.want[0]);
}

TEST(Disagg, ADecodeWorkerKilledUnderThirtyTwoStreamsFailsOver) {
  // Heartbeats every kQuickHeartbeatMs, dead after 3 missed.
  // No restarts: this is about failover to the survivor (tandem up would restart the victim).
  // The workers sleep 10 ms before each step: 300 tokens take over 3 s, so the victim still
  // runs streams when it is killed, however fast the machine.
  Deployment d({"--prefill", "1", "--decode", "2", "--threads", "1", "--heartbeat-ms", test::kQuickHeartbeat,
                "--kv-memory", "67108864", "--oversubscribe", "--max-restarts", "0", "--test-step-delay-ms", "10"});
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  const StatusInfo before = client->status(5s).value();
  auto [streams, want] = test::start_greedy(
      *client, 32, [](uint32_t i) { return test::greedy_request(prompt_of(5 + i * 5, 200 + i), 300); });
  std::vector<Collected> got(32);
  for (uint32_t i = 0; i < 32; ++i) {  // two tokens each: the second comes from a decode worker
    for (int k = 0; k < 2; ++k) {
      auto ev = streams[i]->next_for(30s);
      ASSERT_TRUE(ev && !ev->final) << "stream " << i;
      got[i].tokens.push_back(ev->token.id);
    }
  }
  const WorkerInfo victim = test::busiest(client->status(5s).value(), "decode");
  ASSERT_GT(victim.running, 0u);
  const auto killed_at = std::chrono::steady_clock::now();
  test::signal_one(static_cast<pid_t>(victim.pid), SIGKILL);
  // Declared dead after 3 heartbeat periods; its sequences are recomputed (prompt + tokens so far) on
  // the prefill worker and handed to the surviving decode worker: exact continuations.
  for (uint32_t i = 0; i < 32; ++i) {
    Collected rest = collect(*streams[i], 60s);
    ASSERT_EQ(rest.finals, 1) << "stream " << i << " hung";
    got[i].tokens.insert(got[i].tokens.end(), rest.tokens.begin(), rest.tokens.end());
    if (rest.fin.reason == FinishReason::kError) {
      ADD_FAILURE() << "stream " << i
                    << " ended with an error although a decode worker survived: " << rest.fin.error_message;
      continue;
    }
    EXPECT_EQ(got[i].tokens, want[i]) << "stream " << i;
  }
  std::printf("all 32 streams done %.1f s after the kill\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count());
  const StatusInfo after = settled(*client);
  ASSERT_EQ(after.workers.size(), 2u);
  for (const auto& w : after.workers) {
    EXPECT_EQ(test::in_use(w), 0u) << "worker " << w.id << " (" << w.role << ")";
    for (const auto& b : before.workers)
      if (b.id == w.id) {
        EXPECT_EQ(w.kv_blocks_free + w.kv_blocks_cached, b.kv_blocks_free) << "back to its starting count";
      }
  }
}

// The workers sleep 20 ms before each step: 400 tokens take over 8 s, so every stream is still
// running when the decode worker dies, however fast the machine.
TEST(Disagg, TheLastDecodeWorkerKilledEndsStreamsWithErrorsNotHangs) {
  Deployment d({"--prefill", "1", "--decode", "1", "--threads", "1", "--heartbeat-ms", test::kQuickHeartbeat,
                "--kv-memory", "67108864", "--max-restarts", "0", "--test-step-delay-ms", "20"});
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  std::vector<std::shared_ptr<Stream>> streams;
  for (uint32_t i = 0; i < 8; ++i) {
    GenerateRequest r;
    r.prompt_tokens = prompt_of(20 + i, 300 + i);
    r.max_tokens = 400;
    r.ignore_eos = true;
    streams.push_back(client->generate(r));
  }
  for (auto& s : streams) {
    for (int k = 0; k < 2; ++k) {
      auto ev = s->next_for(30s);
      ASSERT_TRUE(ev && !ev->final);
    }
  }
  const StatusInfo running = client->status(5s).value();
  for (const auto& w : running.workers)
    if (w.role == "decode") test::signal_one(static_cast<pid_t>(w.pid), SIGKILL);
  for (auto& s : streams) {
    Collected c = collect(*s, 20s);  // heartbeat timeout (0.6 s) plus margin
    ASSERT_EQ(c.finals, 1) << "a stream hung";
    EXPECT_EQ(c.fin.reason, FinishReason::kError);
    EXPECT_EQ(c.fin.code, Code::kUnavailable) << c.fin.error_message;
  }
  const StatusInfo st = settled(*client);
  EXPECT_FALSE(st.ready) << "a prefill worker alone cannot serve";
  ASSERT_EQ(st.workers.size(), 1u);
  EXPECT_EQ(test::in_use(st.workers[0]), 0u);
}

// 16 greedy streams of 24 tokens through `tandem up` with `flags`: their tokens and the bytes
// handed over. With `refused` (a split deployment), a decode worker started with those KV
// flags must be refused for its KV format, the error naming `refusal`.
std::pair<std::vector<std::vector<int32_t>>, uint64_t> run_handoff(std::vector<std::string> flags,
                                                                   const std::vector<std::string>& refused = {},
                                                                   const std::string& refusal = "KV format") {
  flags.insert(flags.end(), {"--threads", "1", "--kv-memory", "67108864"});
  Deployment d(flags);
  EXPECT_TRUE(d.ok());
  std::pair<std::vector<std::vector<int32_t>>, uint64_t> out;
  if (!d.ok()) return out;
  auto client = d.client();
  std::vector<std::shared_ptr<Stream>> streams;
  for (uint32_t i = 0; i < 16; ++i) {
    GenerateRequest r = test::greedy_request(prompt_of(40 + i * 9, 500 + i), 24);
    r.ignore_eos = true;
    streams.push_back(client->generate(r));
  }
  for (auto& s : streams) {
    Collected c = collect(*s);
    EXPECT_EQ(c.finals, 1);
    EXPECT_EQ(c.fin.reason, FinishReason::kLength) << c.fin.error_message;
    out.first.push_back(c.tokens);
  }
  out.second = client->status(5s).value().handoff_bytes;
  if (!refused.empty()) {  // a decode worker storing KV in another format cannot join
    const std::string dir = test::temp_dir();
    std::vector<std::string> argv = {std::string(TANDEM_TANDEM_BIN) + "-worker",
                                     "--model",
                                     test::model_file("tiny", 1),
                                     "--scheduler",
                                     d.worker_endpoint(),
                                     "--threads",
                                     "1",
                                     "--role",
                                     "decode"};
    argv.insert(argv.end(), refused.begin(), refused.end());
    const pid_t w = test::spawn(argv, dir + "/w.out");
    EXPECT_NE(test::wait_for(w, 30s), 0);
    const std::string err = test::slurp(dir + "/w.out.err");
    EXPECT_NE(err.find(refusal), std::string::npos) << err;
  }
  return out;
}

// Quantized KV moves as its quantized bytes: the split gives the same tokens as one worker
// of role both with the same format, and moves fewer bytes than F32 does.
TEST(Disagg, QuantizedKvIsHandedOverAsIsAndAMismatchedWorkerIsRefused) {
  const auto both8 = run_handoff({"--workers", "1", "--kv-bits", "8"});
  // Against 8-bit workers: 8-bit too, but with an F32 window of one block; against F32: 8-bit.
  const auto split8 =
      run_handoff({"--prefill", "1", "--decode", "1", "--kv-bits", "8"}, {"--kv-bits", "8", "--kv-f32-window", "1"});
  const auto split32 =
      run_handoff({"--prefill", "1", "--decode", "1", "--kv-bits", "0"}, {"--kv-bits", "8", "--kv-f32-window", "2"});
  EXPECT_EQ(split8.first, both8.first) << "8-bit KV handed over byte for byte";
  EXPECT_GT(split8.second, 0u);
  // 8-bit blocks are 2.67x smaller here (head_dim 16); each sequence also moves the tail
  // of its F32 window (6 blocks), so these prompts (115 blocks in all) move 1.4x fewer bytes.
  EXPECT_LT(split8.second * 5, split32.second * 4) << "8-bit blocks move fewer bytes";
}

// Rotated KV (its codes, norms and F32 window tail) moves as its bytes too: a split deployment
// gives the tokens of one worker of role both with the same format, and a decode worker with
// another scheme or width is refused, the error naming the formats.
TEST(Disagg, RotatedKvIsHandedOverAsIsAndAMismatchedWorkerIsRefused) {
  const std::vector<std::string> rot4 = {"--kv-bits", "4", "--kv-quant-scheme", "rotated"};
  auto with = [&](std::vector<std::string> head) {
    head.insert(head.end(), rot4.begin(), rot4.end());
    return head;
  };
  const auto both = run_handoff(with({"--workers", "1"}));
  const auto split = run_handoff(with({"--prefill", "1", "--decode", "1"}), {"--kv-bits", "4"}, "KV format q4/g64");
  EXPECT_EQ(split.first, both.first) << "rotated KV handed over byte for byte";
  EXPECT_GT(split.second, 0u);
  const auto split3 = run_handoff({"--prefill", "1", "--decode", "1", "--kv-bits", "3", "--kv-quant-scheme", "rotated"},
                                  rot4, "KV format rotated 4-bit");
  // (3-bit blocks are smaller, but at head_dim 16 a sequence's F32 window tail takes 16 of them
  // against 11 at 4 bits: these short prompts move 6% more bytes, so bytes are not compared.)
  EXPECT_GT(split3.second, 0u);
  EXPECT_NE(split3.first, split.first) << "3 and 4 bits are different codes";
}

}  // namespace
}  // namespace tandem
