// Sampling parameters as every actor sees them: the scheduler validates them at admission,
// the worker's sampler applies them.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/status.h"

namespace tandem::model {

// One logit_bias entry: `bias` is added to token `token`'s logit.
struct LogitBias {
  int32_t token = 0;
  float bias = 0.0f;
  bool operator==(const LogitBias&) const = default;
};

struct SamplingParams {
  float temperature = 0.0f;         // 0: greedy (argmax; ties go to the lowest id)
  int32_t top_k = 0;                // 0: off
  float top_p = 1.0f;               // 1: off; in (0, 1]
  float min_p = 0.0f;               // 0: off; in [0, 1]
  float repetition_penalty = 1.0f;  // 1: off; > 0 (llama.cpp/CTRL style on the recent tokens)
  uint64_t seed = 0;
  int32_t top_logprobs = 0;  // how many top alternatives to report, 0..kMaxTopLogprobs
  // OpenAI / vLLM: subtracted from a token's logit for each time (frequency) and once if
  // (presence) it occurs among the tokens this sequence generated so far (the prompt does not
  // count, as vLLM). 0: off; in [-2, 2].
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // Added to the named tokens' logits before every other stage; each bias in [-100, 100], at
  // most kMaxLogitBias entries, each token once. Ids are checked against the vocabulary at
  // admission (the vocabulary is not known here).
  std::vector<LogitBias> logit_bias;
};
inline constexpr int32_t kMaxTopLogprobs = 20;
inline constexpr size_t kMaxLogitBias = 300;  // OpenAI's cap
inline constexpr float kMaxLogitBiasValue = 100.0f;
inline constexpr float kMaxPresenceFrequencyPenalty = 2.0f;

// Error (kInvalidArgument) naming the first bad field and its value, e.g.
// "top_p 1.5 is outside (0, 1]". Valid: temperature finite and >= 0; top_k >= 0;
// top_p in (0, 1]; min_p in [0, 1]; repetition_penalty finite and > 0;
// top_logprobs in [0, kMaxTopLogprobs]; presence_penalty and frequency_penalty in [-2, 2];
// logit_bias at most kMaxLogitBias entries, token ids >= 0 and each once, biases in
// [-100, 100]. Errors name the field, e.g. "logit_bias: bias 150 for token 7 is outside
// [-100, 100]".
Status validate(const SamplingParams& params);

// logit_bias's token ids against a vocabulary: "logit_bias: token id 70000 is outside the
// vocabulary of 49152".
Status validate_logit_bias_ids(const SamplingParams& params, uint32_t vocab_size);

}  // namespace tandem::model
