// The arithmetic of a Gated DeltaNet layer (docs/HYBRID.md), as free functions the engine
// calls per sequence and V head. Each is a fixed sequence of float operations whatever the
// batch or the prompt's chunking, so a sequence's results are bitwise the same however the
// scheduler cuts its steps: the delta rule runs in the chunked (WY) form on a grid of kGrid
// absolute positions, one row at a time in its float operations (delta_rows), so a grid chunk
// computed in one call, across several calls or one token a step gives the same bits.
#pragma once

#include <cstddef>
#include <cstdint>

#include "workers/engine/kernels.h"

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

// y = rms_norm(o) * w * silu(z), d elements. y may be o.
void gated_norm(const float* o, const float* w, const float* z, uint32_t d, float eps, float* y);

// ---- The chunked (WY) form on the absolute grid ----------------------------------------------
//
// Grid chunk c covers positions [c * kGrid, (c + 1) * kGrid). Per V head the state is S0, the
// state at the chunk's start, and the rows of the chunk so far: the cumulative log decay
// gamma_t = gamma_{t-1} + g_t (gamma_0 = g_0), the key k_t (per Q/K head) and the solved
// delta_t. Row t (t = position - chunk start) is, from S0 and rows m < t only:
//   P      = S0^T k_t, Y = S0^T q_t                          (GEMM rows: kernels' gemm)
//   a_m    = (beta_t * e^(gamma_t - gamma_m)) * (k_t . k_m)  (m < t)
//   delta_t = beta_t * (v_t - e^gamma_t * P) - chain_{m<t} a_m delta_m
//   o_t    = e^gamma_t * Y + chain_{m<=t} (e^(gamma_t - gamma_m) * (q_t . k_m)) delta_m
// (chain: one fma chain in m order, the kernels' gemm with k = t or t + 1), and when row
// kGrid - 1 is done the chunk folds: S0 = e^gamma_L S0 + chain_m (e^(gamma_L - gamma_m) k_m)
// delta_m^T. Every float of a row depends on the row's position in its grid chunk, never on
// how many rows a call brings, so the bits are the same for any chunking (docs/HYBRID.md).
inline constexpr uint32_t kGrid = 64;

// Where a recurrent layer's delta-rule state lies in a slot (after its conv state): per V head
// S0 (PackedView {n = d, k = d}: W[j][i] = S0[i][j]), delta (PackedView {n = d, k = kGrid}:
// W[j][m] = delta_m[j]) and gamma [kGrid]; then per Q/K head the keys (PackedView {n = kGrid,
// k = d}: W[m][i] = k_m[i]).
struct ChunkLayout {
  uint32_t d = 0, v_heads = 0, k_heads = 0;
  size_t s0_floats() const { return kernels::packed_floats(d, d); }
  size_t head_floats() const { return s0_floats() + kernels::packed_floats(d, kGrid) + kGrid; }
  size_t keys_floats() const { return kernels::packed_floats(kGrid, d); }
  size_t floats() const { return v_heads * head_floats() + k_heads * keys_floats(); }
};

struct HeadState {
  float* s0 = nullptr;
  float* delta = nullptr;
  float* gamma = nullptr;
};
inline HeadState head_state(float* layer, const ChunkLayout& lay, uint32_t j) {
  float* h = layer + j * lay.head_floats();
  return {h, h + lay.s0_floats(), h + lay.head_floats() - kGrid};
}
inline float* key_rows(float* layer, const ChunkLayout& lay, uint32_t i) {
  return layer + lay.v_heads * lay.head_floats() + i * lay.keys_floats();
}

// One V head's inputs for a run of rows: row r's q, k, v at q + r * stride, ... (q, k of its
// Q/K head, normalized by conv_token), its g and beta at g + r * gate_stride, beta + ...
struct HeadRows {
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  size_t stride = 0;
  const float *g = nullptr, *beta = nullptr;
  size_t gate_stride = 0;
};

// Floats of delta_rows' scratch (one per thread).
size_t chunk_scratch_floats(uint32_t d);

// Advances one V head by n rows at positions [pos, pos + n) and writes each row's o (d floats,
// o_stride apart). `keys` is the head's Q/K key rows in the slot: the rows of the grid chunk
// holding `pos` must be there up to pos + n or the chunk's end (store_keys, before); rows of
// later grid chunks are packed into the scratch.
void delta_rows(const kernels::Kernels& kern, const ChunkLayout& lay, HeadState st, const float* keys,
                const HeadRows& in, uint32_t pos, uint32_t n, float* o, size_t o_stride, float* scratch);

// Packs the keys of rows [pos, pos + n) (all in one grid chunk) into the slot's key rows.
void store_keys(const float* k, size_t stride, uint32_t pos, uint32_t n, uint32_t d, float* keys);

}  // namespace tandem::engine::hybrid
