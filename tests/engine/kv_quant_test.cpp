// KV cache quantization: the group round trip, the pool's formats and sizes, and the model
// with quantized KV against F32 KV (logit error, greedy agreement, skip_last_layer).
#include "workers/engine/kv_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>

#include "tests/test_util.h"
#include "workers/engine/engine.h"
#include "workers/engine/kernels_scalar.h"
#include "model/make_model.h"

namespace tandem::engine {
namespace {

constexpr uint64_t kRotationSeedForTest = kKvRotationSeed;  // KvFormat's default

// The bound quantize_group promises: half a step, plus the rounding of scale to float
// (at most levels * ulp(scale) / 2 where the top code is clamped).
void expect_round_trip(const std::vector<float>& x, uint32_t bits, const std::string& what) {
  std::vector<uint8_t> codes(x.size(), 0xAA);
  const QuantParams p = quantize_group(x.data(), static_cast<uint32_t>(x.size()), bits, codes.data());
  const uint32_t levels = (1u << bits) - 1;
  const double bound = 0.5 * p.scale + levels * double(p.scale) * std::ldexp(1.0, -24);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_LE(codes[i], levels) << what;
    const double back = double(p.scale) * codes[i] + p.bias;
    ASSERT_LE(std::abs(back - x[i]), bound) << what << " bits=" << bits << " i=" << i << " x=" << x[i];
  }
}

TEST(KvQuant, RoundTripErrorIsAtMostHalfAStepPerGroup) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (uint32_t bits : {8u, 4u}) {
    for (uint32_t n : {16u, 32u, 64u, 128u}) {
      for (int trial = 0; trial < 200; ++trial) {
        std::vector<float> x(n);
        const float scale = std::pow(10.0f, static_cast<float>(trial % 13 - 6));
        for (auto& v : x) v = normal(rng) * scale + (trial % 3) * scale;
        if (trial % 5 == 0) x[trial % n] *= 50.0f;  // an outlier stretches the range
        expect_round_trip(x, bits, "random");
      }
      expect_round_trip(std::vector<float>(n, 0.0f), bits, "zeros");
      expect_round_trip(std::vector<float>(n, -3.25f), bits, "constant");
      std::vector<float> extreme(n, 1.0f);
      extreme[0] = std::numeric_limits<float>::max();
      extreme[1] = -std::numeric_limits<float>::max();
      expect_round_trip(extreme, bits, "float max and -max");
      std::vector<float> tiny(n, 0.0f);
      tiny[2] = std::numeric_limits<float>::denorm_min();
      expect_round_trip(tiny, bits, "denormal");
    }
  }
  // A constant group is exact: scale 0, bias the value, no division.
  std::vector<uint8_t> codes(32);
  const std::vector<float> c(32, 7.5f);
  const QuantParams p = quantize_group(c.data(), 32, 4, codes.data());
  EXPECT_EQ(p.scale, 0.0f);
  EXPECT_EQ(p.bias, 7.5f);
}

TEST(KvQuant, FormatValidationNamesTheBadValue) {
  ModelConfig small = model::preset_config("small").value();  // head_dim 64
  auto msg = [&](KvFormat f) {
    const Status st = f.validate(small);
    return st.is_ok() ? std::string("ok") : st.message();
  };
  EXPECT_EQ(msg({0, 64, false}), "ok");
  EXPECT_EQ(msg({8, 32, false}), "ok");
  EXPECT_EQ(msg({4, 64, true}), "ok");
  EXPECT_NE(msg({6, 64, false}).find("got 6"), std::string::npos) << msg({6, 64, false});
  EXPECT_NE(msg({8, 48, false}).find("got 48"), std::string::npos);
  ModelConfig odd = small;
  odd.dim = 96 * odd.n_heads;  // head_dim 96: group 64 does not divide it
  const KvFormat g64{8, 64, false}, g32{8, 32, false};
  EXPECT_NE(g64.validate(odd).message().find("does not divide the head dimension 96"), std::string::npos);
  EXPECT_TRUE(g32.validate(odd).is_ok());
  EXPECT_FALSE(KvPool::create(small, 4, 16, KvFormat{3, 64, false}));
  EXPECT_EQ(KvFormat{}.to_string(), "f32");
  EXPECT_EQ((KvFormat{8, 64, false}.to_string()), "q8/g64");
  EXPECT_EQ((KvFormat{4, 32, true}.to_string()), "q4/g32+f32-last");
  // The rotated scheme: 4 or 3 bits, a head dimension the transform takes.
  constexpr auto kRot = KvScheme::kRotated;
  EXPECT_EQ(msg({4, 64, false, 2, kRot}), "ok");
  EXPECT_EQ(msg({3, 64, true, 2, kRot}), "ok");
  EXPECT_NE(msg({8, 64, false, 2, kRot}).find("rotated KV scheme needs 4 or 3 bits per element, got 8"),
            std::string::npos);
  EXPECT_NE(msg({0, 64, false, 2, kRot}).find("got 0"), std::string::npos);
  EXPECT_NE(msg({3, 64, false}).find("3 bits only with the rotated scheme"), std::string::npos) << msg({3, 64, false});
  EXPECT_NE(KvFormat({4, 64, false, 2, kRot}).validate(odd).message().find("power of two in [16, 256], got 96"),
            std::string::npos);
  EXPECT_EQ((KvFormat{4, 64, false, 2, kRot}.to_string()), "rot4");
  EXPECT_EQ((KvFormat{3, 64, true, 1, kRot}.to_string()), "rot3+f32-last+w1");
}

