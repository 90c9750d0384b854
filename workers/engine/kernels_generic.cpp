// Scalar kernels: the definition every SIMD variant reproduces bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "workers/engine/kernels.h"
#include "workers/engine/kernels_scalar.h"

namespace tandem::engine::kernels {
namespace {

void gemm(const float* a, size_t lda, uint32_t m, const PackedView& w, uint32_t p0, uint32_t p1,
          float* c, size_t ldc) {
  const uint32_t k_dim = w.k;
  for (uint32_t p = p0; p < p1; ++p) {
    const float* panel = w.data + static_cast<size_t>(p) * k_dim * kPanel;
    const uint32_t n0 = p * kPanel;
    const uint32_t cols = std::min(kPanel, w.n - n0);
    for (uint32_t r = 0; r < m; ++r) {
      const float* ar = a + r * lda;
      for (uint32_t j = 0; j < cols; ++j) {
        float acc = 0.0f;
        for (uint32_t k = 0; k < k_dim; ++k) acc = std::fma(ar[k], panel[k * kPanel + j], acc);
        c[r * ldc + n0 + j] = acc;
      }
    }
  }
}

void attention(const AttentionArgs& x) {
  const uint32_t hd = x.head_dim, bt = x.block_tokens;
  const uint32_t stride = (x.n_keys + 15) / 16 * 16;
  for (uint32_t h = 0; h < x.n_q; ++h) {
    const float* q = x.q + h * hd;
    float* s = x.scores + h * stride;
    float mx = -INFINITY;
    for (uint32_t j = 0; j < x.n_keys; ++j) {
      const float* kb = x.k_base + x.blocks[j / bt] * x.block_stride;
      const uint32_t slot = j % bt;
      float acc = 0.0f;
      for (uint32_t d = 0; d < hd; ++d) acc = std::fma(q[d], kb[d * bt + slot], acc);
      s[j] = acc * x.scale;
      mx = std::max(mx, s[j]);
    }
    float lanes[16] = {};
    for (uint32_t j = 0; j < x.n_keys; ++j) {
      s[j] = exp_scalar(s[j] - mx);
      lanes[j % 16] = lanes[j % 16] + s[j];
    }
    const float sum = reduce16(lanes);
    const float inv = 1.0f / sum;
    float* out = x.out + h * hd;
    for (uint32_t d = 0; d < hd; ++d) out[d] = 0.0f;
    for (uint32_t j = 0; j < x.n_keys; ++j) {
      const float* vb = x.v_base + x.blocks[j / bt] * x.block_stride + (j % bt) * hd;
      for (uint32_t d = 0; d < hd; ++d) out[d] = std::fma(s[j], vb[d], out[d]);
    }
    for (uint32_t d = 0; d < hd; ++d) out[d] = out[d] * inv;
  }
}

void silu_mul(const float* gate, const float* up, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = silu_mul_scalar(gate[i], up[i]);
}

}  // namespace

extern const Kernels kGenericKernels{"generic", gemm, attention, silu_mul};

}  // namespace tandem::engine::kernels
