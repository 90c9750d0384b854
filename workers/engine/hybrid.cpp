#include "workers/engine/hybrid.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace tandem::engine::hybrid {

namespace {

float silu(float x) { return x / (1.0f + std::exp(-x)); }

// x / sqrt(sum x^2 + eps) * scale, in place (llama.cpp's build_gdn_l2_norm with the rms eps).
void l2_normalize(float* x, uint32_t n, float eps, float scale) {
  double ss = 0.0;
  for (uint32_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float f = scale / std::sqrt(static_cast<float>(ss) + eps);
  for (uint32_t i = 0; i < n; ++i) x[i] = x[i] * f;
}

}  // namespace

void conv_token(const DeltaNetShape& s, const float* kernel, const float* const* window, float* out) {
  const uint32_t K = s.conv_kernel;
  for (uint32_t ch = 0; ch < s.channels; ++ch) {
    float acc = 0.0f;
    for (uint32_t m = 0; m < K; ++m) acc = acc + kernel[size_t{ch} * K + m] * window[m][ch];
    out[ch] = silu(acc);
  }
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  for (uint32_t h = 0; h < s.k_heads; ++h) {
    l2_normalize(out + size_t{h} * s.d, s.d, s.eps, q_scale);
    l2_normalize(out + size_t{s.k_heads + h} * s.d, s.d, s.eps, 1.0f);
  }
}

void gates(uint32_t v_heads, const float* alpha, const float* b_raw, const float* dt_bias, const float* a, float* g,
           float* beta) {
  for (uint32_t j = 0; j < v_heads; ++j) {
    const float x = alpha[j] + dt_bias[j];
    const float softplus = x > 20.0f ? x : std::log1p(std::exp(x));
    g[j] = softplus * a[j];
    beta[j] = 1.0f / (1.0f + std::exp(-b_raw[j]));
  }
}

void delta_step(float* S, const float* q, const float* k, const float* v, float g, float beta, uint32_t d, float* o) {
  const float decay = std::exp(g);
  // o doubles as the scratch for S^T k, then delta, then the output.
  for (uint32_t j = 0; j < d; ++j) o[j] = 0.0f;
  for (uint32_t i = 0; i < d; ++i) {
    float* row = S + size_t{i} * d;
    const float ki = k[i];
    for (uint32_t j = 0; j < d; ++j) {
      row[j] = row[j] * decay;
      o[j] = o[j] + row[j] * ki;
    }
  }
  for (uint32_t j = 0; j < d; ++j) o[j] = beta * (v[j] - o[j]);
  for (uint32_t i = 0; i < d; ++i) {
    float* row = S + size_t{i} * d;
    const float ki = k[i];
    for (uint32_t j = 0; j < d; ++j) row[j] = row[j] + ki * o[j];
  }
  for (uint32_t j = 0; j < d; ++j) o[j] = 0.0f;
  for (uint32_t i = 0; i < d; ++i) {
    const float* row = S + size_t{i} * d;
    const float qi = q[i];
    for (uint32_t j = 0; j < d; ++j) o[j] = o[j] + row[j] * qi;
  }
}

void gated_norm(const float* o, const float* w, const float* z, uint32_t d, float eps, float* y) {
  double ss = 0.0;
  for (uint32_t i = 0; i < d; ++i) ss += static_cast<double>(o[i]) * o[i];
  const float scale = 1.0f / std::sqrt(static_cast<float>(ss / d) + eps);
  for (uint32_t i = 0; i < d; ++i) y[i] = ((o[i] * scale) * w[i]) * silu(z[i]);
}

}  // namespace tandem::engine::hybrid

