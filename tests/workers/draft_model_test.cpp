// Speculative decoding from a draft model (workers/draft_model.h) through engine::generate, the
// path `tandem run --spec draft` takes and the worker's parts (DraftModel::draft,
// engine::verify_sampled): greedy output equal to plain decoding's, at temperature 1 the token
// distribution equal to plain decoding's (chi-square), a vocabulary that differs refused.
#include "workers/draft_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "tests/test_util.h"
#include "workers/engine/generate.h"

namespace tandem::workers {
namespace {

std::string trained_model() { return std::string(TANDEM_SOURCE_DIR) + "/tests/data/tiny-trained.gguf"; }

struct Models {
  std::unique_ptr<engine::Engine> target;
  std::unique_ptr<DraftModel> draft;
};

// The trained tiny model, drafted for by `draft_path` (a pool of its whole context).
Models load(const std::string& draft_path) {
  Models m;
  m.target = engine::Engine::load(trained_model(), {1, engine::GemmBackend::kPacked}).value();
  auto draft = DraftModel::load(draft_path, {1, engine::GemmBackend::kPacked}, *m.target);
  EXPECT_TRUE(draft) << draft.status().to_string();
  if (!draft) return m;
  m.draft = std::move(draft.value());
  const uint32_t context = m.target->config().context_length;
  EXPECT_TRUE(m.draft->make_pool((context + 15) / 16, 16));
  return m;
}

Result<engine::Generation> generate_with(Models& m, std::span<const int32_t> prompt, engine::GenerateOptions opt,
                                         uint32_t k) {
  ModelDrafter drafter(*m.draft, k, m.target->config().context_length);
  drafter.set_sampling(&opt.sampling, static_cast<uint32_t>(prompt.size()));
  opt.drafter = &drafter;
  opt.spec_tokens = k;
  return engine::generate(*m.target, prompt, opt);
}

// A draft of the trained model's own vocabulary: the tiny preset with random weights (its
// distribution nearly flat where the target's is peaked, so many drafts are rejected).
std::string random_draft() { return test::model_file("tiny", 7); }

TEST(GenerateWithDraftModel, GreedyEqualsPlainDecodingTokenForToken) {
  Models m = load(random_draft());
  ASSERT_TRUE(m.draft);
  Models self = load(trained_model());  // the target drafting for itself: every draft accepted
  ASSERT_TRUE(self.draft);
  const std::vector<int32_t> prompt =
      m.target->tokenizer().encode("The file is the file. The file is the", true).value();
  for (uint32_t bits : {0u, 8u}) {
    engine::GenerateOptions plain;
    plain.max_tokens = 60;
    plain.ignore_eos = true;
    plain.kv_format.bits = bits;
    plain.sampling.presence_penalty = 0.3f;
    const auto want = engine::generate(*m.target, prompt, plain).value();
    for (Models* models : {&m, &self}) {
      const auto got = generate_with(*models, prompt, plain, 4).value();
      EXPECT_EQ(got.tokens, want.tokens) << "bits " << bits;
      EXPECT_EQ(got.logprobs, want.logprobs) << "bits " << bits;
      if (models == &self) {
        EXPECT_LT(got.decode_steps * 3, got.tokens.size()) << "its own drafts are all accepted, bits " << bits;
      }
    }
  }
}

// A draft model of a shorter context drafts only within it: past it the target decodes alone.
TEST(GenerateWithDraftModel, ADraftOfAShorterContextStopsDraftingAtItsEnd) {
  const std::string short_draft = test::temp_dir() + "/draft-ctx32.gguf";
  const test::CommandOutput made = test::run_command(
      std::string(TANDEM_TANDEM_BIN) + " make-model --preset tiny --seed 7 --context 32 --out " + short_draft);
  ASSERT_EQ(made.exit_code, 0) << made.err;
  Models m = load(short_draft);
  ASSERT_TRUE(m.draft);
  const std::vector<int32_t> prompt = m.target->tokenizer().encode("The file is the", true).value();
  engine::GenerateOptions plain;
  plain.max_tokens = 60;
  plain.ignore_eos = true;
  const auto want = engine::generate(*m.target, prompt, plain).value();
  const auto got = generate_with(m, prompt, plain, 4);
  ASSERT_TRUE(got) << got.status().to_string();
  EXPECT_EQ(got->tokens, want.tokens);
}

// The p-value of Pearson's chi-square test that two samples of tokens come from one
// distribution: bins with fewer than 10 tokens in both samples together are pooled into one.
double homogeneity_p(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  std::map<int32_t, std::pair<double, double>> counts;
  for (int32_t t : a) counts[t].first += 1;
  for (int32_t t : b) counts[t].second += 1;
  std::vector<std::pair<double, double>> bins;
  std::pair<double, double> rare{0, 0};
  for (const auto& [t, c] : counts) {
    if (c.first + c.second < 10) {
      rare.first += c.first, rare.second += c.second;
    } else {
      bins.push_back(c);
    }
  }
  if (rare.first + rare.second > 0) bins.push_back(rare);
  const double na = static_cast<double>(a.size()), nb = static_cast<double>(b.size()), n = na + nb;
  double chi2 = 0;
  for (const auto& [x, y] : bins) {
    const double ea = (x + y) * na / n, eb = (x + y) * nb / n;
    chi2 += (x - ea) * (x - ea) / ea + (y - eb) * (y - eb) / eb;
  }
  // Wilson-Hilferty: (chi2 / df)^(1/3) is close to normal.
  const double df = static_cast<double>(bins.size() - 1);
  const double z = (std::cbrt(chi2 / df) - (1 - 2 / (9 * df))) / std::sqrt(2 / (9 * df));
  return 0.5 * std::erfc(z / std::sqrt(2.0));
}

// At temperature 1 (with a presence penalty, which applies to p as in plain decoding), the
// tokens at the second and third generated positions, which a round's drafts decide (accepted
// by min(1, p/q) or corrected from the residual), are distributed as plain decoding's: 20k
// samples each, seeds fixed and disjoint.
TEST(GenerateWithDraftModel, DistributionAtTemperatureOneEqualsPlainDecoding) {
  Models m = load(random_draft());
  ASSERT_TRUE(m.draft);
  const std::vector<int32_t> prompt = m.target->tokenizer().encode("The file is", true).value();
  constexpr uint32_t kSamples = 20000;
  engine::GenerateOptions opt;
  opt.max_tokens = 4;
  opt.ignore_eos = true;
  opt.sampling.temperature = 1.0f;
  opt.sampling.presence_penalty = 0.5f;
  std::vector<int32_t> plain[2], spec[2];
  uint32_t steps = 0;
  for (uint32_t i = 0; i < kSamples; ++i) {
    opt.sampling.seed = 1'000'000 + i;
    const auto p = engine::generate(*m.target, prompt, opt).value();
    opt.sampling.seed = i;
    const auto s = generate_with(m, prompt, opt, 3).value();
    ASSERT_EQ(s.tokens.size(), 4u);
    for (int at : {0, 1}) plain[at].push_back(p.tokens[1 + at]), spec[at].push_back(s.tokens[1 + at]);
    steps += s.decode_steps;
  }
  for (int at : {0, 1}) {
    const double pv = homogeneity_p(spec[at], plain[at]);
    EXPECT_GT(pv, 0.01) << "generated token " << 1 + at << ": chi-square p = " << pv;
    std::printf("generated token %d: chi-square p = %.4g\n", 1 + at, pv);
  }
  // Some rounds accept drafts and some reject: both branches of the rule were taken.
  EXPECT_LT(steps, kSamples * 3u);
  EXPECT_GT(steps, kSamples * 1u);
}

TEST(DraftModelLoad, RefusesAnotherVocabulary) {
  auto target = engine::Engine::load(trained_model(), {1, engine::GemmBackend::kPacked}).value();
  // The small preset's vocabulary is larger than the trained tiny model's.
  const std::string other = test::model_file("small", 1);
  auto draft = DraftModel::load(other, {1, engine::GemmBackend::kPacked}, *target);
  ASSERT_FALSE(draft);
  EXPECT_NE(draft.status().message().find("does not share the target model's vocabulary"), std::string::npos)
      << draft.status().message();
  EXPECT_NE(draft.status().message().find("tokens, the target's"), std::string::npos) << draft.status().message();
  const Status st = check_draft_model_file(trained_model(), other);
  EXPECT_FALSE(st);
  EXPECT_NE(st.message().find("vocabulary"), std::string::npos) << st.message();
  EXPECT_TRUE(check_draft_model_file(trained_model(), random_draft())) << "the tiny preset's vocabulary is the same";
}

// The flags, as `tandem run` and `tandem up` check them before anything starts.
TEST(DraftModelFlags, RefuseAMissingDraftModelOrAnotherVocabulary) {
  const std::string tandem = TANDEM_TANDEM_BIN, model = " --model " + trained_model();
  struct Case {
    std::string args, error;
  };
  const std::string small = test::model_file("small", 1);
  for (const Case& c : std::vector<Case>{
           {"run" + model + " --prompt hi --spec draft", "--spec draft needs --draft-model FILE"},
           {"run" + model + " --prompt hi --spec ngram --draft-model " + small, "add --spec draft"},
           {"run" + model + " --prompt hi --spec draft --draft-model " + small,
            "does not share the target model's vocabulary"},
           {"up" + model + " --spec draft --draft-model " + small, "does not share the target model's vocabulary"},
           {"up" + model + " --spec draft", "--spec draft needs --draft-model FILE"},
       }) {
    const test::CommandOutput r = test::run_command(tandem + " " + c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.err.find(c.error), std::string::npos) << c.args << ": " << r.err;
  }
  const test::CommandOutput ok = test::run_command(
      tandem + " run" + model + " --prompt 'The file' --max-tokens 8 --spec draft --draft-model " + random_draft());
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

}  // namespace
}  // namespace tandem::workers
