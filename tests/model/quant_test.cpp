// ggml's tensor types (model/quant.h): the traits table, block layouts with hand-built blocks,
// round trips within each type's step, edge cases (zero and constant blocks, NaN, rows split
// anywhere). Bit equality with llama.cpp itself: quant_reference_test.cpp.
#include "model/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "model/half.h"

namespace tandem::model {
namespace {

const TensorType kConvertible[] = {TensorType::kF32,  TensorType::kF16,  TensorType::kBF16, TensorType::kQ8_0,
                                   TensorType::kQ4_0, TensorType::kQ4_1, TensorType::kQ5_0, TensorType::kQ5_1,
                                   TensorType::kQ4_K, TensorType::kQ5_K, TensorType::kQ6_K, TensorType::kQ8_K};

std::vector<float> normal_values(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<float> round_trip(TensorType type, const std::vector<float>& x) {
  const TypeTraits* t = type_traits(type);
  std::vector<std::byte> q(row_bytes(type, x.size()));
  t->quantize(x.data(), q.data(), static_cast<int64_t>(x.size()));
  std::vector<float> y(x.size());
  t->dequantize(q.data(), y.data(), static_cast<int64_t>(x.size()));
  return y;
}

TEST(QuantTraits, GeometryAndNamesOfEveryGgmlType) {
  struct Want {
    uint32_t id;
    const char* name;
    uint32_t elems, bytes;
  };
  for (Want w : {Want{0, "F32", 1, 4}, Want{1, "F16", 1, 2}, Want{2, "Q4_0", 32, 18}, Want{3, "Q4_1", 32, 20},
                 Want{6, "Q5_0", 32, 22}, Want{7, "Q5_1", 32, 24}, Want{8, "Q8_0", 32, 34}, Want{12, "Q4_K", 256, 144},
                 Want{13, "Q5_K", 256, 176}, Want{14, "Q6_K", 256, 210}, Want{15, "Q8_K", 256, 292},
                 Want{30, "BF16", 1, 2}, Want{39, "MXFP4", 32, 17}, Want{42, "Q2_0", 64, 18}}) {
    const TypeTraits* t = type_traits(w.id);
    ASSERT_NE(t, nullptr) << w.name;
    EXPECT_STREQ(t->name, w.name);
    EXPECT_EQ(t->block_elems, w.elems) << w.name;
    EXPECT_EQ(t->block_bytes, w.bytes) << w.name;
    EXPECT_STREQ(ggml_type_name(w.id), w.name);
  }
  for (uint32_t removed : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 43u, 1000u, 0xffffffffu}) {
    EXPECT_EQ(type_traits(removed), nullptr) << removed;
  }
  EXPECT_STREQ(ggml_type_name(43), "type 43");
  for (TensorType type : kConvertible) {
    EXPECT_NE(type_traits(type)->dequantize, nullptr) << ggml_type_name(type);
    EXPECT_NE(type_traits(type)->quantize, nullptr) << ggml_type_name(type);
  }
  EXPECT_EQ(type_traits(10)->dequantize, nullptr) << "Q2_K is named but not converted";
  EXPECT_EQ(row_bytes(TensorType::kQ4_K, 512), 288u);
  EXPECT_EQ(row_bytes(TensorType::kBF16, 3), 6u);
}

TEST(QuantLayout, HandBuiltBlocksDecodeAsGgmlDefinesThem) {
  BlockQ4_0 q4{};
  q4.d = float_to_half(0.5f);
  for (int j = 0; j < 16; ++j) q4.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[256];
  dequantize_row_q4_0(&q4, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * static_cast<float>(j - 8));
    EXPECT_EQ(y[j + 16], 0.5f * static_cast<float>(7 - j));
  }
  BlockQ5_1 q5{};
  q5.d = float_to_half(2.0f);
  q5.m = float_to_half(-1.0f);
  const uint32_t qh = 0x80000001u;  // bit 4 of elements 0 and 31
  std::memcpy(q5.qh, &qh, 4);
  dequantize_row_q5_1(&q5, y, 32);
  EXPECT_EQ(y[0], 2.0f * 16 - 1.0f);
  EXPECT_EQ(y[1], -1.0f);
  EXPECT_EQ(y[31], 2.0f * 16 - 1.0f);
  BlockQ4_K k{};
  k.d = float_to_half(1.0f);
  k.dmin = float_to_half(0.25f);
  k.scales[0] = 3;  // sub-block 0: scale 3, min 5
  k.scales[4] = 5;
  k.scales[10] = 0x21 | 0;  // sub-block 6: low nibbles scale 1, min 2
  k.scales[2] = 1 << 6;     // sub-block 6 scale bit 4: 1 + 16 = 17
  k.qs[0] = 0x72;           // element 0 (sub-block 0): 2; element 32 (sub-block 1): 7
  k.qs[96] = 0x04;          // element 192 (sub-block 6): 4
  dequantize_row_q4_k(&k, y, 256);
  EXPECT_EQ(y[0], 3.0f * 2 - 0.25f * 5);
  EXPECT_EQ(y[32], 0.0f) << "sub-block 1 has scale 0 and min 0";
  EXPECT_EQ(y[192], 17.0f * 4 - 0.25f * 2);
  BlockQ6_K q6{};
  q6.d = float_to_half(1.0f);
  for (int s = 0; s < 16; ++s) q6.scales[s] = static_cast<int8_t>(s - 8);
  q6.ql[32 + 5] = 0x30;  // element 128·0 + 32·3 + 5 = 101: high nibble of ql[37], bits 6-7 of qh[5]
  q6.qh[5] = 0x80;
  dequantize_row_q6_k(&q6, y, 256);
  EXPECT_EQ(y[101], static_cast<float>(101 / 16 - 8) * static_cast<float>((3 | (2 << 4)) - 32));
  EXPECT_EQ(y[100], static_cast<float>(100 / 16 - 8) * -32.0f);
}

TEST(QuantRoundTrip, EveryTypeWithinItsStep) {
  // Largest error relative to the block's largest magnitude, per type: half a step (a whole one
  // for the clamped end of Q4_0/Q5_0) plus the rounding of the scale to binary16.
  struct Bound {
    TensorType type;
    float rel;
  };
  const std::vector<float> x = normal_values(4096, 7);
  for (Bound b :
       {Bound{TensorType::kF32, 0}, Bound{TensorType::kF16, 1e-3f}, Bound{TensorType::kBF16, 8e-3f},
        Bound{TensorType::kQ8_0, 0.005f}, Bound{TensorType::kQ4_0, 0.13f}, Bound{TensorType::kQ4_1, 0.07f},
        Bound{TensorType::kQ5_0, 0.065f}, Bound{TensorType::kQ5_1, 0.034f}, Bound{TensorType::kQ4_K, 0.2f},
        Bound{TensorType::kQ5_K, 0.1f}, Bound{TensorType::kQ6_K, 0.05f}, Bound{TensorType::kQ8_K, 1.0f / 200}}) {
    const std::vector<float> y = round_trip(b.type, x);
    const uint32_t block = std::max<uint32_t>(type_traits(b.type)->block_elems, 32);
    for (size_t i0 = 0; i0 < x.size(); i0 += block) {
      float amax = 0, err = 0;
      for (size_t i = i0; i < i0 + block; ++i) {
        amax = std::max(amax, std::fabs(x[i]));
        err = std::max(err, std::fabs(x[i] - y[i]));
      }
      ASSERT_LE(err, b.rel * amax) << ggml_type_name(b.type) << " block at " << i0;
    }
  }
}

TEST(QuantRoundTrip, ZeroAndConstantBlocksStayFinite) {
  for (TensorType type : kConvertible) {
    for (float c : {0.0f, 1.0f, -3.5f}) {
      const std::vector<float> x(512, c);
      const std::vector<float> y = round_trip(type, x);
      for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_TRUE(std::isfinite(y[i])) << ggml_type_name(type) << " constant " << c;
        ASSERT_NEAR(y[i], c, std::fabs(c) * 0.07f) << ggml_type_name(type) << " constant " << c;
      }
    }
  }
}

