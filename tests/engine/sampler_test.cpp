// Tests for workers/engine/sampler.{h,cpp}. Every random input comes from fixed seeds,
// so the statistical checks are deterministic: they cannot flake.

#include "workers/engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <new>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "tests/counted_allocations.h"  // sample() allocates nothing after construction

namespace tandem::engine {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> random_logits(uint32_t n, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> l(n);
  for (float& x : l) x = nd(rng);
  return l;
}

// log_softmax in long double.
std::vector<double> log_softmax(const std::vector<float>& l) {
  long double m = -INFINITY;
  for (float x : l) m = std::max<long double>(m, x);
  long double s = 0;
  for (float x : l) s += std::exp(static_cast<long double>(x) - m);
  std::vector<double> out(l.size());
  for (size_t i = 0; i < l.size(); ++i) out[i] = static_cast<double>(l[i] - m - std::log(s));
  return out;
}

std::vector<double> softmax(const std::vector<float>& l, double temperature = 1.0) {
  double m = -INFINITY;
  for (float x : l) m = std::max<double>(m, x);
  std::vector<double> p(l.size());
  double s = 0;
  for (size_t i = 0; i < l.size(); ++i) s += p[i] = std::exp((l[i] - m) / temperature);
  for (double& x : p) x /= s;
  return p;
}

// Ids by (value desc, id asc).
template <class T>
std::vector<int32_t> ranked(const std::vector<T>& v) {
  std::vector<int32_t> ids(v.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return v[a] > v[b]; });
  return ids;
}

SamplingParams temp(float t, uint64_t seed = 1) {
  SamplingParams p;
  p.temperature = t;
  p.seed = seed;
  return p;
}

// ---------------------------------------------------------------------------------------
// validate()

TEST(SamplerValidate, DefaultsAndEdgesAreValid) {
  EXPECT_TRUE(validate(SamplingParams{}).is_ok());
  SamplingParams p;
  p.temperature = 2.0f;
  p.top_k = 1;
  p.top_p = 1e-6f;
  p.min_p = 1.0f;
  p.repetition_penalty = 0.5f;
  p.top_logprobs = kMaxTopLogprobs;
  EXPECT_TRUE(validate(p).is_ok()) << validate(p).to_string();
}

void expect_invalid(const SamplingParams& p, const std::string& needle) {
  const Status st = validate(p);
  ASSERT_FALSE(st.is_ok()) << needle;
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

TEST(SamplerValidate, NamesTheBadFieldAndValue) {
  SamplingParams p;
  p.top_p = 1.5f;
  EXPECT_EQ(validate(p).message(), "top_p 1.5 is outside (0, 1]");
  p.top_p = 0.0f;
  expect_invalid(p, "top_p 0 is outside (0, 1]");
  p.top_p = std::nanf("");
  expect_invalid(p, "top_p nan");

  p = {};
  p.temperature = -0.5f;
  expect_invalid(p, "temperature -0.5");
  p.temperature = kInf;
  expect_invalid(p, "temperature inf");
  p.temperature = std::nanf("");
  expect_invalid(p, "temperature nan");

  p = {};
  p.top_k = -1;
  expect_invalid(p, "top_k -1");

  p = {};
  p.min_p = -0.1f;
  expect_invalid(p, "min_p -0.1 is outside [0, 1]");
  p.min_p = 1.5f;
  expect_invalid(p, "min_p 1.5 is outside [0, 1]");

  p = {};
  p.repetition_penalty = 0.0f;
  expect_invalid(p, "repetition_penalty 0");
  p.repetition_penalty = -1.0f;
  expect_invalid(p, "repetition_penalty -1");
  p.repetition_penalty = kInf;
  expect_invalid(p, "repetition_penalty inf");

  p = {};
  p.top_logprobs = -1;
  expect_invalid(p, "top_logprobs -1 is outside [0, 20]");
  p.top_logprobs = kMaxTopLogprobs + 1;
  expect_invalid(p, "top_logprobs 21 is outside [0, 20]");
}

// ---------------------------------------------------------------------------------------
// uniform_draw()

TEST(SamplerUniformDraw, InUnitIntervalAndSpread) {
  double sum = 0.0;
  int buckets[10] = {};
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const double u = uniform_draw(static_cast<uint64_t>(i % 7), static_cast<uint64_t>(i));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    ++buckets[static_cast<int>(u * 10)];
  }
  EXPECT_NEAR(sum / n, 0.5, 0.01);
  for (int b : buckets) EXPECT_NEAR(b, n / 10, 600);  // ~6.3 sigma
  EXPECT_EQ(uniform_draw(5, 9), uniform_draw(5, 9));
  EXPECT_NE(uniform_draw(5, 9), uniform_draw(5, 10));
  EXPECT_NE(uniform_draw(5, 9), uniform_draw(6, 9));
}

// ---------------------------------------------------------------------------------------
// Greedy

TEST(SamplerGreedy, IsArgmaxWithLowestIdTieBreak) {
  Sampler s(1000);
  for (uint32_t trial = 0; trial < 50; ++trial) {
    const auto l = random_logits(1000, trial);
    const auto best = std::max_element(l.begin(), l.end()) - l.begin();
    SamplingParams p;
    p.seed = trial;
    EXPECT_EQ(s.sample(l, p, trial).token, best);
  }
  std::vector<float> l(1000, -3.0f);
  l[17] = 5.0f;
  l[900] = 5.0f;
  l[512] = 5.0f;
  EXPECT_EQ(s.sample(l, SamplingParams{}, 0).token, 17);
  std::vector<float> flat(1000, 0.0f);
  EXPECT_EQ(s.sample(flat, SamplingParams{}, 3).token, 0);
}

