#include "gateway/response.h"

#include "runtime/json.h"

namespace tandem::gateway {

using runtime::append_json_string;

namespace {

void append_number(std::string& out, double v) {
  char buf[32];
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  const int n = std::snprintf(buf, sizeof buf, "%.7g", v);
  out.append(buf, n > 0 ? static_cast<size_t>(n) : 0);
}

void append_int(std::string& out, uint64_t v) {
  char buf[24];
  const int n = std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(v));
  out.append(buf, static_cast<size_t>(n));
}

// A token's bytes as the chat logprobs' "bytes" array.
void append_bytes(std::string& out, const std::string& piece) {
  out += '[';
  for (size_t i = 0; i < piece.size(); ++i) {
    if (i) out += ',';
    append_int(out, static_cast<unsigned char>(piece[i]));
  }
  out += ']';
}

}  // namespace

const char* openai_finish_reason(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "abort";
    case FinishReason::kError: return "error";
  }
  return "error";
}

std::string_view openai_finish_reason(std::string_view parser_reason) {
  return parser_reason == "cancelled" ? "abort" : parser_reason;
}

ApiError error_from_final(const FinalEvent& fin) {
  ApiError e;
  e.message = fin.error_message.empty() ? std::string(fin.error_code) : fin.error_message;
  e.code = fin.error_code;
  switch (fin.code) {
    case Code::kInvalidArgument: e.status = 400; break;
    case Code::kOverloaded:
      e.status = 429;
      e.type = "rate_limit_error";
      break;
    case Code::kUnavailable:
      e.status = 503;
      e.type = "service_unavailable";
      break;
    case Code::kPermissionDenied:
      e.status = 403;
      e.type = "permission_error";
      break;
    default: e.status = 500; e.type = "internal_error";
  }
  return e;
}

void append_usage(std::string& out, const Usage& u) {
  out += "{\"prompt_tokens\":";
  append_int(out, u.prompt_tokens);
  out += ",\"completion_tokens\":";
  append_int(out, u.completion_tokens);
  out += ",\"total_tokens\":";
  append_int(out, u.prompt_tokens + u.completion_tokens);
  out += ",\"prompt_tokens_details\":{\"cached_tokens\":";
  append_int(out, u.cached_tokens);
  out += "}}";
}

ResponseFormat::ResponseFormat(ApiKind kind, const std::string& id, int64_t created, const std::string& model,
                               int32_t logprobs, TokenPiece piece)
    : kind_(kind), logprobs_(logprobs), piece_(std::move(piece)) {
  const bool chat = kind == ApiKind::kChat;
  head_ = "{\"id\":";
  append_json_string(head_, id);
  prefix_ = head_ + (chat ? ",\"object\":\"chat.completion.chunk\"" : ",\"object\":\"text_completion\"");
  head_ += chat ? ",\"object\":\"chat.completion\"" : ",\"object\":\"text_completion\"";
  std::string rest = ",\"created\":" + std::to_string(created) + ",\"model\":";
  append_json_string(rest, model);
  head_ += rest;
  prefix_ = "data: " + prefix_ + rest + ",\"choices\":[{\"index\":";
  scratch_.reserve(256);
}

void ResponseFormat::role_chunk(std::string& out, uint32_t index) const {
  out += prefix_;
  append_int(out, index);
  out += ",\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n";
}

void ResponseFormat::append_logprobs(std::string& out, const TokenEvent& t, uint64_t offset) const {
  std::string& piece = scratch_;
  piece.clear();
  piece_(t.id, piece);
  if (kind_ == ApiKind::kChat) {
    out += "{\"token\":";
    append_json_string(out, piece);
    out += ",\"logprob\":";
    append_number(out, t.logprob);
    out += ",\"bytes\":";
    append_bytes(out, piece);
    out += ",\"top_logprobs\":[";
    for (size_t k = 0; k < t.top.size(); ++k) {
      piece.clear();
      piece_(t.top[k].first, piece);
      out += k ? ",{\"token\":" : "{\"token\":";
      append_json_string(out, piece);
      out += ",\"logprob\":";
      append_number(out, t.top[k].second);
      out += ",\"bytes\":";
      append_bytes(out, piece);
      out += '}';
    }
    out += "]}";
    return;
  }
  out += "{\"tokens\":[";
  append_piece(out, t.id);
  out += "],\"token_logprobs\":[";
  append_number(out, t.logprob);
  out += "],\"top_logprobs\":[";
  append_top_object(out, t);
  out += "],\"text_offset\":[";
  append_int(out, offset);
  out += "]}";
}

