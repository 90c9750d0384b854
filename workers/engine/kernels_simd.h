// The SIMD kernels, written once over a vector type V (V512 or V256 below) and compiled
// in one translation unit per instruction set. Each lane performs exactly the scalar
// operation sequence of kernels_generic.cpp.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "model/half.h"
#include "workers/engine/kernels.h"
#include "workers/engine/kernels_rotated.h"
#include "workers/engine/kernels_scalar.h"

// The members of a lane type (V256, V512) whose intrinsics differ between instruction sets
// only by the vector width in their names (_mm256_add_ps, _mm512_add_ps): written once and
// expanded in each kernels_*.cpp with BITS 256 or 512. What the widths do differently
// (conversions, rounding, blends and masks, the horizontal max) each file writes itself.
#define TANDEM_SIMD_LANE_OPS(BITS)                                                                              \
  using T = __m##BITS;                                                                                          \
  static constexpr uint32_t W = BITS / 32;                                                                      \
  static T zero() { return _mm##BITS##_setzero_ps(); }                                                          \
  static T set1(float x) { return _mm##BITS##_set1_ps(x); }                                                     \
  static T load(const float* p) { return _mm##BITS##_load_ps(p); }                                              \
  static T loadu(const float* p) { return _mm##BITS##_loadu_ps(p); }                                            \
  static void storeu(float* p, T v) { _mm##BITS##_storeu_ps(p, v); }                                            \
  static T fma(T a, T b, T c) { return _mm##BITS##_fmadd_ps(a, b, c); }                                         \
  static T mul(T a, T b) { return _mm##BITS##_mul_ps(a, b); }                                                   \
  static T add(T a, T b) { return _mm##BITS##_add_ps(a, b); }                                                   \
  static T sub(T a, T b) { return _mm##BITS##_sub_ps(a, b); }                                                   \
  static T div(T a, T b) { return _mm##BITS##_div_ps(a, b); }                                                   \
  static T max(T a, T b) { return _mm##BITS##_max_ps(a, b); }                                                   \
  static T pow2(T n) {                                                                                          \
    const __m##BITS##i biased = _mm##BITS##_add_epi32(_mm##BITS##_cvtps_epi32(n), _mm##BITS##_set1_epi32(127)); \
    return _mm##BITS##_castsi##BITS##_ps(_mm##BITS##_slli_epi32(biased, 23));                                   \
  }

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

  // Weight loaders: W floats of a panel row as a vector (F32 as is, F16/BF16 widened exactly).
  struct LoadF32 {
    using E = float;
    static T load(const float* p) { return V::loadu(p); }
  };
  struct LoadF16 {
    using E = uint16_t;
    static T load(const uint16_t* p) { return V::load_f16(p); }
  };
  struct LoadBF16 {
    using E = uint16_t;
    static T load(const uint16_t* p) { return V::load_bf16(p); }
  };

  // MR rows x one panel, full K: acc[r][v] is the fma chain of kernels_generic.cpp.
  template <uint32_t MR, class L>
  static void micro(const float* a, size_t lda, const typename L::E* panel, uint32_t k_dim, float* c, size_t ldc,
                    uint32_t cols) {
    T acc[MR][NV];
#pragma GCC unroll 16
    for (uint32_t r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (uint32_t v = 0; v < NV; ++v) acc[r][v] = V::zero();
    for (uint32_t k = 0; k < k_dim; ++k) {
      const typename L::E* wk = panel + k * kPanel;
      T w[NV];
#pragma GCC unroll 4
      for (uint32_t v = 0; v < NV; ++v) w[v] = L::load(wk + v * W);
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

  template <uint32_t MR, class L>
  static void rows(const float* a, size_t lda, uint32_t m, const typename L::E* panel, uint32_t k_dim, float* c,
                   size_t ldc, uint32_t cols) {
    uint32_t r = 0;
    for (; r + MR <= m; r += MR) micro<MR, L>(a + r * lda, lda, panel, k_dim, c + r * ldc, ldc, cols);
    if constexpr (MR > 1) {
      if (r < m) tail<MR - 1, L>(a + r * lda, lda, m - r, panel, k_dim, c + r * ldc, ldc, cols);
    }
  }

  template <uint32_t MR, class L>
  static void tail(const float* a, size_t lda, uint32_t m, const typename L::E* panel, uint32_t k_dim, float* c,
                   size_t ldc, uint32_t cols) {
    if (m == MR) return micro<MR, L>(a, lda, panel, k_dim, c, ldc, cols);
    if constexpr (MR > 1) tail<MR - 1, L>(a, lda, m, panel, k_dim, c, ldc, cols);
  }

  template <class L>
  static void gemm_panels(const float* a, size_t lda, uint32_t m, const typename L::E* data, uint32_t n, uint32_t k,
                          uint32_t p0, uint32_t p1, float* c, size_t ldc) {
    for (uint32_t p = p0; p < p1; ++p) {
      const typename L::E* panel = data + static_cast<size_t>(p) * k * kPanel;
      const uint32_t n0 = p * kPanel;
      const uint32_t cols = std::min(kPanel, n - n0);
      rows<V::kMaxRows, L>(a, lda, m, panel, k, c + n0, ldc, cols);
    }
  }

  // gemm_bf16 (kernels.h) by F32 fmas, each sum flushed as vdpbf16ps does: MR rows x one
  // panel. (The CPUs without AVX-512 BF16.)
  template <uint32_t MR>
  static void micro_pairs(const uint16_t* a, uint32_t k_dim, const uint16_t* panel, float* c, size_t ldc,
                          uint32_t cols) {
    T acc[MR][NV];
    for (uint32_t r = 0; r < MR; ++r)
      for (uint32_t v = 0; v < NV; ++v) acc[r][v] = V::zero();
    for (uint32_t q = 0; q < k_dim / 2; ++q) {
      T even[NV], odd[NV];
      for (uint32_t v = 0; v < NV; ++v) V::load_pairs(panel + (size_t{q} * kPanel + v * W) * 2, even[v], odd[v]);
      for (uint32_t r = 0; r < MR; ++r) {
        const T ao = V::set1(model::bf16_to_float(a[r * k_dim + 2 * q + 1]));
        const T ae = V::set1(model::bf16_to_float(a[r * k_dim + 2 * q]));
        for (uint32_t v = 0; v < NV; ++v) {
          acc[r][v] = V::ftz(V::fma(ao, odd[v], acc[r][v]));
          acc[r][v] = V::ftz(V::fma(ae, even[v], acc[r][v]));
        }
      }
    }
    store_rows<MR>(acc, c, ldc, cols);
  }

  // acc (MR rows x NV vectors) into C, the first `cols` columns.
  template <uint32_t MR>
  static void store_rows(const T (&acc)[MR][NV], float* c, size_t ldc, uint32_t cols) {
    alignas(64) float tmp[kPanel];
    for (uint32_t r = 0; r < MR; ++r) {
      for (uint32_t v = 0; v < NV; ++v) V::storeu(tmp + v * W, acc[r][v]);
      std::copy(tmp, tmp + cols, c + r * ldc);
    }
  }

  // Rows [0, m) in groups of at most MR, as even as possible (16 rows: 8 + 8, not 12 + 4, so
  // no group is too small to hide the multiply-add latency): f.template operator()<R>(r0).
  template <uint32_t MR, class F>
  static void pair_rows(uint32_t m, F&& f) {
    const uint32_t groups = (m + MR - 1) / MR;
    uint32_t r = 0;
    for (uint32_t g = 0; g < groups; ++g) {
      const uint32_t size = (m - r) / (groups - g);  // the larger groups last
      pair_tail<MR>(r, size, f);
      r += size;
    }
  }
  template <uint32_t R, class F>
  static void pair_tail(uint32_t r, uint32_t left, F& f) {
    if (left == R) return f.template operator()<R>(r);
    if constexpr (R > 1) pair_tail<R - 1>(r, left, f);
  }

  static void gemm_bf16(const uint16_t* a, uint32_t m, const PackedPairsView& w, uint32_t p0, uint32_t p1, float* c,
                        size_t ldc) {
    for (uint32_t p = p0; p < p1; ++p) {
      const uint16_t* panel = w.data + static_cast<size_t>(p) * w.k * kPanel;
      const uint32_t n0 = p * kPanel, cols = std::min(kPanel, w.n - n0);
      pair_rows<V::kMaxRows>(m, [&]<uint32_t MR>(uint32_t r) {
        micro_pairs<MR>(a + size_t{r} * w.k, w.k, panel, c + r * ldc + n0, ldc, cols);
      });
    }
  }

  static void gemm(const float* a, size_t lda, uint32_t m, const PackedView& w, uint32_t p0, uint32_t p1, float* c,
                   size_t ldc) {
    gemm_panels<LoadF32>(a, lda, m, w.data, w.n, w.k, p0, p1, c, ldc);
  }

  static void gemm16(const float* a, size_t lda, uint32_t m, const Packed16View& w, uint32_t p0, uint32_t p1, float* c,
                     size_t ldc) {
    if (w.bf16) return gemm_panels<LoadBF16>(a, lda, m, w.data, w.n, w.k, p0, p1, c, ldc);
    gemm_panels<LoadF16>(a, lda, m, w.data, w.n, w.k, p0, p1, c, ldc);
  }

  // NQ query vectors of one KV head (F32 cache): vector i's query q[i], its scores row s[i] (from
  // key 0), its output out[i] and its keys [first_key, n_keys[i]). The vectors are the query
  // heads of one or more consecutive rows of a sequence (AttentionArgs::rows): K and V are read
  // once for all of them, and each has its own fma chains, so grouping them changes no bit.
  template <uint32_t NQ>
  struct Queries {
    const float* q[NQ];
    float* s[NQ];
    float* out[NQ];
    uint32_t n_keys[NQ];
    uint32_t min_keys, max_keys;
  };

  // Scores of the NQ vectors against the 16 * G keys starting at j0 (G groups of 16, each in one
  // block), K read once for all vectors. Lane l of group g is key j0 + 16 g + l.
  template <uint32_t NQ, uint32_t G>
  static void scores(const AttentionArgs& x, const Queries<NQ>& qs, uint32_t j0, T* mx) {
    constexpr uint32_t L = 16 / W;
    const uint32_t hd = x.head_dim, bt = x.block_tokens;
    const float* kb[G];
    for (uint32_t g = 0; g < G; ++g) {
      const uint32_t j = j0 + 16 * g;
      kb[g] = x.k_base + x.blocks[j / bt] * x.block_stride + (j % bt);
    }
    T acc[NQ][G * L];
#pragma GCC unroll 8
    for (uint32_t h = 0; h < NQ; ++h)
#pragma GCC unroll 8
      for (uint32_t i = 0; i < G * L; ++i) acc[h][i] = V::zero();
    // The next block's keys live in another page the hardware prefetcher will not enter:
    // fetch them one line per d step, one block ahead.
    const uint32_t jn = j0 + 16 * G;
    const float* next = jn < qs.max_keys ? x.k_base + x.blocks[jn / bt] * x.block_stride + (jn % bt) : nullptr;
    if (next)
      for (uint32_t d = 0; d < hd; ++d) _mm_prefetch(reinterpret_cast<const char*>(next + d * bt), _MM_HINT_T0);
    for (uint32_t d = 0; d < hd; ++d) {
      T k[G * L];
#pragma GCC unroll 8
      for (uint32_t i = 0; i < G * L; ++i) k[i] = V::loadu(kb[i / L] + d * bt + (i % L) * W);
#pragma GCC unroll 8
      for (uint32_t h = 0; h < NQ; ++h) {
        const T qd = V::set1(qs.q[h][d]);
#pragma GCC unroll 8
        for (uint32_t i = 0; i < G * L; ++i) acc[h][i] = V::fma(qd, k[i], acc[h][i]);
      }
    }
    const T scale = V::set1(x.scale);
#pragma GCC unroll 8
    for (uint32_t h = 0; h < NQ; ++h) {
      const uint32_t valid = qs.n_keys[h] > j0 ? std::min(16u * G, qs.n_keys[h] - j0) : 0;
#pragma GCC unroll 8
      for (uint32_t i = 0; i < G * L; ++i) {
        const T sv = V::mul(acc[h][i], scale);
        V::storeu(qs.s[h] + j0 + i * W, sv);
        mx[h] = V::max(mx[h], V::masked_keep(sv, V::set1(-INFINITY), valid, i * W));
      }
    }
  }

  template <uint32_t NQ, uint32_t DV>
  static void clear(T (&o)[NQ][DV]) {
#pragma GCC unroll 8
    for (uint32_t h = 0; h < NQ; ++h)
#pragma GCC unroll 16
      for (uint32_t v = 0; v < DV; ++v) o[h][v] = V::zero();
  }

  // Row h of `o` to out + h * hd.
  template <uint32_t NQ, uint32_t DV>
  static void store_rows(const T (&o)[NQ][DV], float* out, uint32_t hd) {
#pragma GCC unroll 8
    for (uint32_t h = 0; h < NQ; ++h)
#pragma GCC unroll 16
      for (uint32_t v = 0; v < DV; ++v) V::storeu(out + h * hd + v * W, o[h][v]);
  }

  // The `bytes` bytes at p into L1, a line at a time (the next KV block: the hardware prefetcher
  // does not cross into another page).
  static void prefetch_block(const void* p, size_t bytes) {
    for (size_t line = 0; line < bytes; line += 64) _mm_prefetch(static_cast<const char*>(p) + line, _MM_HINT_T0);
  }

  // Keys [first_key, to) a block at a time: body(j, end, b0) for the keys [j, end) of the block
  // that starts at key b0, after prefetch(next block's index) while another block follows. One
  // division a block, not one a key: the value loops run a few cycles a key at small head sizes.
  template <class Body, class Prefetch>
  [[gnu::always_inline]] static void value_blocks(const AttentionArgs& x, uint32_t to, Body&& body,
                                                  Prefetch&& prefetch) {
    const uint32_t bt = x.block_tokens;
    for (uint32_t j = x.first_key; j < to;) {
      const uint32_t b = j / bt, b0 = b * bt, end = std::min(to, b0 + bt);
      if (end < to) prefetch(b + 1);
      body(j, end, b0);
      j = end;
    }
  }

  // body(block bytes, slot, j) for every coded key j in [first_key, to), in order (quantized and
  // rotated V: `block_bytes` a pool block).
  template <class Body>
  [[gnu::always_inline]] static void coded_values(const AttentionArgs& x, uint32_t to, Body&& body) {
    value_blocks(
        x, to,
        [&](uint32_t j, uint32_t end, uint32_t b0) {
          const uint8_t* vb = x.v_bytes + x.blocks[j / x.block_tokens] * x.block_bytes;
          for (; j < end; ++j) body(vb, j - b0, j);
        },
        [&](uint32_t block) { prefetch_block(x.v_bytes + x.blocks[block] * x.block_bytes, x.block_bytes); });
  }

  // out[h][:] = fma chain over keys of p[h][j] * v_j, V read once for all NQ vectors (p: their
  // probabilities, qs.s); DV vectors span the head dimension. Unscaled: times inv by the caller.
  template <uint32_t NQ, uint32_t DV>
  static void weighted_values(const AttentionArgs& x, const Queries<NQ>& qs) {
    const uint32_t hd = x.head_dim, bt = x.block_tokens;
    T o[NQ][DV];
    clear(o);
    value_blocks(
        x, qs.min_keys,
        [&](uint32_t j, uint32_t end, uint32_t b0) {
          const float* block = x.v_base + x.blocks[j / bt] * x.block_stride;
          for (; j < end; ++j) add_value(o, block + (j - b0) * hd, qs.s, j);
        },
        [&](uint32_t block) { prefetch_block(x.v_base + x.blocks[block] * x.block_stride, bt * hd * sizeof(float)); });
    // Keys some vectors have and others not (the later rows'): each vector's chain goes on alone.
    for (uint32_t j = std::max(qs.min_keys, x.first_key); j < qs.max_keys; ++j) {
      const float* vb = x.v_base + x.blocks[j / bt] * x.block_stride + (j % bt) * hd;
#pragma GCC unroll 8
      for (uint32_t h = 0; h < NQ; ++h) {
        if (j >= qs.n_keys[h]) continue;
        const T pj = V::set1(qs.s[h][j]);
#pragma GCC unroll 16
        for (uint32_t v = 0; v < DV; ++v) o[h][v] = V::fma(pj, V::loadu(vb + v * W), o[h][v]);
      }
    }
#pragma GCC unroll 8
    for (uint32_t h = 0; h < NQ; ++h)
#pragma GCC unroll 16
      for (uint32_t v = 0; v < DV; ++v) V::storeu(qs.out[h] + v * W, o[h][v]);
  }

  // o[h][:] = fma(p[h][j], v[:], o[h][:]) for every vector: one F32 value row, read once.
  template <uint32_t NQ, uint32_t DV, class P>
  [[gnu::always_inline]] static void add_value(T (&o)[NQ][DV], const float* vb, const P (&p)[NQ], uint32_t j) {
    T vv[DV];
#pragma GCC unroll 16
    for (uint32_t v = 0; v < DV; ++v) vv[v] = V::loadu(vb + v * W);
#pragma GCC unroll 8
    for (uint32_t h = 0; h < NQ; ++h) {
      const T pj = V::set1(p[h][j]);
#pragma GCC unroll 16
      for (uint32_t v = 0; v < DV; ++v) o[h][v] = V::fma(pj, vv[v], o[h][v]);
    }
  }

  // One vector's scores s[first_scored, n_keys) with running max mx to probabilities in place;
  // returns 1 / sum. The window and the cap (shape_scores) before; the lanes start at what the
  // keys before first_scored would have added (masked_lanes).
  static float softmax_row(const AttentionArgs& x, float* s, uint32_t n_keys, T mx) {
    constexpr uint32_t L = 16 / W;
    const uint32_t from = first_scored(x);
    float m = V::hmax(mx);
    if (x.first_key != 0 || x.softcap > 0.0f) {
      AttentionArgs keys = x;
      keys.n_keys = n_keys;
      m = shape_scores(keys, s, m);
    }
    const T mxv = V::set1(m);
    T lanes[L];
    for (uint32_t l = 0; l < L; ++l) lanes[l] = V::set1(from ? masked_lanes(from / 16) : 0.0f);
    for (uint32_t g = from; g < n_keys; g += 16) {
      const uint32_t valid = std::min(16u, n_keys - g);
      for (uint32_t l = 0; l < L; ++l) {
        T p = exp_v(V::sub(V::loadu(s + g + l * W), mxv));
        p = V::masked_keep(p, V::zero(), valid, l * W);
        V::storeu(s + g + l * W, p);
        lanes[l] = V::add(lanes[l], p);
      }
    }
    alignas(64) float lane_sums[16];
    for (uint32_t l = 0; l < L; ++l) V::storeu(lane_sums + l * W, lanes[l]);
    return 1.0f / reduce16(lane_sums);
  }

  // softmax_row for NQ heads stride apart in s, all with x.n_keys keys; inv[h] = 1 / sum.
  template <uint32_t NQ>
  static void softmax(const AttentionArgs& x, float* s, uint32_t stride, const T* mx, float* inv) {
    for (uint32_t h = 0; h < NQ; ++h) inv[h] = softmax_row(x, s + h * stride, x.n_keys, mx[h]);
  }

  // Attention of the NQ vectors (F32 cache), each to its own out.
  template <uint32_t NQ, uint32_t DV>
  static void vectors(const AttentionArgs& x, const Queries<NQ>& qs) {
    const uint32_t end = (qs.max_keys + 15) / 16 * 16;
    T mx[NQ];
    for (uint32_t h = 0; h < NQ; ++h) mx[h] = V::set1(-INFINITY);
    // Two groups of 16 keys at once: twice the independent chains.
    uint32_t j0 = first_scored(x);
    for (; j0 + 32 <= end; j0 += 32) scores<NQ, 2>(x, qs, j0, mx);
    if (j0 < end) scores<NQ, 1>(x, qs, j0, mx);
    float inv[NQ];
    for (uint32_t h = 0; h < NQ; ++h) inv[h] = softmax_row(x, qs.s[h], qs.n_keys[h], mx[h]);
    weighted_values<NQ, DV>(x, qs);
    for (uint32_t h = 0; h < NQ; ++h) {
      const T invv = V::set1(inv[h]);
      for (uint32_t v = 0; v < DV; ++v) V::storeu(qs.out[h] + v * W, V::mul(V::loadu(qs.out[h] + v * W), invv));
    }
  }

  // The query vectors [i0, i0 + NQ) of x's rows x heads (vector i: row i / n_q, head i % n_q).
  template <uint32_t NQ>
  static Queries<NQ> queries(const AttentionArgs& x, uint32_t i0) {
    const uint32_t hd = x.head_dim, stride = (x.n_keys + x.rows - 1 + 15) / 16 * 16;
    Queries<NQ> qs;
    qs.min_keys = UINT32_MAX, qs.max_keys = 0;
    for (uint32_t h = 0; h < NQ; ++h) {
      const uint32_t i = i0 + h, r = i / x.n_q, head = i % x.n_q;
      qs.q[h] = x.q + r * x.q_row_stride + head * hd;
      qs.out[h] = x.out + r * x.out_row_stride + head * hd;
      qs.s[h] = x.scores + size_t{i} * stride;
      qs.n_keys[h] = x.n_keys + r;
      qs.min_keys = std::min(qs.min_keys, qs.n_keys[h]);
      qs.max_keys = std::max(qs.max_keys, qs.n_keys[h]);
    }
    return qs;
  }

  // run(queries) for every query vector of x in groups of up to MAXQ.
  template <uint32_t MAXQ, class Run>
  static void all_vectors(const AttentionArgs& x, Run&& run) {
    const uint32_t n = x.rows * x.n_q;
    uint32_t i = 0;
    for (; i + MAXQ <= n; i += MAXQ) run(queries<MAXQ>(x, i));
    if constexpr (MAXQ > 1) {
      if (i < n) [&]<uint32_t... Q>(std::integer_sequence<uint32_t, Q...>) {
          ((n - i == Q + 1 ? run(queries<Q + 1>(x, i)) : void()), ...);
        }
      (std::make_integer_sequence<uint32_t, MAXQ - 1>{});
    }
  }

  // run.template operator()<DV, MAXQ>() for x's head size: DV vectors span a head, and MAXQ query
  // vectors a call keep their score and value accumulators in registers (32 with AVX-512, 16 with AVX2).
  template <class Run>
  static void by_head_size(const AttentionArgs& x, Run&& run) {
    constexpr uint32_t kWide = W == 16 ? 2 : 1;
    switch (x.head_dim / W) {
      case 1: return run.template operator()<1, 4 * kWide>();
      case 2: return run.template operator()<2, 4 * kWide>();
      case 4: return run.template operator()<4, 2 * kWide>();
      case 8: return run.template operator() < 8, kWide == 2 ? 3 : 1 > ();
      case 16: return run.template operator()<16, 1>();
      case 32: return run.template operator()<32, 1>();
    }
  }

  static void attention_f32(const AttentionArgs& x) {
    by_head_size(x, [&]<uint32_t DV, uint32_t MAXQ>() {
      all_vectors<MAXQ>(x, [&]<uint32_t Q>(const Queries<Q>& qs) { vectors<Q, DV>(x, qs); });
    });
  }

  // 16 quantized codes (8 bits: 16 bytes; 4 bits: 8 bytes, even index in the low nibble)
  // as 16 / W float vectors; the conversion is exact.
  template <uint32_t BITS>
  static void codes16(const uint8_t* p, T* out) {
    V::u8_to_float(BITS == 8 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)) : nibbles16(p), out);
  }

  // 16 4-bit codes (8 bytes, the even index in the low nibble) as 16 bytes.
  static __m128i nibbles16(const uint8_t* p) {
    const __m128i packed = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const __m128i mask = _mm_set1_epi8(0x0F);
    return _mm_unpacklo_epi8(_mm_and_si128(packed, mask), _mm_and_si128(_mm_srli_epi16(packed, 4), mask));
  }

  // 16 rotated codes as 16 bytes (kv_cache.h): 4 bits as nibbles16; 3 bits from three bit
  // planes `plane` bytes apart, 2 bytes each (code i: bit i of each plane's 16-bit word).
  template <uint32_t BITS>
  static __m128i rotated16(const uint8_t* p, size_t plane) {
    if constexpr (BITS == 4) {
      return nibbles16(p);
    } else {
      const __m128i sel = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
      const __m128i bit = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
      __m128i out = _mm_setzero_si128();
      for (uint32_t b = 0; b < 3; ++b) {
        uint16_t w;
        std::memcpy(&w, p + b * plane, 2);
        const __m128i x = _mm_shuffle_epi8(_mm_set1_epi16(static_cast<int16_t>(w)), sel);
        out = _mm_or_si128(out, _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(x, bit), bit), _mm_set1_epi8(1 << b)));
      }
      return out;
    }
  }
  // The levels of 16 rotated codes at p (planes `plane` bytes apart for 3 bits) as 16 / W
  // vectors. Where the lane type has mask registers (V::kPlaneMasks), the 3-bit planes' words
  // are those masks and the codes are built in 32-bit lanes directly.
  template <uint32_t BITS>
  [[gnu::always_inline]] static void rotated_levels(const uint8_t* p, size_t plane, const typename V::Table& t,
                                                    T* out) {
    if constexpr (BITS == 3 && V::kPlaneMasks) {
      V::lookup_planes(p, plane, t, out);
    } else {
      V::lookup(rotated16<BITS>(p, plane), t, out);
    }
  }
  // The byte where the 16 rotated codes from index i (a multiple of 16) start in a row.
  template <uint32_t BITS>
  static size_t rotated_offset(uint32_t i) {
    return BITS == 4 ? i / 2 : i / 8;
  }

  // Quantized K: scores of the NQ vectors against the 16 keys at j0 (one block), the dot product
  // taken on the codes per group, then scaled and shifted (kernels.h). qsum[h][g]: sums of q.
  template <uint32_t NQ, uint32_t BITS>
  static void scores_q(const AttentionArgs& x, const Queries<NQ>& qs, const float (*qsum)[16], uint32_t j0, T* mx) {
    constexpr uint32_t L = 16 / W;
    const uint32_t hd = x.head_dim, bt = x.block_tokens, gs = x.group_size, ng = hd / gs;
    const size_t row_bytes = size_t{bt} * BITS / 8;
    const uint8_t* kb = x.k_bytes + x.blocks[j0 / bt] * x.block_bytes;
    const uint32_t slot = j0 % bt;
    if (slot == 0 && j0 + bt < qs.max_keys)  // the next block, all at once: another page
      prefetch_block(x.k_bytes + x.blocks[j0 / bt + 1] * x.block_bytes, x.block_bytes);
    const float* ksc = reinterpret_cast<const float*>(kb + hd * row_bytes) + slot;
    const float* kbi = ksc + size_t{ng} * bt;
    const uint8_t* codes = kb + slot * BITS / 8;
    T t[NQ][L];
    for (uint32_t h = 0; h < NQ; ++h)
      for (uint32_t i = 0; i < L; ++i) t[h][i] = V::zero();
    for (uint32_t g = 0; g < ng; ++g) {
      T a[NQ][L];
#pragma GCC unroll 8
      for (uint32_t h = 0; h < NQ; ++h)
        for (uint32_t i = 0; i < L; ++i) a[h][i] = V::zero();
      for (uint32_t d = g * gs; d < (g + 1) * gs; ++d) {
        T k[L];
        codes16<BITS>(codes + d * row_bytes, k);
#pragma GCC unroll 8
        for (uint32_t h = 0; h < NQ; ++h) {
          const T qd = V::set1(qs.q[h][d]);
          for (uint32_t i = 0; i < L; ++i) a[h][i] = V::fma(qd, k[i], a[h][i]);
        }
      }
      for (uint32_t i = 0; i < L; ++i) {
        const T sc = V::loadu(ksc + g * bt + i * W), bi = V::loadu(kbi + g * bt + i * W);
#pragma GCC unroll 8
        for (uint32_t h = 0; h < NQ; ++h) {
          t[h][i] = V::fma(sc, a[h][i], t[h][i]);
          t[h][i] = V::fma(bi, V::set1(qsum[h][g]), t[h][i]);
        }
      }
    }
    const T scale = V::set1(x.scale);
    for (uint32_t h = 0; h < NQ; ++h) {
      const uint32_t valid = qs.n_keys[h] > j0 ? std::min(16u, qs.n_keys[h] - j0) : 0;
      for (uint32_t i = 0; i < L; ++i) {
        const T sv = V::mul(t[h][i], scale);
        V::storeu(qs.s[h] + j0 + i * W, sv);
        mx[h] = V::max(mx[h], V::masked_keep(sv, V::set1(-INFINITY), valid, i * W));
      }
    }
  }

  // An F32 key row of the window: per vector, 16 lanes (lane l: fma chain over d = l, l + 16,
  // ...), tree-reduced as the softmax sums are (kernels.h).
  template <uint32_t NQ>
  static void scores_row(const AttentionArgs& x, const float* q, const float* k, uint32_t j, float* s, uint32_t stride,
                         T* mx) {
    Queries<NQ> qs;
    for (uint32_t h = 0; h < NQ; ++h) qs.q[h] = q + h * x.head_dim, qs.s[h] = s + h * stride;
    scores_row<NQ>(x, qs, k, j, mx);
  }
  template <uint32_t NQ>
  static void scores_row(const AttentionArgs& x, const Queries<NQ>& qs, const float* k, uint32_t j, T* mx) {
    constexpr uint32_t L = 16 / W;
    const uint32_t hd = x.head_dim;
    T acc[NQ][L];
    for (uint32_t h = 0; h < NQ; ++h)
      for (uint32_t i = 0; i < L; ++i) acc[h][i] = V::zero();
    for (uint32_t d0 = 0; d0 < hd; d0 += 16)
      for (uint32_t i = 0; i < L; ++i) {
        const T kv = V::loadu(k + d0 + i * W);
        for (uint32_t h = 0; h < NQ; ++h) acc[h][i] = V::fma(V::loadu(qs.q[h] + d0 + i * W), kv, acc[h][i]);
      }
    for (uint32_t h = 0; h < NQ; ++h) {
      alignas(64) float lanes[16];
      for (uint32_t i = 0; i < L; ++i) V::storeu(lanes + i * W, acc[h][i]);
      const float sj = reduce16(lanes) * x.scale;
      qs.s[h][j] = sj;
      mx[h] = V::max(mx[h], V::set1(sj));
    }
  }

  // Quantized V, key j (its block's bytes vb, its slot) into the vectors' chains: o[h][d] =
  // fma(p_j * vscale_jg, c_j[d], o[h][d]), pb[h][g] = fma(p_j, vbias_jg, pb[h][g]); with TAIL,
  // only the vectors that have key j.
  template <bool TAIL, uint32_t NQ, uint32_t DV, uint32_t BITS>
  [[gnu::always_inline]] static void add_coded_value(const AttentionArgs& x, const Queries<NQ>& qs, const uint8_t* vb,
                                                     uint32_t slot, uint32_t j, const uint32_t (&group_of)[DV],
                                                     T (&o)[NQ][DV], float (&pb)[NQ][16]) {
    constexpr uint32_t L = 16 / W;
    const uint32_t hd = x.head_dim, bt = x.block_tokens, ng = hd / x.group_size;
    const uint8_t* row = vb + size_t{slot} * hd * BITS / 8;
    const float* vsc = reinterpret_cast<const float*>(vb + size_t{hd} * bt * BITS / 8) + size_t{slot} * ng;
    const float* vbi = vsc + size_t{bt} * ng;
    T c[DV < L ? L : DV];  // DV < L only in instantiations no head_dim reaches
#pragma GCC unroll 16
    for (uint32_t v = 0; v < DV; v += L) codes16<BITS>(row + v * W * BITS / 8, c + v);
#pragma GCC unroll 8
    for (uint32_t h = 0; h < NQ; ++h) {
      if (TAIL && j >= qs.n_keys[h]) continue;
      const float pj = qs.s[h][j];
      for (uint32_t g = 0; g < ng; ++g) pb[h][g] = std::fma(pj, vbi[g], pb[h][g]);
        // o is indexed at compile time only, so it stays in registers.
#pragma GCC unroll 16
      for (uint32_t v = 0; v < DV; ++v) o[h][v] = V::fma(V::set1(pj * vsc[group_of[v]]), c[v], o[h][v]);
    }
  }

  // Quantized V: o[h][d] = fma chain over j >= first_key of (p_j * vscale_jg) * c_j[d]; pb[h][g] =
  // fma chain over j >= first_key of p_j * vbias_jg; then the F32 window's values continue o.
  // DV vectors span the head dimension. o unscaled to qs.out.
  template <uint32_t NQ, uint32_t DV, uint32_t BITS>
  static void weighted_values_q(const AttentionArgs& x, const Queries<NQ>& qs, float (&pb)[NQ][16]) {
    const uint32_t hd = x.head_dim, bt = x.block_tokens, gs = x.group_size;
    uint32_t group_of[DV];  // the group of vector v
    for (uint32_t v = 0; v < DV; ++v) group_of[v] = v * W / gs;
    T o[NQ][DV];
    clear(o);
    float pbl[NQ][16] = {};  // local: the compiler need not assume it aliases the scores
    const uint32_t coded = x.win_k ? x.f32_from : qs.min_keys;
    coded_values(x, coded, [&](const uint8_t* vb, uint32_t slot, uint32_t j) {
      add_coded_value<false, NQ, DV, BITS>(x, qs, vb, slot, j, group_of, o, pbl);
    });
    if (!x.win_k)  // keys some vectors have and others not (the later rows')
      for (uint32_t j = std::max(coded, x.first_key); j < qs.max_keys; ++j)
        add_coded_value<true, NQ, DV, BITS>(x, qs, x.v_bytes + x.blocks[j / bt] * x.block_bytes, j % bt, j, group_of, o,
                                            pbl);
    else  // the F32 window (one row)
      for (uint32_t j = std::max(coded, x.first_key); j < x.n_keys; ++j) add_value(o, x.win_v[j - coded], qs.s, j);
#pragma GCC unroll 8
    for (uint32_t h = 0; h < NQ; ++h) {
#pragma GCC unroll 16
      for (uint32_t v = 0; v < DV; ++v) V::storeu(qs.out[h] + v * W, o[h][v]);
      for (uint32_t g = 0; g < hd / gs; ++g) pb[h][g] = pbl[h][g];
    }
  }

  // Attention of the NQ vectors over a quantized cache (the F32 window only with one row).
  template <uint32_t NQ, uint32_t DV, uint32_t BITS>
  static void vectors_q(const AttentionArgs& x, const Queries<NQ>& qs) {
    const uint32_t hd = x.head_dim, gs = x.group_size, ng = hd / gs;
    float qsum[NQ][16];
    for (uint32_t h = 0; h < NQ; ++h)
      for (uint32_t g = 0; g < ng; ++g) {
        qsum[h][g] = 0.0f;
        for (uint32_t d = g * gs; d < (g + 1) * gs; ++d) qsum[h][g] = qsum[h][g] + qs.q[h][d];
      }
    T mx[NQ];
    for (uint32_t h = 0; h < NQ; ++h) mx[h] = V::set1(-INFINITY);
    const uint32_t coded = x.win_k ? x.f32_from : qs.max_keys;
    for (uint32_t j0 = first_scored(x); j0 < coded; j0 += 16) scores_q<NQ, BITS>(x, qs, qsum, j0, mx);
    for (uint32_t j = std::max(coded, x.first_key); j < x.n_keys && x.win_k; ++j)
      scores_row<NQ>(x, qs, x.win_k[j - coded], j, mx);
    float inv[NQ];
    for (uint32_t h = 0; h < NQ; ++h) inv[h] = softmax_row(x, qs.s[h], qs.n_keys[h], mx[h]);
    float pb[NQ][16] = {};
    weighted_values_q<NQ, DV, BITS>(x, qs, pb);
    for (uint32_t h = 0; h < NQ; ++h) {
      const T invv = V::set1(inv[h]);
      for (uint32_t v = 0; v < DV; ++v) {
        const T b = V::set1(pb[h][v * W / gs]);
        V::storeu(qs.out[h] + v * W, V::mul(V::add(V::loadu(qs.out[h] + v * W), b), invv));
      }
    }
  }

  template <uint32_t BITS>
  static void attention_q(const AttentionArgs& x) {
    by_head_size(x, [&]<uint32_t DV, uint32_t MAXQ>() {
      all_vectors<MAXQ>(x, [&]<uint32_t Q>(const Queries<Q>& qs) { vectors_q<Q, DV, BITS>(x, qs); });
    });
  }

  // Rotated K: scores of NQ rotated query heads (qr) against the 16 keys at j0 (one block),
  // lane by lane the chain of kernels_rotated.h: (n_j * (fma chain over d of qr[d] * L[c_j[d]])) * scale.
  template <uint32_t NQ, uint32_t BITS>
  static void scores_rot(const AttentionArgs& x, const float* qr, const typename V::Table& levels, uint32_t j0,
                         float* s, uint32_t stride, T* mx) {
    constexpr uint32_t L = 16 / W;
    const uint32_t hd = x.head_dim, bt = x.block_tokens;
    const size_t row_bytes = size_t{bt} * BITS / 8;
    const uint8_t* kb = x.k_bytes + x.blocks[j0 / bt] * x.block_bytes;
    const uint32_t slot = j0 % bt;
    if (slot == 0 && j0 + bt < x.n_keys) {  // the next block, all at once: another page
      const char* nb = reinterpret_cast<const char*>(x.k_bytes + x.blocks[j0 / bt + 1] * x.block_bytes);
      for (size_t line = 0; line < x.block_bytes; line += 64) _mm_prefetch(nb + line, _MM_HINT_T0);
    }
    const uint8_t* codes = kb + rotated_offset<BITS>(slot);
    T acc[NQ][L];
    for (uint32_t h = 0; h < NQ; ++h)
      for (uint32_t i = 0; i < L; ++i) acc[h][i] = V::zero();
    for (uint32_t d = 0; d < hd; ++d) {
      T k[L];
      rotated_levels<BITS>(codes + d * row_bytes, bt / 8, levels, k);
#pragma GCC unroll 8
      for (uint32_t h = 0; h < NQ; ++h) {
        const T qd = V::set1(qr[h * hd + d]);
        for (uint32_t i = 0; i < L; ++i) acc[h][i] = V::fma(qd, k[i], acc[h][i]);
      }
    }
    const float* norms = reinterpret_cast<const float*>(kb + hd * row_bytes) + slot;
    const T scale = V::set1(x.scale);
    const uint32_t valid = std::min(16u, x.n_keys - j0);
    for (uint32_t h = 0; h < NQ; ++h)
      for (uint32_t i = 0; i < L; ++i) {
        const T sv = V::mul(V::mul(V::loadu(norms + i * W), acc[h][i]), scale);
        V::storeu(s + h * stride + j0 + i * W, sv);
        mx[h] = V::max(mx[h], V::masked_keep(sv, V::set1(-INFINITY), valid, i * W));
      }
  }

  // Rotated V: a[h][d] = fma chain over the coded keys from first_key of (p_j * n_j) * L[c_j[d]], in the
  // rotated basis. DV vectors span the head dimension.
  template <uint32_t NQ, uint32_t DV, uint32_t BITS>
  static void weighted_values_rot(const AttentionArgs& x, const float* p, uint32_t stride, uint32_t coded,
                                  const typename V::Table& levels, float* a) {
    constexpr uint32_t L = 16 / W;
    const uint32_t hd = x.head_dim, bt = x.block_tokens;
    const size_t code_bytes = size_t{hd} * bt * BITS / 8;
    T o[NQ][DV];
    clear(o);
    coded_values(x, coded, [&](const uint8_t* vb, uint32_t slot, uint32_t j) {
      const uint8_t* row = vb + size_t{slot} * hd * BITS / 8;
      const float norm = reinterpret_cast<const float*>(vb + code_bytes)[slot];
      T c[DV < L ? L : DV];  // DV < L only in instantiations no head_dim reaches
#pragma GCC unroll 16
      for (uint32_t v = 0; v < DV; v += L)
        rotated_levels<BITS>(row + rotated_offset<BITS>(v * W), hd / 8, levels, c + v);
#pragma GCC unroll 8
      for (uint32_t h = 0; h < NQ; ++h) {
        const T pn = V::set1(p[h * stride + j] * norm);
#pragma GCC unroll 16
        for (uint32_t v = 0; v < DV; ++v) o[h][v] = V::fma(pn, c[v], o[h][v]);
      }
    });
    store_rows(o, a, hd);
  }

  template <uint32_t NQ, uint32_t BITS>
  static void heads_rot(const AttentionArgs& x, uint32_t h0) {
    const uint32_t hd = x.head_dim, stride = (x.n_keys + 15) / 16 * 16;
    const uint32_t coded = x.win_k ? x.f32_from : x.n_keys;
    const float* q = x.q + h0 * hd;
    float* s = x.scores + h0 * stride;
    alignas(64) float qr[NQ * 256], a[NQ * 256];  // head_dim <= 256 (kv_rotation::check_head_dim)
    for (uint32_t h = 0; h < NQ; ++h) kv_rotation::rotate_row({q + h * hd, hd}, {x.k_signs, hd}, {qr + h * hd, hd});
    float padded[16] = {};  // 3 bits: 8 levels, the rest never indexed
    std::copy_n(x.levels, 1u << BITS, padded);
    const typename V::Table levels = V::table(padded);
    T mx[NQ];
    for (uint32_t h = 0; h < NQ; ++h) mx[h] = V::set1(-INFINITY);
    for (uint32_t j0 = first_scored(x); j0 < coded; j0 += 16) scores_rot<NQ, BITS>(x, qr, levels, j0, s, stride, mx);
    for (uint32_t j = std::max(coded, x.first_key); j < x.n_keys; ++j)
      scores_row<NQ>(x, q, x.win_k[j - coded], j, s, stride, mx);
    float inv[NQ];
    softmax<NQ>(x, s, stride, mx, inv);
    switch (hd / W) {
      case 1: weighted_values_rot<NQ, 1, BITS>(x, s, stride, coded, levels, a); break;
      case 2: weighted_values_rot<NQ, 2, BITS>(x, s, stride, coded, levels, a); break;
      case 4: weighted_values_rot<NQ, 4, BITS>(x, s, stride, coded, levels, a); break;
      case 8: weighted_values_rot<NQ, 8, BITS>(x, s, stride, coded, levels, a); break;
      case 16: weighted_values_rot<NQ, 16, BITS>(x, s, stride, coded, levels, a); break;
      case 32:  // head_dim 256 on 8 lanes (head_dim <= 256: no wider instantiation is reached)
        if constexpr (W * 32 <= 256) weighted_values_rot<NQ, 32, BITS>(x, s, stride, coded, levels, a);
        break;
    }
    for (uint32_t h = 0; h < NQ; ++h)
      rotated_finish(x, a + h * hd, s + h * stride, coded, inv[h], x.out + (h0 + h) * hd);
  }

  template <uint32_t BITS>
  static void attention_rot(const AttentionArgs& x) {
    uint32_t h = 0;
    for (; h + 4 <= x.n_q; h += 4) heads_rot<4, BITS>(x, h);
    switch (x.n_q - h) {
      case 3: heads_rot<3, BITS>(x, h); break;
      case 2: heads_rot<2, BITS>(x, h); break;
      case 1: heads_rot<1, BITS>(x, h); break;
    }
  }

  static void attention_rotated(const AttentionArgs& x) {
    if (x.kv_bits == 4) return attention_rot<4>(x);
    attention_rot<3>(x);
  }

  // Several rows at once but rotated KV, which takes a row at a time, as does the F32 window.
  static void attention(const AttentionArgs& x) {
    if (x.kv_rotated || (x.rows > 1 && x.win_k)) {
      for (uint32_t r = 0; r < x.rows; ++r) {
        const AttentionArgs a = row_of(x, r);
        if (a.kv_rotated) {
          attention_rotated(a);
        } else {
          a.kv_bits == 8 ? attention_q<8>(a) : attention_q<4>(a);
        }
      }
      return;
    }
    if (x.kv_bits == 8) return attention_q<8>(x);
    if (x.kv_bits == 4) return attention_q<4>(x);
    attention_f32(x);
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

  // Blocks of 256: each block's max in vectors (maxps returns its second operand when either
  // is NaN, so a NaN never wins), the first block holding the largest, then the first element
  // of that block equal to it.
  static uint32_t argmax(const float* x, uint32_t n, float* max) {
    constexpr uint32_t kBlock = 256;
    static_assert(kBlock % (4 * W) == 0);
    const float ninf = -std::numeric_limits<float>::infinity();
    float best = ninf;
    uint32_t best_block = 0;
    for (uint32_t b = 0; b < n; b += kBlock) {
      const uint32_t e = std::min(n, b + kBlock);
      T m0 = V::set1(ninf), m1 = m0, m2 = m0, m3 = m0;
      uint32_t i = b;
      for (; i + 4 * W <= e; i += 4 * W) {
        m0 = V::max(V::loadu(x + i), m0);
        m1 = V::max(V::loadu(x + i + W), m1);
        m2 = V::max(V::loadu(x + i + 2 * W), m2);
        m3 = V::max(V::loadu(x + i + 3 * W), m3);
      }
      float bm = V::hmax(V::max(V::max(m0, m1), V::max(m2, m3)));
      for (; i < e; ++i) bm = x[i] > bm ? x[i] : bm;
      if (bm > best) best = bm, best_block = b;
    }
    *max = best;
    if (best == ninf) return 0;
    uint32_t i = best_block;
    while (!(x[i] == best)) ++i;
    return i;
  }

  static void chunk_max(const float* x, uint32_t n, float* out) {
    static_assert(kScreenChunk % (4 * W) == 0);
    uint32_t c = 0;
    for (; (c + 1) * kScreenChunk <= n; ++c) {
      const float* p = x + c * kScreenChunk;
      T m0 = V::loadu(p), m1 = V::loadu(p + W), m2 = V::loadu(p + 2 * W), m3 = V::loadu(p + 3 * W);
      for (uint32_t i = 4 * W; i < kScreenChunk; i += 4 * W) {
        m0 = V::max(V::loadu(p + i), m0);
        m1 = V::max(V::loadu(p + i + W), m1);
        m2 = V::max(V::loadu(p + i + 2 * W), m2);
        m3 = V::max(V::loadu(p + i + 3 * W), m3);
      }
      out[c] = V::hmax(V::max(V::max(m0, m1), V::max(m2, m3)));
    }
    if (c * kScreenChunk < n) {  // the last, partial chunk
      float m = x[c * kScreenChunk];
      for (uint32_t i = c * kScreenChunk + 1; i < n; ++i) m = std::max(m, x[i]);
      out[c] = m;
    }
  }
};

template <class V>
inline Kernels make_kernels(const char* name, decltype(Kernels::gemm_bf16) gemm_bf16, decltype(Kernels::qgemm) qgemm,
                            decltype(Kernels::round_bf16) round_bf16, decltype(Kernels::quantize) quantize) {
  return Kernels{name,
                 Ops<V>::gemm,
                 gemm_bf16,
                 Ops<V>::gemm16,
                 qgemm,
                 round_bf16,
                 quantize,
                 Ops<V>::attention,
                 Ops<V>::silu_mul,
                 Ops<V>::argmax,
                 Ops<V>::chunk_max};
}

}  // namespace tandem::engine::kernels::simd
