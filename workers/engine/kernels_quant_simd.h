// The quantized dot products (Kernels::qgemm) with 256-bit integer SIMD: compiled into the
// AVX2 and the AVX-512 translation units (each its own copy, anonymous namespace). Integer
// sums are exact whatever the order (every partial fits its lane: maddubs pairs <= 2 * 128 *
// 127, since activation codes are in [-127, 127]), and the float steps are the sequence of
// kernels_quant.h: so every variant's result equals the scalar reference bit for bit.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <type_traits>

#include "workers/engine/kernels_quant.h"

namespace tandem::engine::kernels {
namespace {
namespace quant_simd {

using model::TensorType;

inline __m256i dot32(__m256i u, const int8_t* a) {  // 8 int32 partial sums of u (unsigned) x a
  const __m256i p = _mm256_maddubs_epi16(u, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}
// As dot32, each pair of 16-bit products scaled by its lane of sc16 first.
inline __m256i dot32_scaled(__m256i u, const int8_t* a, __m256i sc16) {
  const __m256i p = _mm256_maddubs_epi16(u, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
  return _mm256_madd_epi16(p, sc16);
}
inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}
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

// Q4_K / Q5_K super-block b: sum_j sc_j * (sum over sub-block j of q * a).
template <TensorType kType>
inline int32_t k_isum(const uint8_t* row, uint32_t b, const int8_t* q8) {
  using B = std::conditional_t<kType == TensorType::kQ4_K, BlockQ4_K, BlockQ5_K>;
  const B& w = reinterpret_cast<const B*>(row)[b];
  const __m256i m4 = _mm256_set1_epi8(15);
  __m256i qh = _mm256_setzero_si256();
  if constexpr (kType == TensorType::kQ5_K) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qh));
  __m256i acc = _mm256_setzero_si256();
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs + 32 * c));
    __m256i lo = _mm256_and_si256(x, m4), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
    if constexpr (kType == TensorType::kQ5_K) {
      const __m256i bl = _mm256_set1_epi8(static_cast<char>(1 << (2 * c)));
      const __m256i bh = _mm256_set1_epi8(static_cast<char>(1 << (2 * c + 1)));
      const __m256i x10 = _mm256_set1_epi8(0x10);
      lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bl), bl), x10));
      hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bh), bh), x10));
    }
    uint8_t sl, sh, m;
    model::k_scale_min(2 * c, w.scales, sl, m);
    model::k_scale_min(2 * c + 1, w.scales, sh, m);
    acc = _mm256_add_epi32(acc, dot32_scaled(lo, q8 + 64 * c, _mm256_set1_epi16(sl)));
    acc = _mm256_add_epi32(acc, dot32_scaled(hi, q8 + 64 * c + 32, _mm256_set1_epi16(sh)));
  }
  return hsum(acc);
}

// Q6_K super-block b: sum_g sc_g * (sum over the 16 elements of g of (q - 32) * a).
inline int32_t q6_isum(const uint8_t* row, uint32_t b, const ActRow& a) {
  const BlockQ6_K& w = reinterpret_cast<const BlockQ6_K*>(row)[b];
  const int8_t* q8 = a.qs + 256 * b;
  const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
  __m256i acc = _mm256_setzero_si256();
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qh + 32 * h));
    const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.ql + 64 * h));
    const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.ql + 64 * h + 32));
    const __m256i lo[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4),
                           _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                           _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), m2);
      const __m256i q = _mm256_or_si256(lo[k], _mm256_slli_epi16(hb, 4));
      const int g = 8 * h + 2 * k;
      const __m256i sc = _mm256_set_m128i(_mm_set1_epi16(w.scales[g + 1]), _mm_set1_epi16(w.scales[g]));
      acc = _mm256_add_epi32(acc, dot32_scaled(q, q8 + 128 * h + 32 * k, sc));
    }
  }
  int32_t off = 0;
  for (int g = 0; g < 16; ++g) off += int32_t{w.scales[g]} * a.s16[16 * b + g];
  return hsum(acc) - 32 * off;
}

template <TensorType kType>
inline float row_dot256(const uint8_t* row, uint32_t nb, const ActRow& a) {
  float lanes[16] = {};
  for (uint32_t b = 0; b < nb; ++b) {
    if constexpr (kType == TensorType::kQ6_K) {
      const BlockQ6_K& w = reinterpret_cast<const BlockQ6_K*>(row)[b];
      lanes[b % 8] = std::fma(h2f(w.d) * a.d[b], static_cast<float>(q6_isum(row, b, a)), lanes[b % 8]);
    } else {
      using B = std::conditional_t<kType == TensorType::kQ4_K, BlockQ4_K, BlockQ5_K>;
      const B& w = reinterpret_cast<const B*>(row)[b];
      k_lane(w, a.d[b], k_isum<kType>(row, b, a.qs + 256 * b), k_min_sum(w, a, b), lanes[b % 8]);
    }
  }
  return reduce16(lanes);
}

template <TensorType kType>
void qgemm_type(const QuantRows& a, uint32_t m, const QuantView& w, uint32_t n0, uint32_t n1, float* c, size_t ldc) {
  if constexpr (kType != TensorType::kQ4_K && kType != TensorType::kQ5_K && kType != TensorType::kQ6_K) {
    qgemm_tiles<kType>(a, m, w, n0, n1, c, ldc);
  } else {
    const uint32_t nb = w.k / 256;
    for (uint32_t n = n0; n < n1; ++n) {
      const uint8_t* row = w.data + size_t{n} * w.row_bytes;
      if (n + 1 < n1) {  // the next row, while this one computes: another stream for the prefetcher
        const char* next = reinterpret_cast<const char*>(row + w.row_bytes);
        for (size_t line = 0; line < w.row_bytes; line += 64) _mm_prefetch(next + line, _MM_HINT_T0);
      }
      for (uint32_t r = 0; r < m; ++r) c[size_t{r} * ldc + n] = row_dot256<kType>(row, nb, act_row(a, r));
    }
  }
}

void qgemm(const QuantRows& a, uint32_t m, const QuantView& w, uint32_t n0, uint32_t n1, float* c, size_t ldc) {
  dispatch_quant(w.type, [&]<TensorType kType>() { qgemm_type<kType>(a, m, w, n0, n1, c, ldc); });
}

}  // namespace quant_simd
}  // namespace
}  // namespace tandem::engine::kernels