// Rotated rows: the head's codes plus one F32 norm per row, in the layout kv_cache.h states;
// what is written reads back as the scalar reference dequantizes and rotates it back.
TEST(KvQuant, RotatedRowsTakeCodesAndANorm) {
  const ModelConfig small = model::preset_config("small").value();  // head_dim 64, 30 layers, 3 KV heads
  constexpr auto kRot = KvScheme::kRotated;
  // Per block: 30 layers x 3 heads x (K, V) x (64 x 16 codes x bits / 8 + 16 F32 norms).
  EXPECT_EQ(KvPool::bytes_per_block(small, 16, {4, 64, false, 2, kRot}), size_t{30} * 3 * 2 * (512 + 64));
  EXPECT_EQ(KvPool::bytes_per_block(small, 16, {3, 64, false, 2, kRot}), size_t{30} * 3 * 2 * (384 + 64));
  const ModelConfig tiny = model::preset_config("tiny").value();
  for (uint32_t bits : {4u, 3u}) {
    auto pool = KvPool::create(tiny, 4, 16, {bits, 64, true, 2, kRot}).value();
    EXPECT_EQ(pool->region_block_bytes(0), size_t{16} * 16 * bits / 8 + 16 * 4);
    EXPECT_EQ(pool->region_block_bytes(1), size_t{16} * 16 * 4);  // the last layer stays F32
    const kv_rotation::Levels& table = *pool->rotation_levels();
    std::mt19937 rng(bits);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (uint32_t slot : {0u, 7u, 15u}) {
      std::vector<float> k(16), v(16), kr(16), vr(16), scratch(16), want(16), y(16);
      for (auto& x : k) x = normal(rng);
      for (auto& x : v) x = 3 * normal(rng);
      pool->write(0, 1, 2, slot, k.data(), v.data());
      pool->read(0, 1, 2, slot, kr.data(), vr.data());
      std::vector<float> signs(16);
      std::vector<uint8_t> codes(16);
      for (uint32_t kv = 0; kv < 2; ++kv) {
        kv_rotation::signs(kRotationSeedForTest, 0, kv, signs);
        const float norm = kv_rotation::quantize(kv ? v : k, signs, table, codes, scratch);
        kv_rotation::dequantize(codes, norm, table, y);
        kv_rotation::unrotate_row(y, signs, want);
        EXPECT_EQ(std::memcmp(want.data(), (kv ? vr : kr).data(), 64), 0) << "bits " << bits << " kv " << kv;
        // The codes and the norm lie where the layout says.
        const uint8_t* b = pool->block_data(0, 1, kv, 2);
        const size_t code_bytes = size_t{16} * 16 * bits / 8;
        EXPECT_EQ(reinterpret_cast<const float*>(b + code_bytes)[slot], norm);
        for (uint32_t d = 0; d < 16; ++d) {
          const uint32_t got = kv ? kernels::rotated_code_at(b + size_t{slot} * 16 * bits / 8, d, 16, bits)
                                  : kernels::rotated_code_at(b + size_t{d} * 16 * bits / 8, slot, 16, bits);
          EXPECT_EQ(got, codes[d]) << "bits " << bits << " kv " << kv << " d " << d;
        }
      }
    }
  }
}

