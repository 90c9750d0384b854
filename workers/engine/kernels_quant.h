// Scalar reference of the quantized dot products (kernels.h, Kernels::qgemm) on the tiled
// weights: one column against one activation row. The SIMD variants compute the same integer
// sums (exact, so in any order) and then these same float operations.
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

// The unsigned code of element e (< 32 or 256) of column c (< kQuantTile) in tile `tile`.
inline int tile_code(const TiledSections& t, size_t tile, uint32_t c, uint32_t e) {
  const uint32_t j = e / 32, i = e % 32 / 4, byte = 4 * c + e % 4;
  const uint8_t* tc = t.codes + tile * t.code_bytes;
  int q = t.code_bytes == 512 ? tc[64 * i + byte] : (tc[256 * j + 64 * (i % 4) + byte] >> (i < 4 ? 0 : 4)) & 15;
  if (t.qh) q |= static_cast<int>((t.qh[tile * (t.code_bytes / 32) + 8 * j + i] >> byte) & 1) << 4;
  if (t.q6h) q |= ((t.q6h[tile * 1024 + 128 * j + 64 * (i / 4) + byte] >> (2 * (i % 4))) & 3) << 4;
  return q;
}

inline int32_t sum32(const ActRow& a, uint32_t b) { return int32_t{a.s16[2 * b]} + a.s16[2 * b + 1]; }

// Sum over e in [e0, e0 + n) of code * a (the activation block starting at q8).
inline int32_t code_dot(const TiledSections& t, size_t tile, uint32_t c, uint32_t e0, uint32_t n, const int8_t* q8) {
  int32_t s = 0;
  for (uint32_t e = e0; e < e0 + n; ++e) s += tile_code(t, tile, c, e) * q8[e];
  return s;
}

// Column n of a tiled matrix against one activation row: the chain of kernels.h.
inline float tiled_dot(const TiledSections& t, uint32_t type, uint32_t n, const ActRow& a) {
  const uint32_t g = n / kQuantTile, c = n % kQuantTile;
  const auto tt = static_cast<TensorType>(type);
  const bool k_type = tt == TensorType::kQ4_K || tt == TensorType::kQ5_K || tt == TensorType::kQ6_K;
  const int offset = code_offset(type);
  float acc = 0.0f;
  for (uint32_t b = 0; b < t.nb; ++b) {
    const size_t tile = size_t{g} * t.nb + b;
    const float d = h2f(t.d[tile * kQuantTile + c]) * a.d[b];
    if (!k_type) {
      const int32_t asum = sum32(a, b);
      const int32_t isum = code_dot(t, tile, c, 0, 32, a.qs + 32 * b) - offset * asum;
      acc = std::fma(d, static_cast<float>(isum), acc);
      if (t.m) acc = std::fma(h2f(t.m[tile * kQuantTile + c]) * a.d[b], static_cast<float>(asum), acc);
    } else if (tt == TensorType::kQ6_K) {
      int32_t isum = 0;
      for (uint32_t q = 0; q < 16; ++q) {  // groups of 16, the code's offset 32 taken off
        const int32_t dot = code_dot(t, tile, c, 16 * q, 16, a.qs + 256 * b) - 32 * a.s16[16 * b + q];
        isum += int32_t{static_cast<int8_t>(t.sc[tile * 256 + kQuantTile * q + c])} * dot;
      }
      acc = std::fma(d, static_cast<float>(isum), acc);
    } else {
      int32_t isum = 0, msum = 0;
      for (uint32_t j = 0; j < 8; ++j) {
        isum += int32_t{t.sc[tile * 128 + kQuantTile * j + c]} * code_dot(t, tile, c, 32 * j, 32, a.qs + 256 * b);
        msum += int32_t{t.mk[tile * 128 + 32 * (j / 2) + 2 * c + j % 2]} * sum32(a, 8 * b + j);
      }
      acc = std::fma(d, static_cast<float>(isum), acc);
      acc = std::fma(-(h2f(t.m[tile * kQuantTile + c]) * a.d[b]), static_cast<float>(msum), acc);
    }
  }
  return acc;
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

}  // namespace
}  // namespace tandem::engine::kernels
