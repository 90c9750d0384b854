#include "model/sampling_params.h"

#include <charconv>
#include <cmath>
#include <string>

namespace tandem::model {

namespace {
std::string fmt(float v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
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
  return Status::ok();
}

}  // namespace tandem::model
