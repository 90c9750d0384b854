// Scalar reference of the quantized dot products (kernels.h, Kernels::qgemm): one weight
// block against the activation codes under it, added to its float lane. The SIMD variants
// compute the same integer sums (exact, so in any order) and then these same float
// operations; they call these functions for the blocks that do not fill a group of 8.
//
// In an anonymous namespace: each kernel translation unit, compiled with its own
// instruction-set flags, keeps its own copy (no ODR merge across instruction sets).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#ifdef __F16C__
#include <immintrin.h>
#endif

#include "model/half.h"
#include "model/quant.h"
#include "workers/engine/kernels.h"
#include "workers/engine/kernels_scalar.h"

namespace tandem::engine::kernels {
namespace {

using model::BlockQ4_0;
using model::BlockQ4_1;
using model::BlockQ4_K;
using model::BlockQ5_0;
using model::BlockQ5_1;
using model::BlockQ5_K;
using model::BlockQ6_K;
using model::BlockQ8_0;
using model::half_to_float;
using model::TensorType;

// binary16 to float: F16C where this translation unit is compiled with it (the same value as
// the software conversion for every non-NaN input).
inline float h2f(uint16_t h) {
#ifdef __F16C__
  return _cvtsh_ss(h);
#else
  return half_to_float(h);
#endif
}

// One activation row: codes, per-block scales (32 or 256 elements), sums of 16 codes.
struct ActRow {
  const int8_t* qs;
  const float* d;
  const int16_t* s16;
};

inline ActRow act_row(const QuantRows& a, uint32_t r) {
  return {a.qs + size_t{r} * a.k, a.d + size_t{r} * (a.k / a.block), a.sums + size_t{r} * (a.k / 16)};
}

// The tiled 32-element types (kernels.h, QuantView): the unsigned code minus kCodeOffset is
// the signed weight the block's scale multiplies; the affine types add min * sum of a apart.
inline int code_offset(uint32_t type) {
  switch (static_cast<TensorType>(type)) {
    case TensorType::kQ8_0: return 128;
    case TensorType::kQ4_0: return 8;
    case TensorType::kQ5_0: return 16;
    default: return 0;
  }
}

// The unsigned code of element e (< 32) of column c (< kQuantTile) in tile `tile`.
inline int tile_code(const TiledSections& t, size_t tile, uint32_t c, uint32_t e) {
  const uint8_t* tc = t.codes + tile * t.code_bytes;
  const uint32_t i = e / 4, byte = 4 * c + e % 4;
  int q = t.code_bytes == 512 ? tc[64 * i + byte] : (tc[64 * (i % 4) + byte] >> (i < 4 ? 0 : 4)) & 15;
  if (t.qh) q |= static_cast<int>((t.qh[tile * 8 + i] >> byte) & 1) << 4;
  return q;
}

inline int32_t sum32(const ActRow& a, uint32_t b) { return int32_t{a.s16[2 * b]} + a.s16[2 * b + 1]; }

// Column n of a tiled matrix against one activation row: the chain of kernels.h.
inline float tiled_dot(const TiledSections& t, uint32_t type, uint32_t n, const ActRow& a) {
  const uint32_t g = n / kQuantTile, c = n % kQuantTile;
  const int offset = code_offset(type);
  float acc = 0.0f;
  for (uint32_t b = 0; b < t.nb; ++b) {
    const size_t tile = size_t{g} * t.nb + b;
    const int32_t asum = sum32(a, b);
    int32_t isum = -offset * asum;
    for (uint32_t e = 0; e < 32; ++e) isum += tile_code(t, tile, c, e) * a.qs[32 * b + e];
    acc = std::fma(h2f(t.d[tile * kQuantTile + c]) * a.d[b], static_cast<float>(isum), acc);
    if (t.m) acc = std::fma(h2f(t.m[tile * kQuantTile + c]) * a.d[b], static_cast<float>(asum), acc);
  }
  return acc;
}

// Sum over the 8 sub-blocks of m_j times the activations' sum under sub-block j.
template <class B>
inline int32_t k_min_sum(const B& w, const ActRow& a, uint32_t b) {
  int32_t ms = 0;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    model::k_scale_min(j, w.scales, sc, m);
    ms += int32_t{m} * sum32(a, 8 * b + j);
  }
  return ms;
}

template <class B>
inline void k_lane(const B& w, float da, int32_t isum, int32_t msum, float& l) {
  l = std::fma(h2f(w.d) * da, static_cast<float>(isum), l);
  l = std::fma(-(h2f(w.dmin) * da), static_cast<float>(msum), l);
}

// Q4_K, and Q5_K with bit 4 of element 32 j + i from bit j of qh[i].
template <class B>
inline void lane_k4(const uint8_t* row, uint32_t b, const ActRow& a, float* lanes) {
  const B& w = reinterpret_cast<const B*>(row)[b];
  const int8_t* q8 = a.qs + 256 * b;
  int32_t isum = 0;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    model::k_scale_min(j, w.scales, sc, m);
    int32_t s = 0;
    for (int i = 0; i < 32; ++i) {
      int q = (w.qs[32 * (j / 2) + i] >> (4 * (j & 1))) & 15;
      if constexpr (std::is_same_v<B, BlockQ5_K>) q |= ((w.qh[i] >> j) & 1) << 4;
      s += q * q8[32 * j + i];
    }
    isum += int32_t{sc} * s;
  }
  k_lane(w, a.d[b], isum, k_min_sum(w, a, b), lanes[b % 8]);
}

