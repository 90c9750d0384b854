#include "model/quant.h"

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>

#include "model/half.h"

// Every expression below is evaluated in float, one IEEE operation at a time, in the order ggml's
// reference code evaluates it (the CMake target passes -ffp-contract=off; no -ffast-math). An
// integer quant meets a float as (float)q, as C's usual conversions do.

namespace tandem::model {

namespace {

// Round half to even, as ggml's nearest_int (valid for |x| < 2^22): adding 1.5·2^23 leaves the
// rounded integer in the low mantissa bits.
inline int nearest_int(float x) { return static_cast<int>(float_bits(x + 12582912.0f) & 0x007fffffu) - 0x00400000; }

// ggml's `(int8_t)(float)` and `(uint8_t)(float)` casts as they compile for x86-64 (cvttss2si to 32
// bits, then the low byte), so a NaN or an out-of-range value, which C++ leaves undefined, gives
// ggml's byte there too: only reachable from non-finite input or a scale whose inverse overflows.
inline int trunc_low_byte(float v, bool is_signed) {
  const int32_t t = (v > -2147483648.0f && v < 2147483648.0f) ? static_cast<int32_t>(v) : INT32_MIN;
  return is_signed ? static_cast<int8_t>(t) : static_cast<uint8_t>(t);
}

inline int clamp_int(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

// Below this largest magnitude a group is all zeros (ggml's GROUP_MAX_EPS).
constexpr float kGroupMaxEps = 1e-15f;

// The value of largest magnitude (the first of equal magnitudes) and that magnitude.
inline void signed_absmax(const float* x, int n, float& max, float& amax) {
  max = 0;
  amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
}

// 4 or 5 bits per element of a 32-element block: low nibbles of elements j and j + 16 share
// byte j; bit 4 of element i goes to bit i of qh.
template <class Block>
void pack_nibbles(const uint8_t* q, Block& b, bool five_bits) {
  uint32_t qh = 0;
  for (int j = 0; j < kQK32 / 2; ++j) {
    const uint8_t lo = q[j], hi = q[j + kQK32 / 2];
    // Q4_0/Q4_1 store the levels unmasked (they are below 16 unless the input was not finite).
    b.qs[j] = five_bits ? static_cast<uint8_t>((lo & 0x0F) | ((hi & 0x0F) << 4)) : static_cast<uint8_t>(lo | (hi << 4));
    qh |= static_cast<uint32_t>((lo & 0x10u) >> 4) << j;
    qh |= static_cast<uint32_t>((hi & 0x10u) >> 4) << (j + kQK32 / 2);
  }
  if constexpr (requires { b.qh; }) {
    if (five_bits) std::memcpy(b.qh, &qh, sizeof qh);
  }
}

// Symmetric 4/5-bit block (Q4_0: levels 16, Q5_0: 32): d = max / −(levels/2), q = trunc(x/d +
// levels/2 + 0.5) capped at levels − 1.
template <class Block>
void quantize_symmetric(const float* x, Block* y, int64_t n, int levels) {
  const int half = levels / 2;
  for (int64_t i = 0; i < n / kQK32; ++i, x += kQK32) {
    float max, amax;
    signed_absmax(x, kQK32, max, amax);
    const float d = max / static_cast<float>(-half);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = float_to_half(d);
    uint8_t q[kQK32];
    for (int j = 0; j < kQK32; ++j) {
      const float v = x[j] * id + (static_cast<float>(half) + 0.5f);
      const int t = trunc_low_byte(v, true);
      q[j] = static_cast<uint8_t>(t < levels - 1 ? t : levels - 1);
    }
    pack_nibbles(q, y[i], levels == 32);
  }
}

// Min-max 4/5-bit block (Q4_1: levels 16, Q5_1: 32): d = (max − min)/(levels − 1),
// q = trunc((x − min)/d + 0.5); Q4_1 caps q at 15, Q5_1 does not (it cannot exceed 31.5).
template <class Block>
void quantize_affine(const float* x, Block* y, int64_t n, int levels) {
  for (int64_t i = 0; i < n / kQK32; ++i, x += kQK32) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < kQK32; ++j) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / static_cast<float>(levels - 1);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = float_to_half(d);
    y[i].m = float_to_half(min);
    uint8_t q[kQK32];
    for (int j = 0; j < kQK32; ++j) {
      const float v = (x[j] - min) * id + 0.5f;
      if (levels == 16) {
        const int t = trunc_low_byte(v, true);
        q[j] = static_cast<uint8_t>(t < 15 ? t : 15);
      } else {
        q[j] = static_cast<uint8_t>(trunc_low_byte(v, false));
      }
    }
    pack_nibbles(q, y[i], levels == 32);
  }
}

// Low nibble (and bit 4 from qh) of element j of a 32-element block.
template <class Block>
inline int element_bits(const Block& b, int j, uint32_t qh) {
  const int lo = j < kQK32 / 2 ? (b.qs[j] & 0x0F) : (b.qs[j - kQK32 / 2] >> 4);
  return lo | static_cast<int>(((qh >> j) & 1u) << 4);
}

// ggml's make_qx_quants with rmse_type 1 and no importance weights (what Q6_K's reference uses):
// symmetric levels −nmax..nmax−1 (stored + nmax in L), weights x², the scale refined by a
// weighted least-squares fit and a search over 18 nearby inverse scales.
float fit_symmetric(int n, int nmax, const float* x, int8_t* L) {
  float max, amax;
  signed_absmax(x, n, max, amax);
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  const float fmax = static_cast<float>(nmax);
  float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i], fl = static_cast<float>(l);
    sumlx += w * x[i] * fl;
    suml2 += w * fl * fl;
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(fmax + 0.1f * static_cast<float>(is)) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      const float fl = static_cast<float>(clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1));
      sumlx += w * x[i] * fl;
      suml2 += w * fl * fl;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i)
        L[i] = static_cast<int8_t>(nmax + clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

struct AffineSearch {
  float rmin, rdelta;
  int nstep;
};

// Weighted squared error of x ≈ scale·L + min.
inline float affine_error(int n, const float* x, const float* w, const uint8_t* L, float scale, float min) {
  float error = 0;
  for (int i = 0; i < n; ++i) {
    float diff = scale * static_cast<float>(L[i]) + min - x[i];
    diff = diff * diff;
    error += w[i] * diff;
  }
  return error;
}

// ggml's make_qkx2_quants (squared error, use_mad false): levels 0..nmax with a min ≤ 0, from the
// min-max scale, then nstep + 1 candidate scales, each fitted by weighted least squares and kept
// if its error is lower. Returns the scale; *neg_min = −min.
float fit_affine(int n, int nmax, const float* x, const float* w, uint8_t* L, float* neg_min, AffineSearch s) {
  float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *neg_min = -min;
    return 0.0f;
  }
  const float fmax = static_cast<float>(nmax);
  float iscale = fmax / (max - min);
  float scale = 1 / iscale;
  for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax));
  float best_error = affine_error(n, x, w, L, scale, min);
  uint8_t Laux[kQK32];
  for (int is = 0; is <= s.nstep; ++is) {
    iscale = (s.rmin + s.rdelta * static_cast<float>(is) + fmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax);
      Laux[i] = static_cast<uint8_t>(l);
      const float fl = static_cast<float>(l);
      sum_l += w[i] * fl;
      sum_l2 += w[i] * fl * fl;
      sum_xl += w[i] * fl * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (!(D > 0)) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
    if (this_min > 0) {
      this_min = 0;
      this_scale = sum_xl / sum_l2;
    }
    const float cur_error = affine_error(n, x, w, Laux, this_scale, this_min);
    if (cur_error < best_error) {
      std::memcpy(L, Laux, static_cast<size_t>(n));
      best_error = cur_error;
      scale = this_scale;
      min = this_min;
    }
  }
  *neg_min = -min;
  return scale;
}

