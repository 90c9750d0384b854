// Token sampling: a pure function of (logits, params, seed, position).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/status.h"

namespace tandem::engine {

struct SamplingParams {
  float temperature = 0.0f;         // 0: greedy (argmax; ties go to the lowest id)
  int32_t top_k = 0;                // 0: off
  float top_p = 1.0f;               // 1: off; in (0, 1]
  float min_p = 0.0f;               // 0: off; in [0, 1]
  float repetition_penalty = 1.0f;  // 1: off; > 0 (llama.cpp/CTRL style on `history`)
  uint64_t seed = 0;
  int32_t top_logprobs = 0;         // how many top alternatives to report, 0..kMaxTopLogprobs
};
inline constexpr int32_t kMaxTopLogprobs = 20;

// Error (kInvalidArgument) naming the first bad field and its value, e.g.
// "top_p 1.5 is outside (0, 1]". Valid: temperature finite and >= 0; top_k >= 0;
// top_p in (0, 1]; min_p in [0, 1]; repetition_penalty finite and > 0;
// top_logprobs in [0, kMaxTopLogprobs]. sample() assumes valid params.
Status validate(const SamplingParams& params);

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct Sample {
  int32_t token = 0;
  // log-softmax of the raw logits (before penalty, temperature and truncation), as vLLM
  // reports by default.
  float logprob = 0.0f;
  std::span<const TokenLogprob> top;  // top_logprobs best by raw logprob; valid until next sample()
};

// Reusable sampler for one vocabulary size; holds its scratch so sample() does not
// allocate. Not thread-safe: one per thread.
class Sampler {
 public:
  explicit Sampler(uint32_t vocab_size);

  // `position` is the index in the sequence of the token being sampled; the uniform
  // draw is derived only from (seed, position), so any worker reproduces it.
  // `history` are the tokens the repetition penalty applies to (caller picks the window;
  // each distinct token is penalized once; ids outside the vocabulary are ignored).
  // `logits` must hold vocab_size entries. Filters apply in the order penalty,
  // temperature, top-k, top-p, min-p; the kept tokens are walked in descending
  // probability (ties by lower id) to the draw. NaN logits count as -inf; if every
  // logit is -inf/NaN the result is token 0 with logprob -inf. See sampler.cpp.
  // Does not allocate.
  Sample sample(std::span<const float> logits, const SamplingParams& params, uint64_t position,
                std::span<const int32_t> history = {});

 private:
  uint32_t vocab_;
  std::vector<float> probs_;        // sanitized -> penalized logits -> sampling weights
  std::vector<int32_t> order_;      // candidate ids (top-k buffer, then descending order)
  std::vector<uint8_t> seen_;       // penalty dedup flags, all 0 between calls
  std::vector<TokenLogprob> top_;   // kMaxTopLogprobs entries; Sample::top points here
};

// The uniform draw in [0, 1) for (seed, position): a counter-based hash (splitmix64).
double uniform_draw(uint64_t seed, uint64_t position);

}  // namespace tandem::engine
