// A GenerateRequest's sampling fields as the one SamplingParams (model/sampling_params.h,
// reached through runtime/, the layer the client library may include): the public header
// cannot name it, so the library, its tests and the gateway's fuzz target map them here.
// Not part of the public API.
#pragma once

#include "runtime/sampling_proto.h"
#include "tandem/client.h"

namespace tandem {

inline model::SamplingParams sampling_params(const GenerateRequest& r) {
  model::SamplingParams s;
  s.temperature = r.temperature;
  s.top_k = r.top_k;
  s.top_p = r.top_p;
  s.min_p = r.min_p;
  s.repetition_penalty = r.repetition_penalty;
  s.seed = r.seed;
  s.top_logprobs = r.top_logprobs;
  s.presence_penalty = r.presence_penalty;
  s.frequency_penalty = r.frequency_penalty;
  s.logit_bias.reserve(r.logit_bias.size());
  for (const auto& [token, bias] : r.logit_bias) s.logit_bias.push_back({token, bias});
  return s;
}

}  // namespace tandem
