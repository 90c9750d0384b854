// The greedy screen (greedy_screen.h): its bound holds for every vocabulary row, its pick is the
// full logits' argmax bit for bit (ties and near-ties the 8-bit screen cannot tell apart
// included), and in the engine a screened row's greedy token is what argmax over that row's
// logits gives, for the demo model's rows of real prompts.
#include "workers/engine/greedy_screen.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/engine/kernel_variants.h"
#include "workers/engine/engine.h"

namespace tandem::engine {
namespace {

// An [n][k] head of plain floats; its exact logits are a K-long fma chain (Kernels::gemm's
// definition), its panels those chains for 32 columns.
struct Head {
  uint32_t n, k;
  std::vector<float> w;
  float logit(uint32_t v, const float* x) const {
    float c = 0.0f;
    for (uint32_t i = 0; i < k; ++i) c = std::fma(x[i], w[size_t{v} * k + i], c);
    return c;
  }
  int32_t argmax(const float* x) const {
    int32_t at = 0;
    float best = -std::numeric_limits<float>::infinity();
    for (uint32_t v = 0; v < n; ++v)
      if (const float z = logit(v, x); z > best) best = z, at = static_cast<int32_t>(v);
    return at;
  }
};

Head random_head(uint32_t n, uint32_t k, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 0.1f);
  Head h{n, k, std::vector<float>(size_t{n} * k)};
  for (float& x : h.w) x = nd(rng);
  return h;
}

// The screen's logits of row x (qgemm over the screen, x quantized as the engine does) and its
// bound factors.
struct Screened {
  std::vector<float> s;
  float h = 0, e = 0;
  bool finite = false;
};
Screened screen(const GreedyScreen& g, const std::vector<float>& x) {
  const kernels::Kernels& kern = kernels::best();
  const uint32_t k = g.k();
  std::vector<int8_t> qs(k);
  std::vector<float> d(k / kernels::kAct32);
  std::vector<int16_t> sums(k / 16);
  kern.quantize(x.data(), k, 0, 1, k, kernels::kAct32, qs.data(), d.data(), sums.data());
  Screened out;
  out.s.resize(g.n());
  kern.qgemm({qs.data(), d.data(), sums.data(), k, kernels::kAct32}, 1, g.view(), 0, g.n(), out.s.data(), g.n());
  out.finite = g.norms(x.data(), qs.data(), d.data(), &out.h, &out.e);
  return out;
}

int32_t pick(const GreedyScreen& g, const Head& head, const std::vector<float>& x, uint32_t* panels = nullptr) {
  const Screened sc = screen(g, x);
  if (!sc.finite) return -2;
  std::vector<float> upper(g.n() / kernels::kScreenChunk + 1);
  uint32_t calls = 0;
  const int32_t got = g.pick(kernels::best(), sc.s.data(), sc.h, sc.e, upper.data(), [&](uint32_t p, float* out) {
    ++calls;
    for (uint32_t j = 0; j < kernels::kPanel && p * kernels::kPanel + j < head.n; ++j)
      out[j] = head.logit(p * kernels::kPanel + j, x.data());
  });
  if (panels) *panels = calls;
  return got;
}

std::unique_ptr<GreedyScreen> build(const Head& head) {
  return GreedyScreen::build(head.n, head.k,
                             [&](uint32_t v, float* out) { std::copy_n(&head.w[size_t{v} * head.k], head.k, out); });
}

std::vector<float> random_row(uint32_t k, std::mt19937& rng, float scale) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> x(k);
  for (float& v : x) v = nd(rng);
  return x;
}

TEST(GreedyScreen, TheBoundHoldsForEveryRow) {
  std::mt19937 rng(3);
  for (uint32_t k : {32u, 64u, 256u}) {
    const Head head = random_head(3001, k, rng);
    const auto g = build(head);
    ASSERT_NE(g, nullptr);
    for (int trial = 0; trial < 20; ++trial) {
      const std::vector<float> x = random_row(k, rng, trial % 2 ? 1.0f : 30.0f);
      const Screened sc = screen(*g, x);
      ASSERT_TRUE(sc.finite);
      for (uint32_t v = 0; v < head.n; ++v) {
        const double err = std::abs(static_cast<double>(head.logit(v, x.data())) - sc.s[v]);
        const double b = g->bound(v, sc.h, sc.e);
        ASSERT_LE(err, b) << "k " << k << " row " << v;
      }
    }
  }
}

// The pick is the exact argmax, whatever the screen sees: random heads and rows, then exact ties
// (two equal rows: the lower id) and near-ties 1-2 ulp apart that the 8-bit screen gives the same
// screening logit, in either order of ids.
TEST(GreedyScreen, PicksTheExactArgmaxThroughTiesAndNearTies) {
  std::mt19937 rng(11);
  for (uint32_t k : {32u, 64u, 128u}) {
    Head head = random_head(4099, k, rng);
    const std::vector<float> x0 = random_row(k, rng, 1.0f);
    // The row the head favours most for x0, copied into other rows: exact ties and near-ties.
    const int32_t top = head.argmax(x0.data());
    std::vector<float> best(head.w.begin() + size_t(top) * k, head.w.begin() + size_t(top + 1) * k);
    auto put = [&](uint32_t v, const std::vector<float>& r) {
      std::copy(r.begin(), r.end(), head.w.begin() + size_t{v} * k);
    };
    std::vector<float> nudged = best;
    for (float& w : nudged)
      w = std::nextafter(w, w > 0 ? 1.0f : -1.0f);  // slightly larger |w|: larger logit for most x
    put(10, best), put(4000, best), put(2000, nudged), put(7, nudged);
    const auto g = build(head);
    ASSERT_NE(g, nullptr);
    uint32_t panels_max = 0;
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> x = trial == 0 ? x0 : random_row(k, rng, trial % 3 == 0 ? 8.0f : 1.0f);
      uint32_t panels = 0;
      ASSERT_EQ(pick(*g, head, x, &panels), head.argmax(x.data())) << "k " << k << " trial " << trial;
      panels_max = std::max(panels_max, panels);
    }
    EXPECT_LT(panels_max, 4099u / kernels::kPanel / 4) << "the screen should rule out most of the vocabulary";
  }
}