// Without a logprob to report, greedy takes the argmax kernel's shortcut: the same token as the
// full stages, on random rows, ties, NaN, +-inf and rows with nothing possible, and the stages
// still run when a penalty or logit_bias reshapes the row.
TEST(SamplerGreedy, SkippingTheLogprobGivesTheSameToken) {
  const float nan = std::nanf("");
  for (uint32_t n : {8u, 300u, 32000u}) {
    Sampler s(n);
    for (uint32_t trial = 0; trial < 40; ++trial) {
      auto l = random_logits(n, trial);
      if (trial % 5 == 1) l[trial % n] = nan, l[(trial * 7) % n] = kInf;
      if (trial % 5 == 2) std::fill(l.begin(), l.end(), trial % 2 ? nan : -kInf);
      if (trial % 5 == 3) l[n - 1] = l[n / 2] = 1e9f;
      SamplingParams p;
      const std::vector<int32_t> history = {static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin())};
      if (trial % 5 == 4) p.repetition_penalty = 50.0f;  // reshapes: the top token is penalized
      const Sample full = s.sample(l, p, trial, history, history);
      const Sample quick = s.sample(l, p, trial, history, history, Sampler::Logprob::kSkip);
      EXPECT_EQ(quick.token, full.token) << "n " << n << " trial " << trial;
      EXPECT_EQ(quick.logprob, 0.0f);
    }
  }
}

TEST(SamplerGreedy, TopKOneAndTinyTemperatureAreGreedy) {
  Sampler s(500);
  for (uint32_t trial = 0; trial < 30; ++trial) {
    const auto l = random_logits(500, 100 + trial);
    const auto best = std::max_element(l.begin(), l.end()) - l.begin();
    SamplingParams p = temp(1.5f, trial);
    p.top_k = 1;
    EXPECT_EQ(s.sample(l, p, trial).token, best);
    EXPECT_EQ(s.sample(l, temp(1e-4f, trial), trial).token, best);
  }
}

// ---------------------------------------------------------------------------------------
// Determinism

TEST(SamplerDeterminism, SameSeedAndPositionSameTokenAcrossInstances) {
  const auto l = random_logits(4096, 7, 1.5f);
  SamplingParams p = temp(0.9f, 1234);
  p.top_p = 0.9f;
  std::vector<int32_t> first;
  {
    Sampler s(4096);
    for (uint64_t pos = 0; pos < 200; ++pos) first.push_back(s.sample(l, p, pos).token);
  }
  Sampler a(4096), b(4096);
  SamplingParams other = temp(1.3f, 99);
  other.top_k = 3;
  for (uint64_t pos = 0; pos < 200; ++pos) {
    EXPECT_EQ(a.sample(l, p, pos).token, first[pos]);
    // Interleaving other work on the same instance changes nothing.
    (void)b.sample(l, other, pos * 3);
    EXPECT_EQ(b.sample(l, p, pos).token, first[pos]);
  }
  // A different seed gives a different sequence.
  SamplingParams q = p;
  q.seed = 1235;
  int same = 0;
  for (uint64_t pos = 0; pos < 200; ++pos) same += a.sample(l, q, pos).token == first[pos];
  EXPECT_LT(same, 100);
}

TEST(SamplerDeterminism, DifferentPositionsGiveDifferentDraws) {
  // Uniform over 64 tokens: over 6400 positions every token shows up about 100 times.
  const uint32_t v = 64;
  std::vector<float> l(v, 0.0f);
  Sampler s(v);
  std::vector<int> counts(v, 0);
  for (uint64_t pos = 0; pos < 6400; ++pos) ++counts[s.sample(l, temp(1.0f, 42), pos).token];
  double chi2 = 0;
  for (int c : counts) chi2 += (c - 100.0) * (c - 100.0) / 100.0;
  EXPECT_LT(chi2, 120.0);  // 63 degrees of freedom: mean 63, sd ~11
  for (int c : counts) EXPECT_GT(c, 50);
}

// ---------------------------------------------------------------------------------------
// Distribution

// Max |empirical - expected| over tokens for `n` draws at positions 0..n-1.
double max_abs_diff(Sampler& s, const std::vector<float>& l, const SamplingParams& p,
                    const std::vector<double>& expected, int n) {
  std::vector<int> counts(l.size(), 0);
  for (int pos = 0; pos < n; ++pos) ++counts[s.sample(l, p, static_cast<uint64_t>(pos)).token];
  double worst = 0;
  for (size_t i = 0; i < l.size(); ++i) {
    worst = std::max(worst, std::abs(counts[i] / static_cast<double>(n) - expected[i]));
  }
  return worst;
}

TEST(SamplerDistribution, MatchesSoftmaxAtTemperatureOne) {
  const auto l = random_logits(16, 3, 1.0f);
  Sampler s(16);
  // 200k draws: the sd of a frequency is at most 0.0011, so 0.006 is > 5 sigma.
  EXPECT_LT(max_abs_diff(s, l, temp(1.0f, 77), softmax(l), 200000), 0.006);
}

TEST(SamplerDistribution, MatchesSoftmaxOfScaledLogits) {
  const auto l = random_logits(16, 4, 1.0f);
  Sampler s(16);
  EXPECT_LT(max_abs_diff(s, l, temp(0.5f, 5), softmax(l, 0.5), 200000), 0.006);
  EXPECT_LT(max_abs_diff(s, l, temp(2.0f, 6), softmax(l, 2.0), 200000), 0.006);
}

TEST(SamplerDistribution, TopKRenormalizes) {
  const auto l = random_logits(32, 8, 1.0f);
  const auto order = ranked(l);
  std::vector<float> kept(l.size(), -kInf);
  for (int j = 0; j < 5; ++j) kept[order[j]] = l[order[j]];
  SamplingParams p = temp(1.0f, 9);
  p.top_k = 5;
  Sampler s(32);
  EXPECT_LT(max_abs_diff(s, l, p, softmax(kept), 200000), 0.006);
}

