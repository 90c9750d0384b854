#include "workers/engine/kernels.h"

#include <cstdlib>
#include <cstring>
#include <initializer_list>

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

const Kernels* by_name(const char* name) {
  if (std::strcmp(name, "generic") == 0) return &kGenericKernels;
#ifdef TANDEM_X86
  __builtin_cpu_init();
  const bool fma = __builtin_cpu_supports("fma");
  if (std::strcmp(name, "avx2") == 0 && __builtin_cpu_supports("avx2") && fma) return &kAvx2Kernels;
  if (std::strcmp(name, "avx512") == 0 && __builtin_cpu_supports("avx512f") && fma) return &kAvx512Kernels;
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
