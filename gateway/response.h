// The OpenAI API's responses made from tandem's events: whole responses (non-streaming) and
// the server-sent events of a stream, one `data:` event per token. Pure: the server feeds
// events in and writes the bytes out. The per-token calls append to a caller's buffer and
// allocate nothing once it has grown (the prefix every chunk shares is built once).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gateway/api.h"
#include "model/chat_output.h"
#include "tandem/client.h"

namespace tandem::gateway {

// Appends the text of token `id` as logprobs name it (its vocabulary piece).
using TokenPiece = std::function<void(int32_t id, std::string& out)>;

// One choice's tokens and end, collected for a non-streaming response.
struct ChoiceResult {
  std::string text;
  std::vector<TokenEvent> tokens;  // kept only when logprobs were asked for
  bool done = false;
  FinalEvent fin;
  // Chat output parsed (model/chat_output.h): `message` replaces `text` and fin.reason.
  bool parsed = false;
  model::ChatOutputMessage message;
};

struct Usage {
  uint64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};

// "stop", "length", or "abort" (cancelled, as vLLM names it).
const char* openai_finish_reason(FinishReason reason);
// The chat output parser's finish_reason (ChatOutputParser::finish) as the API says it:
// "cancelled" is "abort", the others as they are.
std::string_view openai_finish_reason(std::string_view parser_reason);

// The HTTP status and OpenAI error for a request that ended in an error before anything was
// sent: INVALID_ARGUMENT 400, OVERLOADED 429, UNAVAILABLE 503, PERMISSION_DENIED 403, others 500.
ApiError error_from_final(const FinalEvent& fin);

class ResponseFormat {
 public:
  // `id`: the response id ("cmpl-..." / "chatcmpl-..."), `created`: Unix seconds.
  ResponseFormat(ApiKind kind, const std::string& id, int64_t created, const std::string& model, int32_t logprobs,
                 TokenPiece piece);

  // Streaming: the events of choice `index`, appended to `out` as "data: ...\n\n".
  void role_chunk(std::string& out, uint32_t index) const;  // chat: the assistant's first delta
  void token_chunk(std::string& out, uint32_t index, const TokenEvent& token);
  // Chat with parsed output: a delta of reasoning_content, content and tool_calls (only the
  // non-empty ones; a call's first delta has its id, type and name, later ones arguments
  // only), with `token`'s logprobs when asked for (nullptr: none).
  void delta_chunk(std::string& out, uint32_t index, const model::ChatDelta& delta, const TokenEvent* token) const;
  void text_chunk(std::string& out, uint32_t index, const std::string& text) const;  // held-back bytes at the end
  void finish_chunk(std::string& out, uint32_t index, FinishReason reason) const;
  void finish_chunk(std::string& out, uint32_t index, std::string_view reason) const;  // "tool_calls", ...
  void usage_chunk(std::string& out, const Usage& usage) const;
  static void error_event(std::string& out, const ApiError& error);
  static void done(std::string& out) { out += "data: [DONE]\n\n"; }

  // Non-streaming: the whole response body.
  std::string full(const std::vector<ChoiceResult>& choices, const Usage& usage) const;

 private:
  void append_logprobs(std::string& out, const TokenEvent& token, uint64_t offset) const;
  void append_piece(std::string& out, int32_t id) const;                    // the token's piece as a JSON string
  void append_top_object(std::string& out, const TokenEvent& token) const;  // {"piece":logprob,...}
  void append_message(std::string& out, const ChoiceResult& choice) const;  // a chat choice's "message"

  ApiKind kind_;
  int32_t logprobs_;
  TokenPiece piece_;
  std::string prefix_;             // data: {"id":..,"object":..,"created":..,"model":..,"choices":[{"index":
  std::string head_;               // the same for a whole response, without "data: " and "choices"
  std::vector<uint64_t> offsets_;  // completions logprobs: each choice's text offset so far
  mutable std::string scratch_;    // a token piece being escaped
};

// The usage object: {"prompt_tokens":..,"completion_tokens":..,"total_tokens":..,
// "prompt_tokens_details":{"cached_tokens":..}}.
void append_usage(std::string& out, const Usage& usage);

}  // namespace tandem::gateway
