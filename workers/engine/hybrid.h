// The per-token arithmetic of a Gated DeltaNet layer (docs/HYBRID.md), as free functions the
// engine calls per sequence and V head. Each is a fixed sequence of float operations whatever
// the batch or the prompt's chunking, so a sequence's results are bitwise the same however the
// scheduler cuts its steps (the recurrent prefill is sequential per token; the chunked WY form
// is not built yet).
#pragma once

#include <cstdint>

namespace tandem::engine::hybrid {

struct DeltaNetShape {
  uint32_t conv_kernel = 4;  // K
  uint32_t channels = 0;     // 2 * k_heads * d + v_heads * d
  uint32_t k_heads = 0, v_heads = 0, d = 0;
  float eps = 1e-6f;
};

// One token's conv output, in place of nothing: out[ch] = silu(sum_m kernel[ch][m] * window[m][ch])
// (window[K - 1] is the token's own input), then the per-head L2 norm of q and k (q also
// scaled by 1/sqrt(d)). kernel is [channels][K] as the GGUF stores ssm_conv1d.
void conv_token(const DeltaNetShape& s, const float* kernel, const float* const* window, float* out);

// Gates of V head j: g = softplus(alpha + dt_bias) * a (a = -exp(A_log), so g < 0) and
// beta = sigmoid(b_raw). Softplus with torch's and ggml's threshold 20.
void gates(uint32_t v_heads, const float* alpha, const float* b_raw, const float* dt_bias, const float* a, float* g,
           float* beta);

// One step of the gated delta rule for one V head: S = e^g S; S += k (beta (v - S^T k))^T;
// o = S^T q. S is [d][d] with S[i][j] at i * d + j (i over k, j over v).
void delta_step(float* S, const float* q, const float* k, const float* v, float g, float beta, uint32_t d, float* o);

// y = rms_norm(o) * w * silu(z), d elements.
void gated_norm(const float* o, const float* w, const float* z, uint32_t d, float eps, float* y);

}  // namespace tandem::engine::hybrid
