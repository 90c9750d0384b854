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
#include "tests/engine/step_runs.h"
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

using test_runs::cuts_every;
using test_runs::Seq;

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
    Seq s{t, std::vector<int32_t>(16), std::move(prompt_cuts), slot};
    std::iota(s.blocks.begin(), s.blocks.end(), slot * 16);
    for (uint32_t p = 141; p <= n; ++p) s.cuts.push_back(p);
    return s;
  };
  std::vector<Seq> alone = {make(tokens, 0, {140})};
  test_runs::run(**e, **kv, states->get(), alone);
  // Cut off the 64-token grid and the 16-token blocks, beside another sequence cut otherwise.
  std::vector<Seq> shared = {make(other, 1, cuts_every(140, {64, 64, 12})), make(tokens, 2, cuts_every(140, {7, 30}))};
  test_runs::run(**e, **kv, states->get(), shared);
  std::vector<Seq> single_tokens = {make(tokens, 3, cuts_every(140, {1}))};
  test_runs::run(**e, **kv, states->get(), single_tokens);
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
