#include "scheduler/step_cost.h"

#include <algorithm>
#include <cmath>

namespace tandem::scheduler {
namespace {

double follow(double mean, double sample) { return mean < 0 ? sample : mean + StepCost::kWeight * (sample - mean); }

}  // namespace

void StepCost::record(uint32_t prompt_tokens, uint32_t decodes, int64_t us) {
  if (us <= 0 || prompt_tokens + decodes == 0) return;
  const double t = static_cast<double>(us);
  if (prompt_tokens == 0) {
    per_decode_ = follow(per_decode_, t / decodes);
    return;
  }
  // The decodes' share as last measured; what is left is the prompt's, never less than an
  // eighth of the step (a decode estimate from a slower moment must not make it negative).
  const double decode_share = per_decode_ < 0 ? 0.0 : per_decode_ * decodes;
  const double prompt_share = per_decode_ < 0 ? t * prompt_tokens / (prompt_tokens + decodes) : t - decode_share;
  per_prompt_ = follow(per_prompt_, std::max(prompt_share, t / 8) / prompt_tokens);
}

std::optional<uint32_t> StepCost::prompt_tokens_within(int64_t target_us, uint32_t decodes) const {
  if (per_prompt_ <= 0) return std::nullopt;
  const double per_decode = per_decode_ < 0 ? per_prompt_ : per_decode_;
  const double room = static_cast<double>(target_us) - per_decode * decodes;
  if (room <= 0) return 0u;
  return static_cast<uint32_t>(std::min(room / per_prompt_, 1e9));
}

std::optional<double> StepCost::us_per_decode() const {
  return per_decode_ < 0 ? std::nullopt : std::optional<double>(per_decode_);
}

std::optional<double> StepCost::us_per_prompt_token() const {
  return per_prompt_ < 0 ? std::nullopt : std::optional<double>(per_prompt_);
}

}  // namespace tandem::scheduler
