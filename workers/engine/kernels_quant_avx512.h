// AVX-512 VNNI kernels for the quantized types. 32-element types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1),
// tiled at load (kernels.h): a zmm holds one 4-element group of 16 output columns, so vpdpbusd
// against the group's 4 activation codes broadcast gives each column's partial sum in its own
// lane, and one float fma per block and 16 columns follows: R activation rows x G tile columns
// per pass (decode: 1 x 4, else 4 x 2). K types the same way, a super-block's sub-block sums
// scaled by vpmulld into an exact integer sum per lane before its float steps.
// Included only by kernels_avx512.cpp (compiled with -mavx512vnni).
#pragma once

#include <immintrin.h>

#include <algorithm>

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

// The unsigned codes of dwords i and i + 4 of sub-block j of a K-type tile (16 columns).
template <TensorType kType, int i>
inline void k_codes(const TiledSections& t, size_t tile, int j, const __m512i* q6h, __m512i& lo, __m512i& hi) {
  const __m512i m4 = _mm512_set1_epi8(15), x10 = _mm512_set1_epi8(0x10), x30 = _mm512_set1_epi8(0x30);
  const __m512i x = _mm512_loadu_si512(t.codes + tile * 2048 + 256 * j + 64 * i);
  lo = _mm512_and_si512(x, m4);
  hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
  if constexpr (kType == TensorType::kQ5_K) {
    const uint64_t* qh = t.qh + tile * 64 + 8 * j;
    lo = _mm512_or_si512(lo, _mm512_maskz_mov_epi8(_cvtu64_mask64(qh[i]), x10));
    hi = _mm512_or_si512(hi, _mm512_maskz_mov_epi8(_cvtu64_mask64(qh[i + 4]), x10));
  } else if constexpr (kType == TensorType::kQ6_K) {  // bits 2 i, 2 i + 1 of each byte to bits 4, 5
    auto bits = [&](__m512i y) {
      if constexpr (i < 2) return _mm512_and_si512(_mm512_slli_epi16(y, 4 - 2 * i), x30);
      if constexpr (i == 2) return _mm512_and_si512(y, x30);
      return _mm512_and_si512(_mm512_srli_epi16(y, 2), x30);
    };
    lo = _mm512_or_si512(lo, bits(q6h[0]));
    hi = _mm512_or_si512(hi, bits(q6h[1]));
  }
}

