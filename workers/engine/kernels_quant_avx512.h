// AVX-512 VNNI tiles for the quantized types. 32-element types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1): R
// activation rows x C weight rows per pass over K, each weight block unpacked once for the R
// rows and each activation block loaded once for the C rows (decode: R = 1, C = 8). A zmm
// holds two blocks; vpdpbusd's int32 lane j of a block is its element group j (elements
// 4j..4j+3), so the lanes are exactly those of the scalar definition (kernels.h): the even
// block's groups in lanes 0..7, the odd one's in 8..15, and the same float fma per lane.
// Included only by kernels_avx512.cpp (compiled with -mavx512vnni).
#pragma once

#include <immintrin.h>

#include <vector>

#include "workers/engine/kernels_quant_simd.h"

namespace tandem::engine::kernels {
namespace {
namespace quant512 {

using model::TensorType;

// The 4-bit codes of two Q4_0-layout blocks (16 bytes each: low nibbles elements 0..15, high
// 16..31) as 64 bytes in element order: each block's bytes twice, shifted 0 and 4.
inline __m512i nibbles64(const uint8_t* qs0, const uint8_t* qs1) {
  const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs0));
  const __m128i q1 = qs1 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs1)) : _mm_setzero_si128();
  __m512i z = _mm512_inserti32x4(_mm512_zextsi128_si512(q0), q1, 2);
  z = _mm512_shuffle_i32x4(z, z, _MM_SHUFFLE(2, 2, 0, 0));
  z = _mm512_srlv_epi64(z, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
  return _mm512_and_si512(z, _mm512_set1_epi8(15));
}

// Unsigned codes of blocks b and b + 1 (zero for a missing b + 1): for Q8_0 w + 128 (w ^ 0x80);
// for the 5-bit types bit 4 of element j from bit j of qh, as a byte mask.
template <TensorType kType>
inline __m512i codes64(const uint8_t* row, uint32_t b, bool pair) {
  if constexpr (kType == TensorType::kQ8_0) {
    const auto* w = reinterpret_cast<const BlockQ8_0*>(row);
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    const __m256i lo = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs)), flip);
    __m256i hi = _mm256_setzero_si256();
    if (pair) hi = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b + 1].qs)), flip);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  } else {
    using B =
        std::conditional_t<kType == TensorType::kQ4_0, BlockQ4_0,
                           std::conditional_t<kType == TensorType::kQ4_1, BlockQ4_1,
                                              std::conditional_t<kType == TensorType::kQ5_0, BlockQ5_0, BlockQ5_1>>>;
    const B* w = reinterpret_cast<const B*>(row);
    const __m512i nib = nibbles64(w[b].qs, pair ? w[b + 1].qs : nullptr);
    if constexpr (kType == TensorType::kQ4_0 || kType == TensorType::kQ4_1) {
      return nib;
    } else {
      const uint64_t bits = qh32(w[b].qh) | (pair ? uint64_t{qh32(w[b + 1].qh)} << 32 : 0);
      return _mm512_or_si512(nib, _mm512_maskz_mov_epi8(_cvtu64_mask64(bits), _mm512_set1_epi8(0x10)));
    }
  }
}

// Lanes 0..7: x0, lanes 8..15: x1.
inline __m512 pair_ps(float x0, float x1) { return _mm512_insertf32x8(_mm512_set1_ps(x0), _mm256_set1_ps(x1), 1); }

// The offset taken off the unsigned codes, as a shift: 128 (Q8_0), 8 (Q4_0), 16 (Q5_0).
template <TensorType kType>
inline constexpr int kOffsetShift = kType == TensorType::kQ8_0   ? 7
                                    : kType == TensorType::kQ4_0 ? 3
                                    : kType == TensorType::kQ5_0 ? 4
                                                                 : 0;

// A pair of blocks of C weight rows, unpacked: the unsigned codes and the scales (and mins)
// of both blocks as lane vectors. Unpacking costs about as much as the dot products of a few
// activation rows, so for many rows each column tile is unpacked once into a cache (L1/L2)
// and every group of rows reads it from there: the same values, so the same results.
template <int C>
struct Unpacked32 {
  __m512i u[C];
  __m512 sw[C], sm[C];
};