// ---------------------------------------------------------------------------------------
// Filters

TEST(SamplerFilters, TopKNeverPicksOutsideTheKLargest) {
  const uint32_t v = 2000;
  Sampler s(v);
  for (uint32_t trial = 0; trial < 10; ++trial) {
    const auto l = random_logits(v, 200 + trial, 0.5f);  // flat-ish: the tail is likely
    const auto order = ranked(l);
    for (int32_t k : {1, 3, 10, 50}) {
      const std::set<int32_t> allowed(order.begin(), order.begin() + k);
      std::set<int32_t> seen;
      SamplingParams p = temp(1.5f, trial);
      p.top_k = k;
      for (uint64_t pos = 0; pos < 300; ++pos) {
        const int32_t t = s.sample(l, p, pos).token;
        ASSERT_TRUE(allowed.count(t)) << "k=" << k << " token " << t;
        seen.insert(t);
      }
      if (k <= 10) {
        EXPECT_EQ(seen.size(), static_cast<size_t>(k));  // and uses all of them
      }
    }
  }
}

TEST(SamplerFilters, TopKTiesAtTheBoundaryGoToLowerIds) {
  std::vector<float> l(100, 0.0f);
  l[50] = 3.0f;
  l[10] = 1.0f;
  l[20] = 1.0f;
  l[30] = 1.0f;
  SamplingParams p = temp(1.0f);
  p.top_k = 3;  // 50, then two of {10, 20, 30}: 10 and 20
  Sampler s(100);
  std::set<int32_t> seen;
  for (uint64_t pos = 0; pos < 2000; ++pos) seen.insert(s.sample(l, p, pos).token);
  EXPECT_EQ(seen, (std::set<int32_t>{10, 20, 50}));
}

TEST(SamplerFilters, TopPConstructed) {
  // probs 0.5, 0.3, 0.15, 0.05: top_p 0.75 keeps {0, 1} (0.5 < 0.75 <= 0.8).
  std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  SamplingParams p = temp(1.0f, 3);
  p.top_p = 0.75f;
  Sampler s(4);
  std::vector<int> counts(4, 0);
  for (uint64_t pos = 0; pos < 20000; ++pos) ++counts[s.sample(l, p, pos).token];
  EXPECT_EQ(counts[2] + counts[3], 0);
  EXPECT_NEAR(counts[0] / 20000.0, 0.625, 0.02);  // renormalized: 0.5 / 0.8
  // A tiny top_p keeps only the best token.
  p.top_p = 0.01f;
  for (uint64_t pos = 0; pos < 100; ++pos) EXPECT_EQ(s.sample(l, p, pos).token, 0);
}

TEST(SamplerFilters, TopPNeverPicksOutsideTheNucleus) {
  const uint32_t v = 3000;
  Sampler s(v);
  for (uint32_t trial = 0; trial < 10; ++trial) {
    const auto l = random_logits(v, 300 + trial, 2.0f);
    for (float top_p : {0.5f, 0.9f, 0.95f}) {
      const float t = 0.8f;
      const auto probs = softmax(l, t);
      const auto order = ranked(probs);
      // The nucleus, plus a 1e-5 slack for rounding at the boundary.
      std::set<int32_t> allowed;
      double cum = 0;
      for (int32_t id : order) {
        allowed.insert(id);
        cum += probs[id];
        if (cum >= top_p + 1e-5) break;
      }
      SamplingParams p = temp(t, trial);
      p.top_p = top_p;
      for (uint64_t pos = 0; pos < 300; ++pos) {
        const int32_t tok = s.sample(l, p, pos).token;
        ASSERT_TRUE(allowed.count(tok)) << "top_p " << top_p << " token " << tok;
      }
    }
  }
}

TEST(SamplerFilters, MinPNeverPicksBelowTheThreshold) {
  // probs 0.5, 0.3, 0.15, 0.05; min_p 0.2 drops prob < 0.1: only token 3.
  std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  SamplingParams p = temp(1.0f, 4);
  p.min_p = 0.2f;
  Sampler s(4);
  std::vector<int> counts(4, 0);
  for (uint64_t pos = 0; pos < 20000; ++pos) ++counts[s.sample(l, p, pos).token];
  EXPECT_EQ(counts[3], 0);
  EXPECT_GT(counts[2], 0);
  EXPECT_NEAR(counts[2] / 20000.0, 0.15 / 0.95, 0.02);

  const uint32_t v = 3000;
  Sampler big(v);
  for (uint32_t trial = 0; trial < 10; ++trial) {
    const auto l2 = random_logits(v, 400 + trial, 2.0f);
    const auto probs = softmax(l2, 1.2);
    const double pmax = *std::max_element(probs.begin(), probs.end());
    SamplingParams q = temp(1.2f, trial);
    q.min_p = 0.05f;
    for (uint64_t pos = 0; pos < 300; ++pos) {
      const int32_t tok = big.sample(l2, q, pos).token;
      ASSERT_GE(probs[tok], 0.05 * pmax * (1 - 1e-4)) << tok;
    }
  }
}

// ---------------------------------------------------------------------------------------
// Repetition penalty

