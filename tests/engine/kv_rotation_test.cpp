// The rotated KV scheme's row arithmetic (workers/engine/kv_rotation.h, issue #23) against its
// definition in docs/KV_ROTATED.md and scripts/kv-quant-sim.py: the pinned signs, the transform
// as the explicit matrix H·D, the generated level tables, and the codes' error against the
// Lloyd-Max MSE the script computes.
#include "workers/engine/kv_rotation.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace tandem::engine::kv_rotation {
namespace {

constexpr uint32_t kDims[] = {16, 32, 64, 128, 256};

std::vector<float> signs_of(uint64_t seed, uint32_t layer, uint32_t kv, uint32_t d) {
  std::vector<float> s(d);
  signs(seed, layer, kv, s);
  return s;
}

std::vector<float> gaussian_row(std::mt19937_64& rng, uint32_t d) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(d);
  for (float& v : x) v = n(rng);
  return x;
}

// The string tests/python/kv_rotation_test.py and docs/KV_ROTATED.md pin for seed 1, layer 0, K.
TEST(KvRotation, SignsArePinnedAndDifferAcrossLayersAndKV) {
  std::string pattern;
  for (float s : signs_of(1, 0, 0, 16)) pattern += s < 0 ? '-' : '+';
  EXPECT_EQ(pattern, "-+++++--++---+-+");
  EXPECT_NE(signs_of(1, 0, 0, 64), signs_of(1, 0, 1, 64));
  EXPECT_NE(signs_of(1, 0, 0, 64), signs_of(1, 1, 0, 64));
  EXPECT_NE(signs_of(1, 0, 0, 64), signs_of(2, 0, 0, 64));
  EXPECT_EQ(signs_of(7, 3, 1, 256), signs_of(7, 3, 1, 256));
  // Past 64 elements a new SplitMix64 word: not a repeat of the first.
  const auto s = signs_of(1, 0, 0, 128);
  EXPECT_FALSE(std::equal(s.begin(), s.begin() + 64, s.begin() + 64));
}

TEST(KvRotation, RotateIsTheMatrixHDAndUnrotateItsInverse) {
  std::mt19937_64 rng(5);
  for (uint32_t d : kDims) {
    const auto s = signs_of(3, 2, 0, d);
    const auto x = gaussian_row(rng, d);
    std::vector<float> y(d), back(d);
    rotate_row(x, s, y);
    double norm_x = 0, norm_y = 0;
    for (uint32_t i = 0; i < d; ++i) {
      double expect = 0;  // (H D x)_i, H[i][j] = (-1)^popcount(i & j) / sqrt(d)
      for (uint32_t j = 0; j < d; ++j) expect += (std::popcount(i & j) % 2 ? -1.0 : 1.0) * s[j] * x[j];
      expect /= std::sqrt(static_cast<double>(d));
      EXPECT_NEAR(y[i], expect, 1e-5) << "d " << d << " i " << i;
      norm_x += static_cast<double>(x[i]) * x[i];
      norm_y += static_cast<double>(y[i]) * y[i];
    }
    EXPECT_NEAR(norm_y / norm_x, 1.0, 1e-5) << d;
    unrotate_row(y, s, back);
    for (uint32_t i = 0; i < d; ++i) EXPECT_NEAR(back[i], x[i], 1e-5) << "d " << d << " i " << i;
    std::vector<float> in_place = x;  // y may alias x
    rotate_row(in_place, s, in_place);
    EXPECT_EQ(0, std::memcmp(in_place.data(), y.data(), d * sizeof(float))) << d;
  }
}

TEST(KvRotation, HeadDimensionsOutsideTheTablesAreRefusedByName) {
  for (uint32_t d : kDims) EXPECT_TRUE(check_head_dim(d).is_ok()) << d;
  for (uint32_t d : {0u, 8u, 96u, 100u, 512u}) {
    const Status st = check_head_dim(d);
    ASSERT_FALSE(st.is_ok()) << d;
    EXPECT_NE(st.message().find("power of two in [16, 256], got " + std::to_string(d)), std::string::npos)
        << st.message();
  }
  EXPECT_EQ(levels(96, 4), nullptr);
  EXPECT_EQ(levels(64, 5), nullptr);
}

