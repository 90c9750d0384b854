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
