// The hybrid qwen35 model (#20) as real processes: `tandem up` on make-model's tiny qwen35
// file, streams of shared and random prompts, greedy and seeded, with prompts cut into chunks
// of 7 (off the 16-token blocks and the 64-token grid) and fewer state slots than streams, so
// slots are reused, colocated and split (prefill and decode workers, the state handed over with
// the KV). Every stream equals the engine alone (whole prompt in one chunk, batch of one) token
// for token, those resumed from a prefix-cache checkpoint too; every block and state slot comes
// back after finishing and after cancelling.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <random>
#include <thread>

#include "tests/e2e/streams.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using test::collect;
using test::Collected;
using test::engine_alone;
using Deployment = test::ClientDeployment;

std::string hybrid_model() {
  static const std::string path = test::tiny_model("qwen35", 3);
  return path;
}

std::vector<GenerateRequest> requests(uint32_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<int32_t> shared = test::prompt_of(40, 9);
  std::vector<GenerateRequest> out;
  for (uint32_t i = 0; i < n; ++i) {
    GenerateRequest r;
    r.prompt_tokens = i % 2 == 0 ? shared : test::prompt_of(5 + rng() % 70, 100 + i);
    r.max_tokens = 12 + i % 13;
    r.ignore_eos = true;
    if (i % 4 >= 2) {
      r.temperature = 1.0f;
      r.seed = 50 + i;
    }
    out.push_back(std::move(r));
  }
  return out;
}

// Every block and slot back (bounded wait for the last releases).
StatusInfo wait_idle(Client& client) {
  StatusInfo st;
  for (int i = 0; i < 100; ++i) {
    st = client.status(5s).value();
    uint32_t used = 0;
    for (const auto& w : st.workers) used += test::in_use(w) + (w.state_slots_total - w.state_slots_free);
    if (used == 0 && st.running == 0) break;
    std::this_thread::sleep_for(50ms);
  }
  return st;
}

// Starts every request on `client`; each stream ends once, by length, with the tokens of `want`.
void expect_streams(Client& client, std::vector<GenerateRequest> reqs, const std::vector<std::vector<int32_t>>& want) {
  std::vector<std::shared_ptr<Stream>> streams;
  for (GenerateRequest& r : reqs) streams.push_back(client.generate(std::move(r)));
  for (size_t i = 0; i < streams.size(); ++i) {
    Collected c = collect(*streams[i]);
    ASSERT_EQ(c.finals, 1) << "stream " << i;
    EXPECT_EQ(c.fin.reason, FinishReason::kLength) << "stream " << i << ": " << c.fin.error_message;
    EXPECT_EQ(c.tokens, want[i]) << "stream " << i;
  }
}

// Serves `reqs` on `tandem up` with `flags` and 3 state slots per worker: every stream equals
// the engine alone and ends by its length; once idle, every worker has its blocks and slots back.
// Returns that status ({} when the deployment did not start).
StatusInfo serve_as_the_engine_alone(std::vector<std::string> flags, std::vector<GenerateRequest> reqs) {
  auto engine = engine::Engine::load(hybrid_model(), {1, engine::GemmBackend::kPacked}).value();
  std::vector<std::vector<int32_t>> want;
  for (const GenerateRequest& r : reqs) want.push_back(engine_alone(*engine, r));
  flags.insert(flags.end(), {"--threads", "1", "--kv-memory", "67108864", "--state-slots", "3"});
  Deployment d(flags, hybrid_model());
  auto client = d.ok() ? d.client() : nullptr;
  EXPECT_TRUE(client);
  if (!client) return {};
  expect_streams(*client, std::move(reqs), want);
  const StatusInfo st = wait_idle(*client);
  for (const auto& w : st.workers) {
    EXPECT_EQ(test::in_use(w), 0u) << "worker " << w.id;
    EXPECT_EQ(w.state_slots_total, 3u) << "worker " << w.id;
    EXPECT_EQ(w.state_slots_free, 3u) << "worker " << w.id;
  }
  return st;
}

