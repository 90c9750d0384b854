// The sampling flags of `tandem run` and `tandem generate`, read once for both (their
// rows of the flag table are shared, bounds included).
#pragma once

#include <cstdint>

#include "cli/args.h"
#include "runtime/status.h"

namespace tandem::cli {

struct SamplingFlags {
  float temperature = 0;
  int32_t top_k = 0;
  float top_p = 1;
  float min_p = 0;
  float repetition_penalty = 1;
  uint64_t seed = 0;
};

// --temperature --top-k --top-p --min-p --repetition-penalty --seed; errors name the flag.
// The values' meaning (top_p in (0, 1], ...) is checked where they are used.
inline Result<SamplingFlags> sampling_from_flags(const Args& args) {
  SamplingFlags s;
  auto temperature = args.real("temperature", s.temperature);
  auto top_k = args.integer("top-k", s.top_k);
  auto top_p = args.real("top-p", s.top_p);
  auto min_p = args.real("min-p", s.min_p);
  auto penalty = args.real("repetition-penalty", s.repetition_penalty);
  auto seed = args.integer("seed", 0);
  for (const Status* st :
       {&temperature.status(), &top_k.status(), &top_p.status(), &min_p.status(), &penalty.status(), &seed.status()})
    if (!st->is_ok()) return *st;
  s.temperature = static_cast<float>(*temperature);
  s.top_k = static_cast<int32_t>(*top_k);
  s.top_p = static_cast<float>(*top_p);
  s.min_p = static_cast<float>(*min_p);
  s.repetition_penalty = static_cast<float>(*penalty);
  s.seed = static_cast<uint64_t>(*seed);
  return s;
}

}  // namespace tandem::cli
