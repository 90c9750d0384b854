// A sliding-window model (gemma3, docs/WINDOWS.md) as real processes: `tandem up` on
// make-model's tiny gemma3 file (window 32), streams whose prompts are up to 9 windows long,
// greedy and seeded, colocated with prompts cut into chunks of 7 and shared prefixes served
// from the prefix cache, and split into a prefill and a decode worker (every layer's blocks
// handed off, or with --kv-rings the full layer's and the windows' only): every stream equals
// the engine alone (whole prompt in one chunk, batch of one). With --kv-rings too, prefixes
// shared from the prefix cache included.
#include <gtest/gtest.h>

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

std::string gemma_model() {
  static const std::string path = test::tiny_model("gemma3", 3);
  return path;
}

// Sends every request at once; each stream ends by length with the tokens `want` gives it (and,
// when given, their log-probabilities, bitwise: the engine is batch- and chunking-invariant).
void expect_streams_equal(Client& client, std::vector<GenerateRequest>& reqs,
                          const std::vector<std::vector<int32_t>>& want,
                          const std::vector<std::vector<float>>& want_logprobs = {}) {
  std::vector<std::shared_ptr<Stream>> streams;
  for (GenerateRequest& r : reqs) streams.push_back(client.generate(std::move(r)));
  for (size_t i = 0; i < streams.size(); ++i) {
    Collected c = collect(*streams[i]);
    ASSERT_EQ(c.finals, 1) << "stream " << i;
    EXPECT_EQ(c.fin.reason, FinishReason::kLength) << c.fin.error_message;
    EXPECT_EQ(c.tokens, want[i]) << "stream " << i;
    if (i < want_logprobs.size()) EXPECT_EQ(c.logprobs, want_logprobs[i]) << "stream " << i;
  }
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
  expect_streams_equal(*client, reqs, want);
}

// Two colocated workers, prompts cut into chunks of 7, shared prefixes from the prefix cache.
TEST(GemmaStreams, PromptsLongerThanTheWindowEqualTheEngineAlone) {
  expect_streams_equal_the_engine(
      {"--workers", "2", "--threads", "1", "--kv-memory", "67108864", "--prefill-chunk", "7"});
}

// Prefill and decode on separate workers without rings: every layer's blocks are handed off.
TEST(GemmaStreams, SplitPrefillAndDecodeEqualTheEngineAlone) {
  expect_streams_equal_the_engine({"--prefill", "1", "--decode", "1", "--threads", "1", "--kv-memory", "67108864"});
}

// Every block of both pools back, free or cached (bounded wait for the last releases).
bool all_back(const WorkerInfo& w) {
  return w.kv_blocks_free + w.kv_blocks_cached == w.kv_blocks_total &&
         w.kv_ring_blocks_free + w.kv_ring_blocks_cached == w.kv_ring_blocks_total;
}

StatusInfo wait_all_blocks_back(Client& client) {
  StatusInfo st;
  for (int i = 0; i < 100; ++i) {
    st = client.status(5s).value();
    bool back = st.running == 0;
    for (const auto& w : st.workers) back &= all_back(w);
    if (back) break;
    std::this_thread::sleep_for(50ms);
  }
  return st;
}

// Serves `reqs` on a deployment of `flags` (every stream equals `want`), then waits for every
// block of both pools to come back; its status then.
StatusInfo serve_and_settle(const std::vector<std::string>& flags, std::vector<GenerateRequest> reqs,
                            const std::vector<std::vector<int32_t>>& want) {
  Deployment d(flags, gemma_model());
  auto client = d.ok() ? d.client() : nullptr;
  if (!client) {
    ADD_FAILURE() << "the deployment did not start";
    return {};
  }
  expect_streams_equal(*client, reqs, want);
  return wait_all_blocks_back(*client);
}

// 16 streams of 100 to 300 prompt tokens (the first 300; `rng_seed` draws the others' lengths,
// `prompt_seed` + i makes prompt i) plus 40 decoded, every third sampled at temperature 1 with
// seed `sample_seed` + i, the others greedy; and what the engine alone gives each.
std::pair<std::vector<GenerateRequest>, std::vector<std::vector<int32_t>>> long_streams(engine::Engine& engine,
                                                                                        uint32_t rng_seed,
                                                                                        uint32_t prompt_seed,
                                                                                        uint64_t sample_seed) {
  std::mt19937 rng(rng_seed);
  std::vector<GenerateRequest> reqs;
  std::vector<std::vector<int32_t>> want;
  for (uint32_t i = 0; i < 16; ++i) {
    GenerateRequest r;
    r.prompt_tokens = test::prompt_of(i == 0 ? 300 : 100 + rng() % 201, prompt_seed + i);
    r.max_tokens = 40;
    r.ignore_eos = true;
    if (i % 3 == 2) {
      r.temperature = 1.0f;
      r.seed = sample_seed + i;
    }
    want.push_back(engine_alone(engine, r));
    reqs.push_back(std::move(r));
  }
  return {std::move(reqs), std::move(want)};
}

