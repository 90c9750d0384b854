#include "scheduler/admission.h"

#include <algorithm>
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

// The prompt: token ids (checked against the vocabulary), or text or a conversation left to
// tokenize (bounded in bytes).
Status admit_prompt(const v1::Submit& submit, const AdmissionLimits& limits, RequestSpec& spec) {
  switch (submit.prompt_case()) {
    case v1::Submit::kText:
    case v1::Submit::kChat: {
      auto in = prompt_input(submit.text(), submit.has_chat() ? &submit.chat() : nullptr, submit.no_bos(),
                             limits.max_prompt_bytes);
      if (!in) return in.status();
      spec.prompt_input = std::move(in.value());
      spec.chat = submit.has_chat();
      break;
    }
    case v1::Submit::kTokens: {
      const auto& ids = submit.tokens().ids();
      if (ids.empty()) return Status::invalid("prompt: empty");
      if (limits.context_length > 0 && static_cast<size_t>(ids.size()) >= limits.context_length) {
        return Status::invalid("prompt of " + str(ids.size()) + " tokens does not fit the context length " +
                               str(limits.context_length) + " (it must leave room for one generated token)");
      }
      TANDEM_RETURN_IF_ERROR(check_ids(ids, limits.vocab_size, "prompt"));
      spec.prompt.assign(ids.begin(), ids.end());
      break;
    }
    case v1::Submit::PROMPT_NOT_SET: return Status::invalid("prompt: missing (give text, tokens or messages)");
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

Status check_principal(const std::string& principal) {
  if (principal.size() > runtime::kMaxPrincipalBytes)
    return Status::invalid("principal: " + str(principal.size()) + " bytes, at most " +
                           str(runtime::kMaxPrincipalBytes));
  for (size_t i = 0; i < principal.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(principal[i]);
    if (c < 0x20 || c > 0x7e)
      return Status::invalid("principal: byte " + str(c) + " at position " + str(i) +
                             " is not printable ASCII (0x20..0x7e)");
  }
  return Status::ok();
}

size_t max_client_message_bytes(const AdmissionLimits& limits) {
  constexpr size_t kFraming = 1024;  // version, scalars, sampling, tags, lengths, CurveZMQ's overhead
  constexpr size_t kVarint = 5;      // an int32 token id below 2^31, or a length, at most
  const size_t text = limits.max_prompt_bytes + kMaxChatMessages * 36;
  const size_t tokens = size_t{limits.context_length > 0 ? limits.context_length - 1 : 0} * kVarint;
  const size_t stop_sequences = kMaxStopSequences * (kMaxStopSequenceTokens * kVarint + 12);
  const size_t stop_strings = kMaxStopStrings * (kMaxStopStringBytes + 6);
  // An entry: its tag and length, the token's tag and varint, the bias's tag and 4 bytes.
  const size_t logit_bias = model::kMaxLogitBias * (2 + 1 + kVarint + 1 + 4);
  return kFraming + limits.max_request_id_bytes + runtime::kMaxPrincipalBytes + std::max(text, tokens) +
         stop_sequences + stop_strings + logit_bias;
}

Result<RequestSpec> admit_fields(const v1::Submit& submit, const AdmissionLimits& limits) {
  RequestSpec spec;

  // request_id
  if (submit.request_id().empty()) return Status::invalid("request_id: empty");
  if (submit.request_id().size() > limits.max_request_id_bytes) {
    return Status::invalid("request_id: " + str(submit.request_id().size()) + " bytes, at most " +
                           str(limits.max_request_id_bytes));
  }
  spec.id = submit.request_id();
  TANDEM_RETURN_IF_ERROR(check_principal(submit.principal()));
  spec.principal = submit.principal();

  TANDEM_RETURN_IF_ERROR(admit_prompt(submit, limits, spec));

  // max_tokens (against the prompt's length in admit_prompt_ids)
  if (submit.max_tokens() == 0) return Status::invalid("max_tokens must be >= 1");
  spec.max_tokens = submit.max_tokens();

  // sampling
  if (submit.has_sampling()) spec.sampling = model::from_proto(submit.sampling());
  TANDEM_RETURN_IF_ERROR(model::validate(spec.sampling));
  TANDEM_RETURN_IF_ERROR(model::validate_logit_bias_ids(spec.sampling, limits.vocab_size));

  TANDEM_RETURN_IF_ERROR(admit_stops(submit, limits, spec));

  spec.include_stop_string = submit.include_stop_string();
  spec.ignore_eos = submit.ignore_eos();
  spec.logprobs = submit.logprobs();
  spec.stream = submit.stream();
  spec.priority = submit.priority();
  spec.timeout_ms = submit.timeout_ms();
  if (submit.has_spec_tokens()) {
    if (submit.spec_tokens() > kMaxSpecTokens)
      return Status::invalid("spec_tokens " + std::to_string(submit.spec_tokens()) + " is more than " +
                             std::to_string(kMaxSpecTokens) + " drafts a round (0: this request does not speculate)");
    spec.spec_tokens = submit.spec_tokens();
  }
  return spec;
}

Status admit_prompt_ids(const RequestSpec& spec, const AdmissionLimits& limits) {
  for (size_t i = 0; i < spec.prompt.size(); ++i) {
    const int32_t id = spec.prompt[i];
    if (id < 0 || static_cast<uint32_t>(id) >= limits.vocab_size) {
      return Status::invalid("prompt: token id " + std::to_string(id) + " at position " + str(i) +
                             " is outside the vocabulary of " + str(limits.vocab_size));
    }
  }
  const std::string prompt = "prompt of " + str(spec.prompt.size()) + " tokens" +
                             (spec.chat ? " (the messages rendered with the chat template)" : "");
  if (spec.prompt.size() >= limits.context_length) {
    return Status::invalid(prompt + " does not fit the context length " + str(limits.context_length) +
                           " (it must leave room for one generated token)");
  }
  if (spec.prompt.size() + spec.max_tokens > limits.context_length) {
    return Status::invalid("max_tokens " + str(spec.max_tokens) + " with a " + prompt + " exceeds the context length " +
                           str(limits.context_length));
  }
  return Status::ok();
}

Result<RequestSpec> admit(const v1::Submit& submit, const PromptRenderer& renderer, const AdmissionLimits& limits) {
  auto spec = admit_fields(submit, limits);
  if (!spec) return spec.status();
  if (spec->prompt_input) {
    auto ids = renderer.render(*spec->prompt_input);
    if (!ids) return ids.status();
    spec->prompt = std::move(ids).value();
  }
  TANDEM_RETURN_IF_ERROR(admit_prompt_ids(*spec, limits));
  return spec;
}

Result<RequestSpec> admit(const v1::Submit& submit, const model::Tokenizer& tokenizer, const AdmissionLimits& limits) {
  return admit(submit, PromptRenderer(tokenizer, std::nullopt), limits);
}

}  // namespace tandem::scheduler
