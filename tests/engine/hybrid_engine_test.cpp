// The hybrid (qwen35) engine's exactness by construction (#20): a sequence's logits are
// bitwise the same however its prompt is cut into chunks and whatever shares its steps, and
// the state slots refuse what a recurrent state cannot do.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tests/test_util.h"
#include "tests/engine/step_runs.h"
#include "workers/engine/engine.h"
#include "workers/engine/hybrid.h"

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

constexpr uint32_t kPrompt = 250, kTokens = 270;  // prompt, then 20 decode steps past the grid point 256
constexpr uint32_t kBlocksPerSeq = 17;            // 16-token blocks

// A sequence of `t` in state slot `slot`: its prompt cut at prompt_cuts, then one token a step.
Seq make_seq(const std::vector<int32_t>& t, int32_t slot, std::vector<uint32_t> prompt_cuts) {
  Seq s{t, std::vector<int32_t>(kBlocksPerSeq), std::move(prompt_cuts), slot};
  std::iota(s.blocks.begin(), s.blocks.end(), slot * static_cast<int32_t>(kBlocksPerSeq));
  for (uint32_t p = kPrompt + 1; p <= kTokens; ++p) s.cuts.push_back(p);
  return s;
}

// Every position's logits of `tokens`, prompt in one chunk, alone.
std::vector<float> alone(Engine& e, KvPool& kv, StatePool& states, const std::vector<int32_t>& tokens) {
  std::vector<Seq> one = {make_seq(tokens, 0, {kPrompt})};
  test_runs::run(e, kv, &states, one);
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
  test_runs::run(**e, **kv, states->get(), batch);
  std::vector<Seq> last = {make_seq(tokens, 0, cuts_every(kPrompt, cuts.back()))};  // slot 0 again: a recompute
  test_runs::run(**e, **kv, states->get(), last);
  batch.push_back(last[0]);
  const size_t bytes = expected.size() * sizeof(float);
  for (size_t i = 1; i < batch.size(); ++i)
    EXPECT_EQ(std::memcmp(expected.data(), batch[i].logits.data(), bytes), 0)
        << "prompt chunks of " << cuts[i - 1][0] << (cuts[i - 1].size() > 1 ? ", ..." : "");
}