// The shared part of Q4_K and Q5_K: per 32-element sub-block an affine fit with weights
// rms + |x|, the 8 scales and mins quantized to 6 bits against the largest, then every element
// quantized again against the stored (rounded) scales. Writes d, dmin, scales; L gets the levels.
template <class Block>
void quantize_k_scales(const float* x, Block& b, uint8_t* L, int nmax, AffineSearch search) {
  float scales[kQKK / 32], mins[kQKK / 32], weights[kQK32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < kQKK / 32; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] = fit_affine(32, nmax, xs, weights, L + 32 * j, &mins[j], search);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  for (int j = 0; j < kQKK / 32; ++j) {
    uint8_t ls = static_cast<uint8_t>(nearest_int(inv_scale * scales[j]));
    uint8_t lm = static_cast<uint8_t>(nearest_int(inv_min * mins[j]));
    ls = ls < 63 ? ls : 63;
    lm = lm < 63 ? lm : 63;
    if (j < 4) {
      b.scales[j] = ls;
      b.scales[j + 4] = lm;
    } else {
      b.scales[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      b.scales[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      b.scales[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  b.d = float_to_half(max_scale / 63.f);
  b.dmin = float_to_half(max_min / 63.f);
  for (int j = 0; j < kQKK / 32; ++j) {
    uint8_t sc, m;
    k_scale_min(j, b.scales, sc, m);
    const float d = half_to_float(b.d) * static_cast<float>(sc);
    if (d == 0.0f) continue;  // keeps the fit's levels
    const float dm = half_to_float(b.dmin) * static_cast<float>(m);
    for (int i = 0; i < 32; ++i)
      L[32 * j + i] = static_cast<uint8_t>(clamp_int(nearest_int((x[32 * j + i] + dm) / d), 0, nmax));
  }
}

// Q6_K's 16 sub-block scales, quantized to int8 against the one of largest magnitude; false when
// the block is all zeros (then the block is zeroed). L gets the levels + 32.
bool quantize_q6_k_scales(const float* x, BlockQ6_K& b, int8_t* L) {
  float scales[kQKK / 16];
  float max_scale = 0, max_abs_scale = 0;
  for (int ib = 0; ib < kQKK / 16; ++ib) {
    scales[ib] = fit_symmetric(16, 32, x + 16 * ib, L + 16 * ib);
    const float abs_scale = std::fabs(scales[ib]);
    if (abs_scale > max_abs_scale) {
      max_abs_scale = abs_scale;
      max_scale = scales[ib];
    }
  }
  if (max_abs_scale < kGroupMaxEps) {
    std::memset(&b, 0, sizeof b);
    return false;
  }
  const float iscale = -128.f / max_scale;
  b.d = float_to_half(1 / iscale);
  for (int ib = 0; ib < kQKK / 16; ++ib) {
    const int v = nearest_int(iscale * scales[ib]);
    b.scales[ib] = static_cast<int8_t>(v < 127 ? v : 127);
  }
  for (int j = 0; j < kQKK / 16; ++j) {
    const float d = half_to_float(b.d) * static_cast<float>(b.scales[j]);
    if (d == 0.0f) continue;
    for (int i = 0; i < 16; ++i)
      L[16 * j + i] = static_cast<int8_t>(clamp_int(nearest_int(x[16 * j + i] / d), -32, 31) + 32);
  }
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------- dequantize

void dequantize_row_f16(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = half_to_float(x[i]);
}

void dequantize_row_bf16(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_float(x[i]);
}

void dequantize_row_q4_0(const BlockQ4_0* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK32; ++i, y += kQK32) {
    const float d = half_to_float(x[i].d);
    for (int j = 0; j < kQK32; ++j) y[j] = static_cast<float>(element_bits(x[i], j, 0) - 8) * d;
  }
}

void dequantize_row_q4_1(const BlockQ4_1* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK32; ++i, y += kQK32) {
    const float d = half_to_float(x[i].d), m = half_to_float(x[i].m);
    for (int j = 0; j < kQK32; ++j) y[j] = static_cast<float>(element_bits(x[i], j, 0)) * d + m;
  }
}

void dequantize_row_q5_0(const BlockQ5_0* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK32; ++i, y += kQK32) {
    const float d = half_to_float(x[i].d);
    uint32_t qh;
    std::memcpy(&qh, x[i].qh, sizeof qh);
    for (int j = 0; j < kQK32; ++j) y[j] = static_cast<float>(element_bits(x[i], j, qh) - 16) * d;
  }
}

void dequantize_row_q5_1(const BlockQ5_1* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK32; ++i, y += kQK32) {
    const float d = half_to_float(x[i].d), m = half_to_float(x[i].m);
    uint32_t qh;
    std::memcpy(&qh, x[i].qh, sizeof qh);
    for (int j = 0; j < kQK32; ++j) y[j] = static_cast<float>(element_bits(x[i], j, qh)) * d + m;
  }
}

void dequantize_row_q8_0(const BlockQ8_0* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK32; ++i, y += kQK32) {
    const float d = half_to_float(x[i].d);
    for (int j = 0; j < kQK32; ++j) y[j] = static_cast<float>(x[i].qs[j]) * d;
  }
}

namespace {

// Q4_K and Q5_K: chunk c (64 elements) uses sub-blocks 2c (low nibbles) and 2c + 1 (high);
// Q5_K's bit 4 of element l of sub-block s is bit s of qh[l].
template <class Block>
void dequantize_k_affine(const Block* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = half_to_float(x[i].d), dmin = half_to_float(x[i].dmin);
    for (int s = 0; s < kQKK / 32; ++s, y += 32) {
      uint8_t sc, m;
      k_scale_min(s, x[i].scales, sc, m);
      const float ds = d * static_cast<float>(sc), ms = dmin * static_cast<float>(m);
      const uint8_t* q = x[i].qs + 32 * (s / 2);
      const int shift = 4 * (s % 2);
      for (int l = 0; l < 32; ++l) {
        int v = (q[l] >> shift) & 0xF;
        if constexpr (requires { x[i].qh; }) v += ((x[i].qh[l] >> s) & 1) << 4;
        y[l] = ds * static_cast<float>(v) - ms;
      }
    }
  }
}

}  // namespace