template <TensorType kType, int C>
inline void unpack32(const uint8_t* const* rows, uint32_t b, bool pair, Unpacked32<C>& w) {
#pragma GCC unroll 8
  for (int j = 0; j < C; ++j) {
    w.u[j] = codes64<kType>(rows[j], b, pair);
    const float d1 = pair ? h2f(scale32<kType>(rows[j], b + 1, false)) : 0.0f;
    w.sw[j] = pair_ps(h2f(scale32<kType>(rows[j], b, false)), d1);
    if constexpr (kAffine32<kType>) {
      const float m1 = pair ? h2f(scale32<kType>(rows[j], b + 1, true)) : 0.0f;
      w.sm[j] = pair_ps(h2f(scale32<kType>(rows[j], b, true)), m1);
    }
  }
}

// R activation rows against C weight rows over all nb blocks. kCache: 0 unpack as it goes,
// 1 unpack and keep every pair in `cache`, 2 read the pairs from `cache`.
template <TensorType kType, int R, int C, int kCache>
inline void tile(const uint8_t* const* rows, const ActRow* act, uint32_t nb, float* c, size_t ldc,
                 Unpacked32<C>* cache) {
  __m512 acc[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < C; ++j) acc[r][j] = _mm512_setzero_ps();
  const __m512i ones8 = _mm512_set1_epi8(1);
  for (uint32_t b = 0; b < nb; b += 2) {
    const bool pair = b + 1 < nb;
    const __mmask16 lanes = pair ? 0xFFFF : 0x00FF;
    Unpacked32<C> local;
    const Unpacked32<C>* w = &local;
    if constexpr (kCache == 2) {
      w = &cache[b / 2];
    } else if constexpr (kCache == 1) {
      unpack32<kType, C>(rows, b, pair, cache[b / 2]);
      w = &cache[b / 2];
    } else {
      unpack32<kType, C>(rows, b, pair, local);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512i a =
          pair ? _mm512_loadu_si512(act[r].qs + 32 * b)
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
        const __m512i p = _mm512_dpbusd_epi32(init, w->u[j], av);
        acc[r][j] = _mm512_mask3_fmadd_ps(_mm512_mul_ps(w->sw[j], sa), _mm512_cvtepi32_ps(p), acc[r][j], lanes);
        if constexpr (kAffine32<kType>)
          acc[r][j] = _mm512_mask3_fmadd_ps(_mm512_mul_ps(w->sm[j], sa), s4f, acc[r][j], lanes);
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
// weights of the activation sums (see Unpacked32 for why it is cached).
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

// Rows [0, m) of activations against the C weight rows at n: tiles of 4 rows, then the rest.
// With more than one tile of rows, the weights are unpacked once (kCache).
template <TensorType kType, int C, bool kSuper>
inline void column(const QuantRows& a, uint32_t m, const QuantView& w, uint32_t n, float* c, size_t ldc) {
  const uint8_t* rows[C];
  for (int j = 0; j < C; ++j) rows[j] = w.data + size_t{n + j} * w.row_bytes;
  const uint32_t nb = w.k / (kSuper ? 256 : 32);
  using U = std::conditional_t<kSuper, UnpackedK<C>, Unpacked32<C>>;
  U* cache = m > 4 ? unpack_cache<U>(kSuper ? nb : (nb + 1) / 2) : nullptr;
  bool filled = false;
  uint32_t r = 0;
  ActRow act[4];
  auto run = [&]<int R>(float* out) {
    auto go = [&]<int kCache>() {
      if constexpr (kSuper) {
        k_tile<kType, R, C, kCache>(rows, act, nb, out, ldc, cache);
      } else {
        tile<kType, R, C, kCache>(rows, act, nb, out, ldc, cache);
      }
    };
    if (!cache) {
      go.template operator()<0>();
    } else if (!filled) {
      go.template operator()<1>();
      filled = true;
    } else {
      go.template operator()<2>();
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
  constexpr int C = 4;
  uint32_t n = n0;
  if constexpr (!kSuper) {  // decode: 8 weight rows share each activation block's preparation
    if (m < 4)
      for (; n + 8 <= n1; n += 8) column<kType, 8, kSuper>(a, m, w, n, c, ldc);
  }
  for (; n + C <= n1; n += C) column<kType, C, kSuper>(a, m, w, n, c, ldc);
  for (; n < n1; ++n) column<kType, 1, kSuper>(a, m, w, n, c, ldc);
}

void qgemm(const QuantRows& a, uint32_t m, const QuantView& w, uint32_t n0, uint32_t n1, float* c, size_t ldc) {
  dispatch_quant(w.type, [&]<TensorType kType>() { qgemm_tiled<kType>(a, m, w, n0, n1, c, ldc); });
}

}  // namespace quant512
}  // namespace
}  // namespace tandem::engine::kernels
