#include "workers/engine/greedy_screen.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "model/half.h"
#include "model/quant.h"

namespace tandem::engine {
namespace {

constexpr double kU = 0x1p-24;              // float's unit roundoff
constexpr double kInflate = 1.0 + 0x1p-16;  // covers the float arithmetic of the bounds (header)

double gamma(uint32_t n) { return n * kU / (1.0 - n * kU); }

// x rounded up to a float (never below x).
float up(double x) {
  const auto f = static_cast<float>(x);
  return static_cast<double>(f) >= x ? f : std::nextafter(f, std::numeric_limits<float>::infinity());
}

}  // namespace

std::unique_ptr<GreedyScreen> GreedyScreen::build(uint32_t n, uint32_t k, FunctionRef<void(uint32_t, float*)> row) {
  using model::BlockQ8_0;
  if (n == 0 || k == 0 || k % model::kQK32 != 0) return nullptr;
  auto g = std::make_unique<GreedyScreen>();
  g->n_ = n, g->k_ = k;
  const uint32_t nb = k / model::kQK32;
  const size_t padded = size_t{(n + kernels::kScreenChunk - 1) / kernels::kScreenChunk} * kernels::kScreenChunk;
  g->alpha_.assign(padded, 0.0f);
  g->beta_.assign(padded, 0.0f);
  std::vector<BlockQ8_0> blocks(size_t{n} * nb);
  std::vector<float> w(k);
  for (uint32_t v = 0; v < n; ++v) {
    row(v, w.data());
    for (float x : w)
      if (!std::isfinite(x)) return nullptr;
    BlockQ8_0* q = &blocks[size_t{v} * nb];
    model::quantize_row_q8_0(w.data(), q, k);
    double err = 0, wq = 0, ww = 0;
    for (uint32_t b = 0; b < nb; ++b) {
      const double d = model::half_to_float(q[b].d);
      if (!std::isfinite(d)) return nullptr;
      for (uint32_t i = 0; i < model::kQK32; ++i) {
        const double x = w[b * model::kQK32 + i], xq = d * q[b].qs[i];
        err += (x - xq) * (x - xq), wq += xq * xq, ww += x * x;
      }
    }
    g->alpha_[v] = up((std::sqrt(err) + gamma(k) * std::sqrt(ww)) * kInflate);
    g->beta_[v] = up(std::sqrt(wq) * kInflate);
  }
  const size_t chunks = padded / kernels::kScreenChunk;
  g->alpha_chunk_.resize(chunks);
  g->beta_chunk_.resize(chunks);
  for (size_t c = 0; c < chunks; ++c) {
    const auto at = static_cast<ptrdiff_t>(c * kernels::kScreenChunk);
    g->alpha_chunk_[c] = *std::max_element(g->alpha_.begin() + at, g->alpha_.begin() + at + kernels::kScreenChunk);
    g->beta_chunk_[c] = *std::max_element(g->beta_.begin() + at, g->beta_.begin() + at + kernels::kScreenChunk);
  }
  const auto type = static_cast<uint32_t>(model::TensorType::kQ8_0);
  g->tiles_.resize(kernels::tiled_bytes(type, n, k));
  kernels::tile_quant(reinterpret_cast<const uint8_t*>(blocks.data()), sizeof(BlockQ8_0) * nb, type, n, k,
                      g->tiles_.data());
  g->view_ = {g->tiles_.data(), type, n, k};
  return g;
}

bool GreedyScreen::norms(const float* x, const int8_t* qs, const float* d, float* h, float* e) const {
  double hh = 0, ee = 0, qq = 0;
  for (uint32_t i = 0; i < k_; ++i) {
    if (!std::isfinite(x[i])) return false;
    const double xi = x[i], qi = static_cast<double>(d[i / model::kQK32]) * qs[i];
    hh += xi * xi, ee += (xi - qi) * (xi - qi), qq += qi * qi;
  }
  // The screen's rounding (gamma_S, two per block) and the bounds' own (8 u of ||h^||: s_v -+ b_v
  // round by at most u (|s_v| + b_v), and |s_v| <= ||w^|| ||h^|| up to rounding).
  const double s_round = gamma(2 * (k_ / model::kQK32) + 2) + 8 * kU;
  *h = up(std::sqrt(hh) * kInflate);
  *e = up((std::sqrt(ee) + s_round * std::sqrt(qq)) * kInflate);
  return std::isfinite(*h) && std::isfinite(*e);
}

// A chunk's bound B_c = fma(max alpha, h, max beta * e) covers each of its rows' b_v, so with m_c
// its largest screening logit, L = max_c (m_c - B_c) is at most the largest exact logit and a
// chunk with m_c + B_c < L holds no candidate: one pass over s (Kernels::chunk_max), then b_v
// per row only in the chunks that may hold one.
int32_t GreedyScreen::pick(const kernels::Kernels& kern, const float* s, float h, float e, float* upper,
                           FunctionRef<void(uint32_t, float*)> exact_panel) const {
  kern.chunk_max(s, n_, upper);
  const uint32_t chunks = (n_ + kernels::kScreenChunk - 1) / kernels::kScreenChunk;
  float lower = -std::numeric_limits<float>::infinity();
  for (uint32_t c = 0; c < chunks; ++c)
    lower = std::max(lower, upper[c] - std::fma(alpha_chunk_[c], h, beta_chunk_[c] * e));
  float panel[kernels::kPanel];
  int64_t have = -1;  // the panel in `panel`
  float best = 0.0f;
  int32_t at = -1;
  for (uint32_t c = 0; c < chunks; ++c) {
    if (!(upper[c] + std::fma(alpha_chunk_[c], h, beta_chunk_[c] * e) >= lower)) continue;
    const uint32_t end = std::min(n_, (c + 1) * kernels::kScreenChunk);
    for (uint32_t v = c * kernels::kScreenChunk; v < end; ++v) {
      if (!(s[v] + bound(v, h, e) >= lower)) continue;
      const uint32_t p = v / kernels::kPanel;
      if (p != have) exact_panel(p, panel), have = p;
      const float z = panel[v % kernels::kPanel];
      if (!std::isfinite(z)) return -1;
      if (at < 0 || z > best) best = z, at = static_cast<int32_t>(v);
    }
  }
  return at;
}

}  // namespace tandem::engine
