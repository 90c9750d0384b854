// The step sampler samples a step's rows on the engine's compute threads: its tokens, logprobs,
// top lists and accepted drafts equal one sampler's, row after row, whichever way it splits the
// work (every row at once for few sequences, waves of rows for many), and when it has the
// engine compute each wave's logits only then (a forward pass with LogitRows::kFirstPerSequence),
// those logits are bitwise the eager pass's and no row past a mismatch is computed.
#include "workers/step_sampler.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "workers/engine/engine.h"
#include "workers/engine/generate.h"

namespace tandem::worker {
namespace {

// One sequence of the test step: a prompt, then `drafts` tokens fed after it (the greedy
// continuation, with the draft at `wrong` replaced so the round stops there; wrong >= drafts:
// none replaced) and its sampling parameters.
struct Case {
  std::vector<int32_t> tokens;  // prompt + drafts
  uint32_t drafts = 0;
  model::SamplingParams sampling;
  bool logprobs = false;
};

// mostly_greedy: fewer requests at temperature 1 or with a penalty (the demo model's samples at
// temperature 1 rarely equal its greedy drafts; greedy requests are what the screen takes).
std::vector<Case> cases(engine::Engine& engine, uint32_t n, bool mostly_greedy = false) {
  std::vector<Case> out;
  for (uint32_t i = 0; i < n; ++i) {
    Case c;
    const std::string text = "The file " + std::to_string(i) + " is the file. The file is the";
    const std::vector<int32_t> prompt = engine.tokenizer().encode(text, true).value();
    engine::GenerateOptions greedy;
    greedy.max_tokens = 6;
    greedy.ignore_eos = true;
    const std::vector<int32_t> next = engine::generate(engine, prompt, greedy).value().tokens;
    c.drafts = (i + 3) % 5;  // 0..4 drafts: plain decodes beside speculating rounds
    c.tokens = prompt;
    c.tokens.insert(c.tokens.end(), next.begin(), next.begin() + c.drafts);
    const uint32_t wrong = (i * 3) % 6;  // some rounds accept all, some stop early
    if (wrong < c.drafts) c.tokens[prompt.size() + wrong] = (c.tokens[prompt.size() + wrong] + 1) % 256 + 3;
    c.sampling.temperature = i % (mostly_greedy ? 6 : 3) == 0 ? 1.0f : 0.0f;
    c.sampling.seed = 100 + i;
    c.sampling.presence_penalty = i % (mostly_greedy ? 8 : 4) == 1 ? 0.5f : 0.0f;
    c.sampling.top_logprobs = c.drafts == 0 && i % 2 == 0 ? 3 : 0;
    c.logprobs = i % 2 == 0;
    out.push_back(std::move(c));
  }
  return out;
}

// Runs the cases as one step (each sequence's whole prompt, with logits for its last 1 + drafts
// positions), then samples it with a StepSampler and with one Sampler row by row, and compares.
// kNone: the demo model, whose head outweighs its layers: its greedy rows are screened, the
// others computed, as the step sampler asks.
void check(uint32_t threads, uint32_t n_seqs, engine::LogitRows computed = engine::LogitRows::kAll) {
  const bool screened = computed == engine::LogitRows::kNone;
  SCOPED_TRACE("threads " + std::to_string(threads) + ", sequences " + std::to_string(n_seqs) +
               (computed == engine::LogitRows::kAll ? ", every logit row up front"
                : screened                          ? ", greedy rows screened"
                                                    : ", logit rows per wave"));
  const std::string model = screened ? "vocab-trained" : "tiny-trained";
  auto engine = engine::Engine::load(std::string(TANDEM_SOURCE_DIR) + "/tests/data/" + model + ".gguf",
                                     {threads, engine::GemmBackend::kPacked})
                    .value();
  ASSERT_EQ(engine->screens_greedy(), screened);
  const std::vector<Case> cs = cases(*engine, n_seqs, screened);
  auto pool = engine::KvPool::create(engine->config(), 8 * n_seqs).value();
  std::vector<std::vector<int32_t>> blocks(n_seqs);
  std::vector<engine::SeqStep> steps;
  std::vector<SampleRequest> requests;
  uint32_t row = 0;
  for (uint32_t i = 0; i < n_seqs; ++i) {
    for (uint32_t b = 0; b < 8; ++b) blocks[i].push_back(static_cast<int32_t>(8 * i + b));
    steps.push_back({cs[i].tokens, 0, blocks[i], 1 + cs[i].drafts});
    const std::span<const int32_t> history(cs[i].tokens);
    requests.push_back(
        {i, row, &cs[i].sampling, history, history.last(3 + cs[i].drafts), history.last(cs[i].drafts), cs[i].logprobs});
    row += 1 + cs[i].drafts;
  }
  ASSERT_TRUE(engine->forward(steps, *pool).is_ok());
  const uint32_t vocab = engine->config().vocab_size;
  std::vector<float> eager(size_t{row} * vocab);  // every row's logits from the eager pass
  for (uint32_t r = 0; r < row; ++r) std::copy_n(engine->logits(r).data(), vocab, eager.begin() + size_t{r} * vocab);
  auto logits = [&](uint32_t r) { return std::span<const float>(eager).subspan(size_t{r} * vocab, vocab); };
  if (computed != engine::LogitRows::kAll) {  // the same step again, its rows' logits left for the waves
    ASSERT_EQ(StepSampler::logit_rows(requests, threads, /*head_outweighs_layers=*/true, screened), computed);
    if (!screened)
      ASSERT_EQ(StepSampler::logit_rows(requests, threads, /*head_outweighs_layers=*/false), engine::LogitRows::kAll);
    ASSERT_TRUE(engine->forward(steps, *pool, nullptr, computed).is_ok());
    ASSERT_EQ(engine->logit_rows_computed(), screened ? 0 : n_seqs);
  }
  // A request whose rows the screen takes: greedy, nothing reported.
  auto greedy = [&](const SampleRequest& q) {
    return screened && !q.logprobs && engine::Sampler::argmax_only(*q.sampling);
  };

  StepSampler sampler(vocab, threads);
  ASSERT_TRUE(sampler.run(requests, *engine, computed).is_ok());

  engine::Sampler one(engine->config().vocab_size);
  uint32_t accepted_somewhere = 0, stopped_somewhere = 0, rows_kept = 0;
  for (uint32_t i = 0; i < n_seqs; ++i) {
    const SampleRequest& q = requests[i];
    const size_t base = q.history.size() - q.drafts.size(), gen_from = q.history.size() - q.generated.size();
    std::vector<RowSample> want;
    std::vector<engine::TokenLogprob> want_top;
    for (uint32_t r = 0;; ++r) {
      const std::span<const int32_t> history = q.history.first(base + r);
      const engine::Sample s = one.sample(logits(q.logits_row + r), *q.sampling, history.size(), history,
                                          history.subspan(std::min(gen_from, history.size())));
      want.push_back({s.token, q.logprobs ? s.logprob : 0.0f});
      if (r == 0) want_top.assign(s.top.begin(), s.top.end());
      if (r == q.drafts.size() || s.token != q.drafts[r]) break;
    }
    const std::span<const RowSample> got = sampler.samples(i);
    ASSERT_EQ(got.size(), want.size()) << "sequence " << i;
    rows_kept += static_cast<uint32_t>(got.size());
    for (uint32_t r = 0; r < got.size() && !greedy(q); ++r)  // what the sampler read: bitwise the eager pass's logits
      ASSERT_TRUE(std::equal(logits(q.logits_row + r).begin(), logits(q.logits_row + r).end(),
                             engine->logits(q.logits_row + r).begin()))
          << "sequence " << i << " row " << r;
    for (size_t r = 0; r < want.size(); ++r) {
      EXPECT_EQ(got[r].token, want[r].token) << "sequence " << i << " row " << r;
      EXPECT_EQ(got[r].logprob, want[r].logprob) << "sequence " << i << " row " << r;
    }
    ASSERT_EQ(sampler.top(i).size(), want_top.size()) << "sequence " << i;
    for (size_t t = 0; t < want_top.size(); ++t) {
      EXPECT_EQ(sampler.top(i)[t].token, want_top[t].token);
      EXPECT_EQ(sampler.top(i)[t].logprob, want_top[t].logprob);
    }
    if (q.drafts.size() > 0 && got.size() == q.drafts.size() + 1) ++accepted_somewhere;
    if (got.size() <= q.drafts.size()) ++stopped_somewhere;
  }
  if (screened && n_seqs < 2 * threads)  // few sequences: every row at once
    EXPECT_EQ(engine->logit_rows_computed() + engine->logit_rows_screened(), row);
  else if (computed != engine::LogitRows::kAll)
    EXPECT_EQ(engine->logit_rows_computed() + engine->logit_rows_screened(), rows_kept)
        << "a row past a round's mismatch went through the head";
  if (screened && n_seqs >= 8) {
    EXPECT_GT(engine->logit_rows_screened(), 0u);
    EXPECT_GT(engine->logit_rows_computed(), 0u);
  }
  if (n_seqs >= 8) {
    EXPECT_GT(accepted_somewhere, 0u) << "some round should accept all its drafts";
    EXPECT_GT(stopped_somewhere, 0u) << "some round should stop at a wrong draft";
  }
}

TEST(StepSampler, EveryRowAtOnceForFewSequencesEqualsOneSamplerRowByRow) {
  check(2, 1);
  check(2, 3);
}

TEST(StepSampler, WavesOfRowsForManySequencesEqualOneSamplerRowByRow) {
  check(2, 12);
  check(1, 12);
}

TEST(StepSampler, LogitsComputedPerWaveAreTheEagerOnesAndOnlyTheRowsKept) {
  check(2, 12, engine::LogitRows::kFirstPerSequence);
  check(1, 5, engine::LogitRows::kFirstPerSequence);
}

// With a greedy screen no logits are computed up front: greedy requests' rows are screened, the
// others' computed, per wave for many sequences and at once for few; tokens as one sampler's.
TEST(StepSampler, GreedyRowsScreenedOthersComputedEqualOneSamplerRowByRow) {
  check(2, 12, engine::LogitRows::kNone);
  check(2, 3, engine::LogitRows::kNone);
  check(1, 9, engine::LogitRows::kNone);
}

// The head goes per wave only where a row through it costs more than through the layers: the
// demo model's 32000 x 64 head over 4 small layers, not the byte-level model's 512 x 64.
TEST(StepSampler, TheHeadGoesPerWaveOnlyWhereItOutweighsTheLayers) {
  for (const auto& [file, outweighs] : {std::pair{"tiny-trained", false}, std::pair{"vocab-trained", true}}) {
    auto engine = engine::Engine::load(std::string(TANDEM_SOURCE_DIR) + "/tests/data/" + file + ".gguf",
                                       {1, engine::GemmBackend::kPacked})
                      .value();
    EXPECT_EQ(engine::head_outweighs_layers(engine->config()), outweighs) << file;
  }
  auto c = model::ModelConfig{};
  c.dim = 4096, c.n_layers = 32, c.n_heads = 32, c.n_kv_heads = 8, c.ffn_dim = 14336, c.vocab_size = 128256;
  EXPECT_FALSE(engine::head_outweighs_layers(c));  // Llama 3 8B
}

TEST(StepSampler, TheEngineRefusesARowOutsideTheStepOrComputedTwice) {
  auto engine = engine::Engine::load(std::string(TANDEM_SOURCE_DIR) + "/tests/data/tiny-trained.gguf").value();
  auto pool = engine::KvPool::create(engine->config(), 4).value();
  const std::vector<int32_t> tokens = {1, 72, 101, 108}, blocks = {0, 1};
  const std::vector<engine::SeqStep> steps = {{tokens, 0, blocks, 3}};
  ASSERT_TRUE(engine->forward(steps, *pool, nullptr, engine::LogitRows::kFirstPerSequence).is_ok());
  EXPECT_EQ(engine->logit_rows_computed(), 1u);
  for (const std::vector<uint32_t>& bad : {std::vector<uint32_t>{3}, {0}, {1, 1}}) {
    const Status st = engine->compute_logit_rows(bad);
    EXPECT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("compute_logit_rows: row"), std::string::npos) << st.message();
  }
  EXPECT_TRUE(engine->compute_logit_rows(std::vector<uint32_t>{2, 1}).is_ok());  // after the refusals, as before them
  EXPECT_EQ(engine->logit_rows_computed(), 3u);
}

}  // namespace
}  // namespace tandem::worker
