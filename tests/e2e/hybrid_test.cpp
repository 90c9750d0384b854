// The hybrid qwen35 model (#20) as real processes: `tandem up` on make-model's tiny qwen35
// file, streams of shared and random prompts, greedy and seeded, with prompts cut into chunks
// of 7 (off the 16-token blocks and the 64-token grid) and fewer state slots than streams, so
// slots are reused. Every stream equals the engine alone (whole prompt in one chunk, batch of
// one) token for token, those resumed from a prefix-cache checkpoint too; every block and state
// slot comes back after finishing and after cancelling.
#include <gtest/gtest.h>

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

TEST(HybridStreams, EqualTheEngineAloneWhateverTheBatchAndChunking) {
  auto engine = engine::Engine::load(hybrid_model(), {1, engine::GemmBackend::kPacked}).value();
  std::vector<GenerateRequest> reqs = requests(16, 4);
  std::vector<std::vector<int32_t>> want;
  for (const GenerateRequest& r : reqs) want.push_back(engine_alone(*engine, r));
  Deployment d(
      {"--workers", "2", "--threads", "1", "--kv-memory", "67108864", "--prefill-chunk", "7", "--state-slots", "3"},
      hybrid_model());
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  ASSERT_TRUE(client);
  std::vector<std::shared_ptr<Stream>> streams;
  for (GenerateRequest& r : reqs) streams.push_back(client->generate(std::move(r)));
  for (size_t i = 0; i < streams.size(); ++i) {
    Collected c = collect(*streams[i]);
    ASSERT_EQ(c.finals, 1) << "stream " << i;
    EXPECT_EQ(c.fin.reason, FinishReason::kLength) << c.fin.error_message;
    EXPECT_EQ(c.tokens, want[i]) << "stream " << i;
  }
  const StatusInfo st = wait_idle(*client);
  EXPECT_EQ(st.cached_prompt_tokens, 0u) << "no 40-token prompt reaches a checkpoint position (every 256)";
  for (const auto& w : st.workers) {
    EXPECT_EQ(test::in_use(w), 0u) << "worker " << w.id;
    EXPECT_EQ(w.state_slots_total, 3u) << "worker " << w.id;
    EXPECT_EQ(w.state_slots_free, 3u) << "worker " << w.id;
  }
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
  std::vector<std::shared_ptr<Stream>> streams;
  for (GenerateRequest& r : reqs) streams.push_back(client->generate(std::move(r)));
  for (size_t i = 0; i < streams.size(); ++i) {
    Collected c = collect(*streams[i]);
    ASSERT_EQ(c.finals, 1) << "stream " << i;
    EXPECT_EQ(c.tokens, want[i]) << "stream " << i << ": " << c.fin.error_message;
  }
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
  std::vector<std::shared_ptr<Stream>> streams;
  for (GenerateRequest& r : reqs) streams.push_back(client->generate(std::move(r)));
  for (size_t i = 0; i < streams.size(); ++i) {
    Collected c = collect(*streams[i]);
    ASSERT_EQ(c.finals, 1) << "stream " << i;
    EXPECT_EQ(c.tokens, want[i]) << "stream " << i << ": " << c.fin.error_message;
  }
  const StatusInfo st = wait_idle(*client);
  EXPECT_GT(st.preemptions, 0u) << "the pool was meant to run short";
  EXPECT_EQ(st.workers[0].state_slots_free, st.workers[0].state_slots_total);
}

// What is not built for hybrids is refused by `tandem up` itself, before any process starts
// (not by workers that exit and are restarted): a split deployment and speculation.
TEST(HybridStreams, TandemUpRefusesASplitOrSpeculatingHybridDeploymentAtOnce) {
  const std::string up = std::string(TANDEM_TANDEM_BIN) + " up --model " + hybrid_model() + " --runtime-dir " +
                         test::temp_dir() + "/refused";
  struct Case {
    std::string flags, error;
  };
  for (const Case& c : std::vector<Case>{
           {"--prefill 1 --decode 1", "(a hybrid model) runs colocated only"},
           {"--spec ngram", "--spec: speculative decoding on qwen35 (a hybrid model) is not built"},
       }) {
    const auto start = std::chrono::steady_clock::now();
    const test::CommandOutput r = test::run_command(up + " " + c.flags);
    EXPECT_NE(r.exit_code, 0) << c.flags;
    EXPECT_NE(r.err.find(c.error), std::string::npos) << c.flags << ": " << r.err;
    EXPECT_EQ((r.out + r.err).find("started"), std::string::npos) << c.flags << ": nothing starts\n" << r.out << r.err;
    EXPECT_LT(std::chrono::steady_clock::now() - start, 20s) << "refused at once, not after restarts";
  }
}

}  // namespace
}  // namespace tandem
