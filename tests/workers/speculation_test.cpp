// Speculative decoding's pure parts: prompt-lookup drafts, greedy-exact acceptance, the draft
// budget and the per-sequence draft length.
#include "workers/speculation.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "tests/test_util.h"
#include "workers/engine/engine.h"
#include "workers/engine/generate.h"

namespace tandem::workers {
namespace {

std::vector<int32_t> draft_of(const std::vector<int32_t>& history, NgramConfig config = {}, size_t room = 4) {
  std::vector<int32_t> out(room, -1);
  out.resize(ngram_draft(history, config, out));
  return out;
}

TEST(NgramDraft, ProposesWhatFollowedTheLatestOccurrenceOfTheLongestSuffix) {
  // "5 6" occurs twice before the end; the latest one is followed by 9 1 5 6.
  EXPECT_EQ(draft_of({5, 6, 7, 8, 5, 6, 9, 1, 5, 6}), (std::vector<int32_t>{9, 1, 5, 6}));
  // The 3-gram "1 5 6" wins over the 2-gram's later occurrence.
  EXPECT_EQ(draft_of({1, 5, 6, 3, 5, 6, 4, 1, 5, 6}), (std::vector<int32_t>{3, 5, 6, 4}));
  // At most out.size() drafts; past the history's end the loop goes on (period 3 here).
  EXPECT_EQ(draft_of({5, 6, 7, 5, 6}, {}, 2), (std::vector<int32_t>{7, 5}));
  EXPECT_EQ(draft_of({5, 6, 7, 5, 6}, {}, 8), (std::vector<int32_t>{7, 5, 6, 7, 5, 6, 7, 5}));
}

TEST(NgramDraft, NothingWithoutAnEarlierOccurrenceOrBelowMinN) {
  EXPECT_TRUE(draft_of({1, 2, 3, 4, 5}).empty());
  EXPECT_TRUE(draft_of({}).empty());
  EXPECT_TRUE(draft_of({7}).empty());
  // Only the last token repeats: min_n 2 finds nothing, min_n 1 does.
  EXPECT_TRUE(draft_of({4, 9, 3, 4}).empty());
  EXPECT_EQ(draft_of({4, 9, 3, 4}, NgramConfig{3, 1, 4}), (std::vector<int32_t>{9, 3, 4, 9}));
  // A run of one token: the suffix's occurrence one step back, the run going on.
  EXPECT_EQ(draft_of({2, 2, 2}, NgramConfig{3, 1, 4}), (std::vector<int32_t>{2, 2, 2, 2}));
}

TEST(AcceptedPrefix, TheLongestPrefixEqualToTheSamples) {
  const std::array<int32_t, 3> drafts{4, 5, 6};
  EXPECT_EQ(accepted_prefix(drafts, std::array<int32_t, 4>{4, 5, 6, 7}), 3u);
  EXPECT_EQ(accepted_prefix(drafts, std::array<int32_t, 4>{4, 5, 1, 6}), 2u);
  EXPECT_EQ(accepted_prefix(drafts, std::array<int32_t, 4>{1, 5, 6, 7}), 0u);  // later matches do not count
  EXPECT_EQ(accepted_prefix({}, std::array<int32_t, 1>{4}), 0u);
}

TEST(DraftBudget, AcceptedDraftsPlusTheCorrectionNeverPassTheRemainingTokensOrTheContext) {
  EXPECT_EQ(draft_budget(4, 100, 100), 4u);
  EXPECT_EQ(draft_budget(4, 3, 100), 2u);  // 2 drafts + 1 correction = the 3 tokens left
  EXPECT_EQ(draft_budget(4, 1, 100), 0u);
  EXPECT_EQ(draft_budget(4, 0, 100), 0u);
  EXPECT_EQ(draft_budget(4, 100, 2), 1u);
}

TEST(DraftLength, GrowsOnFullAcceptanceHalvesOnNoneAndProbesWhenOff) {
  DraftLength k(4);
  EXPECT_EQ(k.next(), 4u);
  k.record(4, 2);  // partial: kept
  EXPECT_EQ(k.next(), 4u);
  k.record(4, 0);
  EXPECT_EQ(k.next(), 2u);
  k.record(2, 0);
  k.record(1, 0);
  EXPECT_EQ(k.next(), 0u);
  // Off: a probe of one draft every kProbeEvery rounds.
  int probes = 0;
  for (uint32_t round = 0; round < 4 * DraftLength::kProbeEvery; ++round) {
    const uint32_t drafts = k.next();
    probes += drafts > 0;
    k.record(drafts, 0);
  }
  EXPECT_EQ(probes, 4);
  // A probe accepted turns it back on and full rounds grow it to max_k.
  while (k.next() == 0) k.record(0, 0);
  k.record(1, 1);
  EXPECT_EQ(k.next(), 2u);
  k.record(2, 2);
  k.record(3, 3);
  k.record(4, 4);
  EXPECT_EQ(k.next(), 4u);
}

// Rounds that accept one draft in four never end in none accepted, so only the acceptance rate
// turns them off; one in two keeps speculating.
TEST(DraftLength, PartialRoundsAcceptingLittleTurnItOff) {
  DraftLength low(4), half(4);
  for (int round = 0; round < 12; ++round) {
    low.record(low.next(), low.next() > 0 ? 1 : 0);
    half.record(4, 2);
  }
  EXPECT_EQ(low.next(), 0u) << "a draft in four accepted should turn speculation off";
  EXPECT_EQ(half.next(), 4u);
}

// A stand-in for the target model that repeats: the next token is a function of the last 3.
int32_t target_next(const std::vector<int32_t>& h) {
  const size_t n = h.size();
  return (h[n - 1] * 7 + h[n - 2] * 3 + h[n - 3]) % 11;
}

TEST(SpeculationLoop, RoundsEmitExactlyThePlainDecodeAndTakeFewerSteps) {
  const std::vector<int32_t> prompt{1, 2, 3};
  const uint32_t max_tokens = 200;
  std::vector<int32_t> plain = prompt;
  while (plain.size() < prompt.size() + max_tokens) plain.push_back(target_next(plain));

  std::vector<int32_t> seq = prompt;
  DraftLength k(4);
  std::array<int32_t, 4> drafts{};
  uint32_t rounds = 0;
  while (seq.size() < prompt.size() + max_tokens) {
    const uint32_t remaining = prompt.size() + max_tokens - static_cast<uint32_t>(seq.size());
    const uint32_t want = draft_budget(k.next(), remaining, 1u << 20);
    const uint32_t drafted = ngram_draft(seq, {}, std::span(drafts).first(want));
    // Verification: the target's sample at each drafted position, from the drafts before it.
    std::vector<int32_t> with = seq, samples;
    for (uint32_t i = 0; i <= drafted; ++i) {
      samples.push_back(target_next(with));
      if (i < drafted) with.push_back(drafts[i]);
    }
    const uint32_t accepted = accepted_prefix(std::span(drafts).first(drafted), samples);
    seq.insert(seq.end(), samples.begin(), samples.begin() + accepted + 1);
    k.record(drafted, accepted);
    ++rounds;
    ASSERT_LE(seq.size(), prompt.size() + max_tokens) << "a round passed max_tokens";
  }
  EXPECT_EQ(seq, plain);
  EXPECT_LT(rounds, max_tokens / 2) << "a sequence that repeats should accept most drafts";
}

// tandem run --spec ngram: the in-process generator verifying prompt-lookup drafts gives plain
// decoding's tokens and logprobs, bit for bit, greedy and seeded at temperature 1, with a
// presence penalty (it counts the accepted tokens before each position), on F32 and 8-bit KV
// (windows 2 and 1: a round never crosses its block there), on the trained tiny model whose
// output repeats (most drafts accepted) and on prompts of random ids.
TEST(GenerateWithDrafts, EqualsPlainDecodingTokenForToken) {
  auto engine = engine::Engine::load(std::string(TANDEM_SOURCE_DIR) + "/tests/data/tiny-trained.gguf",
                                     {1, engine::GemmBackend::kPacked})
                    .value();
  const std::vector<int32_t> text =
      engine->tokenizer().encode("The file is the file. The file is the file. The", true).value();
  std::mt19937 rng(3);
  std::vector<int32_t> noise;
  for (int i = 0; i < 40; ++i) noise.push_back(3 + static_cast<int32_t>(rng() % 500));
  uint32_t steps = 0, tokens = 0;
  const std::vector<int32_t>* noisy = &noise;
  for (const std::vector<int32_t>* prompt : {&text, noisy})
    for (uint32_t bits : {0u, 8u})
      for (uint32_t window : {2u, 1u})
        for (float temperature : {0.0f, 1.0f}) {
          if (bits == 0 && window == 1) continue;
          engine::GenerateOptions plain;
          plain.max_tokens = 120;
          plain.ignore_eos = true;
          plain.sampling.temperature = temperature;
          plain.sampling.seed = 11;
          plain.sampling.presence_penalty = temperature > 0 ? 0.5f : 0.0f;
          plain.kv_format.bits = bits;
          plain.kv_format.f32_window = window;
          NgramDrafter drafter(4);
          engine::GenerateOptions spec = plain;
          spec.drafter = &drafter;
          spec.spec_tokens = 4;
          const auto want = engine::generate(*engine, *prompt, plain).value();
          const auto got = engine::generate(*engine, *prompt, spec).value();
          const std::string what = "bits " + std::to_string(bits) + " window " + std::to_string(window) +
                                   " temperature " + std::to_string(temperature);
          EXPECT_EQ(got.tokens, want.tokens) << what;
          EXPECT_EQ(got.logprobs, want.logprobs) << what;
          if (prompt == &text && temperature == 0) {
            steps += got.decode_steps;
            tokens += static_cast<uint32_t>(got.tokens.size() - 1);
          }
        }
  EXPECT_LT(steps * 6, tokens * 5) << "the trained model's repeating output should accept drafts: " << tokens
                                   << " tokens in " << steps << " steps";
}

}  // namespace
}  // namespace tandem::workers