void dequantize_row_q4_k(const BlockQ4_K* x, float* y, int64_t n) { dequantize_k_affine(x, y, n); }
void dequantize_row_q5_k(const BlockQ5_K* x, float* y, int64_t n) { dequantize_k_affine(x, y, n); }

void dequantize_row_q6_k(const BlockQ6_K* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = half_to_float(x[i].d);
    for (int e = 0; e < kQKK; ++e) {
      const int half = e / 128, k = (e % 128) / 32, l = e % 32;
      const uint8_t ql = x[i].ql[64 * half + l + 32 * (k & 1)];
      const uint8_t qh = x[i].qh[32 * half + l];
      const int q = (((ql >> (4 * (k / 2))) & 0xF) | (((qh >> (2 * k)) & 3) << 4)) - 32;
      y[e] = d * static_cast<float>(x[i].scales[e / 16]) * static_cast<float>(q);
    }
    y += kQKK;
  }
}

void dequantize_row_q8_k(const BlockQ8_K* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQKK; ++i) {
    for (int j = 0; j < kQKK; ++j) *y++ = x[i].d * static_cast<float>(x[i].qs[j]);
  }
}

// ---------------------------------------------------------------------------- quantize

void quantize_row_f16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = float_to_half(x[i]);
}

void quantize_row_bf16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = float_to_bf16(x[i]);
}

