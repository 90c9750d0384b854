// A worker's cost of a step, learned from its recent steps, for the step-time target
// (--target-step-ms; Sarathi-Serve sizes a step's prompt chunk from a latency target rather
// than a fixed token budget): the time per decode, from steps that only decode (the step's
// fixed cost, weights streamed once, is folded into it at that batch), and the time per
// prompt token, from steps with prompt tokens once the decodes' share is taken out. Each an
// exponentially weighted mean, so a worker that slows down (a busy host, a longer context)
// is followed within a few steps. Fixed size, allocation-free.
#pragma once

#include <cstdint>
#include <optional>

namespace tandem::scheduler {

class StepCost {
 public:
  static constexpr double kWeight = 0.25;  // of the newest step: 95% of a change within 10 steps

  // A step of `prompt_tokens` prompt tokens and `decodes` decodes took `us` microseconds.
  void record(uint32_t prompt_tokens, uint32_t decodes, int64_t us);
  // The prompt tokens a step with `decodes` decodes can take and still last at most
  // `target_us` (0 when the decodes alone use it up); none until a step with prompt tokens
  // was seen. A decode costs a prompt token's time until a decode-only step was seen.
  std::optional<uint32_t> prompt_tokens_within(int64_t target_us, uint32_t decodes) const;

  std::optional<double> us_per_decode() const;
  std::optional<double> us_per_prompt_token() const;

 private:
  double per_decode_ = -1, per_prompt_ = -1;  // < 0: not seen yet
};

}  // namespace tandem::scheduler
