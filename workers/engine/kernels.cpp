#include "workers/engine/kernels.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <type_traits>

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

float shape_scores(const AttentionArgs& x, float* s, float mx) {
  if (x.first_key == 0 && !(x.softcap > 0.0f)) return mx;
  for (uint32_t j = first_scored(x); j < x.first_key; ++j) s[j] = -INFINITY;
  float m = -INFINITY;
  for (uint32_t j = x.first_key; j < x.n_keys; ++j) {
    if (x.softcap > 0.0f) s[j] = x.softcap * std::tanh(s[j] / x.softcap);
    m = std::max(m, s[j]);
  }
  return m;
}

namespace {
// masked_lanes(g) for g < kMaskedTable: the running sum, as the softmax's lanes add it.
constexpr uint32_t kMaskedTable = 1u << 14;
struct MaskedLanes {
  float e = exp_scalar(-INFINITY);
  std::array<float, kMaskedTable> sum{};
  MaskedLanes() {
    for (uint32_t g = 1; g < kMaskedTable; ++g) sum[g] = sum[g - 1] + e;
  }
};
}  // namespace

float masked_lanes(uint32_t groups) {
  static const MaskedLanes t;
  if (groups < kMaskedTable) return t.sum[groups];
  float s = t.sum[kMaskedTable - 1];
  for (uint32_t g = kMaskedTable - 1; g < groups; ++g) s = s + t.e;
  return s;
}

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

void pack_bf16_pairs_row(const uint16_t* row, uint32_t n, uint32_t k, uint16_t* packed) {
  uint16_t* panel = packed + size_t{n / kPanel} * k * kPanel;
  const uint32_t j = n % kPanel;
  for (uint32_t i = 0; i < k; ++i) {
    const bool denormal = (row[i] & 0x7F80) == 0;
    panel[(size_t{i / 2} * kPanel + j) * 2 + i % 2] = denormal ? static_cast<uint16_t>(row[i] & 0x8000) : row[i];
  }
}

void round_rows_bf16(const float* a, size_t lda, uint32_t r0, uint32_t r1, uint32_t k, uint16_t* out) {
  for (uint32_t r = r0; r < r1; ++r) {
    const float* x = a + size_t{r} * lda;
    uint16_t* o = out + size_t{r} * k;
    for (uint32_t i = 0; i < k; ++i) {
      uint32_t u;
      std::memcpy(&u, &x[i], 4);
      uint16_t h;
      if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
        h = static_cast<uint16_t>((u >> 16) | 0x40);  // NaN, quieted
      } else {
        h = static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
        if ((h & 0x7F80) == 0) h &= 0x8000;  // denormal (or zero): zero of its sign
      }
      o[i] = h;
    }
  }
}

bool tiled_type(uint32_t type) { return act_block(type) != 0; }

