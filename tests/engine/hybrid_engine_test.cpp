// The hybrid (qwen35) engine's exactness by construction (#20): a sequence's logits are
// bitwise the same however its prompt is cut into chunks and whatever shares its steps, and
// the state slots refuse what a recurrent state cannot do.
#include <gtest/gtest.h>

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

TEST(HybridEngine, LogitsAreBitwiseTheSameForAnyChunkingAndBatch) {
  auto e = Engine::load(hybrid_model(), {2, GemmBackend::kPacked});
  ASSERT_TRUE(e) << e.status().to_string();
  auto kv = KvPool::create((*e)->config(), 64);
  auto states = StatePool::create((*e)->config(), 4);
  ASSERT_TRUE(kv && states);
  const uint32_t n = 150;  // prompt 140 + 10 decode steps (chunks of 1)
  const std::vector<int32_t> tokens = test::random_tokens(n, (*e)->config().vocab_size, 21);
  const std::vector<int32_t> other = test::random_tokens(n, (*e)->config().vocab_size, 22);
  auto make = [&](const std::vector<int32_t>& t, int32_t slot, std::vector<uint32_t> prompt_cuts) {
    Seq s{t, std::vector<int32_t>(16), slot, std::move(prompt_cuts), {}};
    std::iota(s.blocks.begin(), s.blocks.end(), slot * 16);
    for (uint32_t p = 141; p <= n; ++p) s.cuts.push_back(p);
    return s;
  };
  std::vector<Seq> alone = {make(tokens, 0, {140})};
  run(**e, **kv, **states, alone);
  // Cut off the 64-token grid and the 16-token blocks, beside another sequence cut otherwise.
  std::vector<Seq> shared = {make(other, 1, cuts_every(140, {64, 64, 12})), make(tokens, 2, cuts_every(140, {7, 30}))};
  run(**e, **kv, **states, shared);
  std::vector<Seq> single_tokens = {make(tokens, 3, cuts_every(140, {1}))};
  run(**e, **kv, **states, single_tokens);
  const size_t bytes = alone[0].logits.size() * sizeof(float);
  EXPECT_EQ(std::memcmp(alone[0].logits.data(), shared[1].logits.data(), bytes), 0) << "chunks of 7 and 30, batched";
  EXPECT_EQ(std::memcmp(alone[0].logits.data(), single_tokens[0].logits.data(), bytes), 0) << "one token a step";
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