TEST(SamplerPenalty, ChangesGreedyChoice) {
  Sampler s(4);
  SamplingParams p;
  p.repetition_penalty = 1.2f;
  // Positive logit divided: 2.0 / 1.2 = 1.67 < 1.9.
  std::vector<float> l = {2.0f, 1.9f, -1.0f, -2.0f};
  const std::vector<int32_t> h0 = {0};
  EXPECT_EQ(s.sample(l, SamplingParams{}, 0, h0).token, 0);  // penalty 1: off
  EXPECT_EQ(s.sample(l, p, 0, h0).token, 1);
  // Negative logit multiplied: -1.0 * 1.2 = -1.2 < -1.1.
  std::vector<float> neg = {-1.0f, -1.1f, -5.0f, -5.0f};
  EXPECT_EQ(s.sample(neg, p, 0).token, 0);
  EXPECT_EQ(s.sample(neg, p, 0, h0).token, 1);
  // Each token once, however often it repeats: 2.0 / 1.2 = 1.67 > 1.5 (thrice: 1.16).
  std::vector<float> once = {2.0f, 1.5f, 0.0f, 0.0f};
  const std::vector<int32_t> h000 = {0, 0, 0};
  EXPECT_EQ(s.sample(once, p, 0, h000).token, 0);
  // Out-of-range history entries are ignored; a penalty < 1 boosts.
  const std::vector<int32_t> bad = {-1, 4, 1000};
  EXPECT_EQ(s.sample(l, p, 0, bad).token, 0);
  SamplingParams boost;
  boost.repetition_penalty = 0.5f;
  const std::vector<int32_t> h1 = {1};
  EXPECT_EQ(s.sample(l, boost, 0, h1).token, 1);
  // The reported logprob stays the raw one.
  const auto raw = log_softmax(l);
  EXPECT_NEAR(s.sample(l, p, 0, h0).logprob, raw[1], 1e-5);
}

// ---------------------------------------------------------------------------------------
// logit_bias, presence and frequency penalties. Exact amounts are checked with greedy ties
// (equal logits go to the lower id, so a shift by exactly d ties and by d + epsilon wins), and
// "exactly these tokens" by comparing against logits reshaped by hand.

TEST(SamplerValidate, PenaltiesAndLogitBias) {
  SamplingParams p;
  p.presence_penalty = -2.0f;
  p.frequency_penalty = 2.0f;
  p.logit_bias = {{0, -100.0f}, {70000, 100.0f}};  // any id >= 0: the vocabulary is admission's
  EXPECT_TRUE(validate(p).is_ok()) << validate(p).to_string();
  p.presence_penalty = 2.5f;
  EXPECT_EQ(validate(p).message(), "presence_penalty 2.5 is outside [-2, 2]");
  p.presence_penalty = 0.0f;
  p.frequency_penalty = std::nanf("");
  EXPECT_EQ(validate(p).message(), "frequency_penalty nan is outside [-2, 2]");
  p.frequency_penalty = -2.01f;
  expect_invalid(p, "frequency_penalty -2.01 is outside [-2, 2]");
  p.frequency_penalty = 0.0f;
  p.logit_bias = {{5, 100.5f}};
  EXPECT_EQ(validate(p).message(), "logit_bias: bias 100.5 for token 5 is outside [-100, 100]");
  p.logit_bias = {{5, -kInf}};
  expect_invalid(p, "logit_bias: bias -inf for token 5");
  p.logit_bias = {{5, std::nanf("")}};
  expect_invalid(p, "logit_bias: bias nan for token 5");
  p.logit_bias = {{-1, 1.0f}};
  EXPECT_EQ(validate(p).message(), "logit_bias: token id -1 is negative");
  p.logit_bias = {{3, 1.0f}, {4, 2.0f}, {3, -1.0f}};
  EXPECT_EQ(validate(p).message(), "logit_bias: token 3 is given twice");
  p.logit_bias.clear();
  for (int32_t t = 0; t < 301; ++t) p.logit_bias.push_back({t, 1.0f});
  EXPECT_EQ(validate(p).message(), "logit_bias: 301 entries, at most 300 (OpenAI's limit)");
  p.logit_bias.pop_back();
  EXPECT_TRUE(validate(p).is_ok());
  EXPECT_TRUE(model::validate_logit_bias_ids(p, 300).is_ok());
  EXPECT_EQ(model::validate_logit_bias_ids(p, 299).message(),
            "logit_bias: token id 299 is outside the vocabulary of 299");
}

TEST(SamplerLogitBias, ShiftsTheNamedTokenByExactlyItsBias) {
  Sampler s(4);
  const std::vector<float> l = {2.0f, 3.0f, 0.0f, -1.0f};
  SamplingParams p;
  p.logit_bias = {{0, 1.0f}};  // 2 + 1 = 3: a tie with token 1, which the lower id wins
  EXPECT_EQ(s.sample(l, p, 0).token, 0);
  p.logit_bias = {{0, 0.99f}};
  EXPECT_EQ(s.sample(l, p, 0).token, 1);
  p.logit_bias = {{1, -1.0f}};  // 3 - 1 = 2: tie again, token 0
  EXPECT_EQ(s.sample(l, p, 0).token, 0);
  p.logit_bias = {{1, -0.99f}};
  EXPECT_EQ(s.sample(l, p, 0).token, 1);
  p.logit_bias = {{3, 4.0f}, {2, 3.0f}};  // 3 and 3 tie with token 1: token 1 is the lowest id
  EXPECT_EQ(s.sample(l, p, 0).token, 1);
  p.logit_bias = {{3, 4.01f}, {7, 100.0f}, {-2, 100.0f}};  // out-of-range ids are ignored
  EXPECT_EQ(s.sample(l, p, 0).token, 3);
  // The reported logprob stays the raw log-softmax.
  EXPECT_NEAR(s.sample(l, p, 0).logprob, log_softmax(l)[3], 1e-6);
}