void quantize_row_q4_0(const float* x, BlockQ4_0* y, int64_t n) { quantize_symmetric(x, y, n, 16); }
void quantize_row_q5_0(const float* x, BlockQ5_0* y, int64_t n) { quantize_symmetric(x, y, n, 32); }
void quantize_row_q4_1(const float* x, BlockQ4_1* y, int64_t n) { quantize_affine(x, y, n, 16); }
void quantize_row_q5_1(const float* x, BlockQ5_1* y, int64_t n) { quantize_affine(x, y, n, 32); }

void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK32; ++i, x += kQK32) {
    float amax = 0;
    for (int j = 0; j < kQK32; ++j) amax = amax > std::fabs(x[j]) ? amax : std::fabs(x[j]);
    const float d = amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = float_to_half(d);
    for (int j = 0; j < kQK32; ++j) y[i].qs[j] = static_cast<int8_t>(trunc_low_byte(std::round(x[j] * id), true));
  }
}

void quantize_row_q4_k(const float* x, BlockQ4_K* y, int64_t n) {
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    uint8_t L[kQKK];
    quantize_k_scales(x, y[i], L, 15, {-1.f, 0.1f, 20});
    for (int c = 0; c < kQKK / 64; ++c) {
      uint8_t* q = y[i].qs + 32 * c;
      for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[64 * c + l] | (L[64 * c + l + 32] << 4));
    }
  }
}