// NaN, infinities and values whose scale's inverse overflows: bytes (checked by UBSan in the
// sanitizer build), never undefined behaviour.
TEST(QuantRoundTrip, NonFiniteAndTinyInputsAreDefined) {
  std::vector<float> x = normal_values(512, 13);
  x[3] = std::nanf("");
  x[40] = INFINITY;
  x[300] = -INFINITY;
  for (int i = 256; i < 288; ++i) x[i] = i % 2 ? 1e-39f : 0.0f;  // a block of subnormals and zeros
  for (TensorType type : kConvertible) {
    const std::vector<float> y = round_trip(type, x);
    EXPECT_EQ(y.size(), x.size()) << ggml_type_name(type);
  }
}

TEST(QuantRoundTrip, RowsAreIndependentOfHowATensorIsSplit) {
  const std::vector<float> x = normal_values(2048, 11, 0.02f);
  for (TensorType type : kConvertible) {
    const TypeTraits* t = type_traits(type);
    std::vector<std::byte> whole(row_bytes(type, x.size())), parts(whole.size());
    t->quantize(x.data(), whole.data(), static_cast<int64_t>(x.size()));
    const uint64_t half = 1024, half_bytes = row_bytes(type, half);
    t->quantize(x.data(), parts.data(), static_cast<int64_t>(half));
    t->quantize(x.data() + half, parts.data() + half_bytes, static_cast<int64_t>(half));
    EXPECT_EQ(whole, parts) << ggml_type_name(type);
  }
}

TEST(QuantHalf, Bf16RoundsToNearestEvenAndQuietsNan) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  float f;
  uint32_t bits = 0x3f808000;  // halfway between 0x3f80 and 0x3f81: to even
  std::memcpy(&f, &bits, 4);
  EXPECT_EQ(float_to_bf16(f), 0x3f80);
  bits = 0x3f818000;  // halfway between 0x3f81 and 0x3f82: to even
  std::memcpy(&f, &bits, 4);
  EXPECT_EQ(float_to_bf16(f), 0x3f82);
  bits = 0x7f800001;  // signalling NaN: stays NaN, made quiet
  std::memcpy(&f, &bits, 4);
  EXPECT_EQ(float_to_bf16(f), 0x7fc0);
  EXPECT_EQ(bf16_to_float(0xc000), -2.0f);
}

TEST(QuantQ8K, SumsPerSixteenMatchTheQuants) {
  const std::vector<float> x = normal_values(512, 3);
  BlockQ8_K b[2];
  quantize_row_q8_k(x.data(), b, 512);
  for (const BlockQ8_K& blk : b) {
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += blk.qs[16 * g + i];
      EXPECT_EQ(blk.bsums[g], sum);
    }
  }
}

}  // namespace
}  // namespace tandem::model
