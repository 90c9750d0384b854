#include "workers/engine/kernels.h"

#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "model/half.h"
#include "model/quant.h"
#include "workers/engine/kernels_scalar.h"

namespace tandem::engine::kernels {

extern const Kernels kGenericKernels;
#ifdef TANDEM_X86
extern const Kernels kAvx2Kernels;
extern const Kernels kAvx512Kernels;
#endif

float exp_approx(float x) { return exp_scalar(x); }

void pack_row(const float* row, uint32_t n, uint32_t k, float* packed) {
  float* panel = packed + size_t{n / kPanel} * k * kPanel;
  const uint32_t j = n % kPanel;
  for (uint32_t i = 0; i < k; ++i) panel[size_t{i} * kPanel + j] = row[i];
}

uint32_t act_block(uint32_t type) {
  using model::TensorType;
  switch (static_cast<TensorType>(type)) {
    case TensorType::kQ8_0:
    case TensorType::kQ4_0:
    case TensorType::kQ5_0:
    case TensorType::kQ4_1:
    case TensorType::kQ5_1: return kAct32;
    case TensorType::kQ4_K:
    case TensorType::kQ5_K:
    case TensorType::kQ6_K: return kAct256;
    default: return 0;
  }
}

bool tiled_type(uint32_t type) { return act_block(type) == kAct32; }

namespace {

using model::TensorType;

struct TileShape {
  uint32_t code_bytes;
  bool qh, m;
};
TileShape tile_shape(uint32_t type) {
  const auto t = static_cast<TensorType>(type);
  return {t == TensorType::kQ8_0 ? 512u : 256u, t == TensorType::kQ5_0 || t == TensorType::kQ5_1,
          t == TensorType::kQ4_1 || t == TensorType::kQ5_1};
}
size_t tile_count(uint32_t n, uint32_t k) { return size_t{(n + kQuantTile - 1) / kQuantTile} * (k / kAct32); }
size_t tile_bytes(const TileShape& s) { return s.code_bytes + (s.qh ? 64 : 0) + 32 + (s.m ? 32 : 0); }

// The unsigned code of element e (< 32) of block b of a row, its 16-bit scale and min.
struct BlockCodes {
  uint8_t q[32];
  uint16_t d, m;
};
BlockCodes block_codes(const uint8_t* row, uint32_t type, uint32_t b) {
  BlockCodes out{};
  auto nibbles = [&](const uint8_t* qs) {
    for (int e = 0; e < 16; ++e) out.q[e] = qs[e] & 15, out.q[e + 16] = qs[e] >> 4;
  };
  auto high = [&](const uint8_t* qh) {
    uint32_t h;
    std::memcpy(&h, qh, 4);
    for (int e = 0; e < 32; ++e) out.q[e] |= ((h >> e) & 1) << 4;
  };
  switch (static_cast<TensorType>(type)) {
    case TensorType::kQ8_0: {
      const auto& w = reinterpret_cast<const model::BlockQ8_0*>(row)[b];
      for (int e = 0; e < 32; ++e) out.q[e] = static_cast<uint8_t>(w.qs[e] + 128);
      out.d = w.d;
      break;
    }
    case TensorType::kQ4_0: {
      const auto& w = reinterpret_cast<const model::BlockQ4_0*>(row)[b];
      nibbles(w.qs), out.d = w.d;
      break;
    }
    case TensorType::kQ4_1: {
      const auto& w = reinterpret_cast<const model::BlockQ4_1*>(row)[b];
      nibbles(w.qs), out.d = w.d, out.m = w.m;
      break;
    }
    case TensorType::kQ5_0: {
      const auto& w = reinterpret_cast<const model::BlockQ5_0*>(row)[b];
      nibbles(w.qs), high(w.qh), out.d = w.d;
      break;
    }
    default: {
      const auto& w = reinterpret_cast<const model::BlockQ5_1*>(row)[b];
      nibbles(w.qs), high(w.qh), out.d = w.d, out.m = w.m;
      break;
    }
  }
  return out;
}

}  // namespace

size_t tiled_bytes(uint32_t type, uint32_t n, uint32_t k) { return tile_count(n, k) * tile_bytes(tile_shape(type)); }

TiledSections tiled_sections(const QuantView& w) {
  const TileShape s = tile_shape(w.type);
  const size_t tiles = tile_count(w.n, w.k);
  TiledSections out;
  out.nb = w.k / kAct32;
  out.code_bytes = s.code_bytes;
  const uint8_t* p = w.data;
  out.codes = p;
  p += tiles * s.code_bytes;
  if (s.qh) out.qh = reinterpret_cast<const uint64_t*>(p), p += tiles * 64;
  out.d = reinterpret_cast<const uint16_t*>(p);
  p += tiles * 32;
  if (s.m) out.m = reinterpret_cast<const uint16_t*>(p);
  return out;
}

void tile_quant(const uint8_t* rows, size_t row_bytes, uint32_t type, uint32_t n, uint32_t k, uint8_t* out) {
  std::memset(out, 0, tiled_bytes(type, n, k));
  const TiledSections t = tiled_sections({out, type, n, k, row_bytes});
  auto* codes = const_cast<uint8_t*>(t.codes);
  auto* qh = const_cast<uint64_t*>(t.qh);
  auto* d = const_cast<uint16_t*>(t.d);
  auto* m = const_cast<uint16_t*>(t.m);
  for (uint32_t col = 0; col < n; ++col) {
    const uint32_t g = col / kQuantTile, c = col % kQuantTile;
    for (uint32_t b = 0; b < t.nb; ++b) {
      const size_t tile = size_t{g} * t.nb + b;
      const BlockCodes bc = block_codes(rows + size_t{col} * row_bytes, type, b);
      uint8_t* tc = codes + tile * t.code_bytes;
      for (uint32_t e = 0; e < 32; ++e) {
        const uint32_t i = e / 4, at = 64 * (i % 4) + 4 * c + e % 4;
        if (t.code_bytes == 512) {
          tc[64 * i + 4 * c + e % 4] = bc.q[e];
        } else {
          tc[at] |= static_cast<uint8_t>((bc.q[e] & 15) << (i < 4 ? 0 : 4));
        }
        if (qh && (bc.q[e] & 16)) qh[tile * 8 + i] |= uint64_t{1} << (4 * c + e % 4);
      }
      d[tile * kQuantTile + c] = bc.d;
      if (m) m[tile * kQuantTile + c] = bc.m;
    }
  }
}

// ggml's reference quantizers, one block at a time, scattered into the kernels' layout.
void quantize_rows(const float* a, size_t lda, uint32_t r0, uint32_t r1, uint32_t k, uint32_t block, int8_t* qs,
                   float* d, int16_t* sums) {
  for (uint32_t r = r0; r < r1; ++r) {
    const float* x = a + size_t{r} * lda;
    int8_t* q = qs + size_t{r} * k;
    float* dr = d + size_t{r} * (k / block);
    for (uint32_t b = 0; b < k / block; ++b) {
      if (block == kAct32) {
        model::BlockQ8_0 blk;
        model::quantize_row_q8_0(x + b * block, &blk, block);
        dr[b] = model::half_to_float(blk.d);
        std::memcpy(q + b * block, blk.qs, block);
      } else {
        model::BlockQ8_K blk;
        model::quantize_row_q8_k(x + b * block, &blk, block);
        dr[b] = blk.d;
        std::memcpy(q + b * block, blk.qs, block);
      }
    }
    int16_t* s = sums + size_t{r} * (k / 16);
    for (uint32_t g = 0; g < k / 16; ++g) {
      int32_t t = 0;
      for (uint32_t i = 0; i < 16; ++i) t += q[16 * g + i];
      s[g] = static_cast<int16_t>(t);
    }
  }
}

const Kernels* by_name(const char* name) {
  if (std::strcmp(name, "generic") == 0) return &kGenericKernels;
#ifdef TANDEM_X86
  __builtin_cpu_init();
  const bool fma = __builtin_cpu_supports("fma");
  if (std::strcmp(name, "avx2") == 0 && __builtin_cpu_supports("avx2") && fma) return &kAvx2Kernels;
  // The AVX-512 variant's quantized kernels use VNNI (vpdpbusd); its others F, BW, DQ, VL.
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512vnni");
  if (std::strcmp(name, "avx512") == 0 && avx512 && fma) return &kAvx512Kernels;
#endif
  return nullptr;
}

const Kernels& best() {
  static const Kernels* chosen = [] {
    if (const char* forced = std::getenv("TANDEM_KERNELS")) {
      if (const Kernels* k = by_name(forced)) return k;
    }
    for (const char* name : {"avx512", "avx2"})
      if (const Kernels* k = by_name(name)) return k;
    return &kGenericKernels;
  }();
  return *chosen;
}

}  // namespace tandem::engine::kernels
