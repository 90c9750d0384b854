#include "model/sampling_params.h"

#include <charconv>
#include <cmath>
#include <string>
#include <utility>

namespace tandem::model {

namespace {
std::string fmt(float v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}
Status validate_logit_bias(const std::vector<LogitBias>& bias) {
  if (bias.size() > kMaxLogitBias) {
    return Status::invalid("logit_bias: " + std::to_string(bias.size()) + " entries, at most " +
                           std::to_string(kMaxLogitBias) + " (OpenAI's limit)");
  }
  for (size_t i = 0; i < bias.size(); ++i) {
    const LogitBias& b = bias[i];
    if (b.token < 0) return Status::invalid("logit_bias: token id " + std::to_string(b.token) + " is negative");
    if (!(b.bias >= -kMaxLogitBiasValue && b.bias <= kMaxLogitBiasValue)) {
      return Status::invalid("logit_bias: bias " + fmt(b.bias) + " for token " + std::to_string(b.token) +
                             " is outside [-100, 100]");
    }
    for (size_t j = 0; j < i; ++j) {  // at most 300 x 300 / 2 comparisons, once per request
      if (bias[j].token == b.token)
        return Status::invalid("logit_bias: token " + std::to_string(b.token) + " is given twice");
    }
  }
  return Status::ok();
}

}  // namespace

Status validate(const SamplingParams& p) {
  if (!(std::isfinite(p.temperature) && p.temperature >= 0.0f)) {
    return Status::invalid("temperature " + fmt(p.temperature) + " must be finite and >= 0");
  }
  if (p.top_k < 0) {
    return Status::invalid("top_k " + std::to_string(p.top_k) + " must be >= 0 (0 disables it)");
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return Status::invalid("top_p " + fmt(p.top_p) + " is outside (0, 1]");
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return Status::invalid("min_p " + fmt(p.min_p) + " is outside [0, 1]");
  }
  if (!(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f)) {
    return Status::invalid("repetition_penalty " + fmt(p.repetition_penalty) + " must be finite and > 0");
  }
  if (p.top_logprobs < 0 || p.top_logprobs > kMaxTopLogprobs) {
    return Status::invalid("top_logprobs " + std::to_string(p.top_logprobs) + " is outside [0, " +
                           std::to_string(kMaxTopLogprobs) + "]");
  }
  for (const auto& [name, v] :
       {std::pair{"presence_penalty", p.presence_penalty}, std::pair{"frequency_penalty", p.frequency_penalty}}) {
    if (!(v >= -kMaxPresenceFrequencyPenalty && v <= kMaxPresenceFrequencyPenalty))
      return Status::invalid(std::string(name) + " " + fmt(v) + " is outside [-2, 2]");
  }
  return validate_logit_bias(p.logit_bias);
}

Status validate_logit_bias_ids(const SamplingParams& p, uint32_t vocab_size) {
  for (const LogitBias& b : p.logit_bias) {
    if (b.token < 0 || static_cast<uint32_t>(b.token) >= vocab_size) {
      return Status::invalid("logit_bias: token id " + std::to_string(b.token) + " is outside the vocabulary of " +
                             std::to_string(vocab_size));
    }
  }
  return Status::ok();
}

}  // namespace tandem::model