// The same draws as the sampler without these parameters on logits reshaped by hand: the
// stages change exactly the named tokens by exactly the stated amounts, in the stated order
// (logit_bias, repetition, presence/frequency), before temperature and the filters.
TEST(SamplerLogitBias, EqualsReshapingTheLogitsByHand) {
  const uint32_t v = 3000;
  const auto l = random_logits(v, 91, 2.0f);
  SamplingParams p = temp(0.7f, 17);
  p.top_k = 200;
  p.top_p = 0.9f;
  p.logit_bias = {{5, 3.5f}, {17, -2.25f}, {2999, 6.0f}, {40, -100.0f}};
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.75f;
  p.frequency_penalty = -0.5f;
  const std::vector<int32_t> history = {17, 5, 900, 900, 12};
  const std::vector<int32_t> generated = {5, 5, 5, 12, 2999, 12, 7};
  std::vector<float> by_hand = l;
  for (const auto& b : p.logit_bias) by_hand[b.token] += b.bias;
  for (int32_t t : std::set<int32_t>(history.begin(), history.end()))
    by_hand[t] = by_hand[t] > 0 ? by_hand[t] / p.repetition_penalty : by_hand[t] * p.repetition_penalty;
  std::map<int32_t, int> count;
  for (int32_t t : generated) ++count[t];
  for (auto [t, c] : count) by_hand[t] = by_hand[t] - p.frequency_penalty * static_cast<float>(c) - p.presence_penalty;
  SamplingParams plain = p;
  plain.logit_bias.clear();
  plain.repetition_penalty = 1.0f;
  plain.presence_penalty = plain.frequency_penalty = 0.0f;
  Sampler a(v), b(v);
  int differs_from_unshaped = 0;
  for (uint64_t pos = 0; pos < 300; ++pos) {
    const int32_t got = a.sample(l, p, pos, history, generated).token;
    EXPECT_EQ(got, b.sample(by_hand, plain, pos).token) << pos;
    differs_from_unshaped += got != b.sample(l, plain, pos).token;
    EXPECT_NE(got, 40);
  }
  EXPECT_GT(differs_from_unshaped, 10);
}

TEST(SamplerLogitBias, MinusOneHundredBansAndPlusOneHundredForces) {
  const uint32_t v = 49152;
  const auto l = random_logits(v, 33, 3.0f);
  const int32_t best = ranked(l)[0];
  const int32_t worst = ranked(l)[v - 1];
  Sampler s(v);
  SamplingParams ban = temp(1.0f, 8);
  ban.logit_bias = {{best, -100.0f}};
  SamplingParams force = temp(1.0f, 9);
  force.logit_bias = {{worst, 100.0f}};
  SamplingParams force_greedy;
  force_greedy.logit_bias = force.logit_bias;
  SamplingParams force_hot = temp(2.0f, 10);  // weights e^(-100/2) of the rest: still forced
  force_hot.logit_bias = force.logit_bias;
  int best_without = 0;
  for (uint64_t pos = 0; pos < 500; ++pos) {
    best_without += s.sample(l, temp(1.0f, 8), pos).token == best;
    EXPECT_NE(s.sample(l, ban, pos).token, best) << pos;
    EXPECT_EQ(s.sample(l, force, pos).token, worst) << pos;
    EXPECT_EQ(s.sample(l, force_hot, pos).token, worst) << pos;
  }
  EXPECT_GT(best_without, 0);  // without the ban it is drawn
  SamplingParams ban_greedy;
  ban_greedy.logit_bias = ban.logit_bias;
  EXPECT_EQ(s.sample(l, SamplingParams{}, 0).token, best);
  EXPECT_EQ(s.sample(l, ban_greedy, 0).token, ranked(l)[1]);
  const Sample forced = s.sample(l, force_greedy, 0);
  EXPECT_EQ(forced.token, worst);
  EXPECT_NEAR(forced.logprob, log_softmax(l)[worst], 1e-4);  // raw, not the biased one
}

TEST(SamplerOccurrencePenalties, SubtractExactlyFrequencyTimesCountPlusPresence) {
  Sampler s(4);
  const std::vector<float> l = {2.0f, 0.5f, -3.0f, -3.0f};
  const std::vector<int32_t> thrice = {0, 2, 0, 0};
  SamplingParams p;
  p.frequency_penalty = 0.5f;  // 2 - 0.5 x 3 = 0.5: a tie with token 1, the lower id wins
  EXPECT_EQ(s.sample(l, p, 4, {}, thrice).token, 0);
  p.frequency_penalty = 0.51f;
  EXPECT_EQ(s.sample(l, p, 4, {}, thrice).token, 1);
  p = {};
  p.presence_penalty = 1.5f;  // once, however often: 2 - 1.5 = 0.5
  EXPECT_EQ(s.sample(l, p, 4, {}, thrice).token, 0);
  p.presence_penalty = 1.51f;
  EXPECT_EQ(s.sample(l, p, 4, {}, thrice).token, 1);
  p.presence_penalty = 0.75f;
  p.frequency_penalty = 0.25f;  // 2 - 0.25 x 3 - 0.75 = 0.5
  EXPECT_EQ(s.sample(l, p, 4, {}, thrice).token, 0);
  p.presence_penalty = 0.76f;
  EXPECT_EQ(s.sample(l, p, 4, {}, thrice).token, 1);
  // Only `generated` counts: the same tokens as history (the prompt's) do nothing here.
  EXPECT_EQ(s.sample(l, p, 4, thrice, {}).token, 0);
  // Out-of-range ids are ignored; a negative penalty boosts (token 2: -3 + 2 x 3 + 0 = 3).
  const std::vector<int32_t> odd = {-1, 4, 1 << 30};
  EXPECT_EQ(s.sample(l, p, 4, {}, odd).token, 0);
  SamplingParams boost;
  boost.frequency_penalty = -2.0f;
  const std::vector<int32_t> twos = {2, 2, 2};
  EXPECT_EQ(s.sample(l, boost, 4, {}, twos).token, 2);
  // The reported logprob stays the raw one.
  EXPECT_NEAR(s.sample(l, boost, 4, {}, twos).logprob, log_softmax(l)[2], 1e-6);
}

