#include "workers/engine/kernels_quant_simd.h"
#include "workers/engine/kernels_simd.h"

namespace tandem::engine::kernels {
namespace {

struct V256 {
  TANDEM_SIMD_LANE_OPS(256)
  static constexpr uint32_t kMaxRows = 3;  // 3 x 4 accumulators + 4 weights = 16 registers
  static void u8_to_float(__m128i b, T* out) {
    out[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
    out[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)));
  }
  // A table of 16 levels (rotated KV) and its lookup: 16 byte indices to 2 vectors of levels.
  struct Table {
    __m256 lo, hi;
  };
  static constexpr bool kPlaneMasks = false;  // 3-bit codes: through bytes (kernels_simd.h, rotated16)
  static Table table(const float* levels16) { return {_mm256_loadu_ps(levels16), _mm256_loadu_ps(levels16 + 8)}; }
  static void lookup(__m128i b, const Table& t, T* out) {
    for (int h = 0; h < 2; ++h) {
      const __m256i idx = _mm256_cvtepu8_epi32(h ? _mm_srli_si128(b, 8) : b);
      const __m256 lo = _mm256_permutevar8x32_ps(t.lo, idx), hi = _mm256_permutevar8x32_ps(t.hi, idx);
      out[h] = _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));  // bit 3: the high half
    }
  }
  static T load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static T load_bf16(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static T round(T x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // 8 BF16 pairs: the even elements and the odd ones, widened.
  static void load_pairs(const uint16_t* p, T& even, T& odd) {
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(d, 16));
    odd = _mm256_castsi256_ps(_mm256_and_si256(d, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
  static T ftz(T x) {  // kernels_scalar.h's ftz
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 tiny = _mm256_cmp_ps(_mm256_andnot_ps(sign, x), _mm256_set1_ps(1.17549435e-38f), _CMP_LT_OQ);
    return _mm256_blendv_ps(x, _mm256_and_ps(x, sign), tiny);
  }
  static T neg_abs(T x) { return _mm256_or_ps(x, _mm256_set1_ps(-0.0f)); }
  static T select_ge0(T g, T a, T b) {
    return _mm256_blendv_ps(b, a, _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_GE_OQ));
  }
  static T masked_keep(T v, T fill, uint32_t valid, uint32_t offset) {
    const __m256i idx =
        _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(static_cast<int>(offset)));
    const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(valid)), idx));
    return _mm256_blendv_ps(fill, v, keep);
  }
  static float hmax(T v) {
    alignas(32) float t[8];
    _mm256_store_ps(t, v);
    return *std::max_element(t, t + 8);
  }
};

}  // namespace

extern const Kernels kAvx2Kernels =
    simd::make_kernels<V256>("avx2", simd::Ops<V256>::gemm_bf16, quant_simd::qgemm, round_rows_bf16, quantize_rows);

}  // namespace tandem::engine::kernels
