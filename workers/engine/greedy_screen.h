// The exact greedy token without every logit: an 8-bit screening pass over the output matrix,
// a certified bound on how far each screened logit is from the exact one, and the exact logits
// of the few tokens the bound cannot rule out.
//
// On a small model with a large vocabulary the head is most of a decode row (the demo model:
// 32000 x 64, 89 % of a row's multiply-adds), and greedy decoding needs only its argmax. The
// screen is the head quantized to Q8_0 (as ggml's quantize_row_q8_0) and multiplied by the
// row's Q8_0 activations on the integer kernels (Kernels::qgemm: ~2.3x the F16 GEMM's rate
// here). For vocabulary row v, with w the head's values as its GEMM widens them, w^ their Q8_0
// copy, h the row and h^ its Q8_0 copy, the exact logit z_v (a K-long fma chain, kernels.h) and
// the screen's s_v differ by at most
//     ||w - w^|| ||h|| + ||w^|| ||h - h^||          (w.h - w^.h^, by Cauchy-Schwarz)
//   + gamma_K ||w|| ||h||                           (z_v's rounding: K fmas)
//   + gamma_S ||w^|| ||h^||                         (s_v's rounding: two per block)
// (gamma_n = n u / (1 - n u), u = 2^-24), which is b_v = alpha_v h + beta_v e with alpha_v,
// beta_v per row (built once) and h, e per activation row (norms), each inflated so that the
// float arithmetic computing b_v, s_v - b_v and s_v + b_v cannot make it smaller than the true
// bound. The argmax v* (the lowest id holding the largest z) has s_v* + b_v* >= z_v* >= z_u >=
// s_u - b_u for every u, so it is among the candidates {v : s_v + b_v >= max_u (s_u - b_u)};
// their exact logits (the head's own kernel over their panels, which gives each column the bits
// the full GEMM does) decide, ties to the lowest id. So pick() returns exactly what argmax over
// the full logits returns, bit for bit, whatever the candidates (tests: GreedyScreen.*).
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "workers/engine/kernels.h"
#include "workers/engine/thread_pool.h"

namespace tandem::engine {

class GreedyScreen {
 public:
  // The screen of an [n][k] head whose row v's exact values `row(v, out)` writes (k floats).
  // Null when it cannot be built: k not a multiple of 32, or a weight that is not finite.
  static std::unique_ptr<GreedyScreen> build(uint32_t n, uint32_t k, FunctionRef<void(uint32_t, float*)> row);

  uint32_t n() const { return n_; }
  uint32_t k() const { return k_; }
  const kernels::QuantView& view() const { return view_; }

  // An activation row's bound factors (h, e above) from the row and its Q8_0 codes and block
  // scales (Kernels::quantize, block 32). False when the row is not finite (no screen then).
  bool norms(const float* x, const int8_t* qs, const float* d, float* h, float* e) const;

  // b_v: how far row v's screening logit may be from its exact one, for bound factors h, e.
  float bound(uint32_t v, float h, float e) const { return std::fma(alpha_[v], h, beta_[v] * e); }

  // The exact greedy token of the row whose screening logits are `s` (qgemm over view()) and
  // bound factors h, e. exact_panel(p, out) writes panel p's exact logits (columns p * kPanel
  // onward, up to kPanel of them). `upper`: scratch of n / kScreenChunk + 1 floats. -1: a
  // candidate's exact logit is not finite (the caller takes the full row's argmax instead).
  int32_t pick(const kernels::Kernels& kern, const float* s, float h, float e, float* upper,
               FunctionRef<void(uint32_t, float*)> exact_panel) const;

 private:
  uint32_t n_ = 0, k_ = 0;
  std::vector<uint8_t> tiles_;  // the Q8_0 copy, tiled (kernels::tile_quant)
  kernels::QuantView view_;
  std::vector<float> alpha_, beta_;              // per row, padded with zeros to whole chunks
  std::vector<float> alpha_chunk_, beta_chunk_;  // per chunk of kScreenChunk rows: the largest
};

}  // namespace tandem::engine
