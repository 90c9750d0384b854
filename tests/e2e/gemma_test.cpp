// A sliding-window model (gemma3, docs/WINDOWS.md) as real processes: `tandem up` on
// make-model's tiny gemma3 file (window 32), streams whose prompts are up to 9 windows long,
// greedy and seeded, colocated with prompts cut into chunks of 7 and shared prefixes served
// from the prefix cache, and split into a prefill and a decode worker: every stream equals the
// engine alone (whole prompt in one chunk, batch of one).
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

std::string gemma_model() {
  static const std::string path = test::tiny_model("gemma3", 3);
  return path;
}

// Streams of `deployment_flags` on the tiny gemma3 (window 32): prompts of 40 to 300 tokens,
// half of them one shared 120-token prompt, greedy and seeded, 40 tokens each; every stream
// equals the engine alone.
void expect_streams_equal_the_engine(const std::vector<std::string>& deployment_flags) {
  auto engine = engine::Engine::load(gemma_model(), {1, engine::GemmBackend::kPacked}).value();
  ASSERT_EQ(engine->config().window(0), 32u);
  std::mt19937 rng(5);
  const std::vector<int32_t> shared = test::prompt_of(120, 9);
  std::vector<GenerateRequest> reqs;
  std::vector<std::vector<int32_t>> want;
  for (uint32_t i = 0; i < 8; ++i) {
    GenerateRequest r;
    r.prompt_tokens = i % 2 == 0 ? shared : test::prompt_of(40 + rng() % 260, 100 + i);
    r.max_tokens = 40;  // decoding crosses another window edge
    r.ignore_eos = true;
    if (i % 4 >= 2) {
      r.temperature = 1.0f;
      r.seed = 50 + i;
    }
    want.push_back(engine_alone(*engine, r));
    reqs.push_back(std::move(r));
  }
  Deployment d(deployment_flags, gemma_model());
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
}

// Two colocated workers, prompts cut into chunks of 7, shared prefixes from the prefix cache.
TEST(GemmaStreams, PromptsLongerThanTheWindowEqualTheEngineAlone) {
  expect_streams_equal_the_engine(
      {"--workers", "2", "--threads", "1", "--kv-memory", "67108864", "--prefill-chunk", "7"});
}

// Prefill and decode on separate workers: every layer's blocks are handed off (no rings yet).
TEST(GemmaStreams, SplitPrefillAndDecodeEqualTheEngineAlone) {
  expect_streams_equal_the_engine({"--prefill", "1", "--decode", "1", "--threads", "1", "--kv-memory", "67108864"});
}

}  // namespace
}  // namespace tandem