TEST(HybridStreams, EqualTheEngineAloneWhateverTheBatchAndChunking) {
  const StatusInfo st = serve_as_the_engine_alone({"--workers", "2", "--prefill-chunk", "7"}, requests(16, 4));
  EXPECT_EQ(st.cached_prompt_tokens, 0u) << "no 40-token prompt reaches a checkpoint position (every 256)";
}

// The prefix cache for hybrids (docs/HYBRID.md "Prefix cache"): prompts sharing a 200-token
// prefix (three grid chunks and more) cut in chunks of 50 (off the grid): the first one saves
// state checkpoints every 64 tokens at its published blocks, the others resume from the last
// one their prefix reaches and must still equal the engine alone token for token.
TEST(HybridStreams, PrefixCacheHitsResumeFromCheckpointsToTheSameTokens) {
  auto engine = engine::Engine::load(hybrid_model(), {1, engine::GemmBackend::kPacked}).value();
  const std::vector<int32_t> shared = test::prompt_of(200, 17);
  std::vector<GenerateRequest> reqs;
  std::vector<std::vector<int32_t>> want;
  for (uint32_t i = 0; i < 10; ++i) {
    GenerateRequest r;
    r.prompt_tokens = shared;
    r.prompt_tokens.resize(i == 1 ? 130 : 200);  // one stops inside the shared prefix
    const std::vector<int32_t> own = test::prompt_of(1 + i * 7 % 40, 300 + i);
    r.prompt_tokens.insert(r.prompt_tokens.end(), own.begin(), own.end());
    r.max_tokens = 10 + i;
    r.ignore_eos = true;
    if (i % 3 == 2) {
      r.temperature = 1.0f;
      r.seed = 70 + i;
    }
    want.push_back(engine_alone(*engine, r));
    reqs.push_back(std::move(r));
  }
  Deployment d({"--workers", "1", "--threads", "1", "--kv-memory", "67108864", "--prefill-chunk", "50", "--state-slots",
                "4", "--state-checkpoints", "3", "--checkpoint-interval", "64"},
               hybrid_model());
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  ASSERT_TRUE(client);
  Collected first = collect(*client->generate(reqs[0]));  // computes and checkpoints the prefix
  EXPECT_EQ(first.tokens, want[0]) << first.fin.error_message;
  std::vector<std::shared_ptr<Stream>> streams;
  for (size_t i = 1; i < reqs.size(); ++i) streams.push_back(client->generate(reqs[i]));
  for (size_t i = 0; i < streams.size(); ++i) {
    Collected c = collect(*streams[i]);
    ASSERT_EQ(c.finals, 1) << "stream " << i + 1;
    EXPECT_EQ(c.fin.reason, FinishReason::kLength) << c.fin.error_message;
    EXPECT_EQ(c.tokens, want[i + 1]) << "stream " << i + 1;
  }
  const StatusInfo st = wait_idle(*client);
  // 8 prompts resume at 192 (the last checkpoint of 200 shared tokens), the short one at 128.
  EXPECT_EQ(st.cached_prompt_tokens, 8u * 192 + 128);
  ASSERT_EQ(st.workers.size(), 1u);
  EXPECT_EQ(st.workers[0].checkpoints_total, 3u);
  EXPECT_EQ(st.workers[0].checkpoints_free, 0u) << "checkpoints at 64, 128 and 192 stay cached";
  EXPECT_EQ(test::in_use(st.workers[0]), 0u);
  EXPECT_EQ(st.workers[0].state_slots_free, 4u);
}