namespace {

using model::TensorType;

// Bytes per tile of each section (kernels.h, QuantView); 0: the type has none.
struct TileShape {
  uint32_t block, codes, qh, q6h, sc, mk, m;
};
TileShape tile_shape(uint32_t type) {
  switch (static_cast<TensorType>(type)) {
    case TensorType::kQ8_0: return {32, 512, 0, 0, 0, 0, 0};
    case TensorType::kQ4_0: return {32, 256, 0, 0, 0, 0, 0};
    case TensorType::kQ4_1: return {32, 256, 0, 0, 0, 0, 32};
    case TensorType::kQ5_0: return {32, 256, 64, 0, 0, 0, 0};
    case TensorType::kQ5_1: return {32, 256, 64, 0, 0, 0, 32};
    case TensorType::kQ4_K: return {256, 2048, 0, 0, 128, 128, 32};
    case TensorType::kQ5_K: return {256, 2048, 512, 0, 128, 128, 32};
    default: return {256, 2048, 0, 1024, 256, 0, 0};  // Q6_K
  }
}
size_t tile_count(const TileShape& s, uint32_t n, uint32_t k) {
  return size_t{(n + kQuantTile - 1) / kQuantTile} * (k / s.block);
}
size_t tile_bytes(const TileShape& s) { return s.codes + s.qh + s.q6h + s.sc + s.mk + 32 + s.m; }

// One block of a row (32 or 256 elements): the unsigned codes (the offset not taken off), the
// sub-block scales and mins (K types) and the 16-bit scale and min (or dmin).
struct BlockCodes {
  uint8_t q[256];
  uint8_t sc[16], mk[8];
  uint16_t d, m;
};
template <class B>
void nibbles_and_bits(const B& w, BlockCodes& out) {
  for (int e = 0; e < 16; ++e) out.q[e] = w.qs[e] & 15, out.q[e + 16] = static_cast<uint8_t>(w.qs[e] >> 4);
  if constexpr (requires { w.qh; }) {
    uint32_t h;
    std::memcpy(&h, w.qh, 4);
    for (int e = 0; e < 32; ++e) out.q[e] |= static_cast<uint8_t>(((h >> e) & 1) << 4);
  }
  out.d = w.d;
  if constexpr (requires { w.m; }) out.m = w.m;
}
template <class B>
void k_codes(const B& w, BlockCodes& out) {  // Q4_K, Q5_K
  for (int j = 0; j < 8; ++j) {
    model::k_scale_min(j, w.scales, out.sc[j], out.mk[j]);
    for (int i = 0; i < 32; ++i) {
      uint8_t q = (w.qs[32 * (j / 2) + i] >> (4 * (j & 1))) & 15;
      if constexpr (std::is_same_v<B, model::BlockQ5_K>) q |= static_cast<uint8_t>(((w.qh[i] >> j) & 1) << 4);
      out.q[32 * j + i] = q;
    }
  }
  out.d = w.d, out.m = w.dmin;
}
void q6_codes(const model::BlockQ6_K& w, BlockCodes& out) {
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, k = (e % 128) / 32, t = e % 32;
    const int lo = (w.ql[64 * h + t + 32 * (k & 1)] >> (4 * (k / 2))) & 15;
    const int hi = (w.qh[32 * h + t] >> (2 * k)) & 3;
    out.q[e] = static_cast<uint8_t>(lo | (hi << 4));
  }
  for (int g = 0; g < 16; ++g) out.sc[g] = static_cast<uint8_t>(w.scales[g]);
  out.d = w.d;
}
BlockCodes block_codes(const uint8_t* row, uint32_t type, uint32_t b) {
  BlockCodes out{};
  switch (static_cast<TensorType>(type)) {
    case TensorType::kQ8_0: {
      const auto& w = reinterpret_cast<const model::BlockQ8_0*>(row)[b];
      for (int e = 0; e < 32; ++e) out.q[e] = static_cast<uint8_t>(w.qs[e] + 128);
      out.d = w.d;
      break;
    }
    case TensorType::kQ4_0: nibbles_and_bits(reinterpret_cast<const model::BlockQ4_0*>(row)[b], out); break;
    case TensorType::kQ4_1: nibbles_and_bits(reinterpret_cast<const model::BlockQ4_1*>(row)[b], out); break;
    case TensorType::kQ5_0: nibbles_and_bits(reinterpret_cast<const model::BlockQ5_0*>(row)[b], out); break;
    case TensorType::kQ5_1: nibbles_and_bits(reinterpret_cast<const model::BlockQ5_1*>(row)[b], out); break;
    case TensorType::kQ4_K: k_codes(reinterpret_cast<const model::BlockQ4_K*>(row)[b], out); break;
    case TensorType::kQ5_K: k_codes(reinterpret_cast<const model::BlockQ5_K*>(row)[b], out); break;
    default: q6_codes(reinterpret_cast<const model::BlockQ6_K*>(row)[b], out); break;
  }
  return out;
}

