#include "workers/engine/hybrid.h"

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