namespace tandem::workers {
namespace {

// The same on a hybrid (qwen35, `tandem run --spec ngram`): each round's rejected drafts are
// rolled out of the recurrent state, drafts capped so a round never completes a grid chunk.
// make-model's random qwen35 does not repeat itself, so a logit bias makes it: one token (all
// drafts accepted), three (greedy: the model picks, drafts partly accepted), two at temperature 1
// (one about 7 times likelier), and none (drafts rejected); 200 tokens cross three grid points.
TEST(GenerateWithDrafts, OnAHybridEqualsPlainDecodingTokenForToken) {
  const std::string path = test::temp_dir() + "/spec-qwen35.gguf";
  const std::string cmd =
      std::string(TANDEM_TANDEM_BIN) + " make-model --arch qwen35 --preset tiny --seed 3 --out " + path + " >/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto engine = engine::Engine::load(path, {1, engine::GemmBackend::kPacked}).value();
  std::mt19937 rng(5);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 30; ++i) prompt.push_back(3 + static_cast<int32_t>(rng() % 500));
  using Bias = std::vector<model::LogitBias>;
  const std::vector<std::pair<Bias, float>> cases = {{{{11, 100.0f}}, 0.0f},
                                                     {{{11, 30.0f}, {12, 30.0f}, {13, 30.0f}}, 0.0f},
                                                     {{{11, 30.0f}, {12, 28.0f}}, 1.0f},
                                                     {{}, 0.0f},
                                                     {{}, 1.0f}};
  uint32_t steps = 0, tokens = 0;
  for (const auto& [bias, temperature] : cases) {
    engine::GenerateOptions plain;
    plain.max_tokens = 200;
    plain.ignore_eos = true;
    plain.sampling.temperature = temperature;
    plain.sampling.seed = 11;
    plain.sampling.logit_bias = bias;
    NgramDrafter drafter(4);
    engine::GenerateOptions spec = plain;
    spec.drafter = &drafter;
    spec.spec_tokens = 4;
    const auto want = engine::generate(*engine, prompt, plain).value();
    const auto got = engine::generate(*engine, prompt, spec);
    ASSERT_TRUE(got) << got.status().to_string();
    const std::string what = std::to_string(bias.size()) + " biased, temperature " + std::to_string(temperature);
    EXPECT_EQ(got->tokens, want.tokens) << what;
    EXPECT_EQ(got->logprobs, want.logprobs) << what;
    if (!bias.empty()) steps += got->decode_steps, tokens += static_cast<uint32_t>(got->tokens.size() - 1);
  }
  EXPECT_LT(steps * 2, tokens) << "the biased outputs repeat: " << tokens << " tokens in " << steps << " steps";
}

}  // namespace
}  // namespace tandem::workers
