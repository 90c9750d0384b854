#include <cstring>

#include "workers/engine/kernels_quant_avx512.h"
#include "workers/engine/kernels_simd.h"

namespace tandem::engine::kernels {
namespace {

struct V512 {
  TANDEM_SIMD_LANE_OPS(512)
  static constexpr uint32_t kMaxRows = 12;  // 12 x 2 accumulators + 2 weights + 1 broadcast
  static void u8_to_float(__m128i b, T* out) { out[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)); }
  // A table of 16 levels (rotated KV) in one register and its lookup: 16 byte indices to levels.
  struct Table {
    __m512 v;
  };
  static Table table(const float* levels16) { return {_mm512_loadu_ps(levels16)}; }
  static void lookup(__m128i b, const Table& t, T* out) {
    out[0] = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(b), t.v);
  }
  // 16 3-bit codes from three bit planes `plane` bytes apart, each plane's 16-bit word a mask:
  // code = 1 where plane 0 has the bit, | 2 where plane 1, | 4 where plane 2; then the lookup.
  static constexpr bool kPlaneMasks = true;
  static void lookup_planes(const uint8_t* p, size_t plane, const Table& t, T* out) {
    uint16_t w[3];
    for (int b = 0; b < 3; ++b) std::memcpy(&w[b], p + b * plane, 2);
    __m512i idx = _mm512_maskz_mov_epi32(w[0], _mm512_set1_epi32(1));
    idx = _mm512_mask_or_epi32(idx, w[1], idx, _mm512_set1_epi32(2));
    idx = _mm512_mask_or_epi32(idx, w[2], idx, _mm512_set1_epi32(4));
    out[0] = _mm512_permutexvar_ps(idx, t.v);
  }
  static T load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static T load_bf16(const uint16_t* p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static T round(T x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // 16 BF16 pairs: the even elements and the odd ones, widened.
  static void load_pairs(const uint16_t* p, T& even, T& odd) {
    const __m512i d = _mm512_loadu_si512(p);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(d, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(d, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
  static T ftz(T x) {  // kernels_scalar.h's ftz
    const __mmask16 tiny = _mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(1.17549435e-38f), _CMP_LT_OQ);
    return _mm512_mask_and_ps(x, tiny, x, _mm512_set1_ps(-0.0f));
  }
  static T neg_abs(T x) {
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN)));
  }
  static T select_ge0(T g, T a, T b) {
    const __mmask16 m = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_GE_OQ);
    return _mm512_mask_blend_ps(m, b, a);
  }
  // Keeps lanes with offset + lane < valid, the others become fill.
  static T masked_keep(T v, T fill, uint32_t valid, uint32_t offset) {
    const uint32_t n = valid > offset ? std::min(valid - offset, W) : 0;
    const __mmask16 m = static_cast<__mmask16>((1u << n) - 1u);
    return _mm512_mask_blend_ps(m, fill, v);
  }
  static float hmax(T v) { return _mm512_reduce_max_ps(v); }
};

// How far ahead of the weights being multiplied the BF16 kernel asks for them (into the next
// panel, which follows in memory). With 16 rows a core has so much to compute per cache line
// that the hardware prefetcher falls behind: streaming 57 MB of weights at M=16 went from 135
// to 215 GMAC/s on one core here (1 KiB ahead: no gain; 32 KiB: a little less).
constexpr size_t kPrefetchBytes = 16384;

// gemm_bf16 with vdpbf16ps: MR rows x one panel (32 columns: two vectors of 16 pairs), the
// rows' activation pairs broadcast as dwords. The instruction is kernels.h's definition.
template <uint32_t MR>
void micro_dpbf16(const uint16_t* a, uint32_t k_dim, const uint16_t* panel, float* c, size_t ldc, uint32_t cols) {
  __m512 acc[MR][2];
#pragma GCC unroll 16
  for (uint32_t r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (uint32_t q = 0; q < k_dim / 2; ++q) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(panel + size_t{q} * kPanel * 2);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(panel + size_t{q} * kPanel * 2 + 32);
    const char* ahead = reinterpret_cast<const char*>(panel + size_t{q} * kPanel * 2) + kPrefetchBytes;
    __builtin_prefetch(ahead, 0, 3);
    __builtin_prefetch(ahead + 64, 0, 3);
#pragma GCC unroll 16
    for (uint32_t r = 0; r < MR; ++r) {
      int32_t pair;
      std::memcpy(&pair, a + size_t{r} * k_dim + 2 * q, 4);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], w0, av);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], w1, av);
    }
  }
  simd::Ops<V512>::store_rows<MR>(acc, c, ldc, cols);
}

void gemm_bf16(const uint16_t* a, uint32_t m, const PackedPairsView& w, uint32_t p0, uint32_t p1, float* c,
               size_t ldc) {
  static const bool native = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16");
  }();
  if (!native) return simd::Ops<V512>::gemm_bf16(a, m, w, p0, p1, c, ldc);
  for (uint32_t p = p0; p < p1; ++p) {
    const uint16_t* panel = w.data + static_cast<size_t>(p) * w.k * kPanel;
    const uint32_t n0 = p * kPanel, cols = std::min(kPanel, w.n - n0);
    simd::Ops<V512>::pair_rows<V512::kMaxRows>(m, [&]<uint32_t MR>(uint32_t r) {
      micro_dpbf16<MR>(a + size_t{r} * w.k, w.k, panel, c + r * ldc + n0, ldc, cols);
    });
  }
}

// round_rows_bf16 (kernels.h) 16 floats at a time, the same integer steps.
void round_bf16(const float* a, size_t lda, uint32_t r0, uint32_t r1, uint32_t k, uint16_t* out) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
  const __m512i exp_mask = _mm512_set1_epi32(0x7F80), sign = _mm512_set1_epi32(0x8000);
  for (uint32_t r = r0; r < r1; ++r) {
    const float* x = a + size_t{r} * lda;
    uint16_t* o = out + size_t{r} * k;
    uint32_t i = 0;
    for (; i + 16 <= k; i += 16) {
      const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(x + i));
      const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
      const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
      __m512i h = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), odd), 16);
      const __mmask16 tiny = _mm512_cmpeq_epi32_mask(_mm512_and_si512(h, exp_mask), _mm512_setzero_si512());
      h = _mm512_mask_and_epi32(h, tiny, h, sign);
      h = _mm512_mask_or_epi32(h, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + i), _mm512_cvtepi32_epi16(h));
    }
    if (i < k) round_rows_bf16(x + i, lda, 0, 1, k - i, o + i);
  }
}

}  // namespace

extern const Kernels kAvx512Kernels =
    simd::make_kernels<V512>("avx512", gemm_bf16, quant512::qgemm, round_bf16, quant512::quantize);

}  // namespace tandem::engine::kernels
