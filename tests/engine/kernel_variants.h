// What the kernel tests share: every kernel variant this CPU runs, and random inputs.
#pragma once

#include <random>
#include <vector>

#include "workers/engine/kernels.h"

namespace tandem::engine::kernels::test {

inline std::vector<float> random_vec(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// generic, then avx2 and avx512 where this CPU has them.
inline std::vector<const Kernels*> variants() {
  std::vector<const Kernels*> out;
  for (const char* name : {"generic", "avx2", "avx512"})
    if (const Kernels* k = by_name(name)) out.push_back(k);
  return out;
}

}  // namespace tandem::engine::kernels::test