// `reqs` on one worker with --kv-rings and `flags`, prompts in chunks of 32: every stream
// equals `want`, and every block of both pools comes back; the status once they have.
StatusInfo serve_on_rings(std::vector<std::string> flags, std::vector<GenerateRequest>& reqs,
                          const std::vector<std::vector<int32_t>>& want) {
  flags.insert(flags.end(), {"--workers", "1", "--threads", "1", "--kv-rings", "--prefill-chunk", "32"});
  const StatusInfo st = serve_and_settle(flags, reqs, want);
  EXPECT_EQ(st.workers.size(), 1u);
  for (const WorkerInfo& w : st.workers) EXPECT_TRUE(all_back(w));
  return st;
}

// --kv-rings on the service: 16 streams of 100 to 300 prompt tokens plus 40 decoded, on one
// worker given the memory of 20 blocks of every layer (320 positions). Without rings the
// longest streams could never fit, let alone all of them at once; with rings that memory holds
// 53 full-layer blocks and 13 ring blocks (the windowed layers are 5 of gemma3 tiny's 6). Every
// stream equals the engine alone, and every block of both pools comes back.
TEST(GemmaStreams, RingsServeContextsPastThePoolAndEqualTheEngineAlone) {
  auto engine = engine::Engine::load(gemma_model(), {1, engine::GemmBackend::kPacked}).value();
  const model::ModelConfig& config = engine->config();
  ASSERT_EQ(config.window(0), 32u);
  auto [reqs, want] = long_streams(*engine, 7, 200, 70);
  uint64_t blocks_needed = 0, longest = 0;
  for (const GenerateRequest& r : reqs) {
    const uint64_t blocks = (r.prompt_tokens.size() + r.max_tokens + 15) / 16;
    blocks_needed += blocks, longest = std::max(longest, blocks);
  }
  constexpr uint32_t kBlocks = 20;
  ASSERT_GT(longest, kBlocks) << "a stream no pool of kBlocks ordinary blocks can ever hold";
  ASSERT_GT(blocks_needed, 8 * kBlocks);
  const StatusInfo st = serve_on_rings({"--kv-blocks", std::to_string(kBlocks)}, reqs, want);
  ASSERT_EQ(st.workers.size(), 1u);
  const WorkerInfo& w = st.workers[0];
  EXPECT_EQ(w.kv_blocks_total, 53u);
  EXPECT_EQ(w.kv_ring_blocks_total, 13u);
  EXPECT_LE(w.kv_bytes, uint64_t{kBlocks} * engine::KvPool::bytes_per_block(config)) << "no more memory than asked";
}

