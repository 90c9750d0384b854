// The OpenAI API's requests as tandem requests: a JSON body of /v1/completions or
// /v1/chat/completions parsed and checked at the edge into the client library's
// GenerateRequest, or refused with the OpenAI error object. Pure functions: no sockets, no
// clock, no logging (the server logs what they report), so the fuzz target drives them alone.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tandem/client.h"

namespace tandem::gateway {

// An error as the OpenAI API returns it: {"error":{"message","type","param","code"}}.
struct ApiError {
  ApiError() = default;
  ApiError(int status_, std::string message_, std::string type_ = "invalid_request_error", std::string param_ = "",
           std::string code_ = "")
      : status(status_),
        message(std::move(message_)),
        type(std::move(type_)),
        param(std::move(param_)),
        code(std::move(code_)) {}

  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the field at fault; "" = null
  std::string code;   // "" = null
};

// The body of a response carrying `error`.
std::string error_body(const ApiError& error);

enum class ApiKind { kCompletion, kChat };

// What the model is, as requests are checked against it.
struct ModelLimits {
  std::string name;             // the only `model` a request may name (another is 404)
  uint32_t context_length = 0;  // prompt + max_tokens may not exceed it
  uint32_t max_n = 16;          // n (choices per prompt) and prompts x n are bounded by it
  uint32_t vocab_size = 0;      // logit_bias ids must be below it (0: left to the scheduler)
};

// One parsed request. `requests` holds one GenerateRequest per choice, prompt-major:
// requests[p * n + j] is choice j of prompt p (OpenAI numbers choices that way). Their ids
// are left empty for the server to fill.
struct ApiRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::vector<GenerateRequest> requests;
  uint32_t n = 1;
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool max_tokens_given = false;  // false: the server sets max_tokens to the rest of the context
  // Completions: logprobs N (top N alternatives; -1: no logprobs). Chat: logprobs true/false
  // and top_logprobs N, held here as the same number (-1: none).
  int32_t logprobs = -1;
  bool echo = false;
  std::string user;  // the caller's `user` field ("" = none)
};

// The outcome of parsing: an error (ok == false) or the request.
struct Parsed {
  bool ok = false;
  ApiError error;
  ApiRequest request;
  // Top-level fields the API has that tandem ignores (SDKs send store, metadata, ...) and
  // fields no API version has: the server logs each name once.
  std::vector<std::string> ignored_fields;
};

// Parses a /v1/completions (kCompletion) or /v1/chat/completions (kChat) body. Every error
// names the field: a body that is not a JSON object (or nests deeper than 64), a field of the
// wrong type or out of range, `model` other than limits.name (404, code model_not_found), a
// field that would change the answer and is not supported (best_of, response_format, suffix
// when not their neutral value); logit_bias keys that are not token ids, ids at or over
// limits.vocab_size, biases outside [-100, 100] or more than 300 entries.
Parsed parse_request(std::string_view body, ApiKind kind, const ModelLimits& limits);

// The scheduler's principal (Submit.principal: printable ASCII, at most kMaxPrincipalBytes) for
// a request's `user`: bytes outside '!'..'~' and '%' percent-encoded (so distinct users stay
// distinct and the access log gets one word), cut to the limit at an escape's boundary.
std::string principal_of_user(std::string_view user);

// POST /tokenize and /detokenize bodies (vLLM's shapes).
struct TokenizeBody {
  TokenizeRequest request;
  bool ok = false;
  ApiError error;
};
TokenizeBody parse_tokenize(std::string_view body, const ModelLimits& limits);
struct DetokenizeBody {
  std::vector<int32_t> tokens;
  bool ok = false;
  ApiError error;
};
DetokenizeBody parse_detokenize(std::string_view body, const ModelLimits& limits);

}  // namespace tandem::gateway