TEST(KvQuant, BlocksPerGigabyteOnTheSmallPreset) {
  const ModelConfig small = model::preset_config("small").value();
  const size_t gib = size_t{1} << 30;
  const uint32_t f32 = KvPool::blocks_for_bytes(small, gib, 16, {0, 64, false});
  const uint32_t q8 = KvPool::blocks_for_bytes(small, gib, 16, {8, 64, false});
  const uint32_t q4 = KvPool::blocks_for_bytes(small, gib, 16, {4, 64, false});
  const uint32_t q8_skip = KvPool::blocks_for_bytes(small, gib, 16, {8, 64, true});
  std::printf("blocks of 16 tokens in 1 GiB: f32 %u, q8 %u (%.2fx), q4 %u (%.2fx), q8+f32-last %u (%.2fx)\n", f32, q8,
              double(q8) / f32, q4, double(q4) / f32, q8_skip, double(q8_skip) / f32);
  EXPECT_GE(double(q8) / f32, 3.5);
  EXPECT_GE(double(q4) / f32, 6.0);
  EXPECT_LT(q8_skip, q8);
  EXPECT_GT(q8_skip, f32);
  // Per block: 30 layers x 3 heads x (K, V) x (64 x 16 codes + 2 x 16 F32 parameters).
  EXPECT_EQ(KvPool::bytes_per_block(small, 16, {8, 64, false}), size_t{30} * 3 * 2 * (1024 + 128));
  EXPECT_EQ(KvPool::bytes_per_block(small, 16, {4, 64, false}), size_t{30} * 3 * 2 * (512 + 128));
  EXPECT_EQ(KvPool::bytes_per_block(small, 16, {0, 64, false}), size_t{30} * 3 * 2 * 4096);
}

TEST(KvQuant, PoolRegionsMatchTheFormat) {
  const ModelConfig tiny = model::preset_config("tiny").value();  // 2 layers, 2 KV heads, head_dim 16
  auto pool = KvPool::create(tiny, 4, 16, {8, 64, true}).value();
  EXPECT_EQ(pool->group_size(), 16u);  // a group never spans heads
  EXPECT_EQ(pool->layer_bits(0), 8u);
  EXPECT_EQ(pool->layer_bits(1), 0u);
  EXPECT_EQ(pool->region_block_bytes(0), size_t{16} * 16 + 2 * 16 * 4);
  EXPECT_EQ(pool->region_block_bytes(1), size_t{16} * 16 * 4);
  EXPECT_EQ(pool->block_bytes(), KvPool::bytes_per_block(tiny, 16, {8, 64, true}));
  // The last layer stays F32: what is written is read back exactly.
  std::vector<float> k(16), v(16);
  std::iota(k.begin(), k.end(), 0.5f);
  std::iota(v.begin(), v.end(), -3.0f);
  pool->write(1, 1, 2, 5, k.data(), v.data());
  const float* kb = reinterpret_cast<const float*>(pool->block_data(1, 1, 0, 2));
  const float* vb = reinterpret_cast<const float*>(pool->block_data(1, 1, 1, 2));
  for (uint32_t d = 0; d < 16; ++d) {
    EXPECT_EQ(kb[d * 16 + 5], k[d]);
    EXPECT_EQ(vb[5 * 16 + d], v[d]);
  }
  // Regions do not overlap: every (layer, head, kv, block) starts past the previous one.
  const uint8_t* last = nullptr;
  for (uint32_t l = 0; l < 2; ++l)
    for (uint32_t h = 0; h < 2; ++h)
      for (uint32_t kv = 0; kv < 2; ++kv)
        for (uint32_t b = 0; b < 4; ++b) {
          const uint8_t* p = pool->block_data(l, h, kv, b);
          if (last) {
            EXPECT_GE(p, last);
          }
          last = p + pool->region_block_bytes(l);
        }
}

// --- The tiny model with quantized KV --------------------------------------------------

std::unique_ptr<Engine> load_tiny(uint32_t threads = 2) {
  return std::move(Engine::load(test::model_file("tiny", 1), {threads, GemmBackend::kPacked}).value());
}

using test::random_tokens;

// Logits of every position of one 120-token prompt.
std::vector<std::vector<float>> prompt_logits(Engine& e, const KvFormat& format, const std::vector<int32_t>& tokens) {
  auto pool = KvPool::create(e.config(), 8, 16, format).value();
  std::vector<int32_t> blocks(8);
  std::iota(blocks.begin(), blocks.end(), 0);
  const uint32_t n = static_cast<uint32_t>(tokens.size());
  SeqStep s{tokens, 0, blocks, n};
  EXPECT_TRUE(e.forward({&s, 1}, *pool).is_ok());
  std::vector<std::vector<float>> out;
  for (uint32_t r = 0; r < n; ++r) out.emplace_back(e.logits(r).begin(), e.logits(r).end());
  return out;
}

