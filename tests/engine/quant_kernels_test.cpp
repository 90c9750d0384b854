// The quantized and 16-bit weight kernels (Kernels::qgemm, gemm16): every variant this CPU
// runs equals the scalar definition bit for bit, a row's result does not depend on the batch
// (M = 1..33) or on how the rows are split, and the result is the dot product of the
// dequantized weights with the activations within the activation quantization's error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "tests/engine/kernel_variants.h"
#include "model/half.h"
#include "model/quant.h"
#include "workers/engine/kernels.h"

namespace tandem::engine::kernels {
namespace {

using model::TensorType;

using test::random_vec;
using test::variants;

// Activation rows quantized for a weight type, with their storage.
struct Acts {
  std::vector<int8_t> qs;
  std::vector<float> d;
  std::vector<int16_t> sums;
  QuantRows rows;
  Acts(const std::vector<float>& a, uint32_t m, uint32_t k, uint32_t block)
      : qs(size_t{m} * k), d(size_t{m} * k / block), sums(size_t{m} * k / 16) {
    quantize_rows(a.data(), k, 0, m, k, block, qs.data(), d.data(), sums.data());
    rows = {qs.data(), d.data(), sums.data(), k, block};
  }
  QuantRows row(uint32_t r) const {  // row r alone, as a batch of one
    return {rows.qs + size_t{r} * rows.k, rows.d + size_t{r} * (rows.k / rows.block),
            rows.sums + size_t{r} * (rows.k / 16), rows.k, rows.block};
  }
};

struct QuantCase {
  TensorType type;
  std::vector<uint32_t> ks;
};

class QuantKernels : public ::testing::TestWithParam<QuantCase> {};

TEST_P(QuantKernels, VariantsBitwiseEqualBatchInvariantAndCloseToDequantized) {
  const QuantCase& tc = GetParam();
  const model::TypeTraits* traits = model::type_traits(tc.type);
  std::mt19937 rng(11 + static_cast<uint32_t>(tc.type));
  const uint32_t n = 73, max_m = 33;  // 4 whole tile columns and a part one
  for (uint32_t k : tc.ks) {
    const size_t rb = model::row_bytes(tc.type, k);
    std::vector<uint8_t> wq(rb * n);
    const auto w = random_vec(size_t{n} * k, rng, 0.05f);
    for (uint32_t r = 0; r < n; ++r) traits->quantize(&w[size_t{r} * k], wq.data() + r * rb, k);
    std::vector<float> wd(size_t{n} * k);  // the weights the kernels must compute with
    for (uint32_t r = 0; r < n; ++r) traits->dequantize(wq.data() + r * rb, &wd[size_t{r} * k], k);
    std::vector<uint8_t> tiles(tiled_bytes(static_cast<uint32_t>(tc.type), n, k));  // as the engine loads them
    tile_quant(wq.data(), rb, static_cast<uint32_t>(tc.type), n, k, tiles.data());
    const QuantView view{tiles.data(), static_cast<uint32_t>(tc.type), n, k};
    const auto a = random_vec(size_t{max_m} * k, rng);
    const Acts acts(a, max_m, k, act_block(static_cast<uint32_t>(tc.type)));

    std::vector<float> ref(size_t{max_m} * n);
    by_name("generic")->qgemm(acts.rows, max_m, view, 0, n, ref.data(), n);
    for (uint32_t r = 0; r < max_m; ++r)
      for (uint32_t j = 0; j < n; ++j) {
        double exact = 0, mag = 0;
        for (uint32_t i = 0; i < k; ++i) {
          exact += double{wd[size_t{j} * k + i]} * a[size_t{r} * k + i];
          mag += std::fabs(double{wd[size_t{j} * k + i]} * a[size_t{r} * k + i]);
        }
        // Activation codes carry <= 1/254 of their block's absmax each; 2% of the
        // magnitude bounds that loosely for Gaussian rows.
        ASSERT_NEAR(ref[size_t{r} * n + j], exact, 0.02 * mag + 1e-6) << traits->name << " k=" << k;
      }
    for (const Kernels* kern : variants()) {
      for (uint32_t m = 1; m <= max_m; ++m) {
        std::vector<float> c(size_t{m} * n, -1.0f);
        kern->qgemm(acts.rows, m, view, 0, 16, c.data(), n);  // split as two threads would
        kern->qgemm(acts.rows, m, view, 16, n, c.data(), n);
        ASSERT_EQ(std::memcmp(c.data(), ref.data(), c.size() * sizeof(float)), 0)
            << kern->name << " " << traits->name << " m=" << m << " k=" << k;
      }
      for (uint32_t r : {0u, 17u, 32u}) {  // a row alone equals its place in the batch of 33
        std::vector<float> c(n);
        kern->qgemm(acts.row(r), 1, view, 0, n, c.data(), n);
        ASSERT_EQ(std::memcmp(c.data(), &ref[size_t{r} * n], n * sizeof(float)), 0) << kern->name << " row " << r;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Types, QuantKernels,
    ::testing::Values(QuantCase{TensorType::kQ8_0, {32, 256, 576}}, QuantCase{TensorType::kQ4_0, {64, 576}},
                      QuantCase{TensorType::kQ4_1, {64, 576}}, QuantCase{TensorType::kQ5_0, {64, 576}},
                      QuantCase{TensorType::kQ5_1, {64, 576}}, QuantCase{TensorType::kQ4_K, {256, 2304}},
                      QuantCase{TensorType::kQ5_K, {256, 2304}}, QuantCase{TensorType::kQ6_K, {256, 2304}}),
    [](const auto& info) { return std::string(model::ggml_type_name(info.param.type)); });

// Activation quantization: every variant's Kernels::quantize writes quantize_rows' bytes (the
// scalar definition, ggml's reference quantizers), ties, zero blocks and non-finite values too.
TEST(QuantKernels, ActivationQuantizationVariantsBitwiseEqual) {
  std::mt19937 rng(5);
  const uint32_t k = 768, m = 9;
  auto a = random_vec(size_t{m} * k, rng);
  for (uint32_t i = 0; i < k; ++i) a[i] = static_cast<float>(static_cast<int>(i % 255) - 127) + 0.5f;  // halves
  a[k] = 127.0f;                                                                                       // row 1: scale 1
  for (uint32_t i = 1; i < 256; ++i) a[k + i] = static_cast<float>(static_cast<int>(i % 200) - 100) / 2;
  std::fill(&a[2 * k], &a[2 * k + 256], 0.0f);             // row 2: a zero block
  a[3 * k + 5] = std::numeric_limits<float>::quiet_NaN();  // row 3: NaN, row 4: infinities
  a[4 * k + 40] = std::numeric_limits<float>::infinity(), a[4 * k + 300] = -a[4 * k + 40];
  for (uint32_t i = 0; i < k; ++i) a[5 * k + i] *= 1e-30f, a[6 * k + i] *= 1e30f;  // tiny and huge
  for (uint32_t block : {kAct32, kAct256}) {
    std::vector<int8_t> q_ref(size_t{m} * k), q(q_ref.size());
    std::vector<float> d_ref(size_t{m} * k / block), d(d_ref.size());
    std::vector<int16_t> s_ref(size_t{m} * k / 16), s(s_ref.size());
    quantize_rows(a.data(), k, 0, m, k, block, q_ref.data(), d_ref.data(), s_ref.data());
    for (const Kernels* kern : variants()) {
      std::fill(q.begin(), q.end(), int8_t{99});
      kern->quantize(a.data(), k, 0, m, k, block, q.data(), d.data(), s.data());
      EXPECT_EQ(q, q_ref) << kern->name << " block " << block;
      EXPECT_EQ(std::memcmp(d.data(), d_ref.data(), d.size() * sizeof(float)), 0) << kern->name << " block " << block;
      EXPECT_EQ(s, s_ref) << kern->name << " block " << block;
    }
  }
}

// F16 and BF16 panels: every variant equals the F32 kernel on the widened weights, bitwise.
TEST(QuantKernels16, EqualsF32GemmOnWidenedWeights) {
  std::mt19937 rng(5);
  for (bool bf16 : {false, true}) {
    for (uint32_t n : {32u, 45u}) {
      const uint32_t k = 72, max_m = 29;
      const auto w = random_vec(size_t{n} * k, rng);
      std::vector<uint16_t> packed16(packed_floats(n, k), 0);
      std::vector<float> packed(packed_floats(n, k), 0.0f), row(k);
      for (uint32_t r = 0; r < n; ++r) {
        for (uint32_t i = 0; i < k; ++i) {
          const uint16_t h =
              bf16 ? model::float_to_bf16(w[size_t{r} * k + i]) : model::float_to_half(w[size_t{r} * k + i]);
          packed16[size_t{r / kPanel} * k * kPanel + size_t{i} * kPanel + r % kPanel] = h;
          row[i] = bf16 ? model::bf16_to_float(h) : model::half_to_float(h);
        }
        pack_row(row.data(), r, k, packed.data());
      }
      const PackedView view{packed.data(), n, k};
      const Packed16View view16{packed16.data(), n, k, bf16};
      const auto a = random_vec(size_t{max_m} * k, rng);
      std::vector<float> ref(size_t{max_m} * n);
      by_name("generic")->gemm(a.data(), k, max_m, view, 0, view.panels(), ref.data(), n);
      for (const Kernels* kern : variants())
        for (uint32_t m = 1; m <= max_m; m += 4) {
          std::vector<float> c(size_t{m} * n);
          kern->gemm16(a.data(), k, m, view16, 0, view16.panels(), c.data(), n);
          ASSERT_EQ(std::memcmp(c.data(), ref.data(), c.size() * sizeof(float)), 0)
              << kern->name << (bf16 ? " BF16" : " F16") << " m=" << m << " n=" << n;
        }
    }
  }
}

// BF16 pair panels with BF16 activations (gemm_bf16): every variant, vdpbf16ps where the CPU has
// it, equals the scalar definition bit for bit, for every M and a split at a panel; sums that
// fall below FLT_MIN are flushed the same way; and the result is the dot product of the BF16
// values within float rounding.
TEST(QuantKernels16, Bf16PairsVariantsBitwiseEqual) {
  std::mt19937 rng(9);
  const uint32_t n = 77, k = 96, max_m = 29;
  auto w = random_vec(size_t{n} * k, rng);
  for (uint32_t i = 0; i < k; ++i) w[i] = (i % 2 ? 1e-20f : 3e-19f) * (i % 3 ? 1.0f : -1.0f);  // column 0: tiny
  w[k + 3] = 1e-39f;                                                                           // a denormal weight
  std::vector<uint16_t> packed(packed_floats(n, k), 0), row(k);
  for (uint32_t r = 0; r < n; ++r) {
    for (uint32_t i = 0; i < k; ++i) row[i] = model::float_to_bf16(w[size_t{r} * k + i]);
    pack_bf16_pairs_row(row.data(), r, k, packed.data());
  }
  auto a = random_vec(size_t{max_m} * k, rng);
  for (uint32_t i = 0; i < k; ++i) a[i] = 2e-19f * (i % 5 ? 1.0f : -1.0f);  // row 0 x column 0: sums near FLT_MIN
  a[k + 1] = 1e-40f;                                                        // a denormal activation
  a[2 * k + 7] = std::numeric_limits<float>::quiet_NaN(), a[2 * k + 8] = -std::numeric_limits<float>::infinity();
  a[2 * k + 9] = 1.00390625f, a[2 * k + 10] = 1.01171875f;  // ties: to even, down and up
  std::vector<uint16_t> ab(size_t{max_m} * k), ab_v(ab.size());
  round_rows_bf16(a.data(), k, 0, max_m, k, ab.data());
  for (const Kernels* kern : variants()) {  // the activation rounding, every variant
    kern->round_bf16(a.data(), k, 0, max_m, k, ab_v.data());
    ASSERT_EQ(ab_v, ab) << kern->name;
  }
  a[2 * k + 7] = a[2 * k + 8] = 0.0f;  // finite again for the products
  round_rows_bf16(a.data(), k, 0, max_m, k, ab.data());
  const PackedPairsView view{packed.data(), n, k};
  std::vector<float> ref(size_t{max_m} * n);
  by_name("generic")->gemm_bf16(ab.data(), max_m, view, 0, view.panels(), ref.data(), n);
  for (uint32_t r = 1; r < max_m; ++r)
    for (uint32_t j = 1; j < n; ++j) {
      double exact = 0, mag = 0;
      for (uint32_t i = 0; i < k; ++i) {
        const double x = double{model::bf16_to_float(ab[size_t{r} * k + i])} *
                         model::bf16_to_float(model::float_to_bf16(w[size_t{j} * k + i]));
        exact += x, mag += std::fabs(x);
      }
      ASSERT_NEAR(ref[size_t{r} * n + j], exact, 1e-5 * mag + 1e-30) << r << " " << j;
    }
  for (const Kernels* kern : variants())
    for (uint32_t m = 1; m <= max_m; ++m) {
      std::vector<float> c(size_t{m} * n, -1.0f);
      kern->gemm_bf16(ab.data(), m, view, 0, 1, c.data(), n);
      kern->gemm_bf16(ab.data(), m, view, 1, view.panels(), c.data(), n);
      ASSERT_EQ(std::memcmp(c.data(), ref.data(), c.size() * sizeof(float)), 0) << kern->name << " m=" << m;
    }
}

}  // namespace
}  // namespace tandem::engine::kernels