// R activation rows against G K-type tile columns from g: per super-block the exact integer
// sums of kernels_quant.h (tiled_dot) per (row, column) lane, then its float steps.
template <TensorType kType, int R, int G>
inline void tiles_k(const TiledSections& t, uint32_t g, const ActRow* act, float* c, size_t ldc, uint32_t cols) {
  constexpr bool kQ6 = kType == TensorType::kQ6_K;
  __m512 acc[R][G];
  for (int r = 0; r < R; ++r)
    for (int jg = 0; jg < G; ++jg) acc[r][jg] = _mm512_setzero_ps();
  for (uint32_t b = 0; b < t.nb; ++b) {
    size_t tile[G];
    for (int jg = 0; jg < G; ++jg) tile[jg] = size_t{g + jg} * t.nb + b;
    __m512i isum[R][G];
    for (int r = 0; r < R; ++r)
      for (int jg = 0; jg < G; ++jg) isum[r][jg] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      __m512i plo[R][G], phi[R][G];
      for (int r = 0; r < R; ++r) {
        // Q6_K: the codes' offset 32 per group of 16 (2 j and 2 j + 1) through the start values.
        const __m512i lo0 = kQ6 ? _mm512_set1_epi32(-32 * act[r].s16[16 * b + 2 * j]) : _mm512_setzero_si512();
        const __m512i hi0 = kQ6 ? _mm512_set1_epi32(-32 * act[r].s16[16 * b + 2 * j + 1]) : _mm512_setzero_si512();
        for (int jg = 0; jg < G; ++jg) plo[r][jg] = lo0, phi[r][jg] = hi0;
      }
      __m512i q6h[G][2];
      if constexpr (kQ6)
        for (int jg = 0; jg < G; ++jg)
          for (int h = 0; h < 2; ++h) q6h[jg][h] = _mm512_loadu_si512(t.q6h + tile[jg] * 1024 + 128 * j + 64 * h);
      auto step = [&]<int i>() {
        __m512i lo[G], hi[G];
        for (int jg = 0; jg < G; ++jg) k_codes<kType, i>(t, tile[jg], j, q6h[jg], lo[jg], hi[jg]);
        for (int r = 0; r < R; ++r) {
          int32_t a_lo, a_hi;
          std::memcpy(&a_lo, act[r].qs + 256 * b + 32 * j + 4 * i, 4);
          std::memcpy(&a_hi, act[r].qs + 256 * b + 32 * j + 16 + 4 * i, 4);
          const __m512i vlo = _mm512_set1_epi32(a_lo), vhi = _mm512_set1_epi32(a_hi);
          for (int jg = 0; jg < G; ++jg) {
            plo[r][jg] = _mm512_dpbusd_epi32(plo[r][jg], lo[jg], vlo);
            phi[r][jg] = _mm512_dpbusd_epi32(phi[r][jg], hi[jg], vhi);
          }
        }
      };
      step.template operator()<0>();
      step.template operator()<1>();
      step.template operator()<2>();
      step.template operator()<3>();
      for (int jg = 0; jg < G; ++jg) {
        if constexpr (kQ6) {
          const uint8_t* sc = t.sc + tile[jg] * 256 + 32 * j;
          const __m512i slo = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
          const __m512i shi = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + 16)));
          for (int r = 0; r < R; ++r)
            isum[r][jg] = _mm512_add_epi32(isum[r][jg], _mm512_add_epi32(_mm512_mullo_epi32(plo[r][jg], slo),
                                                                         _mm512_mullo_epi32(phi[r][jg], shi)));
        } else {
          const __m512i sc =
              _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.sc + tile[jg] * 128 + 16 * j)));
          for (int r = 0; r < R; ++r)
            isum[r][jg] =
                _mm512_add_epi32(isum[r][jg], _mm512_mullo_epi32(_mm512_add_epi32(plo[r][jg], phi[r][jg]), sc));
        }
      }
    }
    for (int jg = 0; jg < G; ++jg) {
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.d + tile[jg] * 16)));
      __m512 dm = _mm512_setzero_ps();
      __m512i mk[4];
      if constexpr (!kQ6) {
        dm = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.m + tile[jg] * 16)));
        for (int k = 0; k < 4; ++k)
          mk[k] = _mm512_cvtepu8_epi16(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.mk + tile[jg] * 128 + 32 * k)));
      }
      for (int r = 0; r < R; ++r) {
        const __m512 da = _mm512_set1_ps(act[r].d[b]);
        acc[r][jg] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(isum[r][jg]), acc[r][jg]);
        if constexpr (!kQ6) {  // the mins: sum_j m_j * (sum of a under sub-block j), as int16 pairs
          __m512i msum = _mm512_setzero_si512();
          for (int k = 0; k < 4; ++k) {
            const uint32_t pair = static_cast<uint16_t>(sum32(act[r], 8 * b + 2 * k)) |
                                  uint32_t{static_cast<uint16_t>(sum32(act[r], 8 * b + 2 * k + 1))} << 16;
            msum = _mm512_dpwssd_epi32(msum, mk[k], _mm512_set1_epi32(static_cast<int>(pair)));
          }
          acc[r][jg] = _mm512_fnmadd_ps(_mm512_mul_ps(dm, da), _mm512_cvtepi32_ps(msum), acc[r][jg]);
        }
      }
    }
  }
  const __mmask16 last = cols >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << cols) - 1);
  for (int r = 0; r < R; ++r)
    for (int jg = 0; jg < G; ++jg) _mm512_mask_storeu_ps(c + r * ldc + 16 * jg, jg + 1 < G ? 0xFFFF : last, acc[r][jg]);
}

// Rows [0, m) in groups of 4 (then the rest) against G tile columns from column n.
template <TensorType kType, int G>
inline void tile_columns(const TiledSections& t, const QuantRows& a, uint32_t m, uint32_t n, float* c, size_t ldc,
                         uint32_t cols) {
  const uint32_t g = n / kQuantTile;
  ActRow act[4];
  uint32_t r = 0;
  auto run = [&]<int R>(float* out) {
    if constexpr (kType == TensorType::kQ4_K || kType == TensorType::kQ5_K || kType == TensorType::kQ6_K) {
      tiles_k<kType, R, G>(t, g, act, out, ldc, cols);
    } else {
      tiles32<kType, R, G>(t, g, act, out, ldc, cols);
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

// std::round (half away from zero) of each lane, exactly: trunc, then one away from zero where
// the dropped part (exact) is at least 0.5.
inline __m512 round_away(__m512 v) {
  const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m512 frac = _mm512_abs_ps(_mm512_sub_ps(v, t));
  const __mmask16 up = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  const __m512 one =
      _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(_mm512_set1_ps(1.0f)),
                                          _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN))));
  return _mm512_mask_add_ps(t, up, t, one);
}