TEST(HybridStreams, CancelledStreamsGiveTheirSlotsBack) {
  auto engine = engine::Engine::load(hybrid_model(), {1, engine::GemmBackend::kPacked}).value();
  Deployment d({"--workers", "1", "--threads", "1", "--kv-memory", "67108864", "--state-slots", "2"}, hybrid_model());
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  ASSERT_TRUE(client);
  for (int round = 0; round < 3; ++round) {  // each round cancels two long streams after a token
    std::vector<std::shared_ptr<Stream>> doomed;
    for (uint32_t i = 0; i < 2; ++i) {
      GenerateRequest r;
      r.prompt_tokens = test::prompt_of(10, 30 + i);
      r.max_tokens = 400;
      r.ignore_eos = true;
      doomed.push_back(client->generate(std::move(r)));
    }
    for (auto& s : doomed) {
      auto ev = s->next_for(30s);
      ASSERT_TRUE(ev && !ev->final);
      s->cancel();
    }
    for (auto& s : doomed) EXPECT_EQ(collect(*s).fin.reason, FinishReason::kCancelled);
  }
  std::vector<GenerateRequest> reqs = requests(4, 8);
  std::vector<std::vector<int32_t>> want;
  for (const GenerateRequest& r : reqs) want.push_back(engine_alone(*engine, r));
  expect_streams(*client, std::move(reqs), want);
  const StatusInfo st = wait_idle(*client);
  ASSERT_EQ(st.workers.size(), 1u);
  EXPECT_EQ(st.workers[0].state_slots_free, 2u);
  EXPECT_EQ(test::in_use(st.workers[0]), 0u);
}

// A pool too small for every stream's growth: the scheduler preempts and recomputes (a hybrid
// sequence restarts from position 0 with a zeroed slot); the streams still equal the engine alone.
TEST(HybridStreams, PreemptedStreamsRecomputeToTheSameTokens) {
  auto engine = engine::Engine::load(hybrid_model(), {1, engine::GemmBackend::kPacked}).value();
  std::vector<GenerateRequest> reqs;
  std::vector<std::vector<int32_t>> want;
  for (uint32_t i = 0; i < 8; ++i) {
    GenerateRequest r;
    r.prompt_tokens = test::prompt_of(20 + 3 * i, 60 + i);
    r.max_tokens = 60;
    r.ignore_eos = true;
    want.push_back(engine_alone(*engine, r));
    reqs.push_back(std::move(r));
  }
  Deployment d({"--workers", "1", "--threads", "1", "--kv-blocks", "24", "--prefill-chunk", "7"}, hybrid_model());
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  ASSERT_TRUE(client);
  expect_streams(*client, std::move(reqs), want);
  const StatusInfo st = wait_idle(*client);
  EXPECT_GT(st.preemptions, 0u) << "the pool was meant to run short";
  EXPECT_EQ(st.workers[0].state_slots_free, st.workers[0].state_slots_total);
}

// 16 streams with prompts of 37, 64, 100 and 130 tokens decoding across grid points, greedy
// and seeded.
std::vector<GenerateRequest> grid_crossing_requests() {
  const uint32_t lengths[] = {37, 64, 100, 130};
  std::vector<GenerateRequest> reqs;
  for (uint32_t i = 0; i < 16; ++i) {
    GenerateRequest r;
    r.prompt_tokens = test::prompt_of(lengths[i % 4], 200 + i);
    r.max_tokens = i % 4 == 3 ? 70 : 30 + i % 7;  // 130 + 70 crosses 192; 37 + 30 and 100 + 30 cross too
    r.ignore_eos = true;
    if (i / 4 % 2 == 1) {
      r.temperature = 1.0f;
      r.seed = 70 + i;
    }
    reqs.push_back(std::move(r));
  }
  return reqs;
}

// A split deployment (#20: "bitwise invariance ... split deployment"): one prefill and two
// decode workers; prompts of 37, 64, 100 and 130 tokens (off, on and across the 64-token grid)
// prefilled in chunks of 7, each handed over with its state slot (the state after the prompt,
// the open grid chunk's rows, the conv inputs) and decoded on across grid points; 3 slots per
// worker for 16 streams, so handoffs wait for decode slots and slots are reused. Every stream
// equals the engine alone token for token, and every block and slot comes back.
TEST(HybridStreams, ASplitDeploymentHandsStatesOverAndEqualsTheEngineAlone) {
  const StatusInfo st = serve_as_the_engine_alone(
      {"--prefill", "1", "--decode", "2", "--oversubscribe", "--prefill-chunk", "7"}, grid_crossing_requests());
  EXPECT_EQ(st.handoffs, 16u);
  EXPECT_EQ(st.handoff_failures, 0u);
  EXPECT_EQ(st.workers.size(), 3u);
  for (const auto& w : st.workers) EXPECT_GT(w.steps, 0u) << "worker " << w.id << " (" << w.role << ") takes part";
}