// Prefix caching with rings: 8 prompts share their first 170 tokens (5 windows) and differ after.
// The first runs alone and publishes its blocks, the ring blocks of the windowed layers too; the
// 7 others, at once, each hit the prefix cache at 160 tokens (10 blocks), sharing the full
// layers' blocks and the two ring blocks of the window ending there; every stream equals the
// engine alone, and every block of both pools comes back (free or cached).
TEST(GemmaStreams, RingsSharePrefixesFromThePrefixCacheAndEqualTheEngineAlone) {
  auto engine = engine::Engine::load(gemma_model(), {1, engine::GemmBackend::kPacked}).value();
  ASSERT_EQ(engine->config().window(0), 32u);
  std::mt19937 rng(9);
  const std::vector<int32_t> shared = test::prompt_of(170, 31);
  std::vector<GenerateRequest> first(1), rest;
  std::vector<std::vector<int32_t>> want;
  std::vector<std::vector<float>> want_logprobs;
  for (uint32_t i = 0; i < 8; ++i) {
    GenerateRequest r;
    r.prompt_tokens = shared;
    const std::vector<int32_t> own = test::prompt_of(10 + rng() % 60, 300 + i);
    r.prompt_tokens.insert(r.prompt_tokens.end(), own.begin(), own.end());
    r.max_tokens = 30;
    r.ignore_eos = true;
    r.logprobs = true;
    if (i % 3 == 1) {
      r.temperature = 1.0f;
      r.seed = 80 + i;
    }
    engine::GenerateOptions opt;
    opt.max_tokens = r.max_tokens;
    opt.ignore_eos = true;
    opt.sampling = sampling_params(r);
    const engine::Generation alone = engine::generate(*engine, r.prompt_tokens, opt).value();
    want.push_back(alone.tokens);
    want_logprobs.push_back(alone.logprobs);
    (i == 0 ? first[0] : rest.emplace_back()) = std::move(r);
  }
  Deployment d({"--workers", "1", "--threads", "1", "--kv-blocks", "64", "--kv-rings", "--prefill-chunk", "32"},
               gemma_model());
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  ASSERT_TRUE(client);
  expect_streams_equal(*client, first, {want[0]}, {want_logprobs[0]});
  expect_streams_equal(*client, rest, std::vector<std::vector<int32_t>>(want.begin() + 1, want.end()),
                       std::vector<std::vector<float>>(want_logprobs.begin() + 1, want_logprobs.end()));
  const StatusInfo st = wait_all_blocks_back(*client);
  ASSERT_EQ(st.workers.size(), 1u);
  const WorkerInfo& w = st.workers[0];
  EXPECT_GT(w.kv_ring_blocks_total, 0u);
  EXPECT_EQ(st.cached_prompt_tokens, 7u * 160u) << "each of the 7 hits the first's 10 blocks";
  EXPECT_GT(w.kv_ring_blocks_cached, 0u) << "the windows of the cached prefixes";
  EXPECT_TRUE(all_back(w));
}

// N-gram speculation on rings (--spec ngram --kv-rings): a round's drafts take ring blocks and a
// rejected draft's trim gives them back (within the margin release_window keeps). 16 streams of
// 100 to 300 prompt tokens plus 48 decoded on the memory of 20 blocks, a repeating 8-token text
// and random ids, greedy and seeded, in the same steps.
// Every stream equals the engine alone without speculation, token for token; drafts were both
// accepted and rejected; every block of both pools comes back.
TEST(GemmaStreams, RingsWithNgramSpeculationEqualTheEngineAloneWithout) {
  auto engine = engine::Engine::load(gemma_model(), {1, engine::GemmBackend::kPacked}).value();
  std::mt19937 rng(11);
  std::vector<GenerateRequest> reqs;
  std::vector<std::vector<int32_t>> want;
  for (uint32_t i = 0; i < 16; ++i) {
    GenerateRequest r;
    const uint32_t len = 100 + rng() % 201;
    for (uint32_t j = 0; j < len; ++j)
      r.prompt_tokens.push_back(3 + static_cast<int32_t>(i % 2 == 0 ? (j % 8) * 37 + i : rng() % 500));
    r.max_tokens = 48;
    r.ignore_eos = true;
    if (i % 4 >= 2) {
      r.temperature = 1.0f;
      r.seed = 90 + i;
    }
    // The tiny model repeats one token forever (every draft accepted); a frequency penalty
    // makes odd streams switch tokens now and then, rejecting the drafts that said it would not.
    if (i % 2 == 1) r.frequency_penalty = 2.0f;
    want.push_back(engine_alone(*engine, r));
    reqs.push_back(std::move(r));
  }
  const StatusInfo st = serve_on_rings({"--kv-blocks", "20", "--spec", "ngram"}, reqs, want);
  ASSERT_EQ(st.workers.size(), 1u);
  const WorkerInfo& w = st.workers[0];
  EXPECT_GT(w.kv_ring_blocks_total, 0u);
  EXPECT_GT(w.spec_rounds, 0u);
  std::printf("ngram on rings: %llu rounds, %llu of %llu drafts accepted\n", (unsigned long long)w.spec_rounds,
              (unsigned long long)w.drafts_accepted, (unsigned long long)w.drafts);
  EXPECT_GT(w.drafts_accepted, 0u) << "the repeating streams accept drafts";
  EXPECT_LT(w.drafts_accepted, w.drafts) << "the random ones reject some";
}

