// AVX-512 VNNI kernels for the quantized types. 32-element types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1),
// tiled at load (kernels.h): a zmm holds one 4-element group of 16 output columns, so vpdpbusd
// against the group's 4 activation codes broadcast gives each column's partial sum in its own
// lane, and one float fma per block and 16 columns follows: R activation rows x G tile columns
// per pass (decode: 1 x 4, else 4 x 2). K types: 4 rows x 4 weight rows per pass from the file's
// blocks. Included only by kernels_avx512.cpp (compiled with -mavx512vnni).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "workers/engine/kernels_quant_simd.h"

namespace tandem::engine::kernels {
namespace {
namespace quant512 {

using model::TensorType;

// R activation rows against G tile columns (16 output columns each) from tile column g, over
// every block: per block, 8 vpdpbusd per (row, tile column), the 4 activation codes of each
// group broadcast from memory, then one float step per 16 columns (kernels.h's chain, a lane
// per column). The codes are unsigned; the offset comes off through the integer sum's start
// value (-offset * sum of a), so the sums are the exact signed ones. `cols` of the last tile
// column's 16 are stored.
template <TensorType kType, int R, int G>
inline void tiles32(const TiledSections& t, uint32_t g, const ActRow* act, float* c, size_t ldc, uint32_t cols) {
  constexpr bool kQ5 = kType == TensorType::kQ5_0 || kType == TensorType::kQ5_1;
  constexpr bool kAffine = kType == TensorType::kQ4_1 || kType == TensorType::kQ5_1;
  const int offset = code_offset(static_cast<uint32_t>(kType));
  const __m512i m4 = _mm512_set1_epi8(15), x10 = _mm512_set1_epi8(0x10);
  __m512 acc[R][G];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < G; ++j) acc[r][j] = _mm512_setzero_ps();
  for (uint32_t b = 0; b < t.nb; ++b) {
    size_t tile[G];
    for (int j = 0; j < G; ++j) tile[j] = size_t{g + j} * t.nb + b;
    __m512i p[R][G];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512i init = _mm512_set1_epi32(-offset * sum32(act[r], b));
#pragma GCC unroll 4
      for (int j = 0; j < G; ++j) p[r][j] = init;
    }
    auto dot = [&](int i, const __m512i* wv) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        int32_t a4;
        std::memcpy(&a4, act[r].qs + 32 * b + 4 * i, 4);
        const __m512i av = _mm512_set1_epi32(a4);
#pragma GCC unroll 4
        for (int j = 0; j < G; ++j) p[r][j] = _mm512_dpbusd_epi32(p[r][j], wv[j], av);
      }
    };
    if constexpr (kType == TensorType::kQ8_0) {
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {
        __m512i wv[G];
        for (int j = 0; j < G; ++j) wv[j] = _mm512_loadu_si512(t.codes + tile[j] * 512 + 64 * i);
        dot(i, wv);
      }
    } else {
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        __m512i lo[G], hi[G];
        for (int j = 0; j < G; ++j) {
          const __m512i x = _mm512_loadu_si512(t.codes + tile[j] * 256 + 64 * i);
          lo[j] = _mm512_and_si512(x, m4);
          hi[j] = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
          if constexpr (kQ5) {
            lo[j] = _mm512_mask_or_epi32(lo[j], 0xFFFF, lo[j],
                                         _mm512_maskz_mov_epi8(_cvtu64_mask64(t.qh[tile[j] * 8 + i]), x10));
            hi[j] = _mm512_mask_or_epi32(hi[j], 0xFFFF, hi[j],
                                         _mm512_maskz_mov_epi8(_cvtu64_mask64(t.qh[tile[j] * 8 + i + 4]), x10));
          }
        }
        dot(i, lo);
        dot(i + 4, hi);
      }
    }
    __m512 dw[G], mw[G];
    for (int j = 0; j < G; ++j) {
      dw[j] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.d + tile[j] * 16)));
      if constexpr (kAffine)
        mw[j] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.m + tile[j] * 16)));
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512 da = _mm512_set1_ps(act[r].d[b]);
#pragma GCC unroll 4
      for (int j = 0; j < G; ++j) {
        acc[r][j] = _mm512_fmadd_ps(_mm512_mul_ps(dw[j], da), _mm512_cvtepi32_ps(p[r][j]), acc[r][j]);
        if constexpr (kAffine)
          acc[r][j] = _mm512_fmadd_ps(_mm512_mul_ps(mw[j], da), _mm512_set1_ps(static_cast<float>(sum32(act[r], b))),
                                      acc[r][j]);
      }
    }
  }
  const __mmask16 last = cols >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << cols) - 1);
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < G; ++j) _mm512_mask_storeu_ps(c + r * ldc + 16 * j, j + 1 < G ? 0xFFFF : last, acc[r][j]);
}