// The same split deployment speculating (--spec ngram): the decode workers' slots keep older
// conv inputs for rolling rounds back, the prefill worker's none, so every handoff moves a slot
// between two layouts of different size; the rounds' rejected drafts are rolled back after it.
TEST(HybridStreams, ASpeculatingSplitDeploymentEqualsTheEngineAlone) {
  const StatusInfo st = serve_as_the_engine_alone(
      {"--prefill", "1", "--decode", "2", "--oversubscribe", "--prefill-chunk", "7", "--spec", "ngram"},
      grid_crossing_requests());
  EXPECT_EQ(st.handoffs, 16u);
  EXPECT_EQ(st.handoff_failures, 0u);
}

// Cancelling hybrid streams in the middle of their handoffs (the decode worker stopped: each has
// a state slot taken or a KvExpect waiting, no transfer acknowledged) frees every block and slot
// on both sides: afterwards more streams than slots are handed over and equal the engine alone
// (a slot leaked on the decode worker would refuse their KvExpects).
TEST(HybridStreams, CancelMidHandoffGivesEverySlotBackOnBothSides) {
  auto engine = engine::Engine::load(hybrid_model(), {1, engine::GemmBackend::kPacked}).value();
  Deployment d({"--prefill", "1", "--decode", "1", "--threads", "1", "--kv-memory", "67108864", "--state-slots", "3"},
               hybrid_model());
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  const auto decode_pid = static_cast<pid_t>(test::worker_pid(client->status(5s).value(), "decode"));
  ASSERT_GT(decode_pid, 0);
  ASSERT_EQ(test::signal_one(decode_pid, SIGSTOP), 0);
  std::vector<std::shared_ptr<Stream>> doomed;
  for (uint32_t i = 0; i < 3; ++i) {
    GenerateRequest r;
    r.prompt_tokens = test::prompt_of(70 + i * 30, 300 + i);
    r.max_tokens = 50;
    r.ignore_eos = true;
    doomed.push_back(client->generate(std::move(r)));
  }
  for (auto& s : doomed) {  // the first token comes from the prefill worker
    auto ev = s->next_for(10s);
    ASSERT_TRUE(ev && !ev->final);
  }
  EXPECT_EQ(client->status(5s).value().handoffs, 0u) << "no transfer could complete";
  for (auto& s : doomed) s->cancel();
  for (auto& s : doomed) EXPECT_EQ(collect(*s, 10s).fin.reason, FinishReason::kCancelled);
  ASSERT_EQ(test::signal_one(decode_pid, SIGCONT), 0);  // well inside the heartbeat timeout
  const StatusInfo after = wait_idle(*client);
  for (const auto& w : after.workers) {
    EXPECT_EQ(test::in_use(w), 0u) << w.role;
    EXPECT_EQ(w.state_slots_free, 3u) << w.role;
  }
  std::vector<GenerateRequest> reqs = requests(6, 12);
  std::vector<std::shared_ptr<Stream>> streams;
  for (const GenerateRequest& r : reqs) streams.push_back(client->generate(r));
  for (size_t i = 0; i < streams.size(); ++i) {
    Collected c = collect(*streams[i]);
    ASSERT_EQ(c.finals, 1) << "stream " << i;
    EXPECT_EQ(c.tokens, engine_alone(*engine, reqs[i])) << "stream " << i << ": " << c.fin.error_message;
  }
}