void ResponseFormat::append_piece(std::string& out, int32_t id) const {
  scratch_.clear();
  piece_(id, scratch_);
  append_json_string(out, scratch_);
}

void ResponseFormat::append_top_object(std::string& out, const TokenEvent& t) const {
  out += '{';
  for (size_t k = 0; k < t.top.size(); ++k) {
    if (k) out += ',';
    append_piece(out, t.top[k].first);
    out += ':';
    append_number(out, t.top[k].second);
  }
  out += '}';
}

void ResponseFormat::token_chunk(std::string& out, uint32_t index, const TokenEvent& t) {
  if (index >= offsets_.size()) offsets_.resize(index + 1, 0);
  out += prefix_;
  append_int(out, index);
  out += kind_ == ApiKind::kChat ? ",\"delta\":{\"content\":" : ",\"text\":";
  append_json_string(out, t.text);
  if (kind_ == ApiKind::kChat) out += '}';
  out += ",\"logprobs\":";
  if (logprobs_ < 0) {
    out += "null";
  } else if (kind_ == ApiKind::kChat) {
    out += "{\"content\":[";
    append_logprobs(out, t, 0);
    out += "]}";
  } else {
    append_logprobs(out, t, offsets_[index]);
  }
  offsets_[index] += t.text.size();
  out += ",\"finish_reason\":null}]}\n\n";
}

void ResponseFormat::delta_chunk(std::string& out, uint32_t index, const model::ChatDelta& delta,
                                 const TokenEvent* token) const {
  out += prefix_;
  append_int(out, index);
  out += ",\"delta\":{";
  const char* sep = "";
  if (!delta.reasoning.empty()) {
    out += "\"reasoning_content\":";
    append_json_string(out, delta.reasoning);
    sep = ",";
  }
  if (!delta.content.empty()) {
    out += sep;
    out += "\"content\":";
    append_json_string(out, delta.content);
    sep = ",";
  }
  if (delta.n_tool_calls > 0) {
    out += sep;
    out += "\"tool_calls\":[";
    for (const model::ToolCallDelta& call : delta.tool_calls()) {
      out += out.back() == '[' ? "{\"index\":" : ",{\"index\":";
      append_int(out, call.index);
      if (!call.id.empty()) {
        out += ",\"id\":";
        append_json_string(out, call.id);
        out += ",\"type\":\"function\",\"function\":{\"name\":";
        append_json_string(out, call.name);
        out += ',';
      } else {
        out += ",\"function\":{";
      }
      out += "\"arguments\":";
      append_json_string(out, call.arguments);
      out += "}}";
    }
    out += ']';
  }
  out += "},\"logprobs\":";
  if (token != nullptr && logprobs_ >= 0) {
    out += "{\"content\":[";
    append_logprobs(out, *token, 0);
    out += "]}";
  } else {
    out += "null";
  }
  out += ",\"finish_reason\":null}]}\n\n";
}

void ResponseFormat::text_chunk(std::string& out, uint32_t index, const std::string& text) const {
  out += prefix_;
  append_int(out, index);
  out += kind_ == ApiKind::kChat ? ",\"delta\":{\"content\":" : ",\"text\":";
  append_json_string(out, text);
  out += kind_ == ApiKind::kChat ? "},\"logprobs\":null,\"finish_reason\":null}]}\n\n"
                                 : ",\"logprobs\":null,\"finish_reason\":null}]}\n\n";
}

void ResponseFormat::finish_chunk(std::string& out, uint32_t index, FinishReason reason) const {
  finish_chunk(out, index, std::string_view(openai_finish_reason(reason)));
}