void quantize_row_q5_k(const float* x, BlockQ5_K* y, int64_t n) {
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    uint8_t L[kQKK];
    quantize_k_scales(x, y[i], L, 31, {-0.5f, 0.1f, 15});
    std::memset(y[i].qh, 0, sizeof y[i].qh);
    for (int c = 0; c < kQKK / 64; ++c) {
      uint8_t* q = y[i].qs + 32 * c;
      for (int l = 0; l < 32; ++l) {
        const int lo = L[64 * c + l], hi = L[64 * c + l + 32];
        y[i].qh[l] |= static_cast<uint8_t>(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
        q[l] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
      }
    }
  }
}

void quantize_row_q6_k(const float* x, BlockQ6_K* y, int64_t n) {
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    int8_t L[kQKK];
    if (!quantize_q6_k_scales(x, y[i], L)) continue;
    for (int half = 0; half < 2; ++half) {
      const int8_t* Lh = L + 128 * half;
      uint8_t* ql = y[i].ql + 64 * half;
      uint8_t* qh = y[i].qh + 32 * half;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((Lh[l] & 0xF) | ((Lh[l + 64] & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((Lh[l + 32] & 0xF) | ((Lh[l + 96] & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
                                     ((Lh[l + 96] >> 4) << 6));
      }
    }
  }
}

void quantize_row_q8_k(const float* x, BlockQ8_K* y, int64_t n) {
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    float max, amax;
    signed_absmax(x, kQKK, max, amax);
    std::memset(y[i].bsums, 0, sizeof y[i].bsums);
    if (amax == 0.0f) {
      y[i].d = 0;
      std::memset(y[i].qs, 0, sizeof y[i].qs);
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < kQKK; ++j) {
      const int v = nearest_int(iscale * x[j]);
      y[i].qs[j] = static_cast<int8_t>(v < 127 ? v : 127);
      y[i].bsums[j / 16] = static_cast<int16_t>(y[i].bsums[j / 16] + y[i].qs[j]);
    }
    y[i].d = 1 / iscale;
  }
}

// ---------------------------------------------------------------------------- traits

namespace {

template <class Block, void (*F)(const Block*, float*, int64_t)>
void dequantize_any(const void* src, float* dst, int64_t n) {
  F(static_cast<const Block*>(src), dst, n);
}
template <class Block, void (*F)(const float*, Block*, int64_t)>
void quantize_any(const float* src, void* dst, int64_t n) {
  F(src, static_cast<Block*>(dst), n);
}
void copy_f32_in(const void* src, float* dst, int64_t n) { std::memcpy(dst, src, static_cast<size_t>(n) * 4); }
void copy_f32_out(const float* src, void* dst, int64_t n) { std::memcpy(dst, src, static_cast<size_t>(n) * 4); }

#define TANDEM_CONVERT(Block, name) \
  &dequantize_any<Block, dequantize_row_##name>, &quantize_any<Block, quantize_row_##name>

// Indexed by ggml type id; {nullptr, 0, ...}: an id ggml does not define. Geometry from
// ggml-common.h (blck_size, type_size of ggml's type_traits); alignment: that of the widest field
// of ggml's block struct (a binary16 scale: 2; IQ1_M, MXFP4 and NVFP4 hold bytes only).
constexpr TypeTraits kTraits[] = {
    {"F32", 1, 4, 4, false, &copy_f32_in, &copy_f32_out},
    {"F16", 1, 2, 2, false, TANDEM_CONVERT(uint16_t, f16)},
    {"Q4_0", 32, 18, 2, true, TANDEM_CONVERT(BlockQ4_0, q4_0)},
    {"Q4_1", 32, 20, 2, true, TANDEM_CONVERT(BlockQ4_1, q4_1)},
    {nullptr, 0, 0, 0, false, nullptr, nullptr},  // 4: Q4_2, removed
    {nullptr, 0, 0, 0, false, nullptr, nullptr},  // 5: Q4_3, removed
    {"Q5_0", 32, 22, 2, true, TANDEM_CONVERT(BlockQ5_0, q5_0)},
    {"Q5_1", 32, 24, 2, true, TANDEM_CONVERT(BlockQ5_1, q5_1)},
    {"Q8_0", 32, 34, 2, true, TANDEM_CONVERT(BlockQ8_0, q8_0)},
    {"Q8_1", 32, 36, 2, true, nullptr, nullptr},
    {"Q2_K", 256, 84, 2, true, nullptr, nullptr},
    {"Q3_K", 256, 110, 2, true, nullptr, nullptr},
    {"Q4_K", 256, 144, 2, true, TANDEM_CONVERT(BlockQ4_K, q4_k)},
    {"Q5_K", 256, 176, 2, true, TANDEM_CONVERT(BlockQ5_K, q5_k)},
    {"Q6_K", 256, 210, 2, true, TANDEM_CONVERT(BlockQ6_K, q6_k)},
    {"Q8_K", 256, 292, 4, true, TANDEM_CONVERT(BlockQ8_K, q8_k)},
    {"IQ2_XXS", 256, 66, 2, true, nullptr, nullptr},
    {"IQ2_XS", 256, 74, 2, true, nullptr, nullptr},
    {"IQ3_XXS", 256, 98, 2, true, nullptr, nullptr},
    {"IQ1_S", 256, 50, 2, true, nullptr, nullptr},
    {"IQ4_NL", 32, 18, 2, true, nullptr, nullptr},
    {"IQ3_S", 256, 110, 2, true, nullptr, nullptr},
    {"IQ2_S", 256, 82, 2, true, nullptr, nullptr},
    {"IQ4_XS", 256, 136, 2, true, nullptr, nullptr},
    {"I8", 1, 1, 1, false, nullptr, nullptr},
    {"I16", 1, 2, 2, false, nullptr, nullptr},
    {"I32", 1, 4, 4, false, nullptr, nullptr},
    {"I64", 1, 8, 8, false, nullptr, nullptr},
    {"F64", 1, 8, 8, false, nullptr, nullptr},
    {"IQ1_M", 256, 56, 1, true, nullptr, nullptr},
    {"BF16", 1, 2, 2, false, TANDEM_CONVERT(uint16_t, bf16)},
    {nullptr, 0, 0, 0, false, nullptr, nullptr},  // 31-33: Q4_0_4_4, Q4_0_4_8, Q4_0_8_8, removed
    {nullptr, 0, 0, 0, false, nullptr, nullptr},
    {nullptr, 0, 0, 0, false, nullptr, nullptr},
    {"TQ1_0", 256, 54, 2, true, nullptr, nullptr},
    {"TQ2_0", 256, 66, 2, true, nullptr, nullptr},
    {nullptr, 0, 0, 0, false, nullptr, nullptr},  // 36-38: IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8, removed
    {nullptr, 0, 0, 0, false, nullptr, nullptr},
    {nullptr, 0, 0, 0, false, nullptr, nullptr},
    {"MXFP4", 32, 17, 1, true, nullptr, nullptr},
    {"NVFP4", 64, 36, 1, true, nullptr, nullptr},
    {"Q1_0", 128, 18, 2, true, nullptr, nullptr},
    {"Q2_0", 64, 18, 2, true, nullptr, nullptr},
};
#undef TANDEM_CONVERT

}  // namespace

const TypeTraits* type_traits(uint32_t type) {
  if (type >= std::size(kTraits) || kTraits[type].name == nullptr) return nullptr;
  return &kTraits[type];
}

const char* ggml_type_name(uint32_t type) {
  if (const TypeTraits* t = type_traits(type)) return t->name;
  static thread_local char buf[24];
  std::snprintf(buf, sizeof buf, "type %u", type);
  return buf;
}

uint64_t row_bytes(TensorType type, uint64_t n) {
  const TypeTraits* t = type_traits(type);
  return n / t->block_elems * t->block_bytes;
}

const char* readable_type_names() { return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K"; }

}  // namespace tandem::model