// The generated tables: ascending, exactly symmetric (the density is even), the bounds the F32
// midpoints, and the values docs/KV_ROTATED.md lists for d = 16.
TEST(KvRotation, LevelTablesAreSymmetricAscendingWithMidpointBounds) {
  for (uint32_t d : kDims)
    for (uint32_t bits : {2u, 3u, 4u}) {
      const Levels* t = levels(d, bits);
      ASSERT_NE(t, nullptr) << d << "x" << bits;
      const uint32_t n = t->count();
      for (uint32_t i = 0; i < n; ++i) EXPECT_EQ(t->levels[i], -t->levels[n - 1 - i]) << d << "x" << bits;
      for (uint32_t i = 0; i + 1 < n; ++i) {
        EXPECT_LT(t->levels[i], t->levels[i + 1]);
        const float mid = static_cast<float>((static_cast<double>(t->levels[i]) + t->levels[i + 1]) / 2);
        EXPECT_EQ(t->bounds[i], mid) << d << "x" << bits << " bound " << i;
      }
      // Wider rows have narrower coordinates: the top level shrinks like 1/sqrt(d).
      if (d > 16) {
        EXPECT_LT(t->levels[n - 1], levels(d / 2, bits)->levels[n - 1]);
      }
    }
  EXPECT_NEAR(levels(16, 4)->levels[15], 0.603895, 1e-6);
  EXPECT_NEAR(levels(16, 3)->levels[4], 0.059922, 1e-6);
  EXPECT_NEAR(levels(16, 2)->levels[3], 0.367207, 1e-6);
}

// The error of a quantized random row, |x - x^|^2 / |x|^2, averages d times the Lloyd-Max MSE
// per coordinate that scripts/kv-quant-sim.py --levels prints (d = 16: 0.00809, 0.0301, 0.1059),
// whatever the row's direction, an outlier channel included: the rotation spreads it.
TEST(KvRotation, QuantizedRowsHaveTheLloydMaxError) {
  const struct {
    uint32_t bits;
    double d_mse;
  } kExpect[] = {{4, 0.00809}, {3, 0.0301}, {2, 0.1059}};
  std::mt19937_64 rng(11);
  constexpr uint32_t d = 16, kRows = 4000;
  const auto s = signs_of(1, 0, 0, d);
  std::vector<uint8_t> codes(d);
  std::vector<float> scratch(d), rot(d), back(d);
  for (const auto& e : kExpect) {
    const Levels& t = *levels(d, e.bits);
    for (bool spike : {false, true}) {
      double sum = 0;
      for (uint32_t r = 0; r < kRows; ++r) {
        auto x = gaussian_row(rng, d);
        if (spike) x[r % d] += 12.0f;  // one channel far larger than the rest, as real keys have
        const float norm = quantize(x, s, t, codes, scratch);
        for (uint8_t c : codes) ASSERT_LT(c, t.count());
        dequantize(codes, norm, t, rot);
        unrotate_row(rot, s, back);
        double err = 0, mag = 0;
        for (uint32_t i = 0; i < d; ++i) {
          err += (static_cast<double>(x[i]) - back[i]) * (static_cast<double>(x[i]) - back[i]);
          mag += static_cast<double>(x[i]) * x[i];
        }
        sum += err / mag;
      }
      // The spiked rows' directions are not uniform, so only the plain rows get the tight bound.
      const double mean = sum / kRows, tolerance = spike ? 0.5 : 0.1;
      EXPECT_NEAR(mean, e.d_mse, tolerance * e.d_mse) << e.bits << " bits, spike " << spike;
    }
  }
}

// A score is the fma chain over the dequantized rotated row, bitwise; and it is the unrotated
// dot product up to the codes' error. A zero row stores norm 0 and scores 0.
TEST(KvRotation, ScoresNeedNoInverseRotation) {
  std::mt19937_64 rng(3);
  for (uint32_t d : kDims) {
    const Levels& t = *levels(d, 4);
    const auto sk = signs_of(9, 1, 0, d);
    const auto q = gaussian_row(rng, d), k = gaussian_row(rng, d);
    std::vector<uint8_t> codes(d);
    std::vector<float> scratch(d), q_rot(d), k_rot(d);
    const float norm = quantize(k, sk, t, codes, scratch);
    rotate_row(q, sk, q_rot);
    const float s = score(q_rot, codes, norm, t);
    dequantize(codes, norm, t, k_rot);
    float chain = 0.0f;
    for (uint32_t i = 0; i < d; ++i) chain = std::fma(q_rot[i], k_rot[i] / norm, chain);
    EXPECT_FLOAT_EQ(s, norm * chain) << d;
    double exact = 0, qn = 0, kn = 0;
    for (uint32_t i = 0; i < d; ++i) {
      exact += static_cast<double>(q[i]) * k[i];
      qn += static_cast<double>(q[i]) * q[i];
      kn += static_cast<double>(k[i]) * k[i];
    }
    // |q·k - q·k^| <= |q| |k - k^|, and 4-bit |k - k^| / |k| is about sqrt(0.008) ~ 0.09.
    EXPECT_NEAR(s, exact, 0.25 * std::sqrt(qn * kn)) << d;
  }
  const std::vector<float> zero(16, 0.0f);
  std::vector<uint8_t> codes(16);
  std::vector<float> scratch(16), out(16, 1.0f);
  const auto s = signs_of(1, 0, 1, 16);
  EXPECT_EQ(quantize(zero, s, *levels(16, 3), codes, scratch), 0.0f);
  dequantize(codes, 0.0f, *levels(16, 3), out);
  for (float v : out) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(score(scratch, codes, 0.0f, *levels(16, 3)), 0.0f);
}

}  // namespace
}  // namespace tandem::engine::kv_rotation