// --kv-rings split into a prefill and a decode worker: each handoff carries the full layer's
// blocks of every position and, of the five windowed layers, only the ring blocks the decode
// worker's next query sees (logical blocks (P + 1 - 32) / 16 .. the last), into the ring the
// scheduler reserved there. 16 streams of 100 to 300 prompt tokens (prompts cut into chunks of
// 32: the prefill worker's ring moves on as it goes) plus 40 decoded, greedy and seeded, without
// and with speculation (--spec ngram) on the decode worker: every
// stream equals the engine alone, the bytes handed off are exactly the full layer's blocks plus
// the windows (printed against every layer's blocks), and every block of both pools of both
// workers comes back (free or cached: the prefix cache is on).
TEST(GemmaStreams, RingsSplitIntoPrefillAndDecodeHandOffTheWindowOnlyAndEqualTheEngineAlone) {
  auto engine = engine::Engine::load(gemma_model(), {1, engine::GemmBackend::kPacked}).value();
  const model::ModelConfig& config = engine->config();
  ASSERT_EQ(config.window(0), 32u);
  const uint64_t every_layer = engine::KvPool::bytes_per_block(config);
  const uint64_t ring_block = engine::KvPool::bytes_per_block(config, 16, {}, true);
  auto [reqs, want] = long_streams(*engine, 11, 300, 90);
  uint64_t expected_bytes = 0, all_layers_bytes = 0;
  for (const GenerateRequest& r : reqs) {
    const uint64_t p = r.prompt_tokens.size(), blocks = (p + 15) / 16, ring = blocks - (p + 1 - 32) / 16;
    expected_bytes += blocks * (every_layer - ring_block) + ring * ring_block;
    all_layers_bytes += blocks * every_layer;
  }
  // Plain decoding, and speculating on the decode worker (its rounds' trims never reach back
  // before the positions handed over).
  for (const std::string spec : {"off", "ngram"}) {
    const StatusInfo st = serve_and_settle({"--prefill", "1", "--decode", "1", "--threads", "1", "--kv-memory",
                                            "67108864", "--kv-rings", "--prefill-chunk", "32", "--spec", spec},
                                           reqs, want);
    EXPECT_EQ(st.handoffs, 16u) << spec;
    EXPECT_EQ(st.handoff_failures, 0u) << spec;
    EXPECT_EQ(st.handoff_bytes, expected_bytes) << spec;
    std::printf(
        "rings handoff (--spec %s): %llu bytes for 16 prompts of 100 to 300 tokens, every layer's blocks %llu "
        "(%.1f %%)\n",
        spec.c_str(), (unsigned long long)st.handoff_bytes, (unsigned long long)all_layers_bytes,
        100.0 * double(st.handoff_bytes) / double(all_layers_bytes));
    ASSERT_EQ(st.workers.size(), 2u);
    uint64_t drafts = 0;
    for (const WorkerInfo& w : st.workers) {
      drafts += w.drafts;
      EXPECT_GT(w.kv_ring_blocks_total, 0u) << w.role;
      EXPECT_TRUE(all_back(w)) << w.role;
    }
    EXPECT_EQ(drafts > 0, spec == "ngram") << drafts << " drafts fed";
  }
}

// What rings do not cover yet is refused by `tandem up` and `tandem worker` at once, naming
// --kv-rings: quantized KV with the F32 window (its tail lives under the full layers' ids).
TEST(GemmaStreams, RingsAreRefusedWhereTheyAreNotBuilt) {
  const std::string up = std::string(TANDEM_TANDEM_BIN) + " up --model " + gemma_model() + " --runtime-dir " +
                         test::temp_dir() + "/rings-refused --kv-rings ";
  const std::string worker = std::string(TANDEM_TANDEM_BIN) + " worker --model " + gemma_model() +
                             " --scheduler ipc://" + test::temp_dir() + "/nobody.sock --kv-rings ";
  struct Case {
    std::string command, error;
  };
  const std::string tail = "--kv-rings: KV rings cannot keep the F32 window tail";
  for (const Case& c : std::vector<Case>{
           {up + "--kv-bits 8", tail},
           {up + "--prefill 1 --decode 1 --kv-bits 8", tail},
           {worker + "--kv-bits 4 --kv-blocks 8", tail},
           {worker + "--role decode --kv-bits 4 --kv-blocks 8", tail},
       }) {
    const auto start = std::chrono::steady_clock::now();
    const test::CommandOutput r = test::run_command(c.command);
    EXPECT_NE(r.exit_code, 0) << c.command;
    EXPECT_NE(r.err.find(c.error), std::string::npos) << c.command << ": " << r.err << r.out;
    EXPECT_EQ((r.out + r.err).find("started"), std::string::npos) << c.command << ": nothing starts";
    EXPECT_LT(std::chrono::steady_clock::now() - start, 20s) << "refused at once, not after restarts";
  }
}

}  // namespace
}  // namespace tandem
