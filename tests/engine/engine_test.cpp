// The forward pass: against the double-precision reference, batch invariance, incremental
// decoding, non-degenerate presets, and errors for bad steps.
#include "workers/engine/engine.h"

#include <gtest/gtest.h>

#include <thread>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>
#include <cstring>
#include <numeric>
#include <random>
#include <set>

#include "tests/engine/reference_model.h"
#include "tests/test_util.h"
#include "workers/engine/generate.h"

namespace tandem::engine {
namespace {

std::unique_ptr<Engine> load(const std::string& path, GemmBackend gemm = GemmBackend::kPacked, uint32_t threads = 2) {
  auto e = Engine::load(path, {threads, gemm});
  if (!e) throw std::runtime_error(e.status().to_string());
  return std::move(e.value());
}

using test::random_tokens;

std::vector<int32_t> iota_blocks(uint32_t n, int32_t first = 0) {
  std::vector<int32_t> b(n);
  std::iota(b.begin(), b.end(), first);
  return b;
}

std::vector<float> row(const Engine& e, uint32_t r) {
  auto s = e.logits(r);
  return {s.begin(), s.end()};
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

// (backend, F16 file, tied embeddings)
class EngineVsReference : public ::testing::TestWithParam<std::tuple<GemmBackend, bool, bool>> {};

TEST_P(EngineVsReference, LogitsMatchWithin1e4Relative) {
  const auto [backend, f16, tied] = GetParam();
  const std::string path = test::model_file("tiny", 1, f16, tied);
  auto e = load(path, backend);
  EXPECT_EQ(e->config().tied_embeddings, tied);
  test::ReferenceModel ref(path);
  const auto tokens = random_tokens(45, e->config().vocab_size, 5);
  auto pool = KvPool::create(e->config(), 8);
  ASSERT_TRUE(pool);
  const auto blocks = iota_blocks(8);
  SeqStep s{tokens, 0, blocks, static_cast<uint32_t>(tokens.size())};
  ASSERT_TRUE(e->forward({&s, 1}, **pool).is_ok());
  const auto want = ref.logits(tokens);
  double worst = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    double scale = 0;
    for (double v : want[t]) scale = std::max(scale, std::abs(v));
    const auto got = e->logits(static_cast<uint32_t>(t));
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[t][i]) / scale);
  }
  RecordProperty("max_relative_error", std::to_string(worst));
  std::printf("max relative logit error vs double reference: %.3g\n", worst);
  EXPECT_LE(worst, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Files, EngineVsReference,
                         ::testing::Combine(::testing::Values(GemmBackend::kPacked, GemmBackend::kOpenBlas),
                                            ::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == GemmBackend::kPacked ? "packed" : "openblas") +
                                  (std::get<1>(info.param) ? "_f16" : "_f32") +
                                  (std::get<2>(info.param) ? "_tied" : "_untied");
                         });

// The logits of sequence A's last prompt token and of three decode steps, computed
// (1) alone, prompt in one chunk, contiguous blocks; and (2) chunked differently, blocks
// scattered, in ragged steps with other sequences of other lengths.
struct InvarianceRun {
  std::vector<std::vector<float>> logits;  // prompt's last token, then each decode step
};

InvarianceRun run_alone(Engine& e, const std::vector<int32_t>& prompt, const std::vector<int32_t>& decode,
                        const KvFormat& format) {
  InvarianceRun out;
  const uint32_t tb = KvPool::tail_blocks_for(e.config(), 16, format);  // F32 open block: the tail's blocks
  auto pool = KvPool::create(e.config(), 16 + tb, 16, format).value();
  const auto blocks = iota_blocks(16), tail = iota_blocks(tb, 16);
  SeqStep s{prompt, 0, blocks, 1, tail};
  EXPECT_TRUE(e.forward({&s, 1}, *pool).is_ok());
  out.logits.push_back(row(e, 0));
  uint32_t pos = static_cast<uint32_t>(prompt.size());
  for (const int32_t& t : decode) {
    SeqStep d{std::span<const int32_t>(&t, 1), pos, blocks, 1, tail, pos};
    ++pos;
    EXPECT_TRUE(e.forward({&d, 1}, *pool).is_ok());
    out.logits.push_back(row(e, 0));
  }
  return out;
}

