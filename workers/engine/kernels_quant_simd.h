// The quantized dot products (Kernels::qgemm) on the tiled weights with 256-bit integer SIMD
// (the AVX2 variant): 16 columns as two halves of 8. Integer sums are exact whatever the order
// (every partial fits its lane: maddubs pairs <= 2 * 128 * 127 since activation codes are in
// [-127, 127] and the unsigned codes below 64, Q8_0 by sign trick), and the float steps are the
// sequence of kernels_quant.h: so the result equals the scalar reference bit for bit.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <type_traits>

#include "workers/engine/kernels_quant.h"

namespace tandem::engine::kernels {
namespace {
namespace quant_simd {

using model::TensorType;

// 0x10 in byte j where bit j of a 32-bit word is set.
inline __m256i bit4_of(uint32_t bits) {
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), shuf);
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), _mm256_set1_epi8(0x10));
}

inline __m256i bcast4(const int8_t* a) {  // 4 activation codes into every 32-bit lane
  int32_t x;
  std::memcpy(&x, a, 4);
  return _mm256_set1_epi32(x);
}

// R activation rows against the 16 columns of tile column g (halves h: columns 8 h..8 h + 7),
// the chain of kernels.h; `cols` of the 16 are stored.
template <TensorType kType, int R>
inline void tiles32(const TiledSections& t, uint32_t g, const ActRow* act, float* c, size_t ldc, uint32_t cols) {
  const __m256i ones16 = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(15);
  const int offset = kType == TensorType::kQ8_0 ? 0 : code_offset(static_cast<uint32_t>(kType));
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (uint32_t b = 0; b < t.nb; ++b) {
    const size_t tile = size_t{g} * t.nb + b;
    const uint8_t* tc = t.codes + tile * t.code_bytes;
    __m256i p[R][2];
    for (int r = 0; r < R; ++r) p[r][0] = p[r][1] = _mm256_set1_epi32(-offset * sum32(act[r], b));
    for (int i = 0; i < 8; ++i) {
      for (int h = 0; h < 2; ++h) {
        if constexpr (kType == TensorType::kQ8_0) {  // signed weights: |w| x (a with w's sign)
          const __m256i w = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tc + 64 * i + 32 * h)),
                                             _mm256_set1_epi8(static_cast<char>(0x80)));
          const __m256i aw = _mm256_abs_epi8(w);
          for (int r = 0; r < R; ++r) {
            const __m256i av = _mm256_sign_epi8(bcast4(act[r].qs + 32 * b + 4 * i), w);
            p[r][h] = _mm256_add_epi32(p[r][h], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, av), ones16));
          }
        } else {
          const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tc + 64 * (i % 4) + 32 * h));
          __m256i u = _mm256_and_si256(i < 4 ? x : _mm256_srli_epi16(x, 4), m4);
          if (t.qh) u = _mm256_or_si256(u, bit4_of(static_cast<uint32_t>(t.qh[tile * 8 + i] >> (32 * h))));
          for (int r = 0; r < R; ++r) {
            const __m256i av = bcast4(act[r].qs + 32 * b + 4 * i);
            p[r][h] = _mm256_add_epi32(p[r][h], _mm256_madd_epi16(_mm256_maddubs_epi16(u, av), ones16));
          }
        }
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.d + tile * 16 + 8 * h)));
      __m256 mw = _mm256_setzero_ps();
      if (t.m) mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.m + tile * 16 + 8 * h)));
      for (int r = 0; r < R; ++r) {
        const __m256 da = _mm256_set1_ps(act[r].d[b]);
        acc[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(p[r][h]), acc[r][h]);
        if (t.m)
          acc[r][h] =
              _mm256_fmadd_ps(_mm256_mul_ps(mw, da), _mm256_set1_ps(static_cast<float>(sum32(act[r], b))), acc[r][h]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float out[16];
    _mm256_store_ps(out, acc[r][0]);
    _mm256_store_ps(out + 8, acc[r][1]);
    std::memcpy(c + r * ldc, out, cols * sizeof(float));
  }
}

template <TensorType kType>
void qgemm_tiles(const QuantRows& a, uint32_t m, const QuantView& w, uint32_t n0, uint32_t n1, float* c, size_t ldc) {
  const TiledSections t = tiled_sections(w);
  for (uint32_t n = n0; n < n1; n += kQuantTile) {
    const uint32_t cols = std::min(kQuantTile, n1 - n);
    uint32_t r = 0;
    ActRow act[2];
    for (; r + 2 <= m; r += 2) {
      act[0] = act_row(a, r), act[1] = act_row(a, r + 1);
      tiles32<kType, 2>(t, n / kQuantTile, act, c + size_t{r} * ldc + n, ldc, cols);
    }
    if (r < m) {
      act[0] = act_row(a, r);
      tiles32<kType, 1>(t, n / kQuantTile, act, c + size_t{r} * ldc + n, ldc, cols);
    }
  }
}

