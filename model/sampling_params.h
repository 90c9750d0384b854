// Sampling parameters as every actor sees them: the scheduler validates them at admission,
// the worker's sampler applies them.
#pragma once

#include <cstdint>

#include "runtime/status.h"

namespace tandem::model {

struct SamplingParams {
  float temperature = 0.0f;         // 0: greedy (argmax; ties go to the lowest id)
  int32_t top_k = 0;                // 0: off
  float top_p = 1.0f;               // 1: off; in (0, 1]
  float min_p = 0.0f;               // 0: off; in [0, 1]
  float repetition_penalty = 1.0f;  // 1: off; > 0 (llama.cpp/CTRL style on the recent tokens)
  uint64_t seed = 0;
  int32_t top_logprobs = 0;  // how many top alternatives to report, 0..kMaxTopLogprobs
};
inline constexpr int32_t kMaxTopLogprobs = 20;

// Error (kInvalidArgument) naming the first bad field and its value, e.g.
// "top_p 1.5 is outside (0, 1]". Valid: temperature finite and >= 0; top_k >= 0;
// top_p in (0, 1]; min_p in [0, 1]; repetition_penalty finite and > 0;
// top_logprobs in [0, kMaxTopLogprobs].
Status validate(const SamplingParams& params);

}  // namespace tandem::model