InvarianceRun run_batched(Engine& e, const std::vector<int32_t>& prompt, const std::vector<int32_t>& decode,
                          const std::vector<uint32_t>& chunks, uint32_t seed, const KvFormat& format) {
  InvarianceRun out;
  const uint32_t tb = KvPool::tail_blocks_for(e.config(), 16, format);  // 16 at most (rotated 3-bit, head_dim 16)
  auto pool = KvPool::create(e.config(), 48 + 3 * tb, 16, format).value();
  std::vector<int32_t> all = iota_blocks(48 + 3 * tb);
  std::shuffle(all.begin(), all.end(), std::mt19937(seed));
  const std::vector<int32_t> mine(all.begin(), all.begin() + 16);
  const std::vector<int32_t> other1(all.begin() + 16, all.begin() + 32), other2(all.begin() + 32, all.begin() + 48);
  const std::vector<int32_t> tail(all.begin() + 48, all.begin() + 48 + tb),
      tail1(all.begin() + 48 + tb, all.begin() + 48 + 2 * tb), tail2(all.begin() + 48 + 2 * tb, all.end());
  const auto o1 = random_tokens(200, e.config().vocab_size, seed + 1);
  const auto o2 = random_tokens(200, e.config().vocab_size, seed + 2);
  uint32_t pos = 0, p1 = 0, p2 = 0;
  // Prompt chunks, each step shared with prefill chunks / decodes of the others.
  for (size_t c = 0; c < chunks.size(); ++c) {
    const uint32_t n = chunks[c];
    const bool last = pos + n == prompt.size();
    const uint32_t n1 = 1 + (c * 7) % 23, n2 = 1 + (c * 3) % 5;
    SeqStep steps[3] = {{std::span(o1).subspan(p1, n1), p1, other1, 1, tail1, p1},
                        {std::span(prompt).subspan(pos, n), pos, mine, last ? 1u : 0u, tail, pos},
                        {std::span(o2).subspan(p2, n2), p2, other2, n2, tail2, p2}};
    EXPECT_TRUE(e.forward(steps, *pool).is_ok());
    if (last) out.logits.push_back(row(e, 1));
    pos += n, p1 += n1, p2 += n2;
  }
  EXPECT_EQ(pos, prompt.size());
  for (size_t i = 0; i < decode.size(); ++i) {
    const uint32_t n1 = 2 + static_cast<uint32_t>(i) * 5;
    SeqStep steps[3] = {{std::span(o2).subspan(p2, 1), p2, other2, 1, tail2, p2},
                        {std::span(o1).subspan(p1, n1), p1, other1, 2, tail1, p1},
                        {std::span(decode).subspan(i, 1), pos, mine, 1, tail, pos}};
    EXPECT_TRUE(e.forward(steps, *pool).is_ok());
    out.logits.push_back(row(e, 3));
    pos += 1, p1 += n1, p2 += 1;
  }
  return out;
}

float invariance_max_diff(GemmBackend backend, uint32_t threads, const KvFormat& format = {}) {
  auto e = load(test::model_file("tiny", 2), backend, threads);
  const auto prompt = random_tokens(61, e->config().vocab_size, 9);
  const auto decode = random_tokens(3, e->config().vocab_size, 10);
  const auto alone = run_alone(*e, prompt, decode, format);
  float worst = 0;
  uint32_t seed = 100;
  for (const auto& chunks :
       std::vector<std::vector<uint32_t>>{{61}, {1, 60}, {16, 16, 16, 13}, {7, 13, 17, 24}, {60, 1}}) {
    const auto batched = run_batched(*e, prompt, decode, chunks, seed++, format);
    if (batched.logits.size() != alone.logits.size()) {
      ADD_FAILURE() << "missing logits";
      return INFINITY;
    }
    for (size_t i = 0; i < alone.logits.size(); ++i)
      worst = std::max(worst, max_abs_diff(alone.logits[i], batched.logits[i]));
  }
  return worst;
}

TEST(BatchInvariance, PackedKernelsAreBitwiseIdentical) {
  for (uint32_t threads : {1u, 2u}) {
    const float worst = invariance_max_diff(GemmBackend::kPacked, threads);
    std::printf("packed, %u threads: largest logit difference alone vs batched: %g\n", threads, worst);
    EXPECT_EQ(worst, 0.0f);
  }
}

