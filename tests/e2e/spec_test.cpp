// Speculative decoding as real processes (#19 Part B): `tandem up --spec ngram` on the trained
// tiny model, 64 concurrent streams with mixed acceptance (repeating text that accepts most
// drafts, random ids that accept almost none, in the same steps), greedy and seeded at
// temperature 1, with the prefix cache on, F32 and 8-bit KV, colocated and split (the decode
// worker speculates). Every stream equals the engine alone without speculation, token for token.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <thread>

#include "tests/e2e/streams.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using test::collect;
using test::Collected;
using Deployment = test::ClientDeployment;

std::string trained_model() { return std::string(TANDEM_SOURCE_DIR) + "/tests/data/tiny-trained.gguf"; }

// n requests and what the engine alone, without speculation, generates for each. Stream i's
// prompt is a repeating text for even i, 30 random ids for odd i; `tweak` sets its length
// and sampling. F32: the repeating prompts are one text, so later ones start from the prefix
// cache (bitwise exact there). 8-bit: a first token of its own, so no two share a block (a
// prefix-cache hit reads its window from the codes, which the engine alone does not).
struct Workload {
  std::vector<GenerateRequest> requests;
  std::vector<std::vector<int32_t>> want;
};
Workload mixed_workload(uint32_t n, bool q8, uint32_t seed,
                        const std::function<void(uint32_t, GenerateRequest&)>& tweak) {
  auto engine = engine::Engine::load(trained_model(), {1, engine::GemmBackend::kPacked}).value();
  const std::vector<int32_t> text =
      engine->tokenizer().encode(" the file is the file and the file is the file and the", false).value();
  std::mt19937 rng(seed);
  Workload w;
  for (uint32_t i = 0; i < n; ++i) {
    GenerateRequest r;
    r.prompt_tokens = {1, static_cast<int32_t>(q8 ? 3 + i : 3)};
    if (i % 2 == 0) {
      r.prompt_tokens.insert(r.prompt_tokens.end(), text.begin(), text.end());
    } else {
      for (int j = 0; j < 30; ++j) r.prompt_tokens.push_back(3 + static_cast<int32_t>(rng() % 500));
    }
    r.ignore_eos = true;
    tweak(i, r);
    engine::GenerateOptions opt;
    opt.max_tokens = r.max_tokens;
    opt.ignore_eos = true;
    opt.sampling = sampling_params(r);
    if (q8) opt.kv_format.bits = 8;
    w.want.push_back(engine::generate(*engine, r.prompt_tokens, opt).value().tokens);
    w.requests.push_back(std::move(r));
  }
  return w;
}

// The service's status once every block is back (a bounded wait for the last releases).
StatusInfo when_idle(Client& client) {
  StatusInfo st;
  for (int i = 0; i < 100; ++i) {
    st = client.status(5s).value();
    uint32_t used = 0;
    for (const auto& w : st.workers) used += test::in_use(w);
    if (used == 0 && st.running == 0) break;
    std::this_thread::sleep_for(50ms);
  }
  return st;
}

// Sends every request at once and checks each stream ends once, by length, with want's tokens
// (only its length where `sampled_length_only` and the request samples at temperature > 0).
void expect_streams(Client& client, const std::vector<GenerateRequest>& requests,
                    const std::vector<std::vector<int32_t>>& want, bool sampled_length_only) {
  std::vector<std::shared_ptr<Stream>> streams;
  for (const GenerateRequest& r : requests) streams.push_back(client.generate(r));
  for (uint32_t i = 0; i < requests.size(); ++i) {
    Collected c = collect(*streams[i]);
    ASSERT_EQ(c.finals, 1) << "stream " << i;
    EXPECT_EQ(c.fin.reason, FinishReason::kLength) << c.fin.error_message;
    if (sampled_length_only && requests[i].temperature > 0.0f) {
      EXPECT_EQ(c.tokens.size(), want[i].size()) << "stream " << i;
    } else {
      EXPECT_EQ(c.tokens, want[i]) << "stream " << i;
    }
  }
}

