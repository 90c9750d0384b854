// The SIMD kernel variants against the scalar definition: bitwise equal, whatever M.
#include "workers/engine/kernels.h"

#include <gtest/gtest.h>

#include "tests/engine/kernel_variants.h"
#include "workers/engine/kernels_scalar.h"
#include "workers/engine/kv_cache.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

namespace tandem::engine::kernels {
namespace {

using test::random_vec;
using test::variants;

bool bitwise_equal(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

TEST(Kernels, ExpApproxIsAccurate) {
  double worst = 0;
  for (float x = -87.0f; x <= 0.0f; x += 0.0137f) {
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(exp_approx(x) - want) / want);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(exp_approx(0.0f), 1.0f);
  EXPECT_LT(exp_approx(-INFINITY), 1e-37f);
}

// The softmax's lanes start at first_scored with masked_lanes(first_scored / 16): exactly the
// sum the skipped masked keys would have left in each lane (exp_approx(-inf) each, added in
// order from +0), in the table and past it.
TEST(Kernels, MaskedLanesAreWhatTheSkippedKeysWouldHaveAdded) {
  float lane = 0.0f;
  for (uint32_t g = 0; g < (1u << 14) + 300; ++g) {
    ASSERT_EQ(masked_lanes(g), lane) << g;
    lane = lane + exp_approx(-INFINITY);
  }
  EXPECT_GT(masked_lanes(1), 0.0f);
}

TEST(Kernels, GemmVariantsAgreeBitwiseForEveryRowCount) {
  std::mt19937 rng(7);
  for (uint32_t n : {32u, 45u, 96u}) {
    for (uint32_t k : {1u, 17u, 64u}) {
      const auto w = random_vec(size_t{n} * k, rng);
      std::vector<float> packed(packed_floats(n, k), 0.0f);
      for (uint32_t r = 0; r < n; ++r) pack_row(&w[size_t{r} * k], r, k, packed.data());
      const PackedView view{packed.data(), n, k};
      const uint32_t max_m = 29;
      const auto a = random_vec(size_t{max_m} * k, rng);
      // Reference: the generic kernel on all rows at once.
      std::vector<float> ref(size_t{max_m} * n);
      by_name("generic")->gemm(a.data(), k, max_m, view, 0, view.panels(), ref.data(), n);
      // The plain fma chain, written out here.
      for (uint32_t m = 0; m < max_m; ++m)
        for (uint32_t j = 0; j < n; ++j) {
          float acc = 0.0f;
          for (uint32_t i = 0; i < k; ++i) acc = std::fma(a[size_t{m} * k + i], w[size_t{j} * k + i], acc);
          ASSERT_EQ(acc, ref[size_t{m} * n + j]);
        }
      for (const Kernels* kern : variants()) {
        for (uint32_t m = 1; m <= max_m; m += (m < 14 ? 1 : 5)) {
          std::vector<float> c(size_t{m} * n, -1.0f);
          // Split the panels in two calls, as two threads would.
          const uint32_t half = view.panels() / 2;
          kern->gemm(a.data(), k, m, view, 0, half, c.data(), n);
          kern->gemm(a.data(), k, m, view, half, view.panels(), c.data(), n);
          ASSERT_TRUE(bitwise_equal(c.data(), ref.data(), c.size()))
              << kern->name << " m=" << m << " n=" << n << " k=" << k;
        }
      }
    }
  }
}

// The generic kernel's output `ref` against double-precision softmax attention over
// key(j, d) and value(j, d) (keys from a.first_key on, scores soft-capped by a.softcap), within 2e-5.
template <class Key, class Value>
void expect_near_double_attention(const AttentionArgs& a, const std::vector<float>& ref, Key key, Value value) {
  const uint32_t hd = a.head_dim;
  for (uint32_t h = 0; h < a.n_q; ++h) {
    std::vector<double> s(a.n_keys);
    double mx = -1e300, sum = 0;
    for (uint32_t j = 0; j < a.n_keys; ++j) {
      double dot = 0;
      for (uint32_t d = 0; d < hd; ++d) dot += double(a.q[h * hd + d]) * key(j, d);
      s[j] = dot * a.scale;
      if (a.softcap > 0) s[j] = a.softcap * std::tanh(s[j] / a.softcap);
      if (j < a.first_key) s[j] = -INFINITY;  // outside the sliding window
      mx = std::max(mx, s[j]);
    }
    for (auto& x : s) sum += (x = std::exp(x - mx));
    for (uint32_t d = 0; d < hd; ++d) {
      double o = 0;
      for (uint32_t j = 0; j < a.n_keys; ++j) o += s[j] * value(j, d);
      ASSERT_NEAR(ref[h * hd + d], o / sum, 2e-5) << "n_keys=" << a.n_keys << " h=" << h << " d=" << d;
    }
  }
}

// Every variant's attention output for `a` equals `ref` (the generic kernel's) bit for bit.
// With an F32 window of two blocks (the query's block and the one before, exact from k and v
// themselves): sets a's window to them, runs the generic kernel into `out` and returns the
// first window key. win_k and win_v hold the row pointers a points at.
uint32_t run_with_window(AttentionArgs& a, const std::vector<float>& k, const std::vector<float>& v, uint32_t hd,
                         uint32_t bt, uint32_t n_keys, std::vector<const float*>& win_k,
                         std::vector<const float*>& win_v, std::vector<float>& out) {
  const uint32_t from = (n_keys - 1) / bt >= 1 ? ((n_keys - 1) / bt - 1) * bt : 0;
  for (uint32_t j = from; j < n_keys; ++j) win_k.push_back(&k[size_t{j} * hd]), win_v.push_back(&v[size_t{j} * hd]);
  a.f32_from = from;
  a.win_k = win_k.data();
  a.win_v = win_v.data();
  a.out = out.data();
  by_name("generic")->attention(a);
  return from;
}

void expect_variants_match_generic(AttentionArgs a, const std::vector<float>& ref) {
  for (const Kernels* kern : variants()) {
    std::vector<float> out(ref.size(), -1.0f);
    a.out = out.data();
    kern->attention(a);
    ASSERT_TRUE(bitwise_equal(out.data(), ref.data(), out.size())) << kern->name << " n_keys=" << a.n_keys;
  }
}

// Where a test's KV blocks live: the K (kv 0) or V (kv 1) bytes of a pool block, `bytes` of
// each; poison_key makes key `slot` of a block unreadable (NaN in every float it has: F32 K and
// V, quantized scales and biases, rotated norms). Blocks 8 and 10 are spare (the tests' tables
// use the other ten of twelve).
struct KvBlocks {
  std::function<uint8_t*(uint32_t kv, uint32_t block)> at;
  size_t bytes = 0;
  std::function<void(uint8_t* k, uint8_t* v, uint32_t slot)> poison_key;
};

float* floats(uint8_t* p) { return reinterpret_cast<float*>(p); }

// A kernel reads no key before first_scored(a) and no value before first_key (kernels.h): `a`
// again with every block before first_key's swapped for spare block 8 (every byte 0xFF: NaN
// floats), first_key's block for spare block 10 (its copy with the keys before first_key
// poisoned), F32 window rows before first_key pointing at a NaN row, and a scores scratch
// holding a sentinel: every variant gives `ref`'s bits (finite) and leaves the sentinel before
// first_scored(a).
void expect_no_read_before_window(AttentionArgs a, const std::vector<float>& ref, const KvBlocks& kv) {
  const uint32_t bt = a.block_tokens, first = a.first_key;
  for (uint32_t c = 0; c < 2; ++c) {
    std::memset(kv.at(c, 8), 0xFF, kv.bytes);
    std::memcpy(kv.at(c, 10), kv.at(c, static_cast<uint32_t>(a.blocks[first / bt])), kv.bytes);
  }
  for (uint32_t slot = 0; slot < first % bt; ++slot) kv.poison_key(kv.at(0, 10), kv.at(1, 10), slot);
  std::vector<int32_t> table(a.blocks, a.blocks + (a.n_keys + bt - 1) / bt);
  for (uint32_t b = 0; b <= first / bt; ++b) table[b] = b < first / bt ? 8 : 10;
  a.blocks = table.data();
  const std::vector<float> nan_row(a.head_dim, NAN);
  std::vector<const float*> win_k, win_v;
  if (a.win_k) {
    for (uint32_t j = a.f32_from; j < a.n_keys; ++j) {
      win_k.push_back(j < first ? nan_row.data() : a.win_k[j - a.f32_from]);
      win_v.push_back(j < first ? nan_row.data() : a.win_v[j - a.f32_from]);
    }
    a.win_k = win_k.data();
    a.win_v = win_v.data();
  }
  const uint32_t stride = (a.n_keys + 15) / 16 * 16;
  for (const Kernels* kern : variants()) {
    std::vector<float> out(ref.size(), -1.0f), scores(size_t{a.n_q} * stride, 12345.0f);
    a.out = out.data();
    a.scores = scores.data();
    kern->attention(a);
    ASSERT_TRUE(bitwise_equal(out.data(), ref.data(), out.size()))
        << kern->name << " n_keys=" << a.n_keys << " first_key=" << first << " f32_from=" << a.f32_from;
    for (uint32_t h = 0; h < a.n_q; ++h)
      for (uint32_t j = 0; j < first_scored(a); ++j)
        ASSERT_EQ(scores[h * stride + j], 12345.0f) << kern->name << " scored key " << j << " before the window";
  }
}

// `a` again with a sliding window of 7 keys and Gemma 2's soft cap (2 here, so it bites): the
// generic kernel against double precision over the window, every variant's bits, and none
// reading a key before the window.
template <class Key, class Value>
void expect_windowed(AttentionArgs a, Key key, Value value, const KvBlocks& kv) {
  a.first_key = a.n_keys > 7 ? a.n_keys - 7 : 0;
  a.softcap = 2.0f;
  std::vector<float> ref(size_t{a.n_q} * a.head_dim);
  a.out = ref.data();
  by_name("generic")->attention(a);
  expect_near_double_attention(a, ref, key, value);
  expect_variants_match_generic(a, ref);
  if (a.first_key > 0) expect_no_read_before_window(a, ref, kv);
}

class AttentionShapes : public ::testing::TestWithParam<std::tuple<uint32_t, uint32_t, uint32_t>> {};

TEST_P(AttentionShapes, VariantsAgreeBitwiseWithReference) {
  std::mt19937 rng(11);
  // (std::get, not a structured binding: clang 14 cannot capture those in the lambdas below)
  const uint32_t hd = std::get<0>(GetParam()), bt = std::get<1>(GetParam()), n_q = std::get<2>(GetParam());
  const uint32_t n_blocks = 12;
  const size_t block_stride = size_t{2} * hd * bt;  // K then V of one head
  auto pool = random_vec(block_stride * n_blocks, rng, 0.5f);
  const std::vector<int32_t> blocks = {5, 2, 7, 0, 3, 11, 9, 1, 4, 6};
  const auto q = random_vec(size_t{n_q} * hd, rng);
  const KvBlocks f32_blocks{
      [&](uint32_t kv, uint32_t b) { return reinterpret_cast<uint8_t*>(&pool[b * block_stride + kv * hd * bt]); },
      size_t{hd} * bt * sizeof(float),
      [&](uint8_t* k, uint8_t* v, uint32_t slot) {
        for (uint32_t d = 0; d < hd; ++d) floats(k)[d * bt + slot] = floats(v)[slot * hd + d] = NAN;
      }};
  for (uint32_t n_keys : {1u, 15u, 16u, 17u, 33u, 100u, 160u}) {
    std::vector<float> ref(size_t{n_q} * hd), scores(size_t{n_q} * 160);
    ASSERT_LE(n_keys, blocks.size() * bt);
    AttentionArgs a;
    a.q = q.data();
    a.n_q = n_q;
    a.head_dim = hd;
    a.blocks = blocks.data();
    a.k_base = pool.data();
    a.v_base = pool.data() + size_t{hd} * bt;
    a.block_stride = block_stride;
    a.block_tokens = bt;
    a.n_keys = n_keys;
    a.scale = 0.125f;
    a.scores = scores.data();
    a.out = ref.data();
    by_name("generic")->attention(a);
    // Against a straightforward double-precision softmax attention.
    auto key = [&](uint32_t j, uint32_t d) { return double(pool[blocks[j / bt] * block_stride + d * bt + j % bt]); };
    auto value = [&](uint32_t j, uint32_t d) {
      return double(pool[blocks[j / bt] * block_stride + size_t{hd} * bt + (j % bt) * hd + d]);
    };
    expect_near_double_attention(a, ref, key, value);
    expect_variants_match_generic(a, ref);
    expect_windowed(a, key, value, f32_blocks);
  }
}

// A masked key's probability is exactly 0 (the value chains start at first_key): values of keys
// outside the window never reach the output, however large (here 1e37, which a probability of
// exp(-87) would still carry into the result), in every variant.
TEST(Kernels, KeysOutsideTheWindowNeverReachTheOutput) {
  std::mt19937 rng(19);
  const uint32_t hd = 64, bt = 16, n_q = 2, n_keys = 100;
  const size_t block_stride = size_t{2} * hd * bt;
  auto pool = random_vec(block_stride * 7, rng, 0.5f);
  const std::vector<int32_t> blocks = {3, 0, 6, 1, 5, 2, 4};
  const auto q = random_vec(size_t{n_q} * hd, rng);
  std::vector<float> scores(size_t{n_q} * 112), want(size_t{n_q} * hd), got(want.size());
  AttentionArgs a;
  a.q = q.data();
  a.n_q = n_q;
  a.head_dim = hd;
  a.blocks = blocks.data();
  a.k_base = pool.data();
  a.block_stride = block_stride;
  a.block_tokens = bt;
  a.n_keys = n_keys;
  a.first_key = 60;
  a.scale = 0.125f;
  a.scores = scores.data();
  for (const Kernels* kern : variants()) {
    a.v_base = pool.data() + size_t{hd} * bt;
    a.out = want.data();
    kern->attention(a);
    auto huge = pool;
    for (uint32_t j = 0; j < a.first_key; ++j)
      for (uint32_t d = 0; d < hd; ++d)
        huge[blocks[j / bt] * block_stride + size_t{hd} * bt + (j % bt) * hd + d] = 1e37f;
    a.v_base = huge.data() + size_t{hd} * bt;
    a.out = got.data();
    kern->attention(a);
    EXPECT_TRUE(bitwise_equal(got.data(), want.data(), got.size())) << kern->name;
  }
}

// Consecutive rows of one sequence at once (AttentionArgs::rows; row r has n_keys + r keys, its
// heads q_row_stride apart) over `a`'s cache: every row's output is bitwise what that row alone
// gives the generic kernel, in every variant. The later rows' keys never reach an earlier row.
const std::vector<std::pair<uint32_t, uint32_t>> kRowRuns = {{1, 2},  {1, 8},  {15, 3},  {16, 5},
                                                             {17, 8}, {31, 2}, {100, 7}, {150, 8}};
void expect_rows_at_once(AttentionArgs a, uint32_t n_keys, uint32_t rows, std::mt19937& rng) {
  const size_t row_stride = size_t{a.n_q} * a.head_dim + 16;  // rows apart by more than their heads
  const auto q = random_vec(rows * row_stride, rng);
  std::vector<float> scores(size_t{rows} * a.n_q * 176, 7.0f), alone(rows * row_stride, 0.0f);
  a.scores = scores.data();
  for (uint32_t r = 0; r < rows; ++r) {  // the reference: the generic kernel, a row at a time
    a.q = q.data() + r * row_stride, a.out = alone.data() + r * row_stride, a.n_keys = n_keys + r;
    by_name("generic")->attention(a);
  }
  a.q = q.data(), a.n_keys = n_keys, a.rows = rows, a.q_row_stride = a.out_row_stride = row_stride;
  for (const Kernels* kern : variants()) {
    std::vector<float> out(rows * row_stride, 0.0f);
    a.out = out.data();
    kern->attention(a);
    for (uint32_t r = 0; r < rows; ++r)
      ASSERT_TRUE(bitwise_equal(&out[r * row_stride], &alone[r * row_stride], size_t{a.n_q} * a.head_dim))
          << kern->name << " n_keys=" << n_keys << " rows=" << rows << " row " << r << " softcap=" << a.softcap;
  }
}

TEST_P(AttentionShapes, RowsAtOnceGiveEachRowsBitsAlone) {
  std::mt19937 rng(12);
  const uint32_t hd = std::get<0>(GetParam()), bt = std::get<1>(GetParam()), n_q = std::get<2>(GetParam());
  const size_t block_stride = size_t{2} * hd * bt;
  auto pool = random_vec(block_stride * 12, rng, 0.5f);
  const std::vector<int32_t> blocks = {5, 2, 7, 0, 3, 11, 9, 1, 4, 6};
  AttentionArgs a;
  a.n_q = n_q, a.head_dim = hd, a.blocks = blocks.data(), a.k_base = pool.data();
  a.v_base = pool.data() + size_t{hd} * bt, a.block_stride = block_stride, a.block_tokens = bt, a.scale = 0.125f;
  for (const auto& [n_keys, rows] : kRowRuns)
    for (float softcap : {0.0f, 5.0f}) {
      a.softcap = softcap;
      expect_rows_at_once(a, n_keys, rows, rng);
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionShapes,
                         ::testing::Combine(::testing::Values(16u, 64u, 128u), ::testing::Values(16u, 32u),
                                            ::testing::Values(1u, 3u, 4u, 7u)));

// Quantized KV (head_dim, block_tokens, query heads, bits, group): every variant gives the
// generic kernel's bits, and the generic kernel matches double-precision attention over
// the dequantized cache (scale * code + bias, read back from the pool's documented layout).
class QuantAttentionShapes
    : public ::testing::TestWithParam<std::tuple<uint32_t, uint32_t, uint32_t, uint32_t, uint32_t>> {};

TEST_P(QuantAttentionShapes, VariantsAgreeBitwiseWithReference) {
  std::mt19937 rng(13);
  const auto& param = GetParam();  // (see above: no structured binding)
  const uint32_t hd = std::get<0>(param), bt = std::get<1>(param), n_q = std::get<2>(param), bits = std::get<3>(param),
                 group = std::get<4>(param);
  ModelConfig c;
  c.dim = hd;
  c.n_heads = 1;
  c.n_kv_heads = 1;
  c.n_layers = 1;
  const KvFormat format{bits, group, false};
  auto pool = KvPool::create(c, 12, bt, format).value();
  const std::vector<int32_t> blocks = {5, 2, 7, 0, 3, 11, 9, 1, 4, 6};
  const uint32_t n_tokens = static_cast<uint32_t>(blocks.size()) * bt;
  // Keys and values with an offset and an outlier channel, as real K has.
  std::vector<float> k(size_t{n_tokens} * hd), v(size_t{n_tokens} * hd);
  for (uint32_t t = 0; t < n_tokens; ++t) {
    const auto kr = random_vec(hd, rng, 0.5f), vr = random_vec(hd, rng, 0.5f);
    for (uint32_t d = 0; d < hd; ++d) {
      k[size_t{t} * hd + d] = kr[d] + (d == 3 ? 4.0f : 0.3f);
      v[size_t{t} * hd + d] = vr[d];
    }
    pool->write(0, 0, static_cast<uint32_t>(blocks[t / bt]), t % bt, &k[size_t{t} * hd], &v[size_t{t} * hd]);
  }
  // Dequantized copies from the layout in kv_cache.h.
  const uint32_t gs = pool->group_size(), ng = hd / gs;
  const size_t code_bytes = size_t{hd} * bt * bits / 8;
  auto deq = [&](uint32_t kv, uint32_t t, uint32_t d) -> double {
    const uint8_t* b = pool->block_data(0, 0, kv, static_cast<uint32_t>(blocks[t / bt]));
    const uint32_t slot = t % bt, g = d / gs;
    const float* par = reinterpret_cast<const float*>(b + code_bytes);
    if (kv == 0) {
      const uint32_t code = code_at(b + size_t{d} * bt * bits / 8, slot, bits);
      return double(par[g * bt + slot]) * code + par[ng * bt + g * bt + slot];
    }
    const uint32_t code = code_at(b + size_t{slot} * hd * bits / 8, d, bits);
    return double(par[slot * ng + g]) * code + par[bt * ng + slot * ng + g];
  };
  const auto q = random_vec(size_t{n_q} * hd, rng);
  const KvBlocks quant_blocks{[&](uint32_t kv, uint32_t b) { return pool->block_data(0, 0, kv, b); },
                              pool->region_block_bytes(0),
                              [&](uint8_t* k, uint8_t* v, uint32_t slot) {
                                for (uint32_t g = 0; g < ng; ++g) {
                                  floats(k + code_bytes)[g * bt + slot] = NAN;  // scale, then bias
                                  floats(k + code_bytes)[ng * bt + g * bt + slot] = NAN;
                                  floats(v + code_bytes)[slot * ng + g] = NAN;
                                  floats(v + code_bytes)[bt * ng + slot * ng + g] = NAN;
                                }
                              }};
  for (uint32_t n_keys : {1u, 15u, 16u, 17u, 33u, 100u, 160u}) {
    std::vector<float> ref(size_t{n_q} * hd), scores(size_t{n_q} * 160);
    AttentionArgs a;
    a.q = q.data();
    a.n_q = n_q;
    a.head_dim = hd;
    a.blocks = blocks.data();
    a.kv_bits = bits;
    a.group_size = gs;
    a.k_bytes = pool->block_data(0, 0, 0, 0);
    a.v_bytes = pool->block_data(0, 0, 1, 0);
    a.block_bytes = pool->region_block_bytes(0);
    a.block_tokens = bt;
    a.n_keys = n_keys;
    a.scale = 0.125f;
    a.scores = scores.data();
    a.out = ref.data();
    by_name("generic")->attention(a);
    expect_near_double_attention(
        a, ref, [&](uint32_t j, uint32_t d) { return deq(0, j, d); },
        [&](uint32_t j, uint32_t d) { return deq(1, j, d); });
    expect_variants_match_generic(a, ref);

    // With an F32 window of two blocks: the keys of the query's block and the one before come
    // exact from their F32 rows, wherever those are (here: k and v themselves).
    std::vector<const float*> win_k, win_v;
    std::vector<float> open_ref(ref.size());
    const uint32_t from = run_with_window(a, k, v, hd, bt, n_keys, win_k, win_v, open_ref);
    auto key = [&](uint32_t j, uint32_t d) { return j >= from ? double(k[size_t{j} * hd + d]) : deq(0, j, d); };
    auto value = [&](uint32_t j, uint32_t d) { return j >= from ? double(v[size_t{j} * hd + d]) : deq(1, j, d); };
    expect_near_double_attention(a, open_ref, key, value);
    expect_variants_match_generic(a, open_ref);
    expect_windowed(a, key, value, quant_blocks);
    a.win_k = a.win_v = nullptr;
    expect_windowed(
        a, [&](uint32_t j, uint32_t d) { return deq(0, j, d); }, [&](uint32_t j, uint32_t d) { return deq(1, j, d); },
        quant_blocks);
  }
  AttentionArgs a;  // runs of rows (speculative rounds, prompt chunks), without the F32 window
  a.n_q = n_q, a.head_dim = hd, a.blocks = blocks.data(), a.kv_bits = bits, a.group_size = gs;
  a.k_bytes = pool->block_data(0, 0, 0, 0), a.v_bytes = pool->block_data(0, 0, 1, 0);
  a.block_bytes = pool->region_block_bytes(0), a.block_tokens = bt, a.scale = 0.125f;
  for (const auto& [n_keys, rows] : kRowRuns) expect_rows_at_once(a, n_keys, rows, rng);
}

INSTANTIATE_TEST_SUITE_P(Shapes, QuantAttentionShapes,
                         ::testing::Combine(::testing::Values(16u, 64u, 128u), ::testing::Values(16u, 32u),
                                            ::testing::Values(1u, 3u, 4u, 7u), ::testing::Values(8u, 4u),
                                            ::testing::Values(32u, 64u)));

// Rotated KV (head_dim, block_tokens, query heads, bits): every variant gives the generic
// kernel's bits, with and without an F32 window, and the generic kernel matches
// double-precision attention over the cache as the pool reads it back (norm * level, rotated
// back): scores against rotated keys need no inverse rotation because the transform is
// orthonormal, and the values' single inverse rotation after the sum is exact up to rounding.
class RotatedAttentionShapes : public ::testing::TestWithParam<std::tuple<uint32_t, uint32_t, uint32_t, uint32_t>> {};

TEST_P(RotatedAttentionShapes, VariantsAgreeBitwiseWithReference) {
  std::mt19937 rng(17);
  const auto& param = GetParam();  // (see above: no structured binding)
  const uint32_t hd = std::get<0>(param), bt = std::get<1>(param), n_q = std::get<2>(param), bits = std::get<3>(param);
  ModelConfig c;
  c.dim = hd;
  c.n_heads = 1;
  c.n_kv_heads = 1;
  c.n_layers = 2;
  auto pool = KvPool::create(c, 12, bt, {bits, 64, false, 2, KvScheme::kRotated}).value();
  const uint32_t layer = 1;
  const std::vector<int32_t> blocks = {5, 2, 7, 0, 3, 11, 9, 1, 4, 6};
  const uint32_t n_tokens = static_cast<uint32_t>(blocks.size()) * bt;
  std::vector<float> k(size_t{n_tokens} * hd), v(size_t{n_tokens} * hd), kr(k.size()), vr(v.size());
  for (uint32_t t = 0; t < n_tokens; ++t) {
    const auto kx = random_vec(hd, rng, 0.5f), vx = random_vec(hd, rng, 0.5f);
    for (uint32_t d = 0; d < hd; ++d) {
      k[size_t{t} * hd + d] = kx[d] + (d == 3 ? 4.0f : 0.3f);  // an offset and an outlier channel
      v[size_t{t} * hd + d] = vx[d];
    }
    const auto block = static_cast<uint32_t>(blocks[t / bt]);
    pool->write(layer, 0, block, t % bt, &k[size_t{t} * hd], &v[size_t{t} * hd]);
    pool->read(layer, 0, block, t % bt, &kr[size_t{t} * hd], &vr[size_t{t} * hd]);
  }
  const auto q = random_vec(size_t{n_q} * hd, rng);
  const size_t norms_at = size_t{hd} * bt * bits / 8;
  const KvBlocks rotated_blocks{
      [&](uint32_t kv, uint32_t b) { return pool->block_data(layer, 0, kv, b); }, pool->region_block_bytes(layer),
      [&](uint8_t* k, uint8_t* v, uint32_t slot) { floats(k + norms_at)[slot] = floats(v + norms_at)[slot] = NAN; }};
  for (uint32_t n_keys : {1u, 15u, 16u, 17u, 33u, 100u, 160u}) {
    std::vector<float> ref(size_t{n_q} * hd), scores(size_t{n_q} * 160);
    AttentionArgs a;
    a.q = q.data();
    a.n_q = n_q;
    a.head_dim = hd;
    a.blocks = blocks.data();
    a.kv_bits = bits;
    a.kv_rotated = true;
    a.k_signs = pool->rotation_signs(layer, 0);
    a.v_signs = pool->rotation_signs(layer, 1);
    a.levels = pool->rotation_levels()->levels;
    a.k_bytes = pool->block_data(layer, 0, 0, 0);
    a.v_bytes = pool->block_data(layer, 0, 1, 0);
    a.block_bytes = pool->region_block_bytes(layer);
    a.block_tokens = bt;
    a.n_keys = n_keys;
    a.scale = 0.125f;
    a.scores = scores.data();
    a.out = ref.data();
    by_name("generic")->attention(a);
    expect_near_double_attention(
        a, ref, [&](uint32_t j, uint32_t d) { return double(kr[size_t{j} * hd + d]); },
        [&](uint32_t j, uint32_t d) { return double(vr[size_t{j} * hd + d]); });
    expect_variants_match_generic(a, ref);

    std::vector<const float*> win_k, win_v;
    std::vector<float> open_ref(ref.size());
    const uint32_t from = run_with_window(a, k, v, hd, bt, n_keys, win_k, win_v, open_ref);
    auto key = [&](uint32_t j, uint32_t d) { return double((j >= from ? k : kr)[size_t{j} * hd + d]); };
    auto value = [&](uint32_t j, uint32_t d) { return double((j >= from ? v : vr)[size_t{j} * hd + d]); };
    expect_near_double_attention(a, open_ref, key, value);
    expect_variants_match_generic(a, open_ref);
    expect_windowed(a, key, value, rotated_blocks);
    a.win_k = a.win_v = nullptr;
    expect_windowed(
        a, [&](uint32_t j, uint32_t d) { return double(kr[size_t{j} * hd + d]); },
        [&](uint32_t j, uint32_t d) { return double(vr[size_t{j} * hd + d]); }, rotated_blocks);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RotatedAttentionShapes,
                         ::testing::Combine(::testing::Values(16u, 64u, 128u), ::testing::Values(16u, 32u),
                                            ::testing::Values(1u, 3u, 4u, 7u), ::testing::Values(4u, 3u)));

TEST(Kernels, SiluMulVariantsAgreeBitwise) {
  std::mt19937 rng(3);
  const size_t n = 1000;
  auto g = random_vec(n, rng, 4.0f), u = random_vec(n, rng);
  g[0] = 0.0f;
  g[1] = -100.0f;
  g[2] = 100.0f;
  std::vector<float> ref(n);
  by_name("generic")->silu_mul(g.data(), u.data(), ref.data(), n);
  for (size_t i = 0; i < n; ++i) {
    const double x = g[i];
    ASSERT_NEAR(ref[i], x / (1 + std::exp(-x)) * u[i], 1e-5 * (1 + std::abs(x * u[i])));
  }
  for (const Kernels* kern : variants()) {
    std::vector<float> out(n);
    kern->silu_mul(g.data(), u.data(), out.data(), n);
    ASSERT_TRUE(bitwise_equal(out.data(), ref.data(), n)) << kern->name;
  }
}

// argmax: the lowest index of the max, NaN as -inf, ties and +-inf and all-NaN rows, at
// lengths around the 256-element blocks and the vector widths; every variant.
TEST(Kernels, ArgmaxIsTheLowestIndexOfTheMaxInEveryVariant) {
  std::mt19937 rng(5);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (uint32_t n : {0u, 1u, 7u, 16u, 255u, 256u, 257u, 1000u, 32000u}) {
    for (int shape = 0; shape < 6; ++shape) {
      std::vector<float> x = random_vec(n, rng, 3.0f);
      uint32_t want = 0;
      float want_max = -inf;
      if (n > 0) {
        if (shape == 1) std::fill(x.begin(), x.end(), nan);              // nothing possible: 0
        if (shape == 2) std::fill(x.begin(), x.end(), -inf);             // nothing possible: 0
        if (shape == 3) x[n / 2] = 50.0f, x[n - 1] = 50.0f, x[0] = nan;  // a tie: the lower
        if (shape == 4) x[n - 1] = inf, x[n / 3] = nan;                  // +inf wins
        if (shape == 5)
          for (size_t i = 0; i < n; i += 2) x[i] = nan;  // every other NaN
        for (uint32_t i = 0; i < n; ++i)
          if (x[i] > want_max) want_max = x[i], want = i;
      }
      for (const Kernels* kern : variants()) {
        float got_max = 0.0f;
        EXPECT_EQ(kern->argmax(x.data(), n, &got_max), want) << kern->name << " n " << n << " shape " << shape;
        EXPECT_EQ(got_max, want_max) << kern->name << " n " << n << " shape " << shape;
      }
    }
  }
}

}  // namespace
}  // namespace tandem::engine::kernels
