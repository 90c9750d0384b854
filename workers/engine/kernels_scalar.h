// Scalar building blocks shared by every kernel variant: the reference semantics.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "workers/engine/kernels.h"

namespace tandem::engine::kernels {

// Constants of exp_approx; the vector variants use the same ones in the same order.
inline constexpr float kExpMin = -87.0f;
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f;
inline constexpr float kLn2Lo = -2.12194440e-4f;
inline constexpr float kExpC[7] = {1.0f, 1.0f, 0.5f, 0.166666672f, 0.0416666679f, 0.00833333377f, 0.00138888892f};

// exp(x) for x <= 0; see kernels.h.
inline float exp_scalar(float x) {
  x = x < kExpMin ? kExpMin : x;  // also maps -inf and NaN-free underflow to ~0
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  float p = kExpC[6];
  for (int i = 5; i >= 0; --i) p = std::fma(p, r, kExpC[i]);
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// vdpbf16ps's flush of a denormal sum: the zero of x's sign when |x| < FLT_MIN (kernels.h, gemm_bf16).
inline float ftz(float x) { return std::fabs(x) < 1.17549435e-38f ? std::copysign(0.0f, x) : x; }

// The fixed tree over 16 partial sums: [i] += [i + 8], then 4, 2, 1.
inline float reduce16(float* l) {
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) l[i] = l[i] + l[i + w];
  return l[0];
}

// silu(g) * u with sigmoid from exp of -|g| (never overflows).
inline float silu_mul_scalar(float g, float u) {
  const float e = exp_scalar(-std::fabs(g));
  const float sig = g >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
  return g * sig * u;
}

// Code `i` of a row of quantized KV codes (4 bits: the even index in the low nibble).
inline uint32_t code_at(const uint8_t* row, uint32_t i, uint32_t bits) {
  return bits == 8 ? row[i] : (row[i / 2] >> (4 * (i & 1))) & 15u;
}

// Code `i` of a row of `n` rotated KV codes (kv_cache.h): 4 bits as code_at; 3 bits as three
// bit planes of n / 8 bytes each, bit b of the code at bit i % 8 of byte i / 8 of plane b.
inline uint32_t rotated_code_at(const uint8_t* row, uint32_t i, uint32_t n, uint32_t bits) {
  if (bits == 4) return code_at(row, i, 4);
  const uint8_t* p = row + i / 8;
  const uint32_t s = i % 8, plane = n / 8;
  return ((p[0] >> s) & 1u) | (((p[plane] >> s) & 1u) << 1) | (((p[2 * plane] >> s) & 1u) << 2);
}

// Softmax of s[from, n) in place (exp of s - max, 16 lane partial sums, each starting at
// `lane0`, tree-reduced); returns 1 / sum: the definition every variant's softmax reproduces.
// `from` is a multiple of 16.
inline float softmax_scalar(float* s, uint32_t from, uint32_t n, float lane0, float mx) {
  float lanes[16];
  for (float& l : lanes) l = lane0;
  for (uint32_t j = from; j < n; ++j) {
    s[j] = exp_scalar(s[j] - mx);
    lanes[j % 16] = lanes[j % 16] + s[j];
  }
  return 1.0f / reduce16(lanes);
}

// One head's scores, computed from first_scored(x) on with running max mx, shaped (window,
// cap) and turned into probabilities; returns 1 / sum (kernels.h, masked_lanes).
inline float softmax_window(const AttentionArgs& x, float* s, float mx) {
  const uint32_t from = first_scored(x);
  return softmax_scalar(s, from, x.n_keys, from ? masked_lanes(from / 16) : 0.0f, shape_scores(x, s, mx));
}

}  // namespace tandem::engine::kernels