// ggml's quantize_row_q8_0 of one block of 32 finite values (kernels.cpp: the reference).
inline void q8_0_block(const float* x, int8_t* q, float& d_out) {
  const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
  const float d = amax / 127;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  d_out = model::half_to_float(model::float_to_half(d));
  const __m512 vid = _mm512_set1_ps(id);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q),
                   _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(round_away(_mm512_mul_ps(x0, vid)))));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16),
                   _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(round_away(_mm512_mul_ps(x1, vid)))));
}

// ggml's quantize_row_q8_K of one block of 256 finite values.
inline void q8_k_block(const float* x, int8_t* q, float& d_out) {
  __m512 amax_v = _mm512_setzero_ps();
  for (int i = 0; i < 256; i += 16) amax_v = _mm512_max_ps(amax_v, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
  const float amax = _mm512_reduce_max_ps(amax_v);
  if (amax == 0.0f) {
    std::memset(q, 0, 256);
    d_out = 0.0f;
    return;
  }
  float max = 0.0f;  // the first value of magnitude amax, with its sign
  for (int i = 0; i < 256; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __mmask16 at = _mm512_cmp_ps_mask(_mm512_abs_ps(v), _mm512_set1_ps(amax), _CMP_EQ_OQ);
    if (at) {
      max = x[i + __builtin_ctz(at)];
      break;
    }
  }
  const float iscale = -127.f / max;
  const __m512 vs = _mm512_set1_ps(iscale), magic = _mm512_set1_ps(12582912.0f);
  for (int i = 0; i < 256; i += 16) {  // nearest_int: the magic number's mantissa, as the reference
    const __m512i bits = _mm512_castps_si512(_mm512_add_ps(_mm512_mul_ps(vs, _mm512_loadu_ps(x + i)), magic));
    __m512i v = _mm512_sub_epi32(_mm512_and_si512(bits, _mm512_set1_epi32(0x007fffff)), _mm512_set1_epi32(0x00400000));
    v = _mm512_min_epi32(v, _mm512_set1_epi32(127));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtepi32_epi8(v));
  }
  d_out = 1 / iscale;
}

// quantize_rows (kernels.h) with AVX-512: the same bytes. Blocks holding a NaN or an infinity
// go to the reference code, whose casts define their bytes.
void quantize(const float* a, size_t lda, uint32_t r0, uint32_t r1, uint32_t k, uint32_t block, int8_t* qs, float* d,
              int16_t* sums) {
  for (uint32_t r = r0; r < r1; ++r) {
    const float* x = a + size_t{r} * lda;
    int8_t* q = qs + size_t{r} * k;
    float* dr = d + size_t{r} * (k / block);
    for (uint32_t b = 0; b < k / block; ++b) {
      const float* xb = x + size_t{b} * block;
      __mmask16 bad = 0;
      for (uint32_t i = 0; i < block; i += 16)
        bad |= _mm512_fpclass_ps_mask(_mm512_loadu_ps(xb + i), 0x01 | 0x80 | 0x08 | 0x10);  // NaN, +-inf
      if (bad) {
        quantize_block(xb, block, q + size_t{b} * block, dr[b]);
      } else if (block == kAct32) {
        q8_0_block(xb, q + size_t{b} * block, dr[b]);
      } else {
        q8_k_block(xb, q + size_t{b} * block, dr[b]);
      }
    }
    int16_t* s = sums + size_t{r} * (k / 16);
    for (uint32_t g = 0; g < k / 16; ++g) {  // sums of 16 codes: vpdpbusd of ones with the codes
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * g));
      const __m512i w = _mm512_cvtepi8_epi32(c);
      s[g] = static_cast<int16_t>(_mm512_reduce_add_epi32(w));
    }
  }
}

void qgemm(const QuantRows& a, uint32_t m, const QuantView& w, uint32_t n0, uint32_t n1, float* c, size_t ldc) {
  dispatch_quant(w.type, [&]<TensorType kType>() { qgemm_tiles<kType>(a, m, w, n0, n1, c, ldc); });
}

}  // namespace quant512
}  // namespace
}  // namespace tandem::engine::kernels