// #20's bitwise invariance in the 64-stream equality test's shape (disagg_test's
// SixtyFourStreams): 64 hybrid streams of 1 to 300 prompt tokens, a quarter sharing a
// 256-token prefix (on a colocated worker, later ones resume from its checkpoint), a third
// with presence and frequency penalties, a fifth sampled at temperature 1, on 3 state slots per
// worker (slots reused), colocated, split (states handed over) and speculating: every stream
// equals the engine alone, and every block and slot comes back.
class HybridSixtyFourStreams : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(HybridSixtyFourStreams, EqualTheEngineAlone) {
  const std::vector<int32_t> shared = test::prompt_of(256, 999);
  std::vector<GenerateRequest> reqs;
  for (uint32_t i = 0; i < 64; ++i) {
    GenerateRequest r;
    r.prompt_tokens = i % 4 == 0 ? shared : test::prompt_of(1 + (i * 13) % 150, i);
    if (i % 4 == 0) {
      const std::vector<int32_t> own = test::prompt_of(1 + i % 40, 500 + i);
      r.prompt_tokens.insert(r.prompt_tokens.end(), own.begin(), own.end());
    }
    r.max_tokens = 2 + i % 30;
    r.ignore_eos = true;
    if (i % 3 == 1) {
      r.presence_penalty = 1.5f;
      r.frequency_penalty = 0.75f;
    }
    if (i % 5 == 2) {
      r.temperature = 1.0f;
      r.seed = 40 + i;
    }
    reqs.push_back(std::move(r));
  }
  const StatusInfo st = serve_as_the_engine_alone(GetParam(), std::move(reqs));
  EXPECT_EQ(st.handoff_failures, 0u);
  std::printf("prompt tokens from the prefix cache: %llu\n", (unsigned long long)st.cached_prompt_tokens);
}

INSTANTIATE_TEST_SUITE_P(
    Deployments, HybridSixtyFourStreams,
    ::testing::Values(std::vector<std::string>{"--workers", "2", "--prefill-chunk", "64"},
                      std::vector<std::string>{"--prefill", "1", "--decode", "2", "--oversubscribe"},
                      std::vector<std::string>{"--workers", "2", "--spec", "ngram", "--prefill-chunk", "32"}),
    [](const auto& info) {
      return info.param[0] == "--prefill" ? std::string("Prefill1Decode2")
             : info.param[2] == "--spec"  ? std::string("Both2Speculating")
                                          : std::string("Both2");
    });

// What is not built for hybrids is refused by `tandem up` itself, before any process starts
// (not by workers that exit and are restarted): a hybrid draft model.
TEST(HybridStreams, TandemUpRefusesAHybridDraftModelAtOnce) {
  const std::string up = std::string(TANDEM_TANDEM_BIN) + " up --model " + hybrid_model() + " --runtime-dir " +
                         test::temp_dir() + "/refused";
  struct Case {
    std::string flags, error;
  };
  for (const Case& c : std::vector<Case>{
           {"--spec draft --draft-model " + hybrid_model(), "a hybrid (recurrent) draft model is not built"},
       }) {
    const auto start = std::chrono::steady_clock::now();
    const test::CommandOutput r = test::run_command(up + " " + c.flags);
    EXPECT_NE(r.exit_code, 0) << c.flags;
    EXPECT_NE(r.err.find(c.error), std::string::npos) << c.flags << ": " << r.err;
    EXPECT_EQ((r.out + r.err).find("started"), std::string::npos) << c.flags << ": nothing starts\n" << r.out << r.err;
    EXPECT_LT(std::chrono::steady_clock::now() - start, 20s) << "refused at once, not after restarts";
  }
}

