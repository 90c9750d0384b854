// The rotated KV scheme's row arithmetic (issue #23; the design and its simulated accuracy are
// docs/KV_ROTATED.md, computed by scripts/kv-quant-sim.py): a head row of K or V is stored as
// its L2 norm plus its direction rotated by a fixed randomized Hadamard transform R = H·D, each
// rotated coordinate the index of the nearest Lloyd-Max level for the distribution a random unit
// vector's coordinates follow. Queries are rotated the same way, so a score needs no inverse
// rotation; values are rotated back once after the weighted sum.
//
// These are the scalar reference operations, one fixed sequence of IEEE operations each (the
// engine builds with -ffp-contract=off), so a SIMD kernel that keeps the same order is bitwise
// equal to them and no result depends on the batch. The KV pool writes rows with quantize
// (KvScheme::kRotated); attention's reference is kernels_rotated.h.
#pragma once

#include <cstdint>
#include <span>

#include "runtime/status.h"

namespace tandem::engine::kv_rotation {

// The head dimensions and widths the level tables hold.
inline constexpr uint32_t kMinHeadDim = 16, kMaxHeadDim = 256;

// Ok for a head dimension the scheme takes (a power of two in [16, 256]); otherwise the error
// names it, e.g. "the rotated KV scheme needs a head dimension that is a power of two in
// [16, 256], got 96".
Status check_head_dim(uint32_t d);

// The ±1 diagonal D of (seed, layer, kv: 0 for K, 1 for V): element i is -1 where bit i % 64 of
// the (i / 64)-th SplitMix64 output is set, the stream starting at seed ^ (2·layer + kv)·φ64.
// The same on every worker of a model; K and V get independent signs.
void signs(uint64_t seed, uint32_t layer, uint32_t kv, std::span<float> out);

// y = H·D·x with H the normalized Walsh-Hadamard matrix in Sylvester order: flip by D, then
// butterflies (a, b) -> (a + b, a - b) at strides 1, 2, 4, ..., d/2, then times 1/sqrt(d).
// x and y may be the same span. d = x.size(), checked by check_head_dim.
void rotate_row(std::span<const float> x, std::span<const float> signs, std::span<float> y);

// x = D·H·y, the inverse (H is its own inverse): the same butterflies and scale, then D.
void unrotate_row(std::span<const float> y, std::span<const float> signs, std::span<float> x);

// 2^bits ascending F32 levels and the 2^bits - 1 midpoints between them.
struct Levels {
  uint32_t d, bits;
  const float* levels;
  const float* bounds;
  uint32_t count() const { return 1u << bits; }
};

// The table for head dimension d and 2, 3 or 4 bits; nullptr when there is none.
const Levels* levels(uint32_t d, uint32_t bits);

// Quantizes one head row x: returns its L2 norm (F32, summed in order) and writes one code per
// rotated coordinate of x / norm, the index of its level (the number of bounds below it, so a
// value on a bound takes the lower level). `scratch` holds d floats. A zero row has norm 0.
float quantize(std::span<const float> x, std::span<const float> signs, const Levels& table, std::span<uint8_t> codes,
               std::span<float> scratch);

// The stored row in the rotated domain: out_i = norm · level[code_i].
void dequantize(std::span<const uint8_t> codes, float norm, const Levels& table, std::span<float> out);

// A rotated query's score against a stored row: norm · Σ_i q_i · level[code_i], the sum one fma
// chain over i in order, then one multiply. Equals the dot product of the unrotated query and
// row up to the codes' error, because R is orthonormal.
float score(std::span<const float> rotated_query, std::span<const uint8_t> codes, float norm, const Levels& table);

}  // namespace tandem::engine::kv_rotation
