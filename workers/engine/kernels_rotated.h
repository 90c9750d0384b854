// Scalar reference of attention over rotated KV codes (kernels.h, Kernels::attention with
// kv_rotated; the layout in kv_cache.h). The SIMD variants keep its order of operations, so
// every variant gives these bits whatever the batch.
//
// In an anonymous namespace: each kernel translation unit, compiled with its own
// instruction-set flags, keeps its own copy (no ODR merge across instruction sets).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "workers/engine/kernels.h"
#include "workers/engine/kernels_scalar.h"
#include "workers/engine/kv_rotation.h"

namespace tandem::engine::kernels {
namespace {

// The F32 window's keys j in [max(coded, first_key), n_keys) against the unrotated query, 16 lanes tree-reduced
// (as for uniform codes); returns the running max.
inline float rotated_window_scores(const AttentionArgs& x, const float* q, uint32_t coded, float* s, float mx) {
  for (uint32_t j = std::max(coded, x.first_key); j < x.n_keys; ++j) {
    const float* kr = x.win_k[j - coded];
    float lanes[16] = {};
    for (uint32_t d = 0; d < x.head_dim; ++d) lanes[d % 16] = std::fma(q[d], kr[d], lanes[d % 16]);
    s[j] = reduce16(lanes) * x.scale;
    mx = std::max(mx, s[j]);
  }
  return mx;
}

// Score of the coded key j against the rotated query qr.
inline float rotated_score(const AttentionArgs& x, const float* qr, uint32_t j) {
  const uint32_t hd = x.head_dim, bt = x.block_tokens, bits = x.kv_bits;
  const uint8_t* kb = x.k_bytes + x.blocks[j / bt] * x.block_bytes;
  const uint32_t slot = j % bt;
  const float norm = reinterpret_cast<const float*>(kb + size_t{hd} * bt * bits / 8)[slot];
  float acc = 0.0f;
  for (uint32_t d = 0; d < hd; ++d)
    acc = std::fma(qr[d], x.levels[rotated_code_at(kb + size_t{d} * bt * bits / 8, slot, bt, bits)], acc);
  return (norm * acc) * x.scale;
}

// a[d] = fma chain over the coded keys from first_key of (p_j * n_j) * L[c_j[d]].
inline void rotated_values(const AttentionArgs& x, const float* p, uint32_t coded, float* a) {
  const uint32_t hd = x.head_dim, bt = x.block_tokens, bits = x.kv_bits;
  for (uint32_t d = 0; d < hd; ++d) a[d] = 0.0f;
  for (uint32_t j = x.first_key; j < coded; ++j) {
    const uint8_t* vb = x.v_bytes + x.blocks[j / bt] * x.block_bytes;
    const uint32_t slot = j % bt;
    const float pn = p[j] * reinterpret_cast<const float*>(vb + size_t{hd} * bt * bits / 8)[slot];
    const uint8_t* row = vb + size_t{slot} * hd * bits / 8;
    for (uint32_t d = 0; d < hd; ++d) a[d] = std::fma(pn, x.levels[rotated_code_at(row, d, hd, bits)], a[d]);
  }
}

// o = unrotate_row(a), then the window's values, then times inv: one head's output.
inline void rotated_finish(const AttentionArgs& x, const float* a, const float* p, uint32_t coded, float inv,
                           float* out) {
  const uint32_t hd = x.head_dim;
  kv_rotation::unrotate_row({a, hd}, {x.v_signs, hd}, {out, hd});
  for (uint32_t j = std::max(coded, x.first_key); j < x.n_keys; ++j)
    for (uint32_t d = 0; d < hd; ++d) out[d] = std::fma(p[j], x.win_v[j - coded][d], out[d]);
  for (uint32_t d = 0; d < hd; ++d) out[d] = out[d] * inv;
}

inline void attention_rotated_scalar(const AttentionArgs& x) {
  const uint32_t hd = x.head_dim, stride = (x.n_keys + 15) / 16 * 16;
  const uint32_t coded = x.win_k ? x.f32_from : x.n_keys;
  for (uint32_t h = 0; h < x.n_q; ++h) {
    const float* q = x.q + h * hd;
    float* s = x.scores + h * stride;
    float qr[256], a[256];  // head_dim <= 256 (kv_rotation::check_head_dim)
    kv_rotation::rotate_row({q, hd}, {x.k_signs, hd}, {qr, hd});
    float mx = rotated_window_scores(x, q, coded, s, -INFINITY);
    for (uint32_t j = x.first_key; j < coded; ++j) {
      s[j] = rotated_score(x, qr, j);
      mx = std::max(mx, s[j]);
    }
    const float inv = softmax_window(x, s, mx);
    rotated_values(x, s, coded, a);
    rotated_finish(x, a, s, coded, inv, x.out + h * hd);
  }
}

}  // namespace
}  // namespace tandem::engine::kernels