// Speculative decoding on a hybrid (--spec ngram): each round's rejected drafts are rolled out
// of the recurrent state (StatePool::roll_back), drafts capped so a round never completes a grid
// chunk. The random tiny model does not repeat itself, so streams are made to: even ones carry a
// logit bias that keeps the output on one token (every draft accepted) or, at temperature 1,
// draws it from two, one about 7 times likelier (most drafts accepted, many rounds cut short);
// odd ones are plain random prompts (drafts rejected). 20 streams over 5 state slots per worker,
// prompts in chunks of 7, outputs across the grid points at 64, 128 and 192: every stream equals the
// engine alone without speculation, token for token, and every block and slot comes back.
TEST(HybridStreams, SpeculatingStreamsEqualTheEngineAloneWithoutSpeculation) {
  auto engine = engine::Engine::load(hybrid_model(), {1, engine::GemmBackend::kPacked}).value();
  std::mt19937 rng(12);
  std::vector<GenerateRequest> reqs;
  std::vector<std::vector<int32_t>> want;
  for (uint32_t i = 0; i < 20; ++i) {
    GenerateRequest r;
    r.prompt_tokens = test::prompt_of(10 + rng() % 50, 200 + i);
    r.max_tokens = 150 + i % 7 * 10;
    r.ignore_eos = true;
    if (i % 8 == 0) r.logit_bias = {{11, 100.0f}};
    if (i % 8 == 4) r.logit_bias = {{11, 30.0f}, {12, 28.0f}};
    if (i % 4 == 2) r.logit_bias = {{11, 30.0f}, {12, 30.0f}, {13, 30.0f}};
    if (i % 8 >= 3 && i % 8 != 6) {
      r.temperature = 1.0f;
      r.seed = 70 + i;
    }
    want.push_back(engine_alone(*engine, r));
    reqs.push_back(std::move(r));
  }
  Deployment d({"--workers", "2", "--threads", "1", "--kv-memory", "67108864", "--prefill-chunk", "7", "--state-slots",
                "5", "--spec", "ngram"},
               hybrid_model());
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  ASSERT_TRUE(client);
  expect_streams(*client, std::move(reqs), want);
  const StatusInfo st = wait_idle(*client);
  uint64_t drafts = 0, accepted = 0;
  for (const auto& w : st.workers) {
    EXPECT_EQ(test::in_use(w), 0u) << "worker " << w.id;
    EXPECT_EQ(w.state_slots_free, 5u) << "worker " << w.id;
    EXPECT_EQ(w.spec_tokens, 4u) << "worker " << w.id;
    drafts += w.drafts, accepted += w.drafts_accepted;
  }
  std::printf("%llu drafts, %llu accepted\n", static_cast<unsigned long long>(drafts),
              static_cast<unsigned long long>(accepted));
  EXPECT_GT(accepted, drafts / 2) << "the biased streams accept most drafts";
  EXPECT_LT(accepted, drafts) << "the random ones reject some";
}

// --spec draft on a hybrid target: an attention draft model (make-model's tiny llama, the same
// vocabulary) drafts, the target's state is rolled back as with prompt lookup (a hybrid draft
// model is refused: DraftModel::load). Greedy streams, biased or not, equal the engine alone.
TEST(HybridStreams, DraftModelStreamsEqualTheEngineAloneGreedy) {
  auto engine = engine::Engine::load(hybrid_model(), {1, engine::GemmBackend::kPacked}).value();
  const std::string draft = test::tiny_model("llama", 4);
  std::vector<GenerateRequest> reqs;
  std::vector<std::vector<int32_t>> want;
  for (uint32_t i = 0; i < 8; ++i) {
    GenerateRequest r;
    r.prompt_tokens = test::prompt_of(20 + 5 * i, 300 + i);
    r.max_tokens = 140;
    r.ignore_eos = true;
    if (i % 2 == 0) r.logit_bias = {{11, 30.0f}, {12, 30.0f}, {13, 30.0f}};
    want.push_back(engine_alone(*engine, r));
    reqs.push_back(std::move(r));
  }
  Deployment d({"--workers", "1", "--threads", "1", "--kv-memory", "67108864", "--state-slots", "4", "--spec", "draft",
                "--draft-model", draft},
               hybrid_model());
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  ASSERT_TRUE(client);
  expect_streams(*client, std::move(reqs), want);
  const StatusInfo st = wait_idle(*client);
  ASSERT_EQ(st.workers.size(), 1u);
  EXPECT_EQ(test::in_use(st.workers[0]), 0u);
  EXPECT_EQ(st.workers[0].state_slots_free, 4u);
  EXPECT_GT(st.workers[0].drafts, st.workers[0].drafts_accepted) << "drafts were rejected and rolled back";
  std::printf("draft model: %llu drafts, %llu accepted\n", static_cast<unsigned long long>(st.workers[0].drafts),
              static_cast<unsigned long long>(st.workers[0].drafts_accepted));
}

}  // namespace
}  // namespace tandem
