// AVX-512 VNNI tiles for the 32-element quantized types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1): R
// activation rows x C weight rows per pass over K, each weight block unpacked once for the R
// rows and each activation block loaded once for the C rows (decode: R = 1, C = 8). A zmm
// holds two blocks; vpdpbusd's int32 lane j of a block is its element group j (elements
// 4j..4j+3), so the lanes are exactly those of the scalar definition (kernels.h): the even
// block's groups in lanes 0..7, the odd one's in 8..15, and the same float fma per lane.
// Included only by kernels_avx512.cpp (compiled with -mavx512vnni).
#pragma once

#include <immintrin.h>

#include "workers/engine/kernels_quant_simd.h"

namespace tandem::engine::kernels {
namespace {
namespace quant512 {

using model::TensorType;

// Unsigned codes of blocks b and b + 1 (zero for a missing b + 1): for Q8_0 w + 128 (w ^ 0x80).
template <TensorType kType>
inline __m512i codes64(const uint8_t* row, uint32_t b, bool pair) {
  __m256i lo, hi = _mm256_setzero_si256();
  if constexpr (kType == TensorType::kQ8_0) {
    const auto* w = reinterpret_cast<const BlockQ8_0*>(row);
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    lo = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs)), flip);
    if (pair) hi = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b + 1].qs)), flip);
  } else {
    lo = quant_simd::codes_u<kType>(row, b);
    if (pair) hi = quant_simd::codes_u<kType>(row, b + 1);
  }
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// Lanes 0..7: x0, lanes 8..15: x1.
inline __m512 pair_ps(float x0, float x1) {
  return _mm512_insertf32x8(_mm512_set1_ps(x0), _mm256_set1_ps(x1), 1);
}

// The offset taken off the unsigned codes, as a shift: 128 (Q8_0), 8 (Q4_0), 16 (Q5_0).
template <TensorType kType>
inline constexpr int kOffsetShift = kType == TensorType::kQ8_0   ? 7
                                    : kType == TensorType::kQ4_0 ? 3
                                    : kType == TensorType::kQ5_0 ? 4
                                                                 : 0;

template <TensorType kType, int R, int C>
inline void tile(const uint8_t* const* rows, const ActRow* act, uint32_t nb, float* c, size_t ldc) {
  __m512 acc[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < C; ++j) acc[r][j] = _mm512_setzero_ps();
  const __m512i ones8 = _mm512_set1_epi8(1);
  for (uint32_t b = 0; b < nb; b += 2) {
    const bool pair = b + 1 < nb;
    const __mmask16 lanes = pair ? 0xFFFF : 0x00FF;
    __m512i u[C];
    __m512 sw[C], sm[C];
#pragma GCC unroll 8
    for (int j = 0; j < C; ++j) {
      u[j] = codes64<kType>(rows[j], b, pair);
      const float d1 = pair ? half_to_float(scale32<kType>(rows[j], b + 1, false)) : 0.0f;
      sw[j] = pair_ps(half_to_float(scale32<kType>(rows[j], b, false)), d1);
      if constexpr (kAffine32<kType>) {
        const float m1 = pair ? half_to_float(scale32<kType>(rows[j], b + 1, true)) : 0.0f;
        sm[j] = pair_ps(half_to_float(scale32<kType>(rows[j], b, true)), m1);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512i a = pair ? _mm512_loadu_si512(act[r].qs + 32 * b)
                             : _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(act[r].qs + 32 * b)));
      const __m512i av = pair ? a : _mm512_inserti64x4(a, _mm256_setzero_si256(), 1);
      const __m512i s4 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones8, av);
      __m512i init = _mm512_setzero_si512();
      if constexpr (kOffsetShift<kType> != 0) init = _mm512_sub_epi32(init, _mm512_slli_epi32(s4, kOffsetShift<kType>));
      const __m512 sa = pair_ps(act[r].d[b], pair ? act[r].d[b + 1] : 0.0f);
      __m512 s4f;
      if constexpr (kAffine32<kType>) s4f = _mm512_cvtepi32_ps(s4);
#pragma GCC unroll 8
      for (int j = 0; j < C; ++j) {
        const __m512i p = _mm512_dpbusd_epi32(init, u[j], av);
        acc[r][j] = _mm512_mask3_fmadd_ps(_mm512_mul_ps(sw[j], sa), _mm512_cvtepi32_ps(p), acc[r][j], lanes);
        if constexpr (kAffine32<kType>)
          acc[r][j] = _mm512_mask3_fmadd_ps(_mm512_mul_ps(sm[j], sa), s4f, acc[r][j], lanes);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) {
      alignas(64) float l[16];
      _mm512_store_ps(l, acc[r][j]);
      c[r * ldc + j] = reduce16(l);
    }
}

// Rows [r0, m) of activations against the C weight rows at n: tiles of 4 rows, then the rest.
template <TensorType kType, int C>
inline void column(const QuantRows& a, uint32_t m, const QuantView& w, uint32_t n, float* c, size_t ldc) {
  const uint8_t* rows[C];
  for (int j = 0; j < C; ++j) rows[j] = w.data + size_t{n + j} * w.row_bytes;
  const uint32_t nb = w.k / 32;
  uint32_t r = 0;
  ActRow act[4];
  for (; r + 4 <= m; r += 4) {
    for (int i = 0; i < 4; ++i) act[i] = act_row(a, r + i);
    tile<kType, 4, C>(rows, act, nb, c + size_t{r} * ldc + n, ldc);
  }
  for (int i = 0; r + i < m; ++i) act[i] = act_row(a, r + i);
  switch (m - r) {
    case 3: tile<kType, 3, C>(rows, act, nb, c + size_t{r} * ldc + n, ldc); break;
    case 2: tile<kType, 2, C>(rows, act, nb, c + size_t{r} * ldc + n, ldc); break;
    case 1: tile<kType, 1, C>(rows, act, nb, c + size_t{r} * ldc + n, ldc); break;
    default: break;
  }
}

template <TensorType kType>
void qgemm32(const QuantRows& a, uint32_t m, const QuantView& w, uint32_t n0, uint32_t n1, float* c, size_t ldc) {
  uint32_t n = n0;
  for (; n + 4 <= n1; n += 4) column<kType, 4>(a, m, w, n, c, ldc);
  for (; n < n1; ++n) column<kType, 1>(a, m, w, n, c, ldc);
}

void qgemm(const QuantRows& a, uint32_t m, const QuantView& w, uint32_t n0, uint32_t n1, float* c, size_t ldc) {
  switch (static_cast<TensorType>(w.type)) {
    case TensorType::kQ8_0: return qgemm32<TensorType::kQ8_0>(a, m, w, n0, n1, c, ldc);
    case TensorType::kQ4_0: return qgemm32<TensorType::kQ4_0>(a, m, w, n0, n1, c, ldc);
    case TensorType::kQ5_0: return qgemm32<TensorType::kQ5_0>(a, m, w, n0, n1, c, ldc);
    case TensorType::kQ4_1: return qgemm32<TensorType::kQ4_1>(a, m, w, n0, n1, c, ldc);
    case TensorType::kQ5_1: return qgemm32<TensorType::kQ5_1>(a, m, w, n0, n1, c, ldc);
    default: return quant_simd::qgemm(a, m, w, n0, n1, c, ldc);
  }
}

}  // namespace quant512
}  // namespace
}  // namespace tandem::engine::kernels