// The prefix cache's checkpoint (docs/HYBRID.md "Prefix cache"): a sequence's state saved at a
// grid point (StatePool::copy into another slot), its slot then reused by another sequence, and
// copied back into a third slot, resumes over the shared KV blocks to bitwise the logits of the
// whole prompt computed alone, across the prompt's end and 20 decode steps.
TEST(HybridEngine, ACheckpointRestoredIntoAnySlotResumesToTheSameLogits) {
  auto e = Engine::load(hybrid_model(), {2, GemmBackend::kPacked});
  ASSERT_TRUE(e) << e.status().to_string();
  auto kv = KvPool::create((*e)->config(), 3 * kBlocksPerSeq);
  auto states = StatePool::create((*e)->config(), 4);
  ASSERT_TRUE(kv && states);
  const uint32_t vocab = (*e)->config().vocab_size;
  const std::vector<int32_t> tokens = test::random_tokens(kTokens, vocab, 31);
  const std::vector<float> expected = alone(**e, **kv, **states, tokens);
  constexpr uint32_t kAt = 128;  // the checkpoint position: a grid point and a block end
  std::vector<test_runs::Seq> first = {
      {std::vector<int32_t>(tokens.begin(), tokens.begin() + kAt), {}, {50, 100, kAt}, 1}};
  for (int32_t b = 0; b < 8; ++b) first[0].blocks.push_back(kBlocksPerSeq + b);
  test_runs::run(**e, **kv, states->get(), first);
  (*states)->copy(1, 3);  // saved
  std::vector<test_runs::Seq> other = {make_seq(test::random_tokens(kTokens, vocab, 32), 0, {kPrompt})};
  other[0].slot = 1;
  test_runs::run(**e, **kv, states->get(), other);  // slot 1 reused, blocks 0.. overwritten
  (*states)->copy(3, 2);                            // restored into another slot
  ASSERT_EQ((*states)->position(2), kAt);
  std::vector<int32_t> blocks = first[0].blocks;  // the cached prefix's blocks, then its own
  for (int32_t b = 0; b < 9; ++b) blocks.push_back(2 * kBlocksPerSeq + b);
  std::vector<float> got;
  for (uint32_t from = kAt; from < kTokens; from = from < kPrompt ? kPrompt : from + 1) {
    const uint32_t to = from < kPrompt ? kPrompt : from + 1;
    SeqStep q{std::span(tokens).subspan(from, to - from), from, blocks, to - from, {}, -1};
    q.state_slot = 2;
    const Status st = (*e)->forward({&q, 1}, **kv, states->get());
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    for (uint32_t r = 0; r < to - from; ++r) got.insert(got.end(), (*e)->logits(r).begin(), (*e)->logits(r).end());
  }
  ASSERT_EQ(got.size(), size_t{kTokens - kAt} * vocab);
  EXPECT_EQ(std::memcmp(expected.data() + size_t{kAt} * vocab, got.data(), got.size() * sizeof(float)), 0);
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

// hybrid::delta_rows on its own, at head sizes the tiny preset does not have (several panels, a
// partial one): one V head over 200 rows, the calls cut in `cuts`, keys stored as the engine
// stores them (the call's first grid chunk before, its last after).
std::vector<float> delta_rule(uint32_t d, const std::vector<float>& rows, const std::vector<float>& gates,
                              const std::vector<uint32_t>& cuts) {
  const hybrid::ChunkLayout lay{d, 1, 1};
  std::vector<float> layer(lay.floats()), scratch(hybrid::chunk_scratch_floats(d)), o(rows.size() / 3);
  float* keys = hybrid::key_rows(layer.data(), lay, 0);
  const size_t C = 3 * d;
  for (uint32_t from = 0, c = 0; c < cuts.size(); from = cuts[c++]) {
    const uint32_t n = cuts[c] - from, grid = hybrid::kGrid;
    const float* k = rows.data() + from * C + d;
    hybrid::store_keys(k, C, from, std::min(n, (from / grid + 1) * grid - from), d, keys);
    const hybrid::HeadRows in{k - d, k, k + d, C, gates.data() + 2 * from, gates.data() + 2 * from + 1, 2};
    hybrid::delta_rows(kernels::best(), lay, hybrid::head_state(layer.data(), lay, 0), keys, in, from, n,
                       o.data() + from * d, d, scratch.data());
    const uint32_t last = cuts[c] / grid * grid;
    if (last > from && last < cuts[c]) hybrid::store_keys(rows.data() + last * C + d, C, last, cuts[c] - last, d, keys);
  }
  return o;
}

TEST(HybridDeltaRule, ChunkedRowsMatchTheRecurrentStepAtAnyHeadSize) {
  for (uint32_t d : {16u, 48u, 64u, 128u}) {
    const uint32_t n = 200;
    std::mt19937 rng(d);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> rows(size_t{n} * 3 * d), gates(2 * n);
    for (float& x : rows) x = nd(rng);
    for (uint32_t r = 0; r < n; ++r) {  // q, k unit vectors (q / sqrt(d) as conv_token scales it)
      for (uint32_t part = 0; part < 2; ++part) {
        float* x = &rows[(size_t{r} * 3 + part) * d];
        float ss = 0;
        for (uint32_t i = 0; i < d; ++i) ss += x[i] * x[i];
        for (uint32_t i = 0; i < d; ++i) x[i] /= std::sqrt(ss) * (part == 0 ? std::sqrt(float(d)) : 1.0f);
      }
      gates[2 * r] = -std::abs(nd(rng)) * 0.3f, gates[2 * r + 1] = 1.0f / (1.0f + std::exp(-nd(rng)));
    }
    std::vector<float> S(size_t{d} * d), want(size_t{n} * d);
    for (uint32_t r = 0; r < n; ++r) {
      const float* x = &rows[size_t{r} * 3 * d];
      hybrid::delta_step(S.data(), x, x + d, x + 2 * d, gates[2 * r], gates[2 * r + 1], d, &want[size_t{r} * d]);
    }
    const std::vector<float> whole = delta_rule(d, rows, gates, {n});
    float worst = 0;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(whole[i] - want[i]));
    EXPECT_LT(worst, 1e-4f) << "d " << d;
    std::printf("d %u: max |o error| against the recurrent step %.3g\n", d, worst);
    for (const auto& sizes : std::vector<std::vector<uint32_t>>{{1}, {7}, {50}, {64}, {100, 3}})
      EXPECT_EQ(std::memcmp(delta_rule(d, rows, gates, cuts_every(n, sizes)).data(), whole.data(),
                            whole.size() * sizeof(float)),
                0)
          << "d " << d << ", calls of " << sizes[0];
  }
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
  EXPECT_NE((*e)->forward({&back, 1}, **kv, states->get()).message().find("roll it back first"), std::string::npos);
  SeqStep pair[2] = {s, s};
  pair[1].start_pos = 0;
  EXPECT_NE((*e)->forward(pair, **kv, states->get()).message().find("shares state slot"), std::string::npos);
  s.state_slot = 2;
  EXPECT_NE((*e)->forward({&s, 1}, **kv, states->get()).message().find("outside the pool"), std::string::npos);
  EXPECT_EQ((*states)->position(0), 10u) << "a refused step changes no state";
}

}  // namespace
}  // namespace tandem::engine

