// Scalar kernels: the definition every SIMD variant reproduces bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "workers/engine/kernels.h"
#include "workers/engine/kernels_quant.h"
#include "workers/engine/kernels_rotated.h"
#include "workers/engine/kernels_scalar.h"

namespace tandem::engine::kernels {
namespace {

// The fma chain of kernels.h over panels of any element type, widened exactly by `widen`.
template <class E, class Widen>
void gemm_panels(const float* a, size_t lda, uint32_t m, const E* data, uint32_t n, uint32_t k_dim, uint32_t p0,
                 uint32_t p1, float* c, size_t ldc, Widen widen) {
  for (uint32_t p = p0; p < p1; ++p) {
    const E* panel = data + static_cast<size_t>(p) * k_dim * kPanel;
    const uint32_t n0 = p * kPanel;
    const uint32_t cols = std::min(kPanel, n - n0);
    for (uint32_t r = 0; r < m; ++r) {
      const float* ar = a + r * lda;
      for (uint32_t j = 0; j < cols; ++j) {
        float acc = 0.0f;
        for (uint32_t k = 0; k < k_dim; ++k) acc = std::fma(ar[k], widen(panel[k * kPanel + j]), acc);
        c[r * ldc + n0 + j] = acc;
      }
    }
  }
}

void gemm(const float* a, size_t lda, uint32_t m, const PackedView& w, uint32_t p0, uint32_t p1, float* c, size_t ldc) {
  gemm_panels(a, lda, m, w.data, w.n, w.k, p0, p1, c, ldc, [](float x) { return x; });
}

void gemm_bf16(const uint16_t* a, uint32_t m, const PackedPairsView& w, uint32_t p0, uint32_t p1, float* c,
               size_t ldc) {
  using model::bf16_to_float;
  for (uint32_t p = p0; p < p1; ++p) {
    const uint16_t* panel = w.data + static_cast<size_t>(p) * w.k * kPanel;
    const uint32_t n0 = p * kPanel, cols = std::min(kPanel, w.n - n0);
    for (uint32_t r = 0; r < m; ++r) {
      const uint16_t* ar = a + size_t{r} * w.k;
      for (uint32_t j = 0; j < cols; ++j) {
        float acc = 0.0f;
        for (uint32_t q = 0; q < w.k / 2; ++q) {
          const uint16_t* wq = panel + (size_t{q} * kPanel + j) * 2;
          acc = ftz(std::fma(bf16_to_float(ar[2 * q + 1]), bf16_to_float(wq[1]), acc));
          acc = ftz(std::fma(bf16_to_float(ar[2 * q]), bf16_to_float(wq[0]), acc));
        }
        c[size_t{r} * ldc + n0 + j] = acc;
      }
    }
  }
}

void gemm16(const float* a, size_t lda, uint32_t m, const Packed16View& w, uint32_t p0, uint32_t p1, float* c,
            size_t ldc) {
  if (w.bf16) return gemm_panels(a, lda, m, w.data, w.n, w.k, p0, p1, c, ldc, model::bf16_to_float);
  gemm_panels(a, lda, m, w.data, w.n, w.k, p0, p1, c, ldc, model::half_to_float);
}

void qgemm(const QuantRows& a, uint32_t m, const QuantView& w, uint32_t n0, uint32_t n1, float* c, size_t ldc) {
  const TiledSections t = tiled_sections(w);
  for (uint32_t n = n0; n < n1; ++n)
    for (uint32_t r = 0; r < m; ++r) c[size_t{r} * ldc + n] = tiled_dot(t, w.type, n, act_row(a, r));
}

void attention_f32(const AttentionArgs& x) {
  const uint32_t hd = x.head_dim, bt = x.block_tokens;
  const uint32_t stride = (x.n_keys + 15) / 16 * 16;
  for (uint32_t h = 0; h < x.n_q; ++h) {
    const float* q = x.q + h * hd;
    float* s = x.scores + h * stride;
    float mx = -INFINITY;
    for (uint32_t j = x.first_key; j < x.n_keys; ++j) {
      const float* kb = x.k_base + x.blocks[j / bt] * x.block_stride;
      const uint32_t slot = j % bt;
      float acc = 0.0f;
      for (uint32_t d = 0; d < hd; ++d) acc = std::fma(q[d], kb[d * bt + slot], acc);
      s[j] = acc * x.scale;
      mx = std::max(mx, s[j]);
    }
    const float inv = softmax_window(x, s, mx);
    float* out = x.out + h * hd;
    for (uint32_t d = 0; d < hd; ++d) out[d] = 0.0f;
    for (uint32_t j = x.first_key; j < x.n_keys; ++j) {
      const float* vb = x.v_base + x.blocks[j / bt] * x.block_stride + (j % bt) * hd;
      for (uint32_t d = 0; d < hd; ++d) out[d] = std::fma(s[j], vb[d], out[d]);
    }
    for (uint32_t d = 0; d < hd; ++d) out[d] = out[d] * inv;
  }
}

void attention_quant(const AttentionArgs& x) {
  const uint32_t hd = x.head_dim, bt = x.block_tokens, bits = x.kv_bits, gs = x.group_size, ng = hd / gs;
  const uint32_t stride = (x.n_keys + 15) / 16 * 16;
  const size_t code_bytes = size_t{hd} * bt * bits / 8, row_bytes = size_t{bt} * bits / 8;
  for (uint32_t h = 0; h < x.n_q; ++h) {
    const float* q = x.q + h * hd;
    float* s = x.scores + h * stride;
    float qs[16];  // hd <= 256, gs >= 16
    for (uint32_t g = 0; g < ng; ++g) {
      qs[g] = 0.0f;
      for (uint32_t d = g * gs; d < (g + 1) * gs; ++d) qs[g] = qs[g] + q[d];
    }
    float mx = -INFINITY;
    const uint32_t coded = x.win_k ? x.f32_from : x.n_keys;
    for (uint32_t j = std::max(coded, x.first_key); j < x.n_keys; ++j) {
      const float* kr = x.win_k[j - coded];
      float lanes[16] = {};
      for (uint32_t d = 0; d < hd; ++d) lanes[d % 16] = std::fma(q[d], kr[d], lanes[d % 16]);
      s[j] = reduce16(lanes) * x.scale;
      mx = std::max(mx, s[j]);
    }
    for (uint32_t j = x.first_key; j < coded; ++j) {
      const uint8_t* kb = x.k_bytes + x.blocks[j / bt] * x.block_bytes;
      const uint32_t slot = j % bt;
      const float* ksc = reinterpret_cast<const float*>(kb + code_bytes);
      const float* kbi = ksc + size_t{ng} * bt;
      float t = 0.0f;
      for (uint32_t g = 0; g < ng; ++g) {
        float a = 0.0f;
        for (uint32_t d = g * gs; d < (g + 1) * gs; ++d)
          a = std::fma(q[d], static_cast<float>(code_at(kb + d * row_bytes, slot, bits)), a);
        t = std::fma(ksc[g * bt + slot], a, t);
        t = std::fma(kbi[g * bt + slot], qs[g], t);
      }
      s[j] = t * x.scale;
      mx = std::max(mx, s[j]);
    }
    const float inv = softmax_window(x, s, mx);
    float* out = x.out + h * hd;
    float pb[16] = {};
    for (uint32_t d = 0; d < hd; ++d) out[d] = 0.0f;
    for (uint32_t j = x.first_key; j < coded; ++j) {
      const uint8_t* vb = x.v_bytes + x.blocks[j / bt] * x.block_bytes;
      const uint32_t slot = j % bt;
      const uint8_t* row = vb + size_t{slot} * hd * bits / 8;
      const float* vsc = reinterpret_cast<const float*>(vb + code_bytes) + size_t{slot} * ng;
      const float* vbi = vsc + size_t{bt} * ng;
      for (uint32_t g = 0; g < ng; ++g) {
        const float ps = s[j] * vsc[g];
        pb[g] = std::fma(s[j], vbi[g], pb[g]);
        for (uint32_t d = g * gs; d < (g + 1) * gs; ++d)
          out[d] = std::fma(ps, static_cast<float>(code_at(row, d, bits)), out[d]);
      }
    }
    for (uint32_t j = std::max(coded, x.first_key); j < x.n_keys; ++j)
      for (uint32_t d = 0; d < hd; ++d) out[d] = std::fma(s[j], x.win_v[j - coded][d], out[d]);
    for (uint32_t d = 0; d < hd; ++d) out[d] = (out[d] + pb[d / gs]) * inv;
  }
}

void attention(const AttentionArgs& x) {
  for (uint32_t r = 0; r < x.rows; ++r) {
    const AttentionArgs a = row_of(x, r);
    if (a.kv_rotated) {
      attention_rotated_scalar(a);
    } else {
      a.kv_bits ? attention_quant(a) : attention_f32(a);
    }
  }
}

void silu_mul(const float* gate, const float* up, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = silu_mul_scalar(gate[i], up[i]);
}

uint32_t argmax(const float* x, uint32_t n, float* max) {
  float best = -std::numeric_limits<float>::infinity();
  uint32_t at = 0;
  for (uint32_t i = 0; i < n; ++i)
    if (x[i] > best) best = x[i], at = i;  // NaN compares false
  *max = best;
  return at;
}

void chunk_max(const float* x, uint32_t n, float* out) {
  for (uint32_t c = 0; c * kScreenChunk < n; ++c) {
    float m = x[c * kScreenChunk];
    for (uint32_t i = c * kScreenChunk + 1; i < std::min(n, (c + 1) * kScreenChunk); ++i) m = std::max(m, x[i]);
    out[c] = m;
  }
}

}  // namespace

extern const Kernels kGenericKernels{"generic",     gemm,      gemm_bf16, gemm16, qgemm,    round_rows_bf16,
                                     quantize_rows, attention, silu_mul,  argmax, chunk_max};

}  // namespace tandem::engine::kernels