// Stage order: logit_bias, then repetition, then presence/frequency. Each case is decided
// one way by that order and the other way by the swapped one.
TEST(SamplerStages, LogitBiasThenRepetitionThenOccurrence) {
  Sampler s(2);
  const std::vector<int32_t> zero = {0};
  // bias then repetition: (3 - 2) / 2 = 0.5 > 0; the other order gives 3 / 2 - 2 = -0.5 < 0.
  SamplingParams p;
  p.logit_bias = {{0, -2.0f}};
  p.repetition_penalty = 2.0f;
  EXPECT_EQ(s.sample(std::vector<float>{3.0f, 0.0f}, p, 1, zero).token, 0);
  // repetition then presence: 3 / 2 - 1 = 0.5 < 0.75; the other order gives (3 - 1) / 2 = 1.
  p = {};
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 1.0f;
  EXPECT_EQ(s.sample(std::vector<float>{3.0f, 0.75f}, p, 1, zero, zero).token, 1);
  // All before temperature: at any temperature, greedy-equivalent forcing by the bias holds.
  p = temp(1e-3f, 3);
  p.logit_bias = {{1, 0.5f}};
  EXPECT_EQ(s.sample(std::vector<float>{1.0f, 0.6f}, p, 1).token, 1);
}

// Pure in its arguments: the counts scratch is clear after every call, so a sampler that has
// seen other sequences gives what a fresh one gives (speculative verification calls it for
// positions p, p+1, ... with the generated tokens before each).
TEST(SamplerOccurrencePenalties, NoStateCarriesBetweenCalls) {
  const uint32_t v = 500;
  const auto l = random_logits(v, 12, 1.0f);
  SamplingParams p = temp(1.0f, 4);
  p.frequency_penalty = 1.0f;
  p.presence_penalty = 0.5f;
  std::vector<int32_t> gen;
  for (int i = 0; i < 64; ++i) gen.push_back((i * 37) % 23);
  Sampler used(v);
  for (size_t k = 0; k <= gen.size(); k += 8) {
    const std::span<const int32_t> before(gen.data(), k);
    (void)used.sample(l, p, 100 + k, {}, std::span<const int32_t>(gen).subspan(k / 2));
    Sampler fresh(v);
    EXPECT_EQ(used.sample(l, p, 100 + k, {}, before).token, fresh.sample(l, p, 100 + k, {}, before).token) << k;
  }
}

// ---------------------------------------------------------------------------------------
// Logprobs

TEST(SamplerLogprobs, ChosenTokenLogprobIsRawLogSoftmax) {
  const uint32_t v = 5000;
  Sampler s(v);
  const auto l = random_logits(v, 11, 4.0f);
  const auto raw = log_softmax(l);
  std::vector<int32_t> hist = {1, 2, 3, 500, 600};
  for (uint64_t pos = 0; pos < 200; ++pos) {
    SamplingParams p = temp(pos % 2 ? 0.7f : 0.0f, pos);
    p.top_k = pos % 3 ? 0 : 40;
    p.top_p = pos % 5 ? 1.0f : 0.9f;
    p.repetition_penalty = 1.3f;
    const Sample out = s.sample(l, p, pos, hist);
    ASSERT_GE(out.token, 0);
    ASSERT_LT(out.token, static_cast<int32_t>(v));
    EXPECT_NEAR(out.logprob, raw[out.token], 1e-5 * std::max(1.0, std::abs(raw[out.token])));
  }
}

