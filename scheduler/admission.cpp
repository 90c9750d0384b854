#include "scheduler/admission.h"

#include <utility>

#include "runtime/sampling_proto.h"
#include "scheduler/stops.h"

namespace tandem::scheduler {

namespace {

std::string str(uint64_t v) { return std::to_string(v); }

// Token ids from the wire, checked against the vocabulary; `field` names them in errors.
Status check_ids(const google::protobuf::RepeatedField<int32_t>& ids, uint32_t vocab, const std::string& field) {
  for (int i = 0; i < ids.size(); ++i) {
    const int32_t id = ids.Get(i);
    if (id < 0 || static_cast<uint32_t>(id) >= vocab) {
      return Status::invalid(field + ": token id " + std::to_string(id) + " at position " + std::to_string(i) +
                             " is outside the vocabulary of " + str(vocab));
    }
  }
  return Status::ok();
}

// The prompt, as text (tokenized here) or token ids, every id inside the vocabulary.
Status admit_prompt(const v1::Submit& submit, const model::Tokenizer& tokenizer, const AdmissionLimits& limits,
                    RequestSpec& spec) {
  switch (submit.prompt_case()) {
    case v1::Submit::kText: {
      const std::string& text = submit.text();
      if (text.empty()) return Status::invalid("prompt: empty");
      if (text.size() > limits.max_prompt_bytes) {
        return Status::invalid("prompt: text of " + str(text.size()) + " bytes, at most " +
                               str(limits.max_prompt_bytes));
      }
      auto ids = tokenizer.encode(text, !submit.no_bos());
      if (!ids) return Status::error(ids.status().code(), "prompt: " + ids.status().message());
      spec.prompt = std::move(ids).value();
      for (size_t i = 0; i < spec.prompt.size(); ++i) {
        const int32_t id = spec.prompt[i];
        if (id < 0 || static_cast<uint32_t>(id) >= limits.vocab_size) {
          return Status::invalid("prompt: token id " + std::to_string(id) + " at position " + str(i) +
                                 " is outside the vocabulary of " + str(limits.vocab_size));
        }
      }
      break;
    }
    case v1::Submit::kTokens: {
      const auto& ids = submit.tokens().ids();
      if (ids.empty()) return Status::invalid("prompt: empty");
      TANDEM_RETURN_IF_ERROR(check_ids(ids, limits.vocab_size, "prompt"));
      spec.prompt.assign(ids.begin(), ids.end());
      break;
    }
    case v1::Submit::PROMPT_NOT_SET: return Status::invalid("prompt: missing (give text or tokens)");
  }
  return Status::ok();
}

// Stop token sequences and stop strings, each bounded in count and size.
Status admit_stops(const v1::Submit& submit, const AdmissionLimits& limits, RequestSpec& spec) {
  // stop_token_sequences
  const auto& sequences = submit.stop_token_sequences();
  if (static_cast<size_t>(sequences.size()) > kMaxStopSequences) {
    return Status::invalid("stop_token_sequences: " + str(sequences.size()) + " given, at most " +
                           str(kMaxStopSequences));
  }
  spec.stop_token_sequences.reserve(sequences.size());
  for (int i = 0; i < sequences.size(); ++i) {
    const std::string field = "stop_token_sequences[" + std::to_string(i) + "]";
    const auto& ids = sequences.Get(i).ids();
    if (ids.empty()) return Status::invalid(field + ": empty");
    if (static_cast<size_t>(ids.size()) > kMaxStopSequenceTokens) {
      return Status::invalid(field + ": " + str(ids.size()) + " tokens, at most " + str(kMaxStopSequenceTokens));
    }
    TANDEM_RETURN_IF_ERROR(check_ids(ids, limits.vocab_size, field));
    spec.stop_token_sequences.emplace_back(ids.begin(), ids.end());
  }

  // stop_strings
  const auto& strings = submit.stop_strings();
  if (static_cast<size_t>(strings.size()) > kMaxStopStrings) {
    return Status::invalid("stop_strings: " + str(strings.size()) + " given, at most " + str(kMaxStopStrings));
  }
  spec.stop_strings.reserve(strings.size());
  for (int i = 0; i < strings.size(); ++i) {
    const std::string field = "stop_strings[" + std::to_string(i) + "]";
    const std::string& s = strings.Get(i);
    if (s.empty()) return Status::invalid(field + ": empty");
    if (s.size() > kMaxStopStringBytes) {
      return Status::invalid(field + ": " + str(s.size()) + " bytes, at most " + str(kMaxStopStringBytes));
    }
    spec.stop_strings.push_back(s);
  }

  return Status::ok();
}

}  // namespace

Result<RequestSpec> admit(const v1::Submit& submit, const model::Tokenizer& tokenizer, const AdmissionLimits& limits) {
  RequestSpec spec;

  // request_id
  if (submit.request_id().empty()) return Status::invalid("request_id: empty");
  if (submit.request_id().size() > limits.max_request_id_bytes) {
    return Status::invalid("request_id: " + str(submit.request_id().size()) + " bytes, at most " +
                           str(limits.max_request_id_bytes));
  }
  spec.id = submit.request_id();

  TANDEM_RETURN_IF_ERROR(admit_prompt(submit, tokenizer, limits, spec));
  const uint64_t n_prompt = spec.prompt.size();
  if (n_prompt >= limits.context_length) {
    return Status::invalid("prompt of " + str(n_prompt) + " tokens does not fit the context length " +
                           str(limits.context_length) + " (it must leave room for one generated token)");
  }

  // max_tokens
  if (submit.max_tokens() == 0) return Status::invalid("max_tokens must be >= 1");
  if (n_prompt + submit.max_tokens() > limits.context_length) {
    return Status::invalid("max_tokens " + str(submit.max_tokens()) + " with a prompt of " + str(n_prompt) +
                           " tokens exceeds the context length " + str(limits.context_length));
  }
  spec.max_tokens = submit.max_tokens();

  // sampling
  if (submit.has_sampling()) spec.sampling = model::from_proto(submit.sampling());
  TANDEM_RETURN_IF_ERROR(model::validate(spec.sampling));

  TANDEM_RETURN_IF_ERROR(admit_stops(submit, limits, spec));

  spec.include_stop_string = submit.include_stop_string();
  spec.ignore_eos = submit.ignore_eos();
  spec.logprobs = submit.logprobs();
  spec.stream = submit.stream();
  spec.priority = submit.priority();
  spec.timeout_ms = submit.timeout_ms();
  return spec;
}

}  // namespace tandem::scheduler