// Max over positions of max |logit - F32 KV logit| / max |F32 KV logit|.
double relative_logit_error(Engine& e, const KvFormat& format) {
  const auto tokens = random_tokens(120, e.config().vocab_size, 7);
  const auto want = prompt_logits(e, {}, tokens), got = prompt_logits(e, format, tokens);
  double worst = 0;
  for (size_t t = 0; t < want.size(); ++t) {
    double scale = 0, diff = 0;
    for (size_t i = 0; i < want[t].size(); ++i) {
      scale = std::max(scale, double(std::abs(want[t][i])));
      diff = std::max(diff, double(std::abs(got[t][i] - want[t][i])));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

TEST(KvQuantModel, LogitsStayCloseToF32Kv) {
  auto e = load_tiny();
  const double q8 = relative_logit_error(*e, {8, 64, false});
  const double q4 = relative_logit_error(*e, {4, 64, false});
  const double q8_skip = relative_logit_error(*e, {8, 64, true});
  const double q4_skip = relative_logit_error(*e, {4, 64, true});
  std::printf(
      "max relative logit error vs F32 KV (tiny, 120 positions): q8 %.3g, q4 %.3g, q8+f32-last %.3g, "
      "q4+f32-last %.3g\n",
      q8, q4, q8_skip, q4_skip);
  RecordProperty("q8_relative_error", std::to_string(q8));
  RecordProperty("q4_relative_error", std::to_string(q4));
  EXPECT_LE(q8, 1e-2);
  EXPECT_LE(q4, 1e-1);
  EXPECT_LE(q8_skip, 1e-2);
  EXPECT_LE(q4_skip, 1e-1);
  EXPECT_GT(q8, 0.0);  // quantization happened
}

using Prompts = std::vector<std::vector<int32_t>>;

// 32 prompts of 12 random tokens (prompt s from seed + s).
Prompts random_prompts(const Engine& e, uint32_t seed = 1000) {
  Prompts p;
  for (uint32_t s = 0; s < 32; ++s) p.push_back(random_tokens(12, e.config().vocab_size, seed + s));
  return p;
}

// Greedy continuations of the prompts x 64 steps, all sequences in every step. With
// `forced`, each step is fed forced[s][i] instead of its own pick (teacher forcing: the
// argmax of every position under the same history).
std::vector<std::vector<int32_t>> greedy(Engine& e, const KvFormat& format, const Prompts& prompts,
                                         const std::vector<std::vector<int32_t>>* forced = nullptr) {
  constexpr uint32_t kSteps = 64;
  const auto n = static_cast<uint32_t>(prompts.size());
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  const auto blocks = static_cast<uint32_t>((longest + kSteps + 15) / 16);
  const uint32_t tail = KvPool::tail_blocks_for(e.config(), 16, format);  // F32 open block: its own blocks
  auto pool = KvPool::create(e.config(), n * (blocks + tail), 16, format).value();
  std::vector<std::vector<int32_t>> tables, tails, out(n);
  std::vector<SeqStep> step;
  for (uint32_t s = 0; s < n; ++s) {
    tables.emplace_back(blocks);
    std::iota(tables.back().begin(), tables.back().end(), static_cast<int32_t>(s * blocks));
    tails.emplace_back(tail);
    std::iota(tails.back().begin(), tails.back().end(), static_cast<int32_t>(n * blocks + s * tail));
    step.push_back({prompts[s], 0, tables[s], 1, tails[s]});
  }
  std::vector<int32_t> last(n);
  for (uint32_t i = 0; i < kSteps; ++i) {
    EXPECT_TRUE(e.forward(step, *pool).is_ok());
    for (uint32_t s = 0; s < n; ++s) {
      const auto l = e.logits(s);
      last[s] = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
      out[s].push_back(last[s]);
      if (forced) last[s] = (*forced)[s][i];
      const uint32_t pos = static_cast<uint32_t>(prompts[s].size()) + i;
      step[s] = {std::span<const int32_t>(&last[s], 1), pos, tables[s], 1, tails[s], pos};
    }
  }
  return out;
}

double agreement(const std::vector<std::vector<int32_t>>& a, const std::vector<std::vector<int32_t>>& b) {
  size_t same = 0, total = 0;
  for (size_t s = 0; s < a.size(); ++s)
    for (size_t i = 0; i < a[s].size(); ++i) same += a[s][i] == b[s][i], ++total;
  return double(same) / total;
}

struct Agreement {
  double free_run, forced;
};

// Both measures of `format` against F32 KV's greedy tokens `f32` for the same prompts.
Agreement measure(Engine& e, const KvFormat& format, const Prompts& prompts,
                  const std::vector<std::vector<int32_t>>& f32) {
  return {agreement(f32, greedy(e, format, prompts)), agreement(f32, greedy(e, format, prompts, &f32))};
}

// Two measures: free-running (each run feeds its own picks, so one early difference changes
// every later position of that sequence) and teacher-forced (both fed F32 KV's tokens: the
// fraction of positions whose next-token pick is the same).
TEST(KvQuantModel, GreedyTokensAgreeWithF32Kv) {
  auto e = load_tiny();
  const Prompts prompts = random_prompts(*e);
  const auto f32 = greedy(*e, {}, prompts);
  double free_run[3], forced[3];
  const KvFormat formats[3] = {{8, 64, false}, {4, 64, false}, {4, 64, true}};
  for (int i = 0; i < 3; ++i) {
    const Agreement a = measure(*e, formats[i], prompts, f32);
    free_run[i] = a.free_run, forced[i] = a.forced;
    std::printf(
        "%-14s greedy tokens equal to F32 KV's (32 prompts x 64 steps): free-running %.1f%%, "
        "teacher-forced %.1f%%\n",
        formats[i].to_string().c_str(), 100 * free_run[i], 100 * forced[i]);
  }
  RecordProperty("q8_free_running", std::to_string(free_run[0]));
  RecordProperty("q8_teacher_forced", std::to_string(forced[0]));
  RecordProperty("q4_free_running", std::to_string(free_run[1]));
  RecordProperty("q4_teacher_forced", std::to_string(forced[1]));
  EXPECT_GE(forced[0], 0.95);
  // Measured 98.0% on the tiny preset (head_dim 16: one group per head; F32 window of 2
  // blocks); GreedyAgreementOverEightPromptSets: mean 97.2%, worst set 92.6% (a random
  // model's nearly flat logits flip on small perturbations). Without the window: 94.6% here,
  // mean 88.9%.
  EXPECT_GE(free_run[0], 0.95);
}

// How much the free-running figure above owes to which 32 prompts were drawn: the same
// measurement over 8 disjoint sets of 32 prompts (set 0 is the one above). Each set's
// teacher-forced agreement must reach 95%, and the free-running mean too; the sets are
// printed (their spread is the point) and bench/RESULTS.md reports them.
TEST(KvQuantModel, GreedyAgreementOverEightPromptSets) {
  auto e = load_tiny();
  const KvFormat q8{8, 64, false};
  double sum = 0, lo = 1, hi = 0;
  for (uint32_t set = 0; set < 8; ++set) {
    const uint32_t seed = 1000 + 32 * set;
    const Prompts prompts = random_prompts(*e, seed);
    const auto f32 = greedy(*e, {}, prompts);
    const auto [free_run, forced] = measure(*e, q8, prompts, f32);
    std::printf("q8/g64 prompt set %u: free-running %.1f%%, teacher-forced %.1f%%\n", set, 100 * free_run,
                100 * forced);
    EXPECT_GE(forced, 0.95) << "set " << set;
    sum += free_run, lo = std::min(lo, free_run), hi = std::max(hi, free_run);
  }
  std::printf("q8/g64 free-running over 8 x 32 prompts x 64 steps: mean %.1f%%, min %.1f%%, max %.1f%%\n",
              100 * sum / 8, 100 * lo, 100 * hi);
  RecordProperty("q8_free_running_mean", std::to_string(sum / 8));
  EXPECT_GE(sum / 8, 0.95);
}

// The tiny architecture trained on English text (scripts/train-tiny.py: Vim's help files,
// held-out loss 1.26 nats per byte): its logits are peaked like a real model's, where the
// random presets' are nearly flat and one near-tie flips a whole free-running sequence.
std::unique_ptr<Engine> load_trained(GemmBackend gemm = GemmBackend::kPacked) {
  return std::move(Engine::load(std::string(TANDEM_SOURCE_DIR) + "/tests/data/tiny-trained.gguf", {2, gemm}).value());
}

// Set `set` of 8 disjoint sets of 32 prompts: BOS, then 48 bytes (token = byte + 3) of text
// the model was not trained on (tests/data/heldout.txt, the held-out tails of the corpus).
Prompts text_prompts(uint32_t set) {
  std::ifstream in(std::string(TANDEM_SOURCE_DIR) + "/tests/data/heldout.txt", std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  constexpr size_t kLen = 48;
  EXPECT_GT(text.size(), 256 * kLen);
  const size_t stride = (text.size() - kLen) / 256;
  Prompts p;
  for (uint32_t s = 0; s < 32; ++s) {
    std::vector<int32_t> prompt = {1};
    for (size_t i = 0; i < kLen; ++i) prompt.push_back(static_cast<uint8_t>(text[(set * 32 + s) * stride + i]) + 3);
    p.push_back(std::move(prompt));
  }
  return p;
}

// The measure on a model with real (peaked) logits: 32 text prompts x 64 greedy
// steps, 8-bit KV against F32 KV, on each of the 8 sets of 32 (256 prompts). With the F32
// window of 2 blocks (the default), 8-bit keeps 97.3% of positions on set 0 and 98.4% on
// average (worst set 94.7%); with the last layer in F32 as well, 98.0%. With a window of 1
// block: 95.3%; without one: 86.4% (75.5% on set 0). This byte-level model has many
// near-ties between its top two logits (2.9% of held-out positions within 0.05), 8-bit codes
// move logits by a median 0.05 (scripts/kv-quant-sim.py), and most of that comes from the
// keys nearest the query, which the window keeps exact. One flip sends a free-running
// sequence elsewhere for good; teacher-forced (per step) agreement is >= 99.9% in every set.
TEST(KvQuantModel, TrainedModelGreedyTokensAgreeWithF32Kv) {
  auto e = load_trained();
  const KvFormat formats[3] = {{8, 64}, {8, 64, true}, {4, 64}};
  double sum[3] = {}, forced_lo[3] = {1, 1, 1};
  for (uint32_t set = 0; set < 8; ++set) {
    const Prompts prompts = text_prompts(set);
    const auto f32 = greedy(*e, {}, prompts);
    for (int i = 0; i < 3; ++i) {
      const Agreement a = measure(*e, formats[i], prompts, f32);
      sum[i] += a.free_run, forced_lo[i] = std::min(forced_lo[i], a.forced);
      if (set == 0) {
        std::printf(
            "trained tiny, %-15s set 0 (32 text prompts x 64 steps): free-running %.1f%%, teacher-forced %.1f%%\n",
            formats[i].to_string().c_str(), 100 * a.free_run, 100 * a.forced);
      }
    }
  }
  for (int i = 0; i < 3; ++i)
    std::printf("trained tiny, %-15s 8 sets: free-running mean %.1f%%, teacher-forced worst set %.1f%%\n",
                formats[i].to_string().c_str(), 100 * sum[i] / 8, 100 * forced_lo[i]);
  RecordProperty("trained_q8_free_running_mean", std::to_string(sum[0] / 8));
  EXPECT_GE(sum[0] / 8, 0.95);
  EXPECT_GE(sum[1] / 8, 0.95);
  EXPECT_GE(forced_lo[0], 0.99);
  EXPECT_GE(forced_lo[2], 0.95);
  EXPECT_GE(sum[2] / 8, 0.70);  // 4-bit: 77.6% (32.1% without the window)
}

// The rotated scheme (docs/KV_ROTATED.md) on the same measure as the test above: 8 sets of 32
// text prompts x 64 greedy steps against F32 KV, free-running and teacher-forced. The
// simulation (scripts/kv-quant-sim.py) predicted free-running 68.7% (4 bits) and 55.1% (3
// bits), teacher-forced 98.6% and 97.2%; the floors are set below the engine's measured
// figures (bench/RESULTS.md), which the printed lines give.
TEST(KvQuantModel, TrainedModelRotatedGreedyTokensAgreeWithF32Kv) {
  auto e = load_trained();
  constexpr auto kRot = KvScheme::kRotated;
  constexpr int kFormats = 3;
  const KvFormat formats[kFormats] = {{4, 64, false, 2, kRot}, {3, 64, false, 2, kRot}, {4, 64, true, 2, kRot}};
  double sum[kFormats] = {}, lo[kFormats], forced_sum[kFormats] = {}, forced_lo[kFormats];
  std::fill_n(lo, kFormats, 1.0), std::fill_n(forced_lo, kFormats, 1.0);
  for (uint32_t set = 0; set < 8; ++set) {
    const Prompts prompts = text_prompts(set);
    const auto f32 = greedy(*e, {}, prompts);
    for (int i = 0; i < kFormats; ++i) {
      const Agreement a = measure(*e, formats[i], prompts, f32);
      std::printf("set %u, %-15s free-running %.1f%%, teacher-forced %.1f%%\n", set, formats[i].to_string().c_str(),
                  100 * a.free_run, 100 * a.forced);
      sum[i] += a.free_run, lo[i] = std::min(lo[i], a.free_run);
      forced_sum[i] += a.forced, forced_lo[i] = std::min(forced_lo[i], a.forced);
    }
  }
  for (int i = 0; i < kFormats; ++i)
    std::printf(
        "trained tiny, %-15s 8 sets x 32 text prompts x 64 steps: free-running mean %.1f%% (worst set %.1f%%), "
        "teacher-forced mean %.2f%% (worst set %.2f%%)\n",
        formats[i].to_string().c_str(), 100 * sum[i] / 8, 100 * lo[i], 100 * forced_sum[i] / 8, 100 * forced_lo[i]);
  RecordProperty("trained_rot4_free_running_mean", std::to_string(sum[0] / 8));
  RecordProperty("trained_rot3_free_running_mean", std::to_string(sum[1] / 8));
  // Measured (bitwise the same on every kernel variant): rot4 75.1% free-running (worst set
  // 68.9%), teacher-forced worst set 98.54%; rot3 58.9% (54.7%), 97.02%; rot4+f32-last 78.5%.
  EXPECT_GE(sum[0] / 8, 0.72);
  EXPECT_GE(sum[1] / 8, 0.56);
  EXPECT_GE(forced_lo[0], 0.98);
  EXPECT_GE(forced_lo[1], 0.965);
  EXPECT_GT(sum[0], sum[1]);  // 4 bits keep more than 3
}

// The same over 8 disjoint sets of 32 text prompts, with the floor of the free-running
// measure: the same F32 model through OpenBLAS's GEMM, whose logits differ from the packed
// kernels' only by summation order (~1e-6), and both formats without the open block. A
// measurement (a few seconds), not a CI test:
//   build/release/tests/kv_quant_test --gtest_also_run_disabled_tests --gtest_filter='*EightTextPromptSets*'
TEST(KvQuantModel, DISABLED_TrainedModelOverEightTextPromptSets) {
  auto e = load_trained();
  auto blas = load_trained(GemmBackend::kOpenBlas);
  constexpr int kFormats = 7;
  const KvFormat formats[kFormats] = {{8, 64}, {8, 64, false, 1}, {8, 64, false, 0}, {8, 64, true},
                                      {4, 64}, {4, 64, false, 0}, {4, 64, true}};
  double sum[kFormats] = {}, lo[kFormats], forced_lo[kFormats], blas_sum = 0, blas_lo = 1;
  std::fill_n(lo, kFormats, 1.0), std::fill_n(forced_lo, kFormats, 1.0);
  for (uint32_t set = 0; set < 8; ++set) {
    const Prompts prompts = text_prompts(set);
    const auto f32 = greedy(*e, {}, prompts);
    const double floor = agreement(f32, greedy(*blas, {}, prompts));
    blas_sum += floor, blas_lo = std::min(blas_lo, floor);
    for (int i = 0; i < kFormats; ++i) {
      const auto [free_run, forced] = measure(*e, formats[i], prompts, f32);
      std::printf("set %u, %-14s free-running %.1f%%, teacher-forced %.1f%%\n", set, formats[i].to_string().c_str(),
                  100 * free_run, 100 * forced);
      sum[i] += free_run, lo[i] = std::min(lo[i], free_run), forced_lo[i] = std::min(forced_lo[i], forced);
    }
  }
  for (int i = 0; i < kFormats; ++i)
    std::printf(
        "trained tiny, %-14s over 8 x 32 text prompts x 64 steps: free-running mean %.1f%% (worst set %.1f%%), "
        "teacher-forced worst set %.1f%%\n",
        formats[i].to_string().c_str(), 100 * sum[i] / 8, 100 * lo[i], 100 * forced_lo[i]);
  std::printf(
      "trained tiny, F32 KV through OpenBLAS's GEMM instead of the packed kernels: free-running mean %.1f%% "
      "(worst set %.1f%%)\n",
      100 * blas_sum / 8, 100 * blas_lo);
  EXPECT_GE(forced_lo[0], 0.99);
}

// The same measurement on the small preset (head_dim 64: groups of 64 as configured, 30
// layers). A measurement, not a CI test (about a minute on 2 cores): run it with
//   build/release/tests/kv_quant_test --gtest_also_run_disabled_tests --gtest_filter='*SmallPreset*'
TEST(KvQuantModel, DISABLED_GreedyTokensAgreeWithF32KvOnTheSmallPreset) {
  auto e = std::move(Engine::load(test::model_file("small", 1), {2, GemmBackend::kPacked}).value());
  const Prompts prompts = random_prompts(*e);
  const auto f32 = greedy(*e, {}, prompts);
  for (const KvFormat& f : {KvFormat{8, 64, false}, KvFormat{8, 64, true}, KvFormat{4, 64, false}}) {
    const auto [free_run, forced] = measure(*e, f, prompts, f32);
    std::printf(
        "small, %-14s greedy tokens equal to F32 KV's (32 prompts x 64 steps): free-running %.1f%%, "
        "teacher-forced %.1f%%\n",
        f.to_string().c_str(), 100 * free_run, 100 * forced);
    // Measured: q8 free-running 94.3%, teacher-forced 99.6% (F32 window of 2 blocks; without
    // it 57.8% / 98.0%). This model's weights are random: its logits over 49,152 tokens are
    // nearly flat, so one flipped argmax sends a free-running sequence elsewhere;
    // teacher-forced agreement is the per-step measure.
    if (f.bits == 8) {
      EXPECT_GE(forced, 0.95);
    }
  }
}

// The handoff contract: copying every region's block_data bytes of a sequence's blocks into
// another pool of the same format (here under other block ids) moves its KV exactly — the
// next decode step's logits are bitwise those of the pool it was prefilled in.
TEST(KvQuantModel, CopiedBlockBytesContinueExactly) {
  auto e = load_tiny();
  const auto prompt = random_tokens(40, e->config().vocab_size, 31);
  const int32_t next = 77;
  for (const KvFormat& format :
       {KvFormat{}, KvFormat{8, 64, false}, KvFormat{4, 32, true}, KvFormat{3, 64, true, 2, KvScheme::kRotated}}) {
    auto src = KvPool::create(e->config(), 6, 16, format).value();
    auto dst = KvPool::create(e->config(), 6, 16, format).value();
    const std::vector<int32_t> src_blocks = {3, 1, 4}, dst_blocks = {0, 5, 2};
    SeqStep p{prompt, 0, src_blocks, 1};
    ASSERT_TRUE(e->forward({&p, 1}, *src).is_ok());
    for (size_t i = 0; i < src_blocks.size(); ++i)
      for (uint32_t l = 0; l < src->n_layers(); ++l)
        for (uint32_t h = 0; h < src->n_kv_heads(); ++h)
          for (uint32_t kv = 0; kv < 2; ++kv)
            std::memcpy(dst->block_data(l, h, kv, static_cast<uint32_t>(dst_blocks[i])),
                        src->block_data(l, h, kv, static_cast<uint32_t>(src_blocks[i])), src->region_block_bytes(l));
    SeqStep d1{std::span(&next, 1), 40, src_blocks, 1}, d2{std::span(&next, 1), 40, dst_blocks, 1};
    ASSERT_TRUE(e->forward({&d1, 1}, *src).is_ok());
    const std::vector<float> want(e->logits(0).begin(), e->logits(0).end());
    ASSERT_TRUE(e->forward({&d2, 1}, *dst).is_ok());
    EXPECT_EQ(std::memcmp(want.data(), e->logits(0).data(), want.size() * sizeof(float)), 0) << format.to_string();
  }
}

// Prefix reuse: a sequence whose first full blocks are another's (written once, quantized
// once) gives bitwise the logits of computing its whole prompt itself.
TEST(KvQuantModel, SharedPrefixBlocksGiveTheSameLogits) {
  auto e = load_tiny();
  const auto prefix = random_tokens(32, e->config().vocab_size, 41);  // two full blocks
  auto a = prefix, b = prefix;
  const auto ta = random_tokens(9, e->config().vocab_size, 42), tb = random_tokens(13, e->config().vocab_size, 43);
  a.insert(a.end(), ta.begin(), ta.end());
  b.insert(b.end(), tb.begin(), tb.end());
  for (const KvFormat& format :
       {KvFormat{8, 64, false}, KvFormat{4, 64, false}, KvFormat{4, 64, false, 2, KvScheme::kRotated}}) {
    auto pool = KvPool::create(e->config(), 8, 16, format).value();
    const std::vector<int32_t> blocks_a = {0, 1, 2}, blocks_b = {0, 1, 3}, alone = {4, 5, 6};
    SeqStep sa{a, 0, blocks_a, 1};
    ASSERT_TRUE(e->forward({&sa, 1}, *pool).is_ok());
    SeqStep sb{std::span(b).subspan(32), 32, blocks_b, 1};  // b's prefix is a's blocks 0 and 1
    ASSERT_TRUE(e->forward({&sb, 1}, *pool).is_ok());
    const std::vector<float> shared(e->logits(0).begin(), e->logits(0).end());
    SeqStep whole{b, 0, alone, 1};
    ASSERT_TRUE(e->forward({&whole, 1}, *pool).is_ok());
    EXPECT_EQ(std::memcmp(shared.data(), e->logits(0).data(), shared.size() * sizeof(float)), 0) << format.to_string();
  }
}

}  // namespace
}  // namespace tandem::engine