TEST(SamplerLogprobs, TopListIsSortedAndCorrect) {
  const uint32_t v = 5000;
  Sampler s(v);
  for (uint32_t trial = 0; trial < 10; ++trial) {
    auto l = random_logits(v, 500 + trial, 3.0f);
    l[42] = l[43] = l[4000] = 20.0f;  // ties (above every random logit): reported by id
    const auto raw = log_softmax(l);
    const auto order = ranked(l);
    for (int32_t k : {0, 1, 5, kMaxTopLogprobs}) {
      SamplingParams p = temp(trial % 2 ? 1.0f : 0.0f, trial);
      p.top_logprobs = k;
      p.repetition_penalty = 1.5f;  // does not affect the reported list
      const std::vector<int32_t> hist = {order[0], order[1]};
      const Sample out = s.sample(l, p, trial, hist);
      ASSERT_EQ(out.top.size(), static_cast<size_t>(k));
      for (int32_t j = 0; j < k; ++j) {
        EXPECT_EQ(out.top[j].token, order[j]) << j;
        EXPECT_NEAR(out.top[j].logprob, raw[order[j]], 1e-5);
        if (j > 0) {
          EXPECT_GE(out.top[j - 1].logprob, out.top[j].logprob);
        }
      }
      if (k >= 3) {
        EXPECT_EQ(out.top[0].token, 42);
        EXPECT_EQ(out.top[1].token, 43);
        EXPECT_EQ(out.top[2].token, 4000);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Special values

TEST(SamplerSpecial, NanAndInfinities) {
  Sampler s(8);
  const float nan = std::nanf("");
  std::vector<float> l = {nan, 1.0f, nan, 2.0f, -kInf, 0.5f, nan, 0.0f};
  EXPECT_EQ(s.sample(l, SamplingParams{}, 0).token, 3);
  for (uint64_t pos = 0; pos < 500; ++pos) {
    const Sample out = s.sample(l, temp(5.0f), pos);
    ASSERT_TRUE(out.token == 1 || out.token == 3 || out.token == 5 || out.token == 7);
    ASSERT_TRUE(std::isfinite(out.logprob));
  }
  SamplingParams p;
  p.top_logprobs = 3;
  const Sample with_top = s.sample(l, p, 0);
  ASSERT_EQ(with_top.top.size(), 3u);
  EXPECT_EQ(with_top.top[0].token, 3);
  EXPECT_EQ(with_top.top[1].token, 1);
  EXPECT_EQ(with_top.top[2].token, 5);

  // Every logit -inf or NaN: token 0 with logprob -inf.
  std::vector<float> none = {nan, -kInf, nan, -kInf, -kInf, nan, -kInf, -kInf};
  for (float t : {0.0f, 1.0f}) {
    const Sample out = s.sample(none, temp(t), 1);
    EXPECT_EQ(out.token, 0);
    EXPECT_EQ(out.logprob, -kInf);
  }

  // +inf wins outright (logprob 0); two +inf split the mass.
  std::vector<float> one_inf = {1.0f, kInf, 3.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  for (float t : {0.0f, 1.0f}) {
    const Sample out = s.sample(one_inf, temp(t), 2);
    EXPECT_EQ(out.token, 1);
    EXPECT_EQ(out.logprob, 0.0f);
  }
  std::vector<float> two_inf = {1.0f, kInf, 3.0f, 0.0f, kInf, 0.0f, 0.0f, 0.0f};
  std::set<int32_t> seen;
  for (uint64_t pos = 0; pos < 200; ++pos) {
    const Sample out = s.sample(two_inf, temp(1.0f), pos);
    seen.insert(out.token);
    EXPECT_NEAR(out.logprob, std::log(0.5f), 1e-6);
  }
  EXPECT_EQ(seen, (std::set<int32_t>{1, 4}));
}

// ---------------------------------------------------------------------------------------
// Against a straightforward reference, in double, with every filter combined. The
// chosen token must be the one whose cumulative interval (in the reference order) holds
// u * total, up to a small slack for float weights. The "flat tail" inputs make the draw
// land beyond the up-front sorted head, so the lazily sorted bands are exercised too.

struct Ref {
  std::vector<int32_t> order;  // kept ids, descending weight
  std::vector<double> w;       // weights, by id
  double total = 0;
};

Ref reference(const std::vector<float>& logits, const SamplingParams& p, const std::vector<int32_t>& history) {
  std::vector<float> l = logits;
  std::set<int32_t> hs(history.begin(), history.end());
  for (int32_t t : hs) {
    if (t >= 0 && t < static_cast<int32_t>(l.size())) {
      l[t] = l[t] > 0 ? l[t] / p.repetition_penalty : l[t] * p.repetition_penalty;
    }
  }
  std::vector<int32_t> cand = ranked(l);
  if (p.top_k > 0 && p.top_k < static_cast<int32_t>(cand.size())) cand.resize(p.top_k);
  const double m = l[cand[0]];
  Ref r;
  r.w.assign(l.size(), 0.0);
  double total = 0;
  for (int32_t id : cand) total += r.w[id] = std::exp((l[id] - m) / p.temperature);
  // cand is already in descending weight order (ties by id).
  size_t len = cand.size();
  if (p.top_p < 1.0f) {
    double cum = 0;
    for (size_t j = 0; j < cand.size(); ++j) {
      cum += r.w[cand[j]];
      if (cum >= p.top_p * total) {
        len = j + 1;
        break;
      }
    }
  }
  cand.resize(len);
  while (cand.size() > 1 && r.w[cand.back()] < p.min_p) cand.pop_back();
  r.order = cand;
  for (int32_t id : cand) r.total += r.w[id];
  return r;
}

// Returns how many draws picked a token below the sampler's up-front head (weight
// <= 5% of the mean weight), i.e. from a lazily sorted band.
int check_against_reference(const std::vector<float>& l, const SamplingParams& p, const std::vector<int32_t>& history,
                            int positions) {
  Sampler s(static_cast<uint32_t>(l.size()));
  const Ref ref = reference(l, p, history);
  std::map<int32_t, size_t> rank;
  for (size_t j = 0; j < ref.order.size(); ++j) rank[ref.order[j]] = j;
  std::vector<double> cum_before(ref.order.size() + 1, 0.0);
  for (size_t j = 0; j < ref.order.size(); ++j) cum_before[j + 1] = cum_before[j] + ref.w[ref.order[j]];
  int deep = 0;
  for (int pos = 0; pos < positions; ++pos) {
    const int32_t tok = s.sample(l, p, static_cast<uint64_t>(pos), history).token;
    auto it = rank.find(tok);
    EXPECT_NE(it, rank.end()) << "token " << tok << " not kept, pos " << pos;
    if (it == rank.end()) return deep;
    const double target = uniform_draw(p.seed, static_cast<uint64_t>(pos)) * ref.total;
    const double slack = 1e-5 * ref.total;
    EXPECT_LE(cum_before[it->second], target + slack) << pos;
    EXPECT_GE(cum_before[it->second + 1], target - slack) << pos;
    deep += ref.w[tok] <= 0.05 * ref.total / static_cast<double>(l.size());
  }
  return deep;
}

TEST(SamplerReference, RandomConfigurations) {
  std::mt19937 rng(2024);
  for (int trial = 0; trial < 24; ++trial) {
    const uint32_t v = trial % 3 == 0 ? 49152 : 3000;
    auto l = random_logits(v, 1000 + trial, trial % 2 ? 1.0f : 3.0f);
    SamplingParams p = temp(std::uniform_real_distribution<float>(0.3f, 1.8f)(rng), trial);
    p.top_k = trial % 4 == 0 ? 0 : std::vector<int32_t>{5, 40, 1000, 2999}[trial % 4];
    p.top_p = trial % 3 == 1 ? 0.9f : 1.0f;
    p.min_p = trial % 5 == 2 ? 0.02f : 0.0f;
    p.repetition_penalty = trial % 2 ? 1.3f : 1.0f;
    std::vector<int32_t> hist;
    for (int i = 0; i < 30; ++i) hist.push_back(static_cast<int32_t>(rng() % v));
    SCOPED_TRACE(trial);
    (void)check_against_reference(l, p, hist, 400);
  }
}

TEST(SamplerReference, FlatTailBeyondTheSortedHead) {
  // One dominant token (weight 1) and ~4% of the mass spread over thousands of tokens
  // with distinct weights in [4.1e-6, 5e-6], all below the head threshold (5% of the
  // mean weight, ~6.5e-6): about one draw in 26 walks into the lazily sorted bands.
  for (int variant = 0; variant < 4; ++variant) {
    const uint32_t v = 8000;
    std::mt19937 rng(77 + variant);
    std::vector<float> l(v);
    for (float& x : l) x = -12.2f - std::uniform_real_distribution<float>(0.0f, 0.2f)(rng);
    l[123] = 0.0f;
    if (variant == 3) {
      for (uint32_t i = 0; i < v; i += 2) l[i] -= 30.0f;  // a second, far deeper band
    }
    SamplingParams p = temp(1.0f, variant);
    if (variant == 1) p.top_k = 6000;
    if (variant == 2) p.min_p = 4.5e-6f;  // cuts the tail about in half
    SCOPED_TRACE(variant);
    EXPECT_GT(check_against_reference(l, p, {}, 2000), variant == 0 ? 40 : 15);
  }
}

// ---------------------------------------------------------------------------------------
// Bitwise unchanged: a fingerprint of (token, logprob bits, top list) over many configurations
// of the parameters that predate the stage split (recorded before it, at commit 26afe3f).

uint64_t fingerprint_existing_params() {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the results
  auto mix = [&h](uint64_t x) {
    for (int b = 0; b < 8; ++b) h = (h ^ ((x >> (8 * b)) & 0xFF)) * 1099511628211ull;
  };
  std::mt19937 rng(4242);
  for (int trial = 0; trial < 48; ++trial) {
    const uint32_t v = trial % 4 == 0 ? 49152 : 1000 + 37 * trial;
    auto l = random_logits(v, 500 + trial, trial % 3 ? 1.5f : 4.0f);
    if (trial % 7 == 3) l[trial] = std::numeric_limits<float>::quiet_NaN();
    if (trial % 11 == 5) l[2 * trial] = kInf;
    SamplingParams p = temp(trial % 5 == 0 ? 0.0f : (trial % 5 == 1 ? 1.0f : 0.25f + 0.05f * trial), trial);
    p.top_k = std::vector<int32_t>{0, 1, 7, 64, 999}[trial % 5];
    p.top_p = trial % 3 == 2 ? 0.8f : 1.0f;
    p.min_p = trial % 4 == 3 ? 0.03f : 0.0f;
    p.repetition_penalty = trial % 2 ? 1.25f : (trial % 6 == 4 ? 0.8f : 1.0f);
    p.top_logprobs = trial % kMaxTopLogprobs;
    std::vector<int32_t> hist;
    for (int i = 0; i < 40; ++i) hist.push_back(static_cast<int32_t>(rng() % v));
    Sampler s(v);
    for (uint64_t pos = 0; pos < 16; ++pos) {
      const Sample out = s.sample(l, p, pos, hist);
      uint32_t bits;
      std::memcpy(&bits, &out.logprob, 4);
      mix(static_cast<uint32_t>(out.token));
      mix(bits);
      for (const TokenLogprob& t : out.top) {
        std::memcpy(&bits, &t.logprob, 4);
        mix(static_cast<uint32_t>(t.token));
        mix(bits);
      }
    }
  }
  return h;
}

TEST(SamplerGolden, ExistingParamsBitwiseUnchanged) { EXPECT_EQ(fingerprint_existing_params(), 0xd128e3811a75c5e0ull); }

// ---------------------------------------------------------------------------------------
// No allocation in sample()

TEST(SamplerAlloc, SampleDoesNotAllocate) {
  const uint32_t v = 49152;
  const auto l = random_logits(v, 5, 2.0f);
  const std::vector<int32_t> hist = {1, 2, 3, 1, 70000, -5};
  Sampler s(v);
  std::vector<SamplingParams> configs;
  configs.push_back(SamplingParams{});
  SamplingParams p = temp(0.8f, 3);
  p.top_p = 0.95f;
  p.top_logprobs = kMaxTopLogprobs;
  p.repetition_penalty = 1.1f;
  configs.push_back(p);
  p.top_k = 50;
  p.min_p = 0.05f;
  configs.push_back(p);
  p = temp(1.0f, 4);
  configs.push_back(p);
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  p.logit_bias = {{7, 5.0f}, {70000, 1.0f}, {3, -100.0f}};
  configs.push_back(p);
  p.temperature = 0.0f;
  configs.push_back(p);
  const std::vector<int32_t> generated = {1, 1, 9, 49151, -3, 1};
  long allocations = 0;
  for (const auto& c : configs) {
    for (uint64_t pos = 0; pos < 20; ++pos) {
      const long before = test::g_allocations.load();
      const Sample out = s.sample(l, c, pos, hist, generated);
      allocations += test::g_allocations.load() - before;
      ASSERT_LT(out.token, static_cast<int32_t>(v));
    }
  }
  EXPECT_EQ(allocations, 0);
}

}  // namespace
}  // namespace tandem::engine