// Rows [0, m) in tiles of 4 (then the rest) against G tile columns from column n.
template <TensorType kType, int G>
inline void tile_columns(const TiledSections& t, const QuantRows& a, uint32_t m, uint32_t n, float* c, size_t ldc,
                         uint32_t cols) {
  const uint32_t g = n / kQuantTile;
  ActRow act[4];
  uint32_t r = 0;
  for (; r + 4 <= m; r += 4) {
    for (int i = 0; i < 4; ++i) act[i] = act_row(a, r + i);
    tiles32<kType, 4, G>(t, g, act, c + size_t{r} * ldc + n, ldc, cols);
  }
  for (int i = 0; r + i < m; ++i) act[i] = act_row(a, r + i);
  float* out = c + size_t{r} * ldc + n;
  switch (m - r) {
    case 3: tiles32<kType, 3, G>(t, g, act, out, ldc, cols); break;
    case 2: tiles32<kType, 2, G>(t, g, act, out, ldc, cols); break;
    case 1: tiles32<kType, 1, G>(t, g, act, out, ldc, cols); break;
    default: break;
  }
}

// Columns [n0, n1) (n0 a multiple of kQuantTile): 4 tile columns at a time for one row
// (decode), else 2, then what is left one at a time.
template <TensorType kType>
void qgemm_tiles(const QuantRows& a, uint32_t m, const QuantView& w, uint32_t n0, uint32_t n1, float* c, size_t ldc) {
  const TiledSections t = tiled_sections(w);
  uint32_t n = n0;
  if (m == 1)
    for (; n + 4 * kQuantTile <= n1; n += 4 * kQuantTile) tile_columns<kType, 4>(t, a, m, n, c, ldc, kQuantTile);
  for (; n + 2 * kQuantTile <= n1; n += 2 * kQuantTile) tile_columns<kType, 2>(t, a, m, n, c, ldc, kQuantTile);
  for (; n < n1; n += kQuantTile) tile_columns<kType, 1>(t, a, m, n, c, ldc, std::min(kQuantTile, n1 - n));
}

// The K types, 4 rows x 2 weight rows per pass: chunk ch (64 elements, 64 ch..64 ch + 63) of
// super-block b as 64 unsigned codes in element order, and the scale of each element pair as
// 32 int16 (what vpdpwssd multiplies maddubs' pair sums by). Integer sums per super-block are
// exact, then reduced and combined exactly as kernels_quant.h does.
template <TensorType kType>
inline void k_chunk(const uint8_t* row, uint32_t b, int ch, const int16_t* scales, __m512i& u, __m512i& sc16) {
  __m128i s;  // the chunk's scales as int16, in lanes 0.. (2 for Q4_K/Q5_K, 4 for Q6_K)
  __m512i idx;
  if constexpr (kType == TensorType::kQ6_K) {
    const BlockQ6_K& w = reinterpret_cast<const BlockQ6_K*>(row)[b];
    const int h = ch / 2, nib = ch % 2;
    const __m512i ql = _mm512_loadu_si512(w.ql + 64 * h);
    const __m512i lo = _mm512_and_si512(nib ? _mm512_srli_epi16(ql, 4) : ql, _mm512_set1_epi8(15));
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qh + 32 * h)));
    const __m512i shift = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(4 * nib)),
                                             _mm256_set1_epi16(static_cast<short>(4 * nib + 2)), 1);
    const __m512i hb = _mm512_and_si512(_mm512_srlv_epi16(qh, shift), _mm512_set1_epi8(3));
    u = _mm512_or_si512(lo, _mm512_slli_epi16(hb, 4));
    s = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales + 4 * ch));
    idx = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0,
                           0);
  } else {
    using B = std::conditional_t<kType == TensorType::kQ4_K, BlockQ4_K, BlockQ5_K>;
    const B& w = reinterpret_cast<const B*>(row)[b];
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs + 32 * ch));
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256i lo = _mm256_and_si256(x, m4), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
    if constexpr (kType == TensorType::kQ5_K) {
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qh));
      const __m256i bl = _mm256_set1_epi8(static_cast<char>(1 << (2 * ch)));
      const __m256i bh = _mm256_set1_epi8(static_cast<char>(1 << (2 * ch + 1)));
      const __m256i x10 = _mm256_set1_epi8(0x10);
      lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bl), bl), x10));
      hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bh), bh), x10));
    }
    u = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    int32_t pair;  // sc_{2 ch} and sc_{2 ch + 1}
    std::memcpy(&pair, scales + 2 * ch, sizeof pair);
    s = _mm_cvtsi32_si128(pair);
    idx = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(1), 1);
  }
  sc16 = _mm512_permutexvar_epi16(idx, _mm512_castsi128_si512(s));
}