class SpecStreams : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(SpecStreams, EqualTheEngineAloneWithoutSpeculation) {
  std::vector<std::string> flags = GetParam();
  flags.insert(flags.end(), {"--threads", "1", "--kv-memory", "67108864", "--prefill-chunk", "64", "--spec", "ngram"});
  const bool q8 = std::find(flags.begin(), flags.end(), "--kv-bits") != flags.end();
  auto [requests, want] = mixed_workload(64, q8, 5, [](uint32_t i, GenerateRequest& r) {
    r.max_tokens = 40 + i % 24;
    if (i % 4 >= 2) {
      r.temperature = 1.0f;
      r.seed = 100 + i;
    }
    if (i % 8 == 3) r.presence_penalty = 0.5f;
  });
  Deployment d(flags, trained_model());
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  ASSERT_TRUE(client);
  std::vector<std::shared_ptr<Stream>> streams;
  for (GenerateRequest& r : requests) streams.push_back(client->generate(std::move(r)));
  for (uint32_t i = 0; i < 64; ++i) {
    Collected c = collect(*streams[i]);
    ASSERT_EQ(c.finals, 1) << "stream " << i;
    EXPECT_EQ(c.fin.reason, FinishReason::kLength) << c.fin.error_message;
    EXPECT_EQ(c.tokens, want[i]) << "stream " << i;
  }
  const StatusInfo st = when_idle(*client);
  uint64_t rounds = 0, drafts = 0, accepted = 0;
  for (const auto& w : st.workers) {
    EXPECT_EQ(test::in_use(w), 0u) << "worker " << w.id;
    EXPECT_EQ(w.spec_tokens, w.role == "prefill" ? 0u : 4u) << "worker " << w.id;
    rounds += w.spec_rounds, drafts += w.drafts, accepted += w.drafts_accepted;
  }
  EXPECT_GT(rounds, 0u);
  if (!q8) EXPECT_GT(st.cached_prompt_tokens, 0u) << "the prefix cache served some prompts";
  EXPECT_GT(accepted, 0u) << "the repeating streams accept drafts";
  EXPECT_LT(accepted, drafts) << "the random ones reject some";
}

INSTANTIATE_TEST_SUITE_P(Deployments, SpecStreams,
                         ::testing::Values(std::vector<std::string>{"--workers", "2"},
                                           std::vector<std::string>{"--workers", "1", "--kv-bits", "8"},
                                           std::vector<std::string>{"--prefill", "1", "--decode", "1"},
                                           std::vector<std::string>{"--prefill", "1", "--decode", "1", "--kv-bits",
                                                                    "8"}),
                         [](const auto& info) {
                           const auto& f = info.param;
                           const bool q8 = std::find(f.begin(), f.end(), "--kv-bits") != f.end();
                           return std::string(f[0] == "--workers" ? "Both" : "Split") + (q8 ? "Q8" : "F32");
                         });

// The demo model (a 32000 x 64 head over four small layers): its workers screen greedy rows for
// their token (greedy_screen.h) instead of computing their logits, per wave with many sequences.
// 24 streams, two threads, speculating: greedy ones (screened), temperature-1 and penalized ones
// (computed) in the same steps, every one equal to the engine alone, which computes every logit.
TEST(SpecStreamsScreened, GreedyScreenedRowsEqualTheEngineAlone) {
  const std::string model = std::string(TANDEM_SOURCE_DIR) + "/tests/data/vocab-trained.gguf";
  auto engine = engine::Engine::load(model, {1, engine::GemmBackend::kPacked}).value();
  ASSERT_TRUE(engine::head_outweighs_layers(engine->config()));
  const std::vector<int32_t> text =
      engine->tokenizer().encode(" the file is the file and the command is the", false).value();
  std::mt19937 rng(11);
  std::vector<GenerateRequest> requests;
  std::vector<std::vector<int32_t>> want;
  for (uint32_t i = 0; i < 24; ++i) {
    GenerateRequest r;
    r.prompt_tokens = {1, static_cast<int32_t>(3 + i)};
    if (i % 3 != 2) {
      r.prompt_tokens.insert(r.prompt_tokens.end(), text.begin(), text.end());
    } else {
      for (int j = 0; j < 20; ++j) r.prompt_tokens.push_back(3 + static_cast<int32_t>(rng() % 30000));
    }
    r.ignore_eos = true;
    r.max_tokens = 40 + i % 16;
    if (i % 6 == 1) r.temperature = 1.0f, r.seed = 200 + i;
    if (i % 8 == 5) r.presence_penalty = 0.5f;
    engine::GenerateOptions opt;
    opt.max_tokens = r.max_tokens;
    opt.ignore_eos = true;
    opt.sampling = sampling_params(r);
    want.push_back(engine::generate(*engine, r.prompt_tokens, opt).value().tokens);
    requests.push_back(std::move(r));
  }
  Deployment d({"--workers", "1", "--threads", "2", "--spec", "ngram"}, model);
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  ASSERT_TRUE(client);
  expect_streams(*client, requests, want, false);
  const StatusInfo st = when_idle(*client);
  for (const auto& w : st.workers) EXPECT_EQ(test::in_use(w), 0u) << "worker " << w.id;
}

// The trained tiny model's Q8_0 copy, drafting for it (most drafts accepted, not all).
std::string q8_draft() {
  static const std::string path = [] {
    const std::string out = test::temp_dir() + "/tiny-trained-q8.gguf";
    const test::CommandOutput r = test::run_command(std::string(TANDEM_TANDEM_BIN) + " make-model --from " +
                                                    trained_model() + " --dtype q8_0 --out " + out);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return out;
  }();
  return path;
}

