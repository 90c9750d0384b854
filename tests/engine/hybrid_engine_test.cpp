// The hybrid (qwen35) engine's exactness by construction (#20): a sequence's logits are
// bitwise the same however its prompt is cut into chunks and whatever shares its steps, and
// the state slots refuse what a recurrent state cannot do.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "tests/test_util.h"
#include "workers/engine/engine.h"

namespace tandem::engine {
namespace {

std::string hybrid_model() {
  static const std::string path = [] {
    const std::string p = test::temp_dir() + "/qwen35.gguf";
    const std::string cmd =
        std::string(TANDEM_TANDEM_BIN) + " make-model --arch qwen35 --preset tiny --seed 5 --out " + p + " 2>/dev/null";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return p;
  }();
  return path;
}

struct Seq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> blocks;
  int32_t slot = 0;
  std::vector<uint32_t> cuts;  // chunk ends within the tokens
  std::vector<float> logits;   // every position's, [tokens][vocab]
};

// Runs every sequence through its chunks, the i-th chunks of all sequences in one step.
void run(Engine& e, KvPool& kv, StatePool& states, std::vector<Seq>& seqs) {
  const uint32_t vocab = e.config().vocab_size;
  size_t most = 0;
  for (const Seq& s : seqs) most = std::max(most, s.cuts.size());
  for (size_t c = 0; c < most; ++c) {
    std::vector<SeqStep> step;
    std::vector<Seq*> in;
    for (Seq& s : seqs) {
      if (c >= s.cuts.size()) continue;
      const uint32_t from = c == 0 ? 0 : s.cuts[c - 1], to = s.cuts[c];
      SeqStep q{std::span(s.tokens).subspan(from, to - from), from, s.blocks, to - from};
      q.state_slot = s.slot;
      step.push_back(q);
      in.push_back(&s);
    }
    const Status st = e.forward(step, kv, &states);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    uint32_t row = 0;
    for (size_t i = 0; i < step.size(); ++i)
      for (uint32_t r = 0; r < step[i].n_logits; ++r, ++row)
        in[i]->logits.insert(in[i]->logits.end(), e.logits(row).begin(), e.logits(row).end());
  }
  for (const Seq& s : seqs) ASSERT_EQ(s.logits.size(), s.tokens.size() * size_t{vocab});
}

std::vector<uint32_t> cuts_every(uint32_t n, std::vector<uint32_t> sizes) {
  std::vector<uint32_t> cuts;
  for (uint32_t at = 0, i = 0; at < n; ++i) cuts.push_back(at = std::min(n, at + sizes[i % sizes.size()]));
  return cuts;
}

constexpr uint32_t kPrompt = 250, kTokens = 270;  // prompt, then 20 decode steps past the grid point 256
constexpr uint32_t kBlocksPerSeq = 17;            // 16-token blocks

// A sequence of `t` in state slot `slot`: its prompt cut at prompt_cuts, then one token a step.
Seq make_seq(const std::vector<int32_t>& t, int32_t slot, std::vector<uint32_t> prompt_cuts) {
  Seq s{t, std::vector<int32_t>(kBlocksPerSeq), slot, std::move(prompt_cuts), {}};
  std::iota(s.blocks.begin(), s.blocks.end(), slot * static_cast<int32_t>(kBlocksPerSeq));
  for (uint32_t p = kPrompt + 1; p <= kTokens; ++p) s.cuts.push_back(p);
  return s;
}

// Every position's logits of `tokens`, prompt in one chunk, alone.
std::vector<float> alone(Engine& e, KvPool& kv, StatePool& states, const std::vector<int32_t>& tokens) {
  std::vector<Seq> one = {make_seq(tokens, 0, {kPrompt})};
  run(e, kv, states, one);
  return one[0].logits;
}

TEST(HybridEngine, LogitsAreBitwiseTheSameForAnyChunkingAndBatch) {
  auto e = Engine::load(hybrid_model(), {2, GemmBackend::kPacked});
  ASSERT_TRUE(e) << e.status().to_string();
  auto kv = KvPool::create((*e)->config(), 8 * kBlocksPerSeq);
  auto states = StatePool::create((*e)->config(), 8);
  ASSERT_TRUE(kv && states);
  const uint32_t vocab = (*e)->config().vocab_size;
  const std::vector<int32_t> tokens = test::random_tokens(kTokens, vocab, 21);
  const std::vector<int32_t> other = test::random_tokens(kTokens, vocab, 22);
  const std::vector<float> expected = alone(**e, **kv, **states, tokens);
  // Prompt chunks on, across and off the 64-token grid (and the 16-token blocks), sequences
  // sharing steps with others cut otherwise; every one then decodes across a grid point.
  const std::vector<std::vector<uint32_t>> cuts = {{7}, {50}, {64}, {100}, {200}, {1}, {7, 30}, {64, 64, 12}};
  std::vector<Seq> batch = {make_seq(other, 0, cuts_every(kPrompt, {64, 64, 12}))};
  for (size_t i = 0; i < cuts.size() - 1; ++i)
    batch.push_back(make_seq(tokens, static_cast<int32_t>(i + 1), cuts_every(kPrompt, cuts[i])));
  run(**e, **kv, **states, batch);
  std::vector<Seq> last = {make_seq(tokens, 0, cuts_every(kPrompt, cuts.back()))};  // slot 0 again: a recompute
  run(**e, **kv, **states, last);
  batch.push_back(last[0]);
  const size_t bytes = expected.size() * sizeof(float);
  for (size_t i = 1; i < batch.size(); ++i)
    EXPECT_EQ(std::memcmp(expected.data(), batch[i].logits.data(), bytes), 0)
        << "prompt chunks of " << cuts[i - 1][0] << (cuts[i - 1].size() > 1 ? ", ..." : "");
}

// The two forms of the delta rule (EngineOptions::delta) are the same math: they agree to float
// rounding over prompt and decode.
TEST(HybridEngine, ChunkedFormAgreesWithTokenByToken) {
  std::vector<float> logits[2];
  const DeltaForm forms[2] = {DeltaForm::kChunked, DeltaForm::kTokenByToken};
  for (int f = 0; f < 2; ++f) {
    auto e = Engine::load(hybrid_model(), {2, GemmBackend::kPacked, forms[f]});
    ASSERT_TRUE(e) << e.status().to_string();
    auto kv = KvPool::create((*e)->config(), kBlocksPerSeq);
    auto states = StatePool::create((*e)->config(), 1);
    ASSERT_TRUE(kv && states);
    logits[f] = alone(**e, **kv, **states, test::random_tokens(kTokens, (*e)->config().vocab_size, 21));
  }
  float worst = 0, largest = 0;
  for (size_t i = 0; i < logits[0].size(); ++i) {
    worst = std::max(worst, std::abs(logits[0][i] - logits[1][i]));
    largest = std::max(largest, std::abs(logits[1][i]));
  }
  EXPECT_LT(worst, 1e-4f * std::max(1.0f, largest));
  EXPECT_GT(worst, 0.0f) << "the forms round differently: equal bits would mean one form ran twice";
}

TEST(HybridEngine, StateSlotsRefuseWhatARecurrentStateCannotDo) {
  auto e = Engine::load(hybrid_model());
  ASSERT_TRUE(e) << e.status().to_string();
  auto kv = KvPool::create((*e)->config(), 8);
  auto states = StatePool::create((*e)->config(), 2);
  ASSERT_TRUE(kv && states);
  std::vector<int32_t> blocks = {0, 1}, tokens = test::random_tokens(20, (*e)->config().vocab_size, 1);
  SeqStep s{std::span(tokens).first(10), 0, blocks, 1};
  s.state_slot = 0;
  EXPECT_NE((*e)->forward({&s, 1}, **kv).message().find("needs a recurrent state pool"), std::string::npos);
  ASSERT_TRUE((*e)->forward({&s, 1}, **kv, states->get()).is_ok());
  EXPECT_EQ((*states)->position(0), 10u);
  SeqStep back{std::span(tokens).subspan(5, 3), 5, blocks, 1};  // a rollback
  back.state_slot = 0;
  EXPECT_NE((*e)->forward({&back, 1}, **kv, states->get()).message().find("cannot roll back"), std::string::npos);
  SeqStep pair[2] = {s, s};
  pair[1].start_pos = 0;
  EXPECT_NE((*e)->forward(pair, **kv, states->get()).message().find("shares state slot"), std::string::npos);
  s.state_slot = 2;
  EXPECT_NE((*e)->forward({&s, 1}, **kv, states->get()).message().find("outside the pool"), std::string::npos);
  EXPECT_EQ((*states)->position(0), 10u) << "a refused step changes no state";
}

}  // namespace
}  // namespace tandem::engine