namespace tandem::engine {
namespace {

// Element (i, j) of a PackedView {n, k} holding W[j][i] (the kernels' panels of kPanel columns).
size_t packed(uint32_t i, uint32_t j, uint32_t k) {
  constexpr uint32_t P = kernels::kPanel;
  return size_t{j / P} * k * P + size_t{i} * P + j % P;
}

// What of slot `a` must equal slot `b` once both hold `pos` positions: per recurrent layer the
// conv state, and per head the state at the grid point and the open chunk's rows before pos
// (their gammas, deltas and keys); rows past it are stale and never read.
bool same_state(StatePool& states, const ModelConfig& c, uint32_t a, uint32_t b, uint32_t pos) {
  const hybrid::ChunkLayout lay{c.ssm_state_size, c.ssm_time_step_rank, c.ssm_group_count};
  const uint32_t d = lay.d, rows = pos % hybrid::kGrid;
  const size_t conv = size_t{c.ssm_conv_kernel - 1} * c.conv_channels();
  for (uint32_t r = 0; r < states.recurrent_layers(); ++r) {
    if (std::memcmp(states.conv(a, r), states.conv(b, r), conv * sizeof(float)) != 0) return false;
    float *la = states.recurrent(a, r), *lb = states.recurrent(b, r);
    for (uint32_t j = 0; j < lay.v_heads; ++j) {
      const hybrid::HeadState x = hybrid::head_state(la, lay, j), y = hybrid::head_state(lb, lay, j);
      if (std::memcmp(x.s0, y.s0, lay.s0_floats() * sizeof(float)) != 0) return false;
      for (uint32_t m = 0; m < rows; ++m) {
        if (std::memcmp(&x.gamma[m], &y.gamma[m], sizeof(float)) != 0) return false;
        for (uint32_t v = 0; v < d; ++v)
          if (std::memcmp(&x.delta[packed(m, v, hybrid::kGrid)], &y.delta[packed(m, v, hybrid::kGrid)], 4) != 0)
            return false;
      }
    }
    for (uint32_t i = 0; i < lay.k_heads; ++i)
      for (uint32_t m = 0; m < rows; ++m)
        for (uint32_t v = 0; v < d; ++v) {
          const size_t at = packed(v, m, d);
          if (std::memcmp(&hybrid::key_rows(la, lay, i)[at], &hybrid::key_rows(lb, lay, i)[at], 4) != 0) return false;
        }
  }
  return true;
}

// Feeds tokens[from, to) to `slot` (blocks of the slot's own), every row's logits appended to `out`.
void feed(Engine& e, KvPool& kv, StatePool& states, std::span<const int32_t> tokens, uint32_t from, uint32_t to,
          int32_t slot, std::vector<float>* out = nullptr) {
  std::vector<int32_t> blocks(kBlocksPerSeq);
  std::iota(blocks.begin(), blocks.end(), slot * static_cast<int32_t>(kBlocksPerSeq));
  SeqStep s{tokens.subspan(from, to - from), from, blocks, out ? to - from : 1};
  s.state_slot = slot;
  ASSERT_TRUE(e.forward({&s, 1}, kv, &states).is_ok());
  if (out == nullptr) return;
  for (uint32_t r = 0; r < to - from; ++r) out->insert(out->end(), e.logits(r).begin(), e.logits(r).end());
}

// Speculative decoding's rollback (StatePool::roll_back): a round of 1 + k rows, of which the
// first 1 + a are kept, then rolled back to them, leaves bitwise the state (and the logits of
// the rows kept and of 80 tokens after, across a grid point) of a sequence that was only ever
// fed the kept tokens, for every a and rounds at the grid's start, middle and last rows.
TEST(HybridEngine, RollingBackARoundIsBitwiseNeverHavingFedTheRejectedDrafts) {
  constexpr uint32_t kDrafts = 5;
  auto e = Engine::load(hybrid_model(), {2, GemmBackend::kPacked});
  ASSERT_TRUE(e) << e.status().to_string();
  const ModelConfig& c = (*e)->config();
  auto kv = KvPool::create(c, 2 * kBlocksPerSeq);
  auto states = StatePool::create(c, 2, kDrafts);
  ASSERT_TRUE(kv && states);
  const std::vector<int32_t> tokens = test::random_tokens(kTokens, c.vocab_size, 31);
  const std::vector<int32_t> other = test::random_tokens(kTokens, c.vocab_size, 32);
  // 57 + 5: the last row before the fold at 63; at 63 the fed row folds and the drafts open a chunk.
  for (uint32_t at : {0u, 30u, 57u, 63u, 128u}) {
    for (uint32_t a = 0; a <= kDrafts; ++a) {
      const uint32_t kept = at + 1 + a, end = kept + 80;
      std::vector<float> want, got;
      feed(**e, **kv, **states, tokens, 0, kept, 1, &want);  // never sees the rejected drafts
      feed(**e, **kv, **states, tokens, kept, end, 1, &want);
      std::vector<int32_t> round(tokens.begin(), tokens.begin() + at + 1 + kDrafts);
      std::copy(other.begin() + kept, other.begin() + at + 1 + kDrafts, round.begin() + kept);  // rejected
      if (at > 0) feed(**e, **kv, **states, round, 0, at, 0);
      feed(**e, **kv, **states, round, at, at + 1 + kDrafts, 0, &got);
      ASSERT_TRUE((*states)->roll_back(0, kept).is_ok()) << "at " << at << ", " << a << " accepted";
      ASSERT_EQ((*states)->position(0), kept);
      // slot 1 again up to `kept` (the same bits: chunking invariance), to compare states.
      feed(**e, **kv, **states, tokens, 0, kept, 1);
      EXPECT_TRUE(same_state(**states, c, 0, 1, kept)) << "at " << at << ", " << a << " accepted";
      feed(**e, **kv, **states, tokens, kept, end, 0, &got);
      const size_t vocab = c.vocab_size, head = size_t{at} * vocab;  // the round's rows kept, then the 80
      EXPECT_EQ(std::memcmp(want.data() + head, got.data(), (1 + a) * vocab * sizeof(float)), 0)
          << "round rows, at " << at << ", " << a << " accepted";
      EXPECT_EQ(std::memcmp(want.data() + size_t{kept} * vocab, got.data() + (1 + kDrafts) * vocab,
                            size_t{80} * vocab * sizeof(float)),
                0)
          << "after the rollback, at " << at << ", " << a << " accepted";
    }
  }
}

TEST(HybridEngine, RollBackRefusesWhatTheSlotNoLongerHolds) {
  auto e = Engine::load(hybrid_model());
  ASSERT_TRUE(e) << e.status().to_string();
  auto kv = KvPool::create((*e)->config(), kBlocksPerSeq);
  auto states = StatePool::create((*e)->config(), 1, 4);
  ASSERT_TRUE(kv && states);
  EXPECT_FALSE(StatePool::create((*e)->config(), 1, hybrid::kGrid)) << "a rollback past a grid chunk";
  const std::vector<int32_t> tokens = test::random_tokens(100, (*e)->config().vocab_size, 3);
  feed(**e, **kv, **states, tokens, 0, 66, 0);
  EXPECT_EQ((*states)->rollback_floor(0), 64u) << "the open grid chunk starts at 64";
  EXPECT_NE((*states)->roll_back(0, 63).message().find("go back to 64 at most"), std::string::npos);
  EXPECT_NE((*states)->roll_back(0, 67).message().find("not 67"), std::string::npos);
  feed(**e, **kv, **states, tokens, 66, 76, 0);
  EXPECT_EQ((*states)->rollback_floor(0), 72u) << "4 conv inputs kept";
  EXPECT_FALSE((*states)->roll_back(0, 71).is_ok());
  EXPECT_EQ((*states)->position(0), 76u) << "a refused rollback changes nothing";
  ASSERT_TRUE((*states)->roll_back(0, 73).is_ok());
  EXPECT_EQ((*states)->rollback_floor(0), 72u) << "one input kept before 73";
  (*states)->set_position(0, 73);
  EXPECT_EQ((*states)->rollback_floor(0), 73u) << "a state set from elsewhere keeps no older inputs";
}

}  // namespace
}  // namespace tandem::engine
