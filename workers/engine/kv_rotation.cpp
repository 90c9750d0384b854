#include "workers/engine/kv_rotation.h"

#include <cmath>
#include <string>

namespace tandem::engine::kv_rotation {

namespace {

using LevelTable = Levels;  // the generated file's name for a row
#include "workers/engine/kv_rotation_levels.inc"

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

uint64_t splitmix64(uint64_t& state) {
  state += kGolden;
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// In-place normalized Walsh-Hadamard butterflies of y (its size a power of two).
void hadamard(std::span<float> y) {
  const size_t d = y.size();
  for (size_t h = 1; h < d; h *= 2)
    for (size_t i = 0; i < d; i += 2 * h)
      for (size_t j = i; j < i + h; ++j) {
        const float a = y[j], b = y[j + h];
        y[j] = a + b;
        y[j + h] = a - b;
      }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (float& v : y) v *= scale;
}

}  // namespace

Status check_head_dim(uint32_t d) {
  if (d < kMinHeadDim || d > kMaxHeadDim || (d & (d - 1)) != 0)
    return Status::invalid("the rotated KV scheme needs a head dimension that is a power of two in [" +
                           std::to_string(kMinHeadDim) + ", " + std::to_string(kMaxHeadDim) + "], got " +
                           std::to_string(d));
  return Status::ok();
}

void signs(uint64_t seed, uint32_t layer, uint32_t kv, std::span<float> out) {
  uint64_t state = seed ^ ((2 * static_cast<uint64_t>(layer) + kv) * kGolden);
  uint64_t word = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (i % 64 == 0) word = splitmix64(state);
    out[i] = (word >> (i % 64)) & 1 ? -1.0f : 1.0f;
  }
}

void rotate_row(std::span<const float> x, std::span<const float> signs, std::span<float> y) {
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * signs[i];
  hadamard(y.first(x.size()));
}

void unrotate_row(std::span<const float> y, std::span<const float> signs, std::span<float> x) {
  for (size_t i = 0; i < y.size(); ++i) x[i] = y[i];
  hadamard(x.first(y.size()));
  for (size_t i = 0; i < y.size(); ++i) x[i] *= signs[i];
}

const Levels* levels(uint32_t d, uint32_t bits) {
  for (const Levels& t : kLevelTables)
    if (t.d == d && t.bits == bits) return &t;
  return nullptr;
}

float quantize(std::span<const float> x, std::span<const float> signs, const Levels& table, std::span<uint8_t> codes,
               std::span<float> scratch) {
  float sum = 0.0f;
  for (float v : x) sum += v * v;
  const float norm = std::sqrt(sum);
  std::span<float> y = scratch.first(x.size());
  rotate_row(x, signs, y);
  const uint32_t bounds = table.count() - 1;
  for (size_t i = 0; i < x.size(); ++i) {
    const float u = norm > 0.0f ? y[i] / norm : 0.0f;
    uint32_t code = 0;
    for (uint32_t b = 0; b < bounds; ++b) code += u > table.bounds[b] ? 1u : 0u;
    codes[i] = static_cast<uint8_t>(code);
  }
  return norm;
}

void dequantize(std::span<const uint8_t> codes, float norm, const Levels& table, std::span<float> out) {
  for (size_t i = 0; i < codes.size(); ++i) out[i] = norm * table.levels[codes[i]];
}

float score(std::span<const float> rotated_query, std::span<const uint8_t> codes, float norm, const Levels& table) {
  float acc = 0.0f;
  for (size_t i = 0; i < codes.size(); ++i) acc = std::fma(rotated_query[i], table.levels[codes[i]], acc);
  return norm * acc;
}

}  // namespace tandem::engine::kv_rotation