inline void lane_q6_k(const uint8_t* row, uint32_t b, const ActRow& a, float* lanes) {
  const auto& w = reinterpret_cast<const BlockQ6_K*>(row)[b];
  const int8_t* q8 = a.qs + 256 * b;
  int32_t isum = 0;
  for (int g = 0; g < 16; ++g) {  // 16 elements e = 16 g + i
    int32_t s = 0;
    for (int i = 0; i < 16; ++i) {
      const int e = 16 * g + i, h = e / 128, k = (e % 128) / 32, t = e % 32;
      const int lo = (w.ql[64 * h + t + 32 * (k & 1)] >> (4 * (k / 2))) & 15;
      const int hi = (w.qh[32 * h + t] >> (2 * k)) & 3;
      s += ((lo | (hi << 4)) - 32) * q8[e];
    }
    isum += int32_t{w.scales[g]} * s;
  }
  lanes[b % 8] = std::fma(h2f(w.d) * a.d[b], static_cast<float>(isum), lanes[b % 8]);
}

// Calls f.template operator()<kType>() for a quantized weight type (the compile-time
// dispatch of every variant's qgemm).
template <class F>
inline void dispatch_quant(uint32_t type, F&& f) {
  switch (static_cast<TensorType>(type)) {
    case TensorType::kQ8_0: return f.template operator()<TensorType::kQ8_0>();
    case TensorType::kQ4_0: return f.template operator()<TensorType::kQ4_0>();
    case TensorType::kQ5_0: return f.template operator()<TensorType::kQ5_0>();
    case TensorType::kQ4_1: return f.template operator()<TensorType::kQ4_1>();
    case TensorType::kQ5_1: return f.template operator()<TensorType::kQ5_1>();
    case TensorType::kQ4_K: return f.template operator()<TensorType::kQ4_K>();
    case TensorType::kQ5_K: return f.template operator()<TensorType::kQ5_K>();
    case TensorType::kQ6_K: return f.template operator()<TensorType::kQ6_K>();
    default: return;
  }
}

using LaneFn = void (*)(const uint8_t* row, uint32_t b, const ActRow& a, float* lanes);

// The block function of a K type (model::TensorType id); nullptr for any other.
inline LaneFn lane_fn(uint32_t type) {
  using model::TensorType;
  switch (static_cast<TensorType>(type)) {
    case TensorType::kQ4_K: return lane_k4<BlockQ4_K>;
    case TensorType::kQ5_K: return lane_k4<BlockQ5_K>;
    case TensorType::kQ6_K: return lane_q6_k;
    default: return nullptr;
  }
}

// Blocks [b0, nb) of one row into lanes (the scalar definition, and the SIMD variants' tail).
inline void lanes_scalar(LaneFn fn, const uint8_t* row, uint32_t b0, uint32_t nb, const ActRow& a, float* lanes) {
  for (uint32_t b = b0; b < nb; ++b) fn(row, b, a, lanes);
}

}  // namespace
}  // namespace tandem::engine::kernels
