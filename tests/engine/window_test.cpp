// Sliding-window layers (Gemma 2/3, docs/WINDOWS.md): the convention at the window's edge, and
// a windowed model's logits bitwise the same however its prompt is cut and whatever shares its
// steps, in every KV format.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "tests/test_util.h"
#include "tests/engine/step_runs.h"
#include "workers/engine/engine.h"
#include "workers/engine/generate.h"

namespace tandem::engine {
namespace {

constexpr uint32_t kWindow = 32;  // the tiny presets'

// `tandem make-model --preset tiny FLAGS --seed 7` in the test's temp dir, made once per name.
std::string made_model(const std::string& name, const std::string& flags) {
  const std::string p = test::temp_dir() + "/" + name + ".gguf";
  if (std::ifstream(p)) return p;
  const std::string cmd =
      std::string(TANDEM_TANDEM_BIN) + " make-model --preset tiny " + flags + " --seed 7 --out " + p + " 2>/dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return p;
}

using test_runs::cuts_every;
using test_runs::Seq;

// Every position's logits of `tokens` as one prompt, F32 KV.
std::vector<float> prompt_logits(Engine& e, const std::vector<int32_t>& tokens) {
  auto kv = KvPool::create(e.config(), 16);
  EXPECT_TRUE(kv) << kv.status().to_string();
  std::vector<Seq> one = {{tokens, std::vector<int32_t>(16), {static_cast<uint32_t>(tokens.size())}}};
  std::iota(one[0].blocks.begin(), one[0].blocks.end(), 0);
  test_runs::run(e, **kv, nullptr, one);
  return one[0].logits;
}

double max_diff(const float* a, const float* b, size_t n) {
  double worst = 0;
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, double(std::abs(a[i] - b[i])));
  return worst;
}

// The convention, pinned at its edge: a query at position p of a windowed layer sees keys
// p - W + 1 .. p, so up to position W - 1 the window hides nothing (the logits are bitwise
// those of the same weights with a window longer than the context) and from position W on it
// hides key 0 on. And at W - 1, W, W + 1 the engine agrees with the float64 reference
// (tests/model/reference_forward.py), which masks exactly i - j >= W as llama.cpp's is_masked_swa.
TEST(Windows, EdgeOfTheWindowIsPositionW) {
  const std::string windowed = made_model("gemma2_w32", "--arch gemma2 --sliding-window 32");
  auto e = Engine::load(windowed, {2, GemmBackend::kPacked});
  auto full = Engine::load(made_model("gemma2_w512", "--arch gemma2 --sliding-window 512"), {2, GemmBackend::kPacked});
  ASSERT_TRUE(e && full);
  ASSERT_EQ((*e)->config().window(0), kWindow);
  ASSERT_EQ((*e)->config().window(1), 0u);
  const uint32_t vocab = (*e)->config().vocab_size, n = kWindow + 2;
  const auto tokens = test::random_tokens(n, vocab, 5);
  const auto got = prompt_logits(**e, tokens), unmasked = prompt_logits(**full, tokens);
  for (uint32_t p = 0; p < kWindow; ++p)
    ASSERT_EQ(std::memcmp(&got[size_t{p} * vocab], &unmasked[size_t{p} * vocab], vocab * sizeof(float)), 0)
        << "position " << p << " is inside the window: nothing is masked yet";
  for (uint32_t p = kWindow; p < n; ++p)
    EXPECT_GT(max_diff(&got[size_t{p} * vocab], &unmasked[size_t{p} * vocab], vocab), 1e-3)
        << "position " << p << " no longer sees key " << p - kWindow;

  std::string list;
  for (int32_t t : tokens) list += (list.empty() ? "" : ",") + std::to_string(t);
  const std::string ref_path = test::temp_dir() + "/gemma2_w32.f64";
  const std::string cmd = "/usr/bin/python3 " + std::string(TANDEM_SOURCE_DIR) + "/tests/model/reference_forward.py " +
                          windowed + " --tokens " + list + " --out " + ref_path + " >/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<double> want(size_t{n} * vocab);
  std::ifstream in(ref_path, std::ios::binary);
  in.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(want.size() * sizeof(double)));
  ASSERT_TRUE(in);
  for (uint32_t p = kWindow - 1; p <= kWindow + 1; ++p) {
    double worst = 0;
    for (uint32_t i = 0; i < vocab; ++i)
      worst = std::max(worst, std::abs(got[size_t{p} * vocab + i] - want[size_t{p} * vocab + i]));
    EXPECT_LE(worst, 1e-4) << "position " << p;
  }
}

class WindowedKv : public ::testing::TestWithParam<KvFormat> {};

