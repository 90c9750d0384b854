#include "workers/engine/kernels_quant_avx512.h"
#include "workers/engine/kernels_simd.h"

namespace tandem::engine::kernels {
namespace {

struct V512 {
  TANDEM_SIMD_LANE_OPS(512)
  static constexpr uint32_t kMaxRows = 12;  // 12 x 2 accumulators + 2 weights + 1 broadcast
  static void u8_to_float(__m128i b, T* out) { out[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)); }
  static T load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static T load_bf16(const uint16_t* p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static T round(T x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
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

}  // namespace

extern const Kernels kAvx512Kernels = simd::make_kernels<V512>("avx512", quant512::qgemm, quant512::quantize);

}  // namespace tandem::engine::kernels