// A super-block's scales as int16 (Q4_K/Q5_K: sc_j in 0..7; Q6_K: sc_g in 0..15) and the
// weights of the 16 activation sums of 16 (Q4_K/Q5_K: m_{g/2}; Q6_K: sc_g), each once per tile.
template <TensorType kType>
inline void k_scales(const uint8_t* row, uint32_t b, int16_t* sc, int16_t* sum_w) {
  if constexpr (kType == TensorType::kQ6_K) {
    const BlockQ6_K& w = reinterpret_cast<const BlockQ6_K*>(row)[b];
    for (int g = 0; g < 16; ++g) sc[g] = sum_w[g] = w.scales[g];
  } else {
    using B = std::conditional_t<kType == TensorType::kQ4_K, BlockQ4_K, BlockQ5_K>;
    const B& w = reinterpret_cast<const B*>(row)[b];
    // model::k_scale_min for all 8 sub-blocks at once (ggml's word trick): bytes 0..7 of u
    // become the scales, bytes 8..15 the mins.
    uint32_t u[4];
    std::memcpy(u, w.scales, 12);
    constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
    u[3] = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);
    const uint32_t mins_lo = u[1] & kLow6;
    u[1] = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);
    u[2] = mins_lo;
    u[0] &= kLow6;
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(sc), _mm_cvtepu8_epi16(bytes));
    const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(bytes, 8));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(sum_w), _mm_unpacklo_epi16(mins, mins));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(sum_w + 8), _mm_unpackhi_epi16(mins, mins));
  }
}

inline int32_t hsum256(__m256i v) { return quant_simd::hsum(v); }

// A super-block of C weight rows, unpacked: each chunk's codes and pair scales, and the
// weights of the activation sums. Unpacking costs about as much as the dot products of a few
// activation rows, so for many rows each column tile is unpacked once into a cache (L1/L2)
// and every group of rows reads it from there: the same values, so the same results.
template <int C>
struct UnpackedK {
  __m512i u[4][C], scv[4][C];
  alignas(32) int16_t sum_w[C][16];
  alignas(64) float d[C], dmin[C];  // the super-block's scales, widened
};

template <TensorType kType, int C>
inline void unpack_k(const uint8_t* const* rows, uint32_t b, UnpackedK<C>& w) {
  alignas(32) int16_t sc[C][16];
  for (int j = 0; j < C; ++j) {
    k_scales<kType>(rows[j], b, sc[j], w.sum_w[j]);
    if constexpr (kType == TensorType::kQ6_K) {
      w.d[j] = h2f(reinterpret_cast<const BlockQ6_K*>(rows[j])[b].d);
      w.dmin[j] = 0.0f;
    } else {
      using B = std::conditional_t<kType == TensorType::kQ4_K, BlockQ4_K, BlockQ5_K>;
      w.d[j] = h2f(reinterpret_cast<const B*>(rows[j])[b].d);
      w.dmin[j] = h2f(reinterpret_cast<const B*>(rows[j])[b].dmin);
    }
  }
#pragma GCC unroll 4
  for (int ch = 0; ch < 4; ++ch)
#pragma GCC unroll 4
    for (int j = 0; j < C; ++j) k_chunk<kType>(rows[j], b, ch, sc[j], w.u[ch][j], w.scv[ch][j]);
}

