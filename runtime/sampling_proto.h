// SamplingParams to and from their wire form (tandem.v1.SamplingParams): the one mapping, for
// every actor that moves them (the client's Submit, the scheduler's admission and plans, the
// worker's plans and KV handoffs).
//
// The proto3 rule: a field left 0 on the wire is indistinguishable from one never set, so 0
// means "the default". For temperature, top_k, min_p, seed and top_logprobs the default is 0
// anyway (presence_penalty and frequency_penalty too; logit_bias is empty); for top_p and repetition_penalty it is 1
// (off), values whose 0 validate() rejects, so from_proto reads their 0 as 1. to_proto writes every field as it is.
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
  out->set_presence_penalty(p.presence_penalty);
  out->set_frequency_penalty(p.frequency_penalty);
  out->clear_logit_bias();
  for (const LogitBias& b : p.logit_bias) {
    v1::LogitBias* o = out->add_logit_bias();
    o->set_token(b.token);
    o->set_bias(b.bias);
  }
}

inline SamplingParams from_proto(const v1::SamplingParams& s) {
  const SamplingParams defaults;
  SamplingParams p{s.temperature(),
                   s.top_k(),
                   s.top_p() == 0.0f ? defaults.top_p : s.top_p(),
                   s.min_p(),
                   s.repetition_penalty() == 0.0f ? defaults.repetition_penalty : s.repetition_penalty(),
                   s.seed(),
                   s.top_logprobs(),
                   s.presence_penalty(),
                   s.frequency_penalty(),
                   {}};
  p.logit_bias.reserve(static_cast<size_t>(s.logit_bias_size()));
  for (const v1::LogitBias& b : s.logit_bias()) p.logit_bias.push_back({b.token(), b.bias()});
  return p;
}

}  // namespace tandem::model
