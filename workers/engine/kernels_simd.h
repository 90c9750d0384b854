// The SIMD kernels, written once over a vector type V (V512 or V256 below) and compiled
// in one translation unit per instruction set. Each lane performs exactly the scalar
// operation sequence of kernels_generic.cpp.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "workers/engine/kernels.h"
#include "workers/engine/kernels_scalar.h"

namespace tandem::engine::kernels::simd {

template <class V>
struct Ops : V {
  using T = typename V::T;
  static constexpr uint32_t W = V::W;
  static constexpr uint32_t NV = kPanel / W;  // vectors per panel row

  static T exp_v(T x) {
    x = V::max(x, V::set1(kExpMin));
    const T n = V::round(V::mul(x, V::set1(kLog2e)));
    T r = V::fma(n, V::set1(-kLn2Hi), x);
    r = V::fma(n, V::set1(-kLn2Lo), r);
    T p = V::set1(kExpC[6]);
    for (int i = 5; i >= 0; --i) p = V::fma(p, r, V::set1(kExpC[i]));
    return V::mul(p, V::pow2(n));
  }

  // MR rows x one panel, full K: acc[r][v] is the fma chain of kernels_generic.cpp.
  template <uint32_t MR>
  static void micro(const float* a, size_t lda, const float* panel, uint32_t k_dim, float* c,
                    size_t ldc, uint32_t cols) {
    T acc[MR][NV];
#pragma GCC unroll 16
    for (uint32_t r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (uint32_t v = 0; v < NV; ++v) acc[r][v] = V::zero();
    for (uint32_t k = 0; k < k_dim; ++k) {
      const float* wk = panel + k * kPanel;
      T w[NV];
#pragma GCC unroll 4
      for (uint32_t v = 0; v < NV; ++v) w[v] = V::loadu(wk + v * W);
#pragma GCC unroll 16
      for (uint32_t r = 0; r < MR; ++r) {
        const T ar = V::set1(a[r * lda + k]);
#pragma GCC unroll 4
        for (uint32_t v = 0; v < NV; ++v) acc[r][v] = V::fma(ar, w[v], acc[r][v]);
      }
    }
    if (cols == kPanel) {
#pragma GCC unroll 16
      for (uint32_t r = 0; r < MR; ++r)
#pragma GCC unroll 4
        for (uint32_t v = 0; v < NV; ++v) V::storeu(c + r * ldc + v * W, acc[r][v]);
    } else {
      alignas(64) float tmp[kPanel];
      for (uint32_t r = 0; r < MR; ++r) {
        for (uint32_t v = 0; v < NV; ++v) V::storeu(tmp + v * W, acc[r][v]);
        std::copy(tmp, tmp + cols, c + r * ldc);
      }
    }
  }

  template <uint32_t MR>
  static void rows(const float* a, size_t lda, uint32_t m, const float* panel, uint32_t k_dim,
                   float* c, size_t ldc, uint32_t cols) {
    uint32_t r = 0;
    for (; r + MR <= m; r += MR) micro<MR>(a + r * lda, lda, panel, k_dim, c + r * ldc, ldc, cols);
    if constexpr (MR > 1) {
      if (r < m) tail<MR - 1>(a + r * lda, lda, m - r, panel, k_dim, c + r * ldc, ldc, cols);
    }
  }

  template <uint32_t MR>
  static void tail(const float* a, size_t lda, uint32_t m, const float* panel, uint32_t k_dim,
                   float* c, size_t ldc, uint32_t cols) {
    if (m == MR) return micro<MR>(a, lda, panel, k_dim, c, ldc, cols);
    if constexpr (MR > 1) tail<MR - 1>(a, lda, m, panel, k_dim, c, ldc, cols);
  }

  static void gemm(const float* a, size_t lda, uint32_t m, const PackedView& w, uint32_t p0,
                   uint32_t p1, float* c, size_t ldc) {
    for (uint32_t p = p0; p < p1; ++p) {
      const float* panel = w.data + static_cast<size_t>(p) * w.k * kPanel;
      const uint32_t n0 = p * kPanel;
      const uint32_t cols = std::min(kPanel, w.n - n0);
      rows<V::kMaxRows>(a, lda, m, panel, w.k, c + n0, ldc, cols);
    }
  }

  // One block of 16 keys at a time: lane l is key (block start + l).
  static void attention(const AttentionArgs& x) {
    static_assert(16 % W == 0);
    constexpr uint32_t L = 16 / W;  // vectors per 16 keys
    const uint32_t hd = x.head_dim, bt = x.block_tokens;
    const uint32_t stride = (x.n_keys + 15) / 16 * 16;
    const uint32_t groups = stride / 16;
    for (uint32_t h = 0; h < x.n_q; ++h) {
      const float* q = x.q + h * hd;
      float* s = x.scores + h * stride;
      T mx = V::set1(-INFINITY);
      for (uint32_t g = 0; g < groups; ++g) {
        const uint32_t j0 = g * 16;
        const float* kb = x.k_base + x.blocks[j0 / bt] * x.block_stride + (j0 % bt);
        T acc[L];
        for (uint32_t l = 0; l < L; ++l) acc[l] = V::zero();
        for (uint32_t d = 0; d < hd; ++d) {
          const T qd = V::set1(q[d]);
          for (uint32_t l = 0; l < L; ++l) acc[l] = V::fma(qd, V::loadu(kb + d * bt + l * W), acc[l]);
        }
        const uint32_t valid = std::min(16u, x.n_keys - j0);
        for (uint32_t l = 0; l < L; ++l) {
          const T sv = V::mul(acc[l], V::set1(x.scale));
          V::storeu(s + j0 + l * W, sv);
          mx = V::max(mx, V::masked_keep(sv, V::set1(-INFINITY), valid, l * W));
        }
      }
      const T mxv = V::set1(V::hmax(mx));
      T lanes[L];
      for (uint32_t l = 0; l < L; ++l) lanes[l] = V::zero();
      for (uint32_t g = 0; g < groups; ++g) {
        const uint32_t j0 = g * 16;
        const uint32_t valid = std::min(16u, x.n_keys - j0);
        for (uint32_t l = 0; l < L; ++l) {
          T p = exp_v(V::sub(V::loadu(s + j0 + l * W), mxv));
          p = V::masked_keep(p, V::zero(), valid, l * W);
          V::storeu(s + j0 + l * W, p);
          lanes[l] = V::add(lanes[l], p);
        }
      }
      alignas(64) float lane_sums[16];
      for (uint32_t l = 0; l < L; ++l) V::storeu(lane_sums + l * W, lanes[l]);
      const float inv = 1.0f / reduce16(lane_sums);

      float* out = x.out + h * hd;
      // hd is a multiple of W for every supported model (checked at load).
      const uint32_t dv = hd / W;
      constexpr uint32_t kMaxDv = 256 / W;
      T o[kMaxDv];
      for (uint32_t v = 0; v < dv; ++v) o[v] = V::zero();
      for (uint32_t j = 0; j < x.n_keys; ++j) {
        const float* vb = x.v_base + x.blocks[j / bt] * x.block_stride + (j % bt) * hd;
        const T p = V::set1(s[j]);
        for (uint32_t v = 0; v < dv; ++v) o[v] = V::fma(p, V::loadu(vb + v * W), o[v]);
      }
      const T invv = V::set1(inv);
      for (uint32_t v = 0; v < dv; ++v) V::storeu(out + v * W, V::mul(o[v], invv));
    }
  }

  static void silu_mul(const float* gate, const float* up, float* out, size_t n) {
    size_t i = 0;
    const T one = V::set1(1.0f);
    for (; i + W <= n; i += W) {
      const T g = V::loadu(gate + i);
      const T e = exp_v(V::neg_abs(g));
      const T pos = V::div(one, V::add(one, e));
      const T neg = V::div(e, V::add(one, e));
      const T sig = V::select_ge0(g, pos, neg);
      V::storeu(out + i, V::mul(V::mul(g, sig), V::loadu(up + i)));
    }
    for (; i < n; ++i) out[i] = silu_mul_scalar(gate[i], up[i]);
  }
};

template <class V>
inline Kernels make_kernels(const char* name) {
  return Kernels{name, Ops<V>::gemm, Ops<V>::attention, Ops<V>::silu_mul};
}

}  // namespace tandem::engine::kernels::simd