// Quantized KV: the codes a token gets depend only on its own K/V, and the fused
// dequantization is a fixed chain per output element.
TEST(BatchInvariance, QuantizedKvIsBitwiseIdentical) {
  constexpr auto kRot = KvScheme::kRotated;
  for (const KvFormat format :
       {KvFormat{8, 64}, KvFormat{8, 64, false, 1}, KvFormat{8, 64, false, 0}, KvFormat{4, 32}, KvFormat{4, 64, true},
        KvFormat{4, 64, false, 2, kRot}, KvFormat{3, 64, true, 2, kRot}, KvFormat{3, 64, false, 0, kRot}})
    for (uint32_t threads : {1u, 2u}) {
      const float worst = invariance_max_diff(GemmBackend::kPacked, threads, format);
      std::printf("%s, %u threads: largest logit difference alone vs batched: %g\n", format.to_string().c_str(),
                  threads, worst);
      EXPECT_EQ(worst, 0.0f) << format.to_string();
    }
}

TEST(BatchInvariance, OpenBlasWithin1e5) {
  const float worst = invariance_max_diff(GemmBackend::kOpenBlas, 2);
  std::printf("openblas, 2 threads: largest logit difference alone vs batched: %g\n", worst);
  EXPECT_LE(worst, 1e-5f);
}

TEST(Engine, IncrementalDecodingEqualsOneShot) {
  auto e = load(test::model_file("tiny", 3));
  const auto prompt = random_tokens(20, e->config().vocab_size, 4);
  GenerateOptions opt;
  opt.max_tokens = 24;
  opt.ignore_eos = true;
  auto gen = generate(*e, prompt, opt);
  ASSERT_TRUE(gen);
  // Logits at each decode step, recomputed incrementally with a pool of our own.
  auto pool = KvPool::create(e->config(), 8).value();
  const auto blocks = iota_blocks(8);
  std::vector<int32_t> seq = prompt;
  SeqStep s{seq, 0, blocks, 1};
  ASSERT_TRUE(e->forward({&s, 1}, *pool).is_ok());
  std::vector<std::vector<float>> incremental{row(*e, 0)};
  for (size_t i = 0; i + 1 < gen->tokens.size(); ++i) {
    seq.push_back(gen->tokens[i]);
    SeqStep d{std::span<const int32_t>(&seq.back(), 1), static_cast<uint32_t>(seq.size() - 1), blocks, 1};
    ASSERT_TRUE(e->forward({&d, 1}, *pool).is_ok());
    incremental.push_back(row(*e, 0));
  }
  // One shot over the whole text, logits for every generated position.
  auto pool2 = KvPool::create(e->config(), 8).value();
  const uint32_t n_gen = static_cast<uint32_t>(gen->tokens.size());
  SeqStep whole{seq, 0, blocks, n_gen};
  ASSERT_TRUE(e->forward({&whole, 1}, *pool2).is_ok());
  for (uint32_t i = 0; i < n_gen; ++i) {
    EXPECT_EQ(max_abs_diff(incremental[i], row(*e, i)), 0.0f) << "position " << i;
    // and greedy picked the argmax of those logits
    const auto l = row(*e, i);
    EXPECT_EQ(std::max_element(l.begin(), l.end()) - l.begin(), gen->tokens[i]);
  }
}

// With std 0.02 and tied embeddings a random model just repeats its last token; make-model's
// weights must give continuations that move.
void expect_not_degenerate(const std::string& preset, uint32_t prompts, uint32_t steps) {
  auto e = load(test::model_file(preset, 1));
  uint32_t repeats = 0, total = 0;
  std::set<std::vector<int32_t>> distinct;
  for (uint32_t p = 0; p < prompts; ++p) {
    const auto prompt = random_tokens(8, e->config().vocab_size, 50 + p);
    GenerateOptions opt;
    opt.max_tokens = steps;
    opt.ignore_eos = true;
    auto gen = generate(*e, prompt, opt);
    ASSERT_TRUE(gen);
    int32_t last = prompt.back();
    for (int32_t t : gen->tokens) {
      repeats += t == last;
      ++total;
      last = t;
    }
    std::set<int32_t> uniq(gen->tokens.begin(), gen->tokens.end());
    EXPECT_GE(uniq.size(), steps / 3) << preset << " prompt " << p << " continuation has few distinct tokens";
    distinct.insert(gen->tokens);
  }
  std::printf("%s: %u of %u greedy tokens repeat the previous token; %zu distinct continuations of %u\n",
              preset.c_str(), repeats, total, distinct.size(), prompts);
  EXPECT_LT(repeats * 4, total);
  EXPECT_EQ(distinct.size(), prompts);
}