// A test name from a KV format: "q8/g32+w0" -> "q8_g32_w0".
std::string format_name(const ::testing::TestParamInfo<KvFormat>& info) {
  std::string s = info.param.to_string();
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

// Gemma 3's five windowed layers and one full layer, a 150-token sequence (prompt 140, more than
// 4 windows, then 10 decode steps): alone in one chunk, cut across block and window edges beside
// another sequence, and one token a step, in this KV format: the same bits.
TEST_P(WindowedKv, LogitsAreBitwiseTheSameForAnyChunkingAndBatch) {
  const KvFormat format = GetParam();
  auto e = Engine::load(made_model("gemma3", "--arch gemma3"), {2, GemmBackend::kPacked});
  ASSERT_TRUE(e) << e.status().to_string();
  const uint32_t tail = format.bits ? KvPool::tail_blocks_for((*e)->config(), 16, format) : 0;
  auto kv = KvPool::create((*e)->config(), 4 * (10 + tail), 16, format);
  ASSERT_TRUE(kv) << kv.status().to_string();
  const uint32_t n = 150, vocab = (*e)->config().vocab_size;
  const auto tokens = test::random_tokens(n, vocab, 21), other = test::random_tokens(n, vocab, 22);
  auto make = [&](const std::vector<int32_t>& t, int32_t slot, std::vector<uint32_t> prompt_cuts) {
    Seq s{t, std::vector<int32_t>(10), std::move(prompt_cuts), -1, std::vector<int32_t>(tail)};
    std::iota(s.blocks.begin(), s.blocks.end(), slot * 10);
    std::iota(s.tail.begin(), s.tail.end(), 40 + slot * static_cast<int32_t>(tail));
    for (uint32_t p = 141; p <= n; ++p) s.cuts.push_back(p);
    return s;
  };
  std::vector<Seq> alone = {make(tokens, 0, {140})};
  test_runs::run(**e, **kv, nullptr, alone);
  std::vector<Seq> shared = {make(other, 1, cuts_every(140, {64, 64, 12})), make(tokens, 2, cuts_every(140, {7, 30}))};
  test_runs::run(**e, **kv, nullptr, shared);
  std::vector<Seq> single_tokens = {make(tokens, 3, cuts_every(140, {1}))};
  test_runs::run(**e, **kv, nullptr, single_tokens);
  const size_t bytes = alone[0].logits.size() * sizeof(float);
  ASSERT_EQ(alone[0].logits.size(), size_t{n} * vocab);
  EXPECT_EQ(std::memcmp(alone[0].logits.data(), shared[1].logits.data(), bytes), 0) << "chunks of 7 and 30, batched";
  EXPECT_EQ(std::memcmp(alone[0].logits.data(), single_tokens[0].logits.data(), bytes), 0) << "one token a step";
  // And close to F32 KV (the window masks the same keys in every format).
  const auto f32 = prompt_logits(**e, std::vector<int32_t>(tokens.begin(), tokens.begin() + 140));
  double worst = 0, largest = 0;
  for (size_t i = 0; i < f32.size(); ++i) {
    worst = std::max(worst, double(std::abs(alone[0].logits[i] - f32[i])));
    largest = std::max(largest, double(std::abs(f32[i])));
  }
  std::printf("%s: max |logit - F32 KV logit| %.3g of max |logit| %.3g\n", format.to_string().c_str(), worst, largest);
  EXPECT_LE(worst, (format.bits == 0 ? 0.0 : format.bits == 8 ? 0.02 : 0.5) * largest);
}

INSTANTIATE_TEST_SUITE_P(Formats, WindowedKv,
                         ::testing::Values(KvFormat{}, KvFormat{8, 64, false}, KvFormat{8, 32, false, 0},
                                           KvFormat{4, 32, true}, KvFormat{4, 64, false, 2, KvScheme::kRotated},
                                           KvFormat{3, 64, false, 0, KvScheme::kRotated}),
                         format_name);

class WindowedRings : public ::testing::TestWithParam<KvFormat> {};

// Rings (docs/WINDOWS.md): the windowed layers keep only the blocks of their window, in a ring
// pool of their own whose freed ids are reused at once; Gemma 3 tiny's logits over a 300-token
// prompt (more than 9 windows) and 10 decode steps, cut in chunks and batched, are bitwise those
// of the same sequence keeping every block, in one chunk.
TEST_P(WindowedRings, LogitsAreBitwiseThoseOfKeepingEveryBlock) {
  const KvFormat format = GetParam();
  auto e = Engine::load(made_model("gemma3", "--arch gemma3"), {2, GemmBackend::kPacked});
  ASSERT_TRUE(e) << e.status().to_string();
  const uint32_t n = 310, prompt = 300, vocab = (*e)->config().vocab_size, per_seq = 20;
  auto kept = KvPool::create((*e)->config(), per_seq, 16, format);
  auto ringed = KvPool::create((*e)->config(), 3 * per_seq, 16, format, 30);
  ASSERT_TRUE(kept && ringed) << kept.status().to_string() << ringed.status().to_string();
  EXPECT_EQ((*kept)->block_bytes(), (*ringed)->block_bytes() + (*ringed)->ring_block_bytes());
  const auto tokens = test::random_tokens(n, vocab, 31), other = test::random_tokens(n, vocab, 32);
  auto make = [&](const std::vector<int32_t>& t, int32_t slot, std::vector<uint32_t> cuts) {
    Seq s{t, std::vector<int32_t>(per_seq), std::move(cuts)};
    std::iota(s.blocks.begin(), s.blocks.end(), slot * static_cast<int32_t>(per_seq));
    for (uint32_t p = prompt + 1; p <= n; ++p) s.cuts.push_back(p);
    return s;
  };
  std::vector<Seq> alone = {make(tokens, 0, {prompt})};
  test_runs::run(**e, **kept, nullptr, alone);
  test_runs::Rings rings{kWindow, std::vector<int32_t>(30)};
  std::iota(rings.free_ids.rbegin(), rings.free_ids.rend(), 0);
  std::vector<Seq> shared = {make(other, 0, cuts_every(prompt, {64, 64, 12})),
                             make(tokens, 1, cuts_every(prompt, {7, 30}))};
  test_runs::run(**e, **ringed, nullptr, shared, &rings);
  std::vector<Seq> single = {make(tokens, 2, cuts_every(prompt, {1}))};
  test_runs::run(**e, **ringed, nullptr, single, &rings);
  const size_t bytes = alone[0].logits.size() * sizeof(float);
  EXPECT_EQ(std::memcmp(alone[0].logits.data(), shared[1].logits.data(), bytes), 0) << "chunks of 7 and 30, batched";
  EXPECT_EQ(std::memcmp(alone[0].logits.data(), single[0].logits.data(), bytes), 0) << "one token a step";
  // The ring held at most the window's blocks plus a chunk's: (31 + 64) / 16 rounded up, plus one.
  EXPECT_LE(shared[0].ring_peak, 7u);
  EXPECT_LE(single[0].ring_peak, 3u);
  EXPECT_EQ(single[0].ring_first, (n - kWindow) / 16);  // the blocks before the window were given back
}

INSTANTIATE_TEST_SUITE_P(Formats, WindowedRings,
                         ::testing::Values(KvFormat{}, KvFormat{8, 32, false, 0},
                                           KvFormat{3, 64, false, 0, KvScheme::kRotated}),
                         format_name);

TEST(WindowedRings, APoolWithRingsRefusesTheF32WindowTailAndAModelWithoutWindows) {
  auto e = Engine::load(made_model("gemma3", "--arch gemma3"), {1, GemmBackend::kPacked});
  ASSERT_TRUE(e) << e.status().to_string();
  auto tail = KvPool::create((*e)->config(), 8, 16, KvFormat{8, 32, false, 2}, 4);
  ASSERT_FALSE(tail);
  EXPECT_NE(tail.status().to_string().find("--kv-f32-window 0"), std::string::npos) << tail.status().to_string();
  auto llama = Engine::load(made_model("llama", "--arch llama"), {1, GemmBackend::kPacked});
  ASSERT_TRUE(llama) << llama.status().to_string();
  auto none = KvPool::create((*llama)->config(), 8, 16, KvFormat{}, 4);
  ASSERT_FALSE(none);
  EXPECT_NE(none.status().to_string().find("sliding-window layers"), std::string::npos) << none.status().to_string();
}

// generate() with rings (`tandem run`'s path): a rotating ring of a few blocks for the windowed
// layers gives the tokens and log-probabilities of keeping every block, over a 300-token prompt
// in chunks of 50 and 40 sampled tokens (temperature 0.8: a flipped logit would show).
TEST(WindowedRings, GenerateWithARotatingRingIsGenerateKeepingEveryBlock) {
  auto e = Engine::load(made_model("gemma3", "--arch gemma3"), {2, GemmBackend::kPacked});
  ASSERT_TRUE(e) << e.status().to_string();
  const auto prompt = test::random_tokens(300, (*e)->config().vocab_size, 41);
  GenerateOptions o;
  o.max_tokens = 40;
  o.ignore_eos = true;
  o.prefill_chunk = 50;  // not a multiple of 16: a chunk spans the most blocks the ring holds
  o.sampling.temperature = 0.8f;
  o.sampling.seed = 5;
  auto kept = generate(**e, prompt, o);
  o.rings = true;
  auto ringed = generate(**e, prompt, o);
  ASSERT_TRUE(kept && ringed) << kept.status().to_string() << ringed.status().to_string();
  EXPECT_EQ(kept->tokens, ringed->tokens);
  EXPECT_EQ(kept->logprobs, ringed->logprobs);
  auto llama = Engine::load(made_model("llama", "--arch llama"), {1, GemmBackend::kPacked});
  ASSERT_TRUE(llama) << llama.status().to_string();
  auto refused = generate(**llama, std::vector<int32_t>{1, 2, 3}, o);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.status().to_string().find("sliding-window"), std::string::npos);
}

}  // namespace
}  // namespace tandem::engine