// Column c's block into tile `tile` of the sections.
void scatter(const BlockCodes& bc, const TiledSections& t, const TileShape& s, size_t tile, uint32_t c) {
  auto* codes = const_cast<uint8_t*>(t.codes) + tile * s.codes;
  for (uint32_t e = 0; e < s.block; ++e) {
    const uint32_t j = e / 32, i = e % 32 / 4, byte = 4 * c + e % 4;
    if (s.codes == 512) {
      codes[64 * i + byte] = bc.q[e];
    } else {
      codes[256 * j + 64 * (i % 4) + byte] |= static_cast<uint8_t>((bc.q[e] & 15) << (i < 4 ? 0 : 4));
    }
    if (t.qh && (bc.q[e] & 16)) const_cast<uint64_t*>(t.qh)[tile * (s.qh / 8) + 8 * j + i] |= uint64_t{1} << byte;
    if (t.q6h)
      const_cast<uint8_t*>(t.q6h)[tile * s.q6h + 128 * j + 64 * (i / 4) + byte] |=
          static_cast<uint8_t>((bc.q[e] >> 4) << (2 * (i % 4)));
  }
  if (t.sc)
    for (uint32_t g = 0; g < s.sc / kQuantTile; ++g)
      const_cast<uint8_t*>(t.sc)[tile * s.sc + kQuantTile * g + c] = bc.sc[g];
  if (t.mk)
    for (uint32_t j = 0; j < 8; ++j) const_cast<uint8_t*>(t.mk)[tile * s.mk + 32 * (j / 2) + 2 * c + j % 2] = bc.mk[j];
  const_cast<uint16_t*>(t.d)[tile * kQuantTile + c] = bc.d;
  if (t.m) const_cast<uint16_t*>(t.m)[tile * kQuantTile + c] = bc.m;
}

}  // namespace

size_t tiled_bytes(uint32_t type, uint32_t n, uint32_t k) {
  const TileShape s = tile_shape(type);
  return tile_count(s, n, k) * tile_bytes(s);
}

TiledSections tiled_sections(const QuantView& w) {
  const TileShape s = tile_shape(w.type);
  const size_t tiles = tile_count(s, w.n, w.k);
  TiledSections out;
  out.nb = w.k / s.block;
  out.code_bytes = s.codes;
  const uint8_t* p = w.data;
  auto take = [&](uint32_t bytes) {
    const uint8_t* at = bytes ? p : nullptr;
    p += tiles * bytes;
    return at;
  };
  out.codes = take(s.codes);
  out.qh = reinterpret_cast<const uint64_t*>(take(s.qh));
  out.q6h = take(s.q6h);
  out.sc = take(s.sc);
  out.mk = take(s.mk);
  out.d = reinterpret_cast<const uint16_t*>(take(32));
  out.m = reinterpret_cast<const uint16_t*>(take(s.m));
  return out;
}

void tile_quant(const uint8_t* rows, size_t row_bytes, uint32_t type, uint32_t n, uint32_t k, uint8_t* out) {
  std::memset(out, 0, tiled_bytes(type, n, k));
  const TileShape s = tile_shape(type);
  const TiledSections t = tiled_sections({out, type, n, k});
  for (uint32_t col = 0; col < n; ++col)
    for (uint32_t b = 0; b < t.nb; ++b)
      scatter(block_codes(rows + size_t{col} * row_bytes, type, b), t, s, size_t{col / kQuantTile} * t.nb + b,
              col % kQuantTile);
}

void quantize_block(const float* x, uint32_t block, int8_t* q, float& d) {
  if (block == kAct32) {
    model::BlockQ8_0 blk;
    model::quantize_row_q8_0(x, &blk, block);
    d = model::half_to_float(blk.d);
    std::memcpy(q, blk.qs, block);
  } else {
    model::BlockQ8_K blk;
    model::quantize_row_q8_k(x, &blk, block);
    d = blk.d;
    std::memcpy(q, blk.qs, block);
  }
}

// ggml's reference quantizers, one block at a time, scattered into the kernels' layout.
void quantize_rows(const float* a, size_t lda, uint32_t r0, uint32_t r1, uint32_t k, uint32_t block, int8_t* qs,
                   float* d, int16_t* sums) {
  for (uint32_t r = r0; r < r1; ++r) {
    const float* x = a + size_t{r} * lda;
    int8_t* q = qs + size_t{r} * k;
    float* dr = d + size_t{r} * (k / block);
    for (uint32_t b = 0; b < k / block; ++b) quantize_block(x + size_t{b} * block, block, q + size_t{b} * block, dr[b]);
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