TEST(Presets, TinyIsNotDegenerate) { expect_not_degenerate("tiny", 16, 24); }
TEST(Presets, SmallIsNotDegenerate) { expect_not_degenerate("small", 3, 12); }

// The worker heartbeats through this hook during long steps: it runs after every layer, on
// the forward pass's thread, and does not change the result.
TEST(Engine, TheBetweenLayersHookRunsAfterEveryLayer) {
  auto e = load(test::model_file("tiny", 3));
  const auto prompt = random_tokens(20, e->config().vocab_size, 4);
  auto pool = KvPool::create(e->config(), 8).value();
  const auto blocks = iota_blocks(8);
  SeqStep s{prompt, 0, blocks, 1};
  ASSERT_TRUE(e->forward({&s, 1}, *pool).is_ok());
  const std::vector<float> without = row(*e, 0);
  uint32_t calls = 0;
  const auto caller = std::this_thread::get_id();
  e->set_between_layers([&] {
    ++calls;
    EXPECT_EQ(std::this_thread::get_id(), caller);
  });
  auto pool2 = KvPool::create(e->config(), 8).value();
  ASSERT_TRUE(e->forward({&s, 1}, *pool2).is_ok());
  EXPECT_EQ(calls, e->config().n_layers);
  EXPECT_EQ(max_abs_diff(without, row(*e, 0)), 0.0f);
}

TEST(Engine, BadStepsGiveClearErrors) {
  auto e = load(test::model_file("tiny", 1));
  auto pool = KvPool::create(e->config(), 4).value();
  const auto blocks = iota_blocks(4);
  auto expect_error = [&](SeqStep s, const std::string& needle) {
    Status st = e->forward({&s, 1}, *pool);
    ASSERT_FALSE(st.is_ok()) << needle;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  const std::vector<int32_t> ok = {1, 2, 3}, bad_id = {1, 100000}, neg = {-1};
  expect_error({ok, 0, std::span(blocks).first(0), 1}, "block table covers 0 positions, needs 3");
  expect_error({bad_id, 0, blocks, 1}, "token id 100000 is outside the vocabulary of 512");
  expect_error({neg, 0, blocks, 1}, "token id -1");
  expect_error({ok, 510, blocks, 1}, "exceed the context length 512");
  expect_error({std::span<const int32_t>(), 0, blocks, 1}, "no tokens");
  expect_error({ok, 0, blocks, 4}, "asks logits for 4 of 3 tokens");
  const std::vector<int32_t> outside = {0, 9};
  expect_error({ok, 16, outside, 1}, "block id 9 is outside the pool of 4");
  EXPECT_FALSE(e->forward({}, *pool).is_ok());
  // The engine keeps serving after errors.
  SeqStep good{ok, 0, blocks, 1};
  EXPECT_TRUE(e->forward({&good, 1}, *pool).is_ok());
}

}  // namespace
}  // namespace tandem::engine

// Counting allocations: after a warm-up step of the same shape, a forward pass (packed
// and OpenBLAS backends) and a decode step allocate nothing.
namespace {
std::atomic<bool> g_counting{false};
std::atomic<uint64_t> g_allocations{0};
}  // namespace