namespace tandem::engine::hybrid {

namespace {

constexpr uint32_t kPanel = kernels::kPanel;

uint32_t panels(uint32_t n) { return (n + kPanel - 1) / kPanel; }

// delta_rows' scratch: one segment's S0 products, key products, keys of a later grid chunk,
// a row's decays and coefficients, and the fold's operands.
struct Scratch {
  float *p, *y, *kk, *qk, *keys, *decay, *coef, *sum, *kt, *fold;
  Scratch(float* f, uint32_t d) {
    float** parts[] = {&p, &y, &kk, &qk, &keys, &decay, &coef, &sum, &kt, &fold};
    const auto n = sizes(d);
    for (size_t i = 0; i < n.size(); ++i) {
      *parts[i] = f;
      f += n[i];
    }
  }
  static std::array<size_t, 10> sizes(uint32_t d) {
    const size_t rows = size_t{kGrid} * d, pairs = size_t{kGrid} * kGrid;
    return {rows, rows,         pairs, pairs, kernels::packed_floats(kGrid, d), kGrid, kGrid, panels(d) * kPanel,
            rows, size_t{d} * d};
  }
};

HeadRows advanced(const HeadRows& in, uint32_t r) {
  HeadRows out = in;
  out.q += r * in.stride, out.k += r * in.stride, out.v += r * in.stride;
  out.g += r * in.gate_stride, out.beta += r * in.gate_stride;
  return out;
}

// c[0, n) = chain over m < k of a[m] * W[j][m], W a PackedView {n, k_cap}: the kernels' gemm
// of one row, panel by panel (a panel read with a chain shorter than its capacity).
void chain_row(const kernels::Kernels& kern, const float* a, const float* w, uint32_t n, uint32_t k_cap, uint32_t k,
               float* c) {
  if (k == 0) {
    std::fill_n(c, n, 0.0f);
    return;
  }
  for (uint32_t p = 0; p < panels(n); ++p) {
    const kernels::PackedView panel{w + size_t{p} * k_cap * kPanel, std::min(kPanel, n - p * kPanel), k};
    kern.gemm(a, k, 1, panel, 0, 1, c + p * kPanel, n);
  }
}

// Element (i, j) of a PackedView {n, k} holding W[j][i]: the column-major view of a [k][n] matrix.
size_t packed_at(uint32_t i, uint32_t j, uint32_t k) {
  return size_t{j / kPanel} * k * kPanel + i * kPanel + j % kPanel;
}

// Row T = t0 + t of the grid chunk (docs/HYBRID.md): delta_T into the state, o_T to out.
void chunk_row(const kernels::Kernels& kern, uint32_t d, HeadState st, const HeadRows& in, uint32_t t0, uint32_t t,
               const Scratch& sc, float* out) {
  const uint32_t T = t0 + t;
  const float gT = st.gamma[T], beta = in.beta[t * in.gate_stride], eT = std::exp(gT);
  for (uint32_t m = 0; m <= T; ++m) sc.decay[m] = std::exp(gT - st.gamma[m]);
  for (uint32_t m = 0; m < T; ++m) sc.coef[m] = (beta * sc.decay[m]) * sc.kk[size_t{t} * kGrid + m];
  chain_row(kern, sc.coef, st.delta, d, kGrid, T, sc.sum);
  const float* v = in.v + t * in.stride;
  const float* p = sc.p + size_t{t} * d;
  for (uint32_t j = 0; j < d; ++j) st.delta[packed_at(T, j, kGrid)] = beta * (v[j] - eT * p[j]) - sc.sum[j];
  for (uint32_t m = 0; m <= T; ++m) sc.coef[m] = sc.decay[m] * sc.qk[size_t{t} * kGrid + m];
  chain_row(kern, sc.coef, st.delta, d, kGrid, T + 1, sc.sum);
  const float* y = sc.y + size_t{t} * d;
  for (uint32_t j = 0; j < d; ++j) out[j] = eT * y[j] + sc.sum[j];
}

// The chunk is complete: S0 = e^gamma_L S0 + (decayed keys)^T delta.
void fold(const kernels::Kernels& kern, uint32_t d, HeadState st, const float* keys, const Scratch& sc) {
  const float gL = st.gamma[kGrid - 1], eL = std::exp(gL);
  for (uint32_t m = 0; m < kGrid; ++m) sc.decay[m] = std::exp(gL - st.gamma[m]);
  for (uint32_t i = 0; i < d; ++i)
    for (uint32_t m = 0; m < kGrid; ++m) sc.kt[size_t{i} * kGrid + m] = sc.decay[m] * keys[packed_at(i, m, d)];
  const kernels::PackedView delta{st.delta, d, kGrid};
  kern.gemm(sc.kt, kGrid, d, delta, 0, delta.panels(), sc.fold, d);
  for (uint32_t i = 0; i < d; ++i)
    for (uint32_t j = 0; j < d; ++j) {
      float& s = st.s0[packed_at(i, j, d)];
      s = eL * s + sc.fold[size_t{i} * d + j];
    }
}

// Rows [t0, t0 + len) of one grid chunk; keys holds them (and the rows before).
void segment(const kernels::Kernels& kern, uint32_t d, HeadState st, const float* keys, const HeadRows& in, uint32_t t0,
             uint32_t len, float* o, size_t o_stride, const Scratch& sc) {
  for (uint32_t t = 0; t < len; ++t) {
    const float g = in.g[t * in.gate_stride];
    st.gamma[t0 + t] = t0 + t == 0 ? g : st.gamma[t0 + t - 1] + g;
  }
  const kernels::PackedView s0{st.s0, d, d}, k_rows{keys, kGrid, d};
  kern.gemm(in.k, in.stride, len, s0, 0, s0.panels(), sc.p, d);
  kern.gemm(in.q, in.stride, len, s0, 0, s0.panels(), sc.y, d);
  kern.gemm(in.k, in.stride, len, k_rows, 0, panels(t0 + len), sc.kk, kGrid);
  kern.gemm(in.q, in.stride, len, k_rows, 0, panels(t0 + len), sc.qk, kGrid);
  for (uint32_t t = 0; t < len; ++t) chunk_row(kern, d, st, in, t0, t, sc, o + t * o_stride);
  if (t0 + len == kGrid) fold(kern, d, st, keys, sc);
}

}  // namespace

size_t chunk_scratch_floats(uint32_t d) {
  size_t n = 0;
  for (size_t s : Scratch::sizes(d)) n += s;
  return n;
}

void store_keys(const float* k, size_t stride, uint32_t pos, uint32_t n, uint32_t d, float* keys) {
  for (uint32_t r = 0; r < n; ++r) kernels::pack_row(k + r * stride, (pos + r) % kGrid, d, keys);
}

void delta_rows(const kernels::Kernels& kern, const ChunkLayout& lay, HeadState st, const float* keys,
                const HeadRows& in, uint32_t pos, uint32_t n, float* o, size_t o_stride, float* scratch) {
  const Scratch sc(scratch, lay.d);
  for (uint32_t r = 0; r < n;) {
    const uint32_t t0 = (pos + r) % kGrid, len = std::min(kGrid - t0, n - r);
    const HeadRows rows = advanced(in, r);
    const float* chunk_keys = keys;
    if (r > 0) {  // a later grid chunk of this call: it starts at the grid, its keys go to the scratch
      store_keys(rows.k, rows.stride, 0, len, lay.d, sc.keys);
      chunk_keys = sc.keys;
    }
    segment(kern, lay.d, st, chunk_keys, rows, t0, len, o + r * o_stride, o_stride, sc);
    r += len;
  }
}

}  // namespace tandem::engine::hybrid