// The sums of 16 vectors of int32, as one vector (element e: the sum of v[e]). Integer adds,
// so exact in any order.
inline __m512i hsum16x16(const __m512i* v) {
  __m512i w[8], x[4];
  for (int i = 0; i < 8; ++i)
    w[i] =
        _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)
    x[i] =
        _mm512_add_epi32(_mm512_unpacklo_epi64(w[2 * i], w[2 * i + 1]), _mm512_unpackhi_epi64(w[2 * i], w[2 * i + 1]));
  const __m512i y0 = _mm512_add_epi32(_mm512_shuffle_i32x4(x[0], x[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                      _mm512_shuffle_i32x4(x[0], x[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i y1 = _mm512_add_epi32(_mm512_shuffle_i32x4(x[2], x[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                      _mm512_shuffle_i32x4(x[2], x[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_epi32(_mm512_shuffle_i32x4(y0, y1, _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i32x4(y0, y1, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Per element e = 4 r + j of a 4 x 4 tile: per_j[j] and the activation rows' scales.
inline __m512 by_column(const float* per_j) { return _mm512_broadcast_f32x4(_mm_load_ps(per_j)); }
inline __m512 by_row(const ActRow* act, uint32_t b) {
  const __m128 d = _mm_setr_ps(act[0].d[b], act[1].d[b], act[2].d[b], act[3].d[b]);
  const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(d));
}

// A super-block's combination (kernels.h) for the 16 (row, column) pairs of a 4 x 4 tile at once:
// the same integer sums and the same float operations per pair as the scalar code.
template <TensorType kType, int R, int C>
inline void k_combine16(const __m512i (&acc)[R][C], const UnpackedK<C>& w, const ActRow* act, uint32_t b,
                        __m512& lane) {
  __m512i sums[16], wsums[16];
  for (int r = 0; r < R; ++r) {
    const __m512i s16 =
        _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(act[r].s16 + 16 * b)));
    for (int j = 0; j < C; ++j) {
      sums[r * C + j] = acc[r][j];
      const __m512i sw = _mm512_zextsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(w.sum_w[j])));
      wsums[r * C + j] = _mm512_madd_epi16(sw, s16);
    }
  }
  const __m512i isum = hsum16x16(sums), wsum = hsum16x16(wsums);
  const __m512 da = by_row(act, b);
  const __m512 d = _mm512_mul_ps(by_column(w.d), da);
  if constexpr (kType == TensorType::kQ6_K) {
    lane = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(isum, _mm512_slli_epi32(wsum, 5))), lane);
  } else {
    lane = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(isum), lane);
    lane = _mm512_fnmadd_ps(_mm512_mul_ps(by_column(w.dmin), da), _mm512_cvtepi32_ps(wsum), lane);
  }
}

// kCache as tile().
template <TensorType kType, int R, int C, int kCache>
inline void k_tile(const uint8_t* const* rows, const ActRow* act, uint32_t nb, float* c, size_t ldc,
                   UnpackedK<C>* cache) {
  constexpr bool kVector = R == 4 && C == 4;
  float lanes[R][C][16] = {};
  __m512 vlanes[8];  // kVector: lane i of every (row, column) pair, element r C + j
  for (__m512& v : vlanes) v = _mm512_setzero_ps();
  for (uint32_t b = 0; b < nb; ++b) {
    UnpackedK<C> local;
    const UnpackedK<C>* w = &local;
    if constexpr (kCache == 2) {
      w = &cache[b];
    } else if constexpr (kCache == 1) {
      unpack_k<kType, C>(rows, b, cache[b]);
      w = &cache[b];
    } else {
      unpack_k<kType, C>(rows, b, local);
    }
    __m512i acc[R][C];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int j = 0; j < C; ++j) acc[r][j] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int ch = 0; ch < 4; ++ch) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m512i a = _mm512_loadu_si512(act[r].qs + 256 * b + 64 * ch);
#pragma GCC unroll 4
        for (int j = 0; j < C; ++j)
          acc[r][j] = _mm512_dpwssd_epi32(acc[r][j], _mm512_maddubs_epi16(w->u[ch][j], a), w->scv[ch][j]);
      }
    }
    if constexpr (kVector) {
      k_combine16<kType, R, C>(acc, *w, act, b, vlanes[b % 8]);
      continue;
    }
    for (int r = 0; r < R; ++r) {
      const __m256i s16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(act[r].s16 + 16 * b));
      for (int j = 0; j < C; ++j) {
        const int32_t isum = _mm512_reduce_add_epi32(acc[r][j]);
        const int32_t wsum =
            hsum256(_mm256_madd_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(w->sum_w[j])), s16));
        float& l = lanes[r][j][b % 8];
        if constexpr (kType == TensorType::kQ6_K) {
          const BlockQ6_K& wb = reinterpret_cast<const BlockQ6_K*>(rows[j])[b];
          l = std::fma(h2f(wb.d) * act[r].d[b], static_cast<float>(isum - 32 * wsum), l);
        } else {
          using B = std::conditional_t<kType == TensorType::kQ4_K, BlockQ4_K, BlockQ5_K>;
          k_lane(reinterpret_cast<const B*>(rows[j])[b], act[r].d[b], isum, wsum, l);
        }
      }
    }
  }
  if constexpr (kVector) {
    alignas(64) float v[8][16];
    for (int i = 0; i < 8; ++i) _mm512_store_ps(v[i], vlanes[i]);
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < C; ++j)
        for (int i = 0; i < 8; ++i) lanes[r][j][i] = v[i][r * C + j];
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) c[r * ldc + j] = reduce16(lanes[r][j]);
}

