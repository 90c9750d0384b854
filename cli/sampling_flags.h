// The sampling flags of `tandem run` and `tandem generate`, read once for both (their
// rows of the flag table are shared, bounds included) into the one SamplingParams.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

#include "cli/args.h"
#include "model/sampling_params.h"
#include "runtime/status.h"

namespace tandem::cli {

// --logit-bias TOKEN=BIAS[,TOKEN=BIAS...]: token ids and biases as given; their bounds are
// validate()'s (and the vocabulary's, at admission).
inline Result<std::vector<model::LogitBias>> logit_bias_from_flag(std::string_view text) {
  std::vector<model::LogitBias> out;
  while (!text.empty()) {
    const size_t comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    const size_t eq = item.find('=');
    model::LogitBias b;
    const char* const end = item.data() + item.size();
    const bool ok = eq != std::string_view::npos &&
                    std::from_chars(item.data(), item.data() + eq, b.token).ptr == item.data() + eq && eq > 0 &&
                    eq + 1 < item.size() && std::from_chars(item.data() + eq + 1, end, b.bias).ptr == end;
    if (!ok) return Status::invalid("--logit-bias: '" + std::string(item) + "' is not TOKEN=BIAS (e.g. 50256=-100)");
    out.push_back(b);
  }
  return out;
}

// --temperature --top-k --top-p --min-p --repetition-penalty --presence-penalty
// --frequency-penalty --logit-bias --seed; errors name the flag. The values' meaning (top_p
// in (0, 1], ...) is checked where they are used (model::validate).
inline Result<model::SamplingParams> sampling_from_flags(const Args& args) {
  model::SamplingParams s;
  auto temperature = args.real("temperature", s.temperature);
  auto top_k = args.integer("top-k", s.top_k);
  auto top_p = args.real("top-p", s.top_p);
  auto min_p = args.real("min-p", s.min_p);
  auto penalty = args.real("repetition-penalty", s.repetition_penalty);
  auto presence = args.real("presence-penalty", s.presence_penalty);
  auto frequency = args.real("frequency-penalty", s.frequency_penalty);
  auto bias = logit_bias_from_flag(args.str("logit-bias").value_or(""));
  auto seed = args.integer("seed", 0);
  for (const Status* st : {&temperature.status(), &top_k.status(), &top_p.status(), &min_p.status(), &penalty.status(),
                           &presence.status(), &frequency.status(), &bias.status(), &seed.status()})
    if (!st->is_ok()) return *st;
  s.temperature = static_cast<float>(*temperature);
  s.top_k = static_cast<int32_t>(*top_k);
  s.top_p = static_cast<float>(*top_p);
  s.min_p = static_cast<float>(*min_p);
  s.repetition_penalty = static_cast<float>(*penalty);
  s.presence_penalty = static_cast<float>(*presence);
  s.frequency_penalty = static_cast<float>(*frequency);
  s.logit_bias = std::move(bias.value());
  s.seed = static_cast<uint64_t>(*seed);
  return s;
}

}  // namespace tandem::cli