TEST(GreedyScreen, RefusesWhatItCannotBound) {
  std::mt19937 rng(5);
  Head head = random_head(100, 64, rng);
  EXPECT_EQ(GreedyScreen::build(100, 48, [&](uint32_t, float* out) { std::fill_n(out, 48, 0.5f); }), nullptr);
  head.w[700] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(build(head), nullptr);
  head.w[700] = 0.5f;
  const auto g = build(head);
  ASSERT_NE(g, nullptr);
  std::vector<float> x = random_row(64, rng, 1.0f);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(pick(*g, head, x), -2) << "a row that is not finite has no bound";
  x[3] = 1e30f;  // finite, but past what a Q8_0 block's binary16 scale holds: no bound either
  EXPECT_EQ(pick(*g, head, x), -2);
  x[3] = 1000.0f;  // large and fine
  EXPECT_EQ(pick(*g, head, x), head.argmax(x.data()));
}

TEST(GreedyScreen, ChunkMaximaAgreeInEveryKernelVariant) {
  std::mt19937 rng(9);
  for (uint32_t n : {1u, 63u, 64u, 65u, 1000u, 32000u}) {
    const std::vector<float> x = kernels::test::random_vec(n, rng, 5.0f);
    std::vector<float> want(n / kernels::kScreenChunk + 1, 0.0f), got(want.size());
    for (uint32_t c = 0; c * kernels::kScreenChunk < n; ++c)
      want[c] = *std::max_element(x.begin() + c * kernels::kScreenChunk,
                                  x.begin() + std::min(n, (c + 1) * kernels::kScreenChunk));
    for (const kernels::Kernels* kern : kernels::test::variants()) {
      std::fill(got.begin(), got.end(), 0.0f);
      kern->chunk_max(x.data(), n, got.data());
      EXPECT_EQ(got, want) << kern->name << " n " << n;
    }
  }
}

// The engine: a forward pass computing every logit, then the same step computing none and
// screening every row; each row's greedy token is the argmax of its logits. The demo model's
// rows of real text, at 1 and 2 threads; the byte-level model has no screen (its head is light).
TEST(GreedyScreen, TheEnginesGreedyTokenIsTheArgmaxOfItsLogits) {
  auto light = Engine::load(std::string(TANDEM_SOURCE_DIR) + "/tests/data/tiny-trained.gguf").value();
  EXPECT_FALSE(light->screens_greedy());
  for (uint32_t threads : {1u, 2u}) {
    auto engine = Engine::load(std::string(TANDEM_SOURCE_DIR) + "/tests/data/vocab-trained.gguf", {threads}).value();
    ASSERT_TRUE(engine->screens_greedy());
    EngineOptions off;
    off.greedy_screen = false;
    EXPECT_FALSE(
        Engine::load(std::string(TANDEM_SOURCE_DIR) + "/tests/data/vocab-trained.gguf", off).value()->screens_greedy());
    auto pool = KvPool::create(engine->config(), 64).value();
    std::vector<std::vector<int32_t>> tokens, blocks;
    const char* texts[] = {"The quick brown fox jumps over the lazy dog.", "Vim is a text editor. To quit, type",
                           "In the beginning", ":help ft-c-syntax talks about the C syntax file and"};
    std::vector<SeqStep> steps;
    for (uint32_t i = 0; i < 4; ++i) {
      tokens.push_back(engine->tokenizer().encode(texts[i], true).value());
      blocks.emplace_back();
      for (int32_t b = 0; b < 16; ++b) blocks.back().push_back(static_cast<int32_t>(16 * i) + b);
    }
    uint32_t rows = 0;
    for (uint32_t i = 0; i < 4; ++i) {
      const auto n = static_cast<uint32_t>(tokens[i].size());
      steps.push_back({tokens[i], 0, blocks[i], n});  // every position's logits: many different rows
      rows += n;
    }
    ASSERT_TRUE(engine->forward(steps, *pool).is_ok());
    std::vector<int32_t> want(rows);
    for (uint32_t r = 0; r < rows; ++r) {
      float max = 0;
      want[r] =
          static_cast<int32_t>(kernels::best().argmax(engine->logits(r).data(), engine->config().vocab_size, &max));
    }
    ASSERT_TRUE(engine->forward(steps, *pool, nullptr, LogitRows::kNone).is_ok());
    EXPECT_EQ(engine->logit_rows_computed(), 0u);
    std::vector<uint32_t> odd, even;
    for (uint32_t r = 0; r < rows; ++r) (r % 2 ? odd : even).push_back(r);
    ASSERT_TRUE(engine->screen_rows(odd).is_ok());
    ASSERT_TRUE(engine->screen_rows(even).is_ok());  // in two passes, as waves do
    EXPECT_EQ(engine->logit_rows_screened(), rows);
    for (const std::vector<uint32_t>& bad : {std::vector<uint32_t>{rows}, {0}}) {
      const Status st = engine->screen_rows(bad);
      EXPECT_NE(st.message().find("screen_rows: row"), std::string::npos) << st.message();
    }
    for (uint32_t r = 0; r < rows; ++r) EXPECT_EQ(engine->greedy_token(r, r % threads), want[r]) << "row " << r;
  }
}

}  // namespace
}  // namespace tandem::engine