// The unpacked blocks of one column tile, per thread: grown to the longest K seen (once, at
// the first steps), never per step after that.
template <class U>
inline U* unpack_cache(uint32_t units) {
  thread_local std::vector<U> cache;
  if (cache.size() < units) cache.resize(units);
  return cache.data();
}

// Rows [0, m) of activations against the C K-type weight rows at n: tiles of 4 rows, then the
// rest. With more than one tile of rows, the weights are unpacked once (kCache).
template <TensorType kType, int C>
inline void column(const QuantRows& a, uint32_t m, const QuantView& w, uint32_t n, float* c, size_t ldc) {
  const uint8_t* rows[C];
  for (int j = 0; j < C; ++j) rows[j] = w.data + size_t{n + j} * w.row_bytes;
  const uint32_t nb = w.k / 256;
  UnpackedK<C>* cache = m > 4 ? unpack_cache<UnpackedK<C>>(nb) : nullptr;
  bool filled = false;
  uint32_t r = 0;
  ActRow act[4];
  auto run = [&]<int R>(float* out) {
    if (!cache) {
      k_tile<kType, R, C, 0>(rows, act, nb, out, ldc, cache);
    } else if (!filled) {
      k_tile<kType, R, C, 1>(rows, act, nb, out, ldc, cache);
      filled = true;
    } else {
      k_tile<kType, R, C, 2>(rows, act, nb, out, ldc, cache);
    }
  };
  for (; r + 4 <= m; r += 4) {
    for (int i = 0; i < 4; ++i) act[i] = act_row(a, r + i);
    run.template operator()<4>(c + size_t{r} * ldc + n);
  }
  for (int i = 0; r + i < m; ++i) act[i] = act_row(a, r + i);
  float* out = c + size_t{r} * ldc + n;
  switch (m - r) {
    case 3: run.template operator()<3>(out); break;
    case 2: run.template operator()<2>(out); break;
    case 1: run.template operator()<1>(out); break;
    default: break;
  }
}

template <TensorType kType>
void qgemm_tiled(const QuantRows& a, uint32_t m, const QuantView& w, uint32_t n0, uint32_t n1, float* c, size_t ldc) {
  constexpr bool kSuper = kType == TensorType::kQ4_K || kType == TensorType::kQ5_K || kType == TensorType::kQ6_K;
  if constexpr (!kSuper) {
    qgemm_tiles<kType>(a, m, w, n0, n1, c, ldc);
  } else {
    constexpr int C = 4;
    uint32_t n = n0;
    for (; n + C <= n1; n += C) column<kType, C>(a, m, w, n, c, ldc);
    for (; n < n1; ++n) column<kType, 1>(a, m, w, n, c, ldc);
  }
}

void qgemm(const QuantRows& a, uint32_t m, const QuantView& w, uint32_t n0, uint32_t n1, float* c, size_t ldc) {
  dispatch_quant(w.type, [&]<TensorType kType>() { qgemm_tiled<kType>(a, m, w, n0, n1, c, ldc); });
}

}  // namespace quant512
}  // namespace
}  // namespace tandem::engine::kernels
