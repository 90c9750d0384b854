// SamplingParams to and from their wire form (tandem.v1.SamplingParams), for every actor
// that moves them: the scheduler's plans, the worker's plans and KV handoffs.
#pragma once

#include "model/sampling_params.h"
#include "tandem/v1/common.pb.h"

namespace tandem::model {

inline void to_proto(const SamplingParams& p, v1::SamplingParams* out) {
  out->set_temperature(p.temperature);
  out->set_top_k(p.top_k);
  out->set_top_p(p.top_p);
  out->set_min_p(p.min_p);
  out->set_repetition_penalty(p.repetition_penalty);
  out->set_seed(p.seed);
  out->set_top_logprobs(p.top_logprobs);
}

inline SamplingParams from_proto(const v1::SamplingParams& s) {
  return {s.temperature(), s.top_k(), s.top_p(), s.min_p(), s.repetition_penalty(), s.seed(), s.top_logprobs()};
}

}  // namespace tandem::model