// The unsigned codes of dwords i and i + 4 of sub-block j, columns 8 h..8 h + 7, of a K-type tile.
template <TensorType kType>
inline void k_codes(const TiledSections& t, size_t tile, int j, int i, int h, __m256i& lo, __m256i& hi) {
  const __m256i m4 = _mm256_set1_epi8(15);
  const __m256i x =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.codes + tile * 2048 + 256 * j + 64 * i + 32 * h));
  lo = _mm256_and_si256(x, m4);
  hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
  if constexpr (kType == TensorType::kQ5_K) {
    const uint64_t* qh = t.qh + tile * 64 + 8 * j;
    lo = _mm256_or_si256(lo, bit4_of(static_cast<uint32_t>(qh[i] >> (32 * h))));
    hi = _mm256_or_si256(hi, bit4_of(static_cast<uint32_t>(qh[i + 4] >> (32 * h))));
  } else if constexpr (kType == TensorType::kQ6_K) {
    const uint8_t* q6h = t.q6h + tile * 1024 + 128 * j + 32 * h;
    const __m256i x30 = _mm256_set1_epi8(0x30);
    const __m256i y0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q6h));
    const __m256i y1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q6h + 64));
    const __m128i shift = _mm_cvtsi32_si128(2 * i);
    lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(_mm256_srl_epi16(y0, shift), 4), x30));
    hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(_mm256_srl_epi16(y1, shift), 4), x30));
  }
}

// One activation row against the 16 columns of K-type tile column g: per super-block the
// exact integer sums of kernels_quant.h (tiled_dot), then its float steps.
template <TensorType kType>
inline void tiles_k(const TiledSections& t, uint32_t g, const ActRow& a, float* c, uint32_t cols) {
  constexpr bool kQ6 = kType == TensorType::kQ6_K;
  const __m256i ones16 = _mm256_set1_epi16(1);
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (uint32_t b = 0; b < t.nb; ++b) {
    const size_t tile = size_t{g} * t.nb + b;
    const int8_t* q8 = a.qs + 256 * b;
    for (int h = 0; h < 2; ++h) {
      __m256i isum = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) {
        __m256i plo = _mm256_setzero_si256(), phi = _mm256_setzero_si256();
        if constexpr (kQ6) {  // the codes' offset 32, per group of 16
          plo = _mm256_set1_epi32(-32 * a.s16[16 * b + 2 * j]);
          phi = _mm256_set1_epi32(-32 * a.s16[16 * b + 2 * j + 1]);
        }
        for (int i = 0; i < 4; ++i) {
          __m256i lo, hi;
          k_codes<kType>(t, tile, j, i, h, lo, hi);
          plo = _mm256_add_epi32(plo, _mm256_madd_epi16(_mm256_maddubs_epi16(lo, bcast4(q8 + 32 * j + 4 * i)), ones16));
          phi = _mm256_add_epi32(phi,
                                 _mm256_madd_epi16(_mm256_maddubs_epi16(hi, bcast4(q8 + 32 * j + 16 + 4 * i)), ones16));
        }
        if constexpr (kQ6) {
          const uint8_t* sc = t.sc + tile * 256 + 8 * h;
          const __m256i slo = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 32 * j)));
          const __m256i shi = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 32 * j + 16)));
          isum = _mm256_add_epi32(isum, _mm256_add_epi32(_mm256_mullo_epi32(plo, slo), _mm256_mullo_epi32(phi, shi)));
        } else {
          const __m256i sc = _mm256_cvtepu8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(t.sc + tile * 128 + 16 * j + 8 * h)));
          isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(_mm256_add_epi32(plo, phi), sc));
        }
      }
      const __m256 da = _mm256_set1_ps(a.d[b]);
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.d + tile * 16 + 8 * h)));
      acc[h] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(isum), acc[h]);
      if constexpr (!kQ6) {  // the mins: sum_j m_j * (sum of a under sub-block j), as int16 pairs
        __m256i msum = _mm256_setzero_si256();
        for (int k = 0; k < 4; ++k) {
          const __m256i mk = _mm256_cvtepu8_epi16(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(t.mk + tile * 128 + 32 * k + 16 * h)));
          const uint32_t pair = static_cast<uint16_t>(sum32(a, 8 * b + 2 * k)) |
                                uint32_t{static_cast<uint16_t>(sum32(a, 8 * b + 2 * k + 1))} << 16;
          msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mk, _mm256_set1_epi32(static_cast<int>(pair))));
        }
        const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.m + tile * 16 + 8 * h)));
        acc[h] = _mm256_fnmadd_ps(_mm256_mul_ps(dm, da), _mm256_cvtepi32_ps(msum), acc[h]);
      }
    }
  }
  alignas(32) float out[16];
  _mm256_store_ps(out, acc[0]);
  _mm256_store_ps(out + 8, acc[1]);
  std::memcpy(c, out, cols * sizeof(float));
}

template <TensorType kType>
void qgemm_type(const QuantRows& a, uint32_t m, const QuantView& w, uint32_t n0, uint32_t n1, float* c, size_t ldc) {
  if constexpr (kType != TensorType::kQ4_K && kType != TensorType::kQ5_K && kType != TensorType::kQ6_K) {
    qgemm_tiles<kType>(a, m, w, n0, n1, c, ldc);
  } else {
    const TiledSections t = tiled_sections(w);
    for (uint32_t n = n0; n < n1; n += kQuantTile)
      for (uint32_t r = 0; r < m; ++r)
        tiles_k<kType>(t, n / kQuantTile, act_row(a, r), c + size_t{r} * ldc + n, std::min(kQuantTile, n1 - n));
  }
}

void qgemm(const QuantRows& a, uint32_t m, const QuantView& w, uint32_t n0, uint32_t n1, float* c, size_t ldc) {
  dispatch_quant(w.type, [&]<TensorType kType>() { qgemm_type<kType>(a, m, w, n0, n1, c, ldc); });
}

}  // namespace quant_simd
}  // namespace
}  // namespace tandem::engine::kernels