void ResponseFormat::finish_chunk(std::string& out, uint32_t index, std::string_view reason) const {
  out += prefix_;
  append_int(out, index);
  out += kind_ == ApiKind::kChat ? ",\"delta\":{}" : ",\"text\":\"\"";
  out += ",\"logprobs\":null,\"finish_reason\":\"";
  out += reason;
  out += "\"}]}\n\n";
}

// content is null when the message is only tool calls (as OpenAI's); reasoning_content and
// tool_calls are there when not empty.
void ResponseFormat::append_message(std::string& out, const ChoiceResult& c) const {
  out += ",\"message\":{\"role\":\"assistant\",\"content\":";
  if (!c.parsed) {
    append_json_string(out, c.text);
    out += '}';
    return;
  }
  const model::ChatOutputMessage& m = c.message;
  if (m.content.empty() && !m.tool_calls.empty()) {
    out += "null";
  } else {
    append_json_string(out, m.content);
  }
  if (!m.reasoning.empty()) {
    out += ",\"reasoning_content\":";
    append_json_string(out, m.reasoning);
  }
  if (!m.tool_calls.empty()) {
    out += ",\"tool_calls\":[";
    for (size_t k = 0; k < m.tool_calls.size(); ++k) {
      out += k ? ",{\"id\":" : "{\"id\":";
      append_json_string(out, m.tool_calls[k].id);
      out += ",\"type\":\"function\",\"function\":{\"name\":";
      append_json_string(out, m.tool_calls[k].name);
      out += ",\"arguments\":";
      append_json_string(out, m.tool_calls[k].arguments);
      out += "}}";
    }
    out += ']';
  }
  out += '}';
}

void ResponseFormat::usage_chunk(std::string& out, const Usage& usage) const {
  // The prefix ends inside the choices array; the usage chunk has an empty one.
  out.append(prefix_, 0, prefix_.size() - std::string_view("[{\"index\":").size());
  out += "[],\"usage\":";
  append_usage(out, usage);
  out += "}\n\n";
}

void ResponseFormat::error_event(std::string& out, const ApiError& error) {
  out += "data: ";
  out += error_body(error);
  out += "\n\n";
}

std::string ResponseFormat::full(const std::vector<ChoiceResult>& choices, const Usage& usage) const {
  const bool chat = kind_ == ApiKind::kChat;
  std::string out = head_ + ",\"choices\":[";
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    out += i ? ",{\"index\":" : "{\"index\":";
    append_int(out, i);
    if (chat) {
      append_message(out, c);
    } else {
      out += ",\"text\":";
      append_json_string(out, c.text);
    }
    out += ",\"logprobs\":";
    if (logprobs_ < 0) {
      out += "null";
    } else if (chat) {
      out += "{\"content\":[";
      for (size_t k = 0; k < c.tokens.size(); ++k) {
        if (k) out += ',';
        append_logprobs(out, c.tokens[k], 0);
      }
      out += "]}";
    } else {
      // Completions: parallel arrays over the tokens.
      std::string tokens, lps, tops, offs;
      uint64_t offset = 0;
      for (size_t k = 0; k < c.tokens.size(); ++k) {
        const TokenEvent& t = c.tokens[k];
        const char* sep = k ? "," : "";
        tokens += sep;
        append_piece(tokens, t.id);
        lps += sep;
        append_number(lps, t.logprob);
        tops += sep;
        append_top_object(tops, t);
        offs += sep;
        append_int(offs, offset);
        offset += t.text.size();
      }
      out += "{\"tokens\":[" + tokens + "],\"token_logprobs\":[" + lps + "],\"top_logprobs\":[" + tops +
             "],\"text_offset\":[" + offs + "]}";
    }
    out += ",\"finish_reason\":\"";
    out += c.parsed ? openai_finish_reason(c.message.finish_reason) : openai_finish_reason(c.fin.reason);
    out += "\"}";
  }
  out += "],\"usage\":";
  append_usage(out, usage);
  out += '}';
  return out;
}

}  // namespace tandem::gateway