#pragma GCC diagnostic ignored "-Wmismatched-new-delete"  // GCC 12 misreads the replaced pair
void* operator new(size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
// The nothrow pair too (std::stable_sort's temporary buffer uses it): every form of new must
// come from the malloc that the replaced delete frees to.
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace tandem::engine {
namespace {

TEST(Engine, StepsAllocateNothingAfterWarmUp) {
  for (const auto& [backend, format] :
       {std::pair{GemmBackend::kPacked, KvFormat{}}, std::pair{GemmBackend::kOpenBlas, KvFormat{}},
        std::pair{GemmBackend::kPacked, KvFormat{4, 32, true}},
        std::pair{GemmBackend::kPacked, KvFormat{3, 64, false, 2, KvScheme::kRotated}}}) {
    auto e = load(test::model_file("tiny", 1), backend);
    const uint32_t tb = KvPool::tail_blocks_for(e->config(), 16, format);  // the F32 window's tails (4-bit)
    auto pool = KvPool::create(e->config(), 16 + 2 * tb, 16, format).value();
    const auto b1 = iota_blocks(8), b2 = iota_blocks(8, 8), t1s = iota_blocks(tb, 16), t2s = iota_blocks(tb, 16 + tb);
    const auto p1 = random_tokens(40, e->config().vocab_size, 1), p2 = random_tokens(20, e->config().vocab_size, 2);
    SeqStep prefill[2] = {{p1, 0, b1, 1, t1s}, {p2, 0, b2, 1, t2s}};
    ASSERT_TRUE(e->forward(prefill, *pool).is_ok());
    const int32_t t1 = 5, t2 = 6;
    SeqStep decode[2] = {{std::span(&t1, 1), 40, b1, 1, t1s, 40}, {std::span(&t2, 1), 20, b2, 1, t2s, 20}};
    ASSERT_TRUE(e->forward(decode, *pool).is_ok());  // warm-up of the decode shape
    g_allocations = 0;
    g_counting = true;
    for (uint32_t i = 0; i < 5; ++i) {
      decode[0].start_pos = 41 + i;
      decode[1].start_pos = 21 + i;
      decode[0].tail_end = decode[0].start_pos;
      decode[1].tail_end = decode[1].start_pos;
      Status st = e->forward(decode, *pool);
      if (!st.is_ok()) break;
    }
    g_counting = false;
    EXPECT_EQ(g_allocations.load(), 0u) << (backend == GemmBackend::kPacked ? "packed " : "openblas ")
                                        << format.to_string();
  }
}

}  // namespace
}  // namespace tandem::engine

namespace tandem::engine {
namespace {

// Speculative decoding rolls a sequence back by shortening it: the next step writes over
// the rejected positions, and the result equals never having computed them.
TEST(Engine, TrimmingASequenceEqualsNeverHavingExtendedIt) {
  auto e = load(test::model_file("tiny", 4));
  const auto prompt = random_tokens(30, e->config().vocab_size, 21);
  const auto rejected = random_tokens(5, e->config().vocab_size, 22);
  const auto accepted = random_tokens(3, e->config().vocab_size, 23);
  const auto blocks = iota_blocks(4);

  auto pool = KvPool::create(e->config(), 4).value();
  SeqStep p{prompt, 0, blocks, 1};
  ASSERT_TRUE(e->forward({&p, 1}, *pool).is_ok());
  SeqStep draft{rejected, 30, blocks, 5};  // verify 5 drafted tokens, keep none of them
  ASSERT_TRUE(e->forward({&draft, 1}, *pool).is_ok());
  SeqStep retry{accepted, 30, blocks, 3};  // the sequence is 30 long again
  ASSERT_TRUE(e->forward({&retry, 1}, *pool).is_ok());
  std::vector<std::vector<float>> got;
  for (uint32_t i = 0; i < 3; ++i) got.push_back(row(*e, i));

  auto fresh = KvPool::create(e->config(), 4).value();
  std::vector<int32_t> whole = prompt;
  whole.insert(whole.end(), accepted.begin(), accepted.end());
  SeqStep once{whole, 0, blocks, 3};
  ASSERT_TRUE(e->forward({&once, 1}, *fresh).is_ok());
  for (uint32_t i = 0; i < 3; ++i) EXPECT_EQ(max_abs_diff(got[i], row(*e, i)), 0.0f) << i;
}

}  // namespace
}  // namespace tandem::engine

namespace tandem::engine {
namespace {

// With an F32 window, a rollback within the open block is exact too (the tail still holds
// the window's rows before the new end); one into an earlier block reads the window rows
// the tail no longer holds back from the codes: close to, not equal to, never having
// extended the sequence.
TEST(Engine, TrimmingWithAnF32Window) {
  auto e = load(test::model_file("tiny", 4));
  const KvFormat q8{8, 64};
  const uint32_t tb = KvPool::tail_blocks_for(e->config(), 16, q8);
  ASSERT_GT(tb, 0u);
  const auto blocks = iota_blocks(4), tail = iota_blocks(tb, 4);
  // The draft stays in block 1 / ends exactly at its end / crosses into block 2.
  for (const uint32_t prompt_len : {20u, 27u, 30u}) {
    const auto prompt = random_tokens(prompt_len, e->config().vocab_size, 21);
    const auto rejected = random_tokens(5, e->config().vocab_size, 22);
    const auto accepted = random_tokens(3, e->config().vocab_size, 23);
    auto pool = KvPool::create(e->config(), 4 + tb, 16, q8).value();
    SeqStep p{prompt, 0, blocks, 1, tail};
    ASSERT_TRUE(e->forward({&p, 1}, *pool).is_ok());
    SeqStep draft{rejected, prompt_len, blocks, 5, tail, prompt_len};
    ASSERT_TRUE(e->forward({&draft, 1}, *pool).is_ok());
    SeqStep retry{accepted, prompt_len, blocks, 3, tail, prompt_len + 5};
    ASSERT_TRUE(e->forward({&retry, 1}, *pool).is_ok());
    std::vector<std::vector<float>> got;
    for (uint32_t i = 0; i < 3; ++i) got.push_back(row(*e, i));

    auto fresh = KvPool::create(e->config(), 4 + tb, 16, q8).value();
    std::vector<int32_t> whole = prompt;
    whole.insert(whole.end(), accepted.begin(), accepted.end());
    SeqStep once{whole, 0, blocks, 3, tail};
    ASSERT_TRUE(e->forward({&once, 1}, *fresh).is_ok());
    for (uint32_t i = 0; i < 3; ++i) {
      const float diff = max_abs_diff(got[i], row(*e, i));
      if (prompt_len != 30)
        EXPECT_EQ(diff, 0.0f) << prompt_len << " " << i;
      else
        EXPECT_LT(diff, 0.05f) << i;  // 8-bit codes for 16 keys instead of their F32 rows
    }
  }
}

TEST(Engine, TailsAreChecked) {
  auto e = load(test::model_file("tiny", 4));
  const auto tokens = random_tokens(4, e->config().vocab_size, 3);
  const auto blocks = iota_blocks(2);
  auto f32 = KvPool::create(e->config(), 8).value();
  const std::vector<int32_t> tail{4, 5, 6};
  SeqStep s{tokens, 0, blocks, 1, tail};
  EXPECT_NE(e->forward({&s, 1}, *f32).message().find("keeps no F32 window"), std::string::npos);
  const KvFormat q8{8, 64, false, 1};
  auto q = KvPool::create(e->config(), 8, 16, q8).value();
  ASSERT_EQ(q->tail_blocks(), 3u);  // 16 rows of 16 floats, 6 in each 384-byte region block
  EXPECT_EQ(KvPool::tail_blocks_for(e->config(), 16, KvFormat{8, 64}), 6u);  // the default window: 2 blocks
  const std::vector<int32_t> short_tail{4, 5}, outside{4, 5, 8};
  s.tail = short_tail;
  EXPECT_NE(e->forward({&s, 1}, *q).message().find("tail of 2 blocks, the pool's tails take 3"), std::string::npos);
  s.tail = outside;
  EXPECT_NE(e->forward({&s, 1}, *q).message().find("tail block id 8 is outside the pool of 8"), std::string::npos);
  s.tail = tail;
  s.tail_end = -2;
  EXPECT_NE(e->forward({&s, 1}, *q).message().find("tail_end -2 is outside [-1, 512]"), std::string::npos);
  s.tail_end = 513;
  EXPECT_NE(e->forward({&s, 1}, *q).message().find("tail_end 513 is outside"), std::string::npos);
  s.tail_end = -1;
  EXPECT_TRUE(e->forward({&s, 1}, *q).is_ok());
}

}  // namespace
}  // namespace tandem::engine
