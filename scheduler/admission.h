// Admission: a client's Submit checked field by field and parsed into native types.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tandem/v1/client.pb.h"
#include "model/sampling_params.h"
#include "model/tokenizer.h"
#include "runtime/status.h"
#include "runtime/wire.h"
#include "scheduler/prompt.h"

namespace tandem::scheduler {

// A request id's bytes at most: refusals echo longer ones cut to this (set_refusal).
using runtime::kMaxRequestIdBytes;

struct AdmissionLimits {
  uint32_t context_length = 0;
  uint32_t vocab_size = 0;
  size_t max_request_id_bytes = kMaxRequestIdBytes;
  size_t max_prompt_bytes = runtime::kMaxPromptBytes;  // a text, or a conversation's messages and tools together
};

// The largest ClientMessage a well-formed client sends under `limits` (its context length and
// the bounds above and in stops.h and prompt.h), in bytes: the client socket's ZMQ_MAXMSGSIZE.
// Every field at its bound, with protobuf's framing at its largest:
//   framing (1 KiB: the version, the scalars, sampling, tags, CurveZMQ's 33 bytes) + request_id
//   + principal (kMaxPrincipalBytes)
//   + max(text or conversation: max_prompt_bytes + kMaxChatMessages x 36 bytes of framing,
//         token ids: (context_length - 1) x 5 bytes)
//   + stop_token_sequences: kMaxStopSequences x (kMaxStopSequenceTokens x 5 + 12)
//   + stop_strings: kMaxStopStrings x (kMaxStopStringBytes + 6)
//   + logit_bias: kMaxLogitBias x 13 bytes.
// A TokenizeQuery is bounded by the same prompt limits, so it is below this too.
size_t max_client_message_bytes(const AdmissionLimits& limits);

// Drafts a speculative round carries at most, per worker (Register.spec_tokens, capped) and
// per request (Submit.spec_tokens, refused above it).
inline constexpr uint32_t kMaxSpecTokens = 16;

// A validated request, in native types. Everything the scheduler needs and nothing else.
struct RequestSpec {
  std::string id;
  std::string principal;                    // whom a proxy sent it for ("" = the client itself)
  std::vector<int32_t> prompt;              // tokenized; BOS included when asked
  std::optional<PromptInput> prompt_input;  // text or a conversation still to tokenize (then prompt is empty)
  bool chat = false;                        // the prompt is a conversation (errors say so)
  model::SamplingParams sampling;
  uint32_t max_tokens = 0;  // >= 1, and prompt.size() + max_tokens <= context_length
  std::vector<std::vector<int32_t>> stop_token_sequences;
  std::vector<std::string> stop_strings;
  bool include_stop_string = false;
  bool ignore_eos = false;
  bool logprobs = false;
  bool stream = true;
  int32_t priority = 0;
  uint32_t timeout_ms = 0;
  std::optional<uint32_t> spec_tokens;  // drafts a round at most (0: none); none: the worker's
};

// Checks every field; the error (kInvalidArgument) names the first bad one, its message
// starting with the field:
//   request_id empty / longer than max_request_id_bytes;
//   principal longer than kMaxPrincipalBytes / not printable ASCII (check_principal);
//   prompt missing (neither text nor tokens) / empty (text "" or no tokens; an empty text
//   is empty even though it would encode to BOS alone) / text longer than max_prompt_bytes /
//   a conversation of more than kMaxChatMessages messages or more than max_prompt_bytes /
//   token ids as many as the context length or more (checked before they are copied) /
//   text with a tokenizer that cannot encode ("prompt: " + the tokenizer's own message) /
//   token id X outside the vocabulary of V / "prompt of N tokens does not fit the context
//   length C" (N >= C: it must leave room for one generated token);
//   "max_tokens must be >= 1" / "max_tokens M with a prompt of N tokens exceeds the context
//   length C" (an error, not clamped, as vLLM);
//   sampling fields (model::validate's message, e.g. "top_p 1.5 is outside (0, 1]");
//   "logit_bias: token id X is outside the vocabulary of V";
//   stop_token_sequences: more than kMaxStopSequences, an empty one, one longer than
//   kMaxStopSequenceTokens, a token outside the vocabulary;
//   stop_strings: more than kMaxStopStrings, an empty one, one longer than
//   kMaxStopStringBytes.
// Token ids (prompt and stop sequences) are checked against limits.vocab_size.
// Sampling: a missing `sampling` is all defaults (greedy); a present one is read by
// model::from_proto (runtime/sampling_proto.h: top_p 0 and repetition_penalty 0 mean "unset",
// 1; every other field as is).
// Everything else is copied as is; note proto3's `stream` defaults to false.
// A conversation (`chat`) is rendered with the renderer's template; the errors are
// PromptRenderer::render's, and a rendered prompt too long for the context says so.
// A Submit's principal: at most kMaxPrincipalBytes bytes of printable ASCII (so it can be
// logged as is); the error names the field.
[[nodiscard]] Status check_principal(const std::string& principal);

Result<RequestSpec> admit(const v1::Submit& submit, const PromptRenderer& renderer, const AdmissionLimits& limits);
Result<RequestSpec> admit(const v1::Submit& submit, const model::Tokenizer& tokenizer, const AdmissionLimits& limits);

// admit() in two parts, for a scheduler that tokenizes off its planning thread:
// admit_fields checks everything but the prompt's length (request_id, the prompt's presence
// and byte size, max_tokens >= 1, sampling, stops) and leaves text or a conversation in
// spec.prompt_input, token ids in spec.prompt (checked against the vocabulary);
// admit_prompt_ids then checks the ids against the vocabulary and the context length with
// max_tokens, once the prompt is tokenized.
Result<RequestSpec> admit_fields(const v1::Submit& submit, const AdmissionLimits& limits);
[[nodiscard]] Status admit_prompt_ids(const RequestSpec& spec, const AdmissionLimits& limits);

}  // namespace tandem::scheduler