// A draft model (`--spec draft`) as real processes: greedy streams (some with a presence
// penalty) equal the engine alone without speculation token for token, colocated, 8-bit and
// split (the decode worker drafts after the handoff, catching the draft model up on the
// prompt); seeded temperature-1 streams (the rejection rule) complete; every block comes back.
class DraftSpecStreams : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(DraftSpecStreams, GreedyEqualsTheEngineAloneWithoutSpeculation) {
  std::vector<std::string> flags = GetParam();
  flags.insert(flags.end(), {"--threads", "1", "--kv-memory", "67108864", "--prefill-chunk", "64", "--spec", "draft",
                             "--draft-model", q8_draft()});
  const bool q8 = std::find(flags.begin(), flags.end(), "--kv-bits") != flags.end();
  const auto [requests, want] = mixed_workload(24, q8, 7, [](uint32_t i, GenerateRequest& r) {
    r.max_tokens = 30 + i % 16;
    if (i % 6 == 5) {
      r.temperature = 1.0f;
      r.seed = 100 + i;
    }
    if (i % 4 == 3) r.presence_penalty = 0.5f;
  });
  Deployment d(flags, trained_model());
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  ASSERT_TRUE(client);
  expect_streams(*client, requests, want, true);
  const StatusInfo st = when_idle(*client);
  uint64_t drafts = 0, accepted = 0;
  for (const auto& w : st.workers) {
    EXPECT_EQ(test::in_use(w), 0u) << "worker " << w.id;
    drafts += w.drafts, accepted += w.drafts_accepted;
  }
  EXPECT_GT(accepted, 0u) << "the draft model's drafts are accepted";
  EXPECT_LT(accepted, drafts) << "and some rejected";
}

INSTANTIATE_TEST_SUITE_P(Deployments, DraftSpecStreams,
                         ::testing::Values(std::vector<std::string>{"--workers", "2"},
                                           std::vector<std::string>{"--workers", "1", "--kv-bits", "8"},
                                           std::vector<std::string>{"--prefill", "1", "--decode", "1"}),
                         [](const auto& info) {
                           const auto& f = info.param;
                           const bool q8 = std::find(f.begin(), f.end(), "--kv-bits") != f.end();
                           return std::string(f[0] == "--workers" ? "Both" : "Split") + (q8 ? "Q8" : "F32");
                         });

// Stops inside a round's tokens, as real processes: max_tokens, stop token sequences and stop
// strings that fall among a round's accepted drafts end the stream at the same token, with the
// same text, as the same requests on a deployment without speculation.
TEST(SpecStops, EndAtTheSameTokenAsWithoutSpeculation) {
  auto engine = engine::Engine::load(trained_model(), {1, engine::GemmBackend::kPacked}).value();
  const std::vector<int32_t> prompt =
      engine->tokenizer().encode("The file is the file and the file is the file and the", true).value();
  engine::GenerateOptions opt;
  opt.max_tokens = 80;
  opt.ignore_eos = true;
  const std::vector<int32_t> ref = engine::generate(*engine, prompt, opt).value().tokens;
  std::vector<GenerateRequest> requests;
  for (uint32_t i = 0; i < 24; ++i) {
    GenerateRequest r;
    r.prompt_tokens = prompt;
    r.ignore_eos = true;
    r.max_tokens = i < 8 ? 1 + i : 80;
    const size_t at = 10 + 3 * i;
    if (i >= 8 && i < 16) r.stop_token_sequences = {{ref[at], ref[at + 1]}};
    if (i >= 16) {
      const std::span<const int32_t> span(ref.data() + at, 2);
      r.stop_strings = {engine->tokenizer().decode(span)};
      r.include_stop_string = i % 2 == 0;
    }
    requests.push_back(std::move(r));
  }
  std::vector<Collected> runs[2];
  for (int spec = 0; spec < 2; ++spec) {
    Deployment d({"--workers", "1", "--threads", "1", "--kv-memory", "67108864", "--spec", spec ? "ngram" : "off"},
                 trained_model());
    ASSERT_TRUE(d.ok());
    auto client = d.client();
    ASSERT_TRUE(client);
    std::vector<std::shared_ptr<Stream>> streams;
    for (const GenerateRequest& r : requests) streams.push_back(client->generate(r));
    for (auto& s : streams) runs[spec].push_back(collect(*s));
  }
  for (uint32_t i = 0; i < requests.size(); ++i) {
    ASSERT_EQ(runs[1][i].finals, 1) << i;
    EXPECT_EQ(runs[1][i].tokens, runs[0][i].tokens) << "request " << i;
    EXPECT_EQ(runs[1][i].text(), runs[0][i].text()) << "request " << i;
    EXPECT_EQ(runs[1][i].fin.reason, runs[0][i].fin.reason) << "request " << i;
    if (i < 8) EXPECT_EQ(runs[1][i].tokens.size(), i + 1);
    if (i >= 8) EXPECT_EQ(runs[0][i].fin.reason, FinishReason::kStop) << "request " << i;
  }
}

}  // namespace
}  // namespace tandem
