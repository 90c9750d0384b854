#include "gateway/api.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "model/sampling_params.h"
#include "runtime/json.h"
#include "runtime/wire.h"

namespace tandem::gateway {

using json = nlohmann::json;

namespace {

constexpr int kMaxDepth = 64;          // nesting of the body's arrays and objects
constexpr size_t kMaxPrompts = 64;     // prompts in one completions request
constexpr size_t kMaxStops = 16;       // stop strings (OpenAI allows 4, vLLM any)
constexpr size_t kMaxMessages = 4096;  // messages of one conversation
constexpr uint32_t kMaxChoices = 64;   // prompts x n

ApiError bad(std::string param, std::string message) {
  return ApiError{400, param + ": " + message, "invalid_request_error", param, ""};
}

ApiError unsupported(const std::string& param, const std::string& what) {
  return ApiError{400, param + ": " + what + " is not supported by tandem", "invalid_request_error", param,
                  "unsupported_parameter"};
}

// Deeper nesting than kMaxDepth, found without parsing (so a hostile body cannot make any
// recursive walk deep).
bool too_deep(std::string_view body) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

// The body as a JSON object, or the error naming why not.
bool parse_object(std::string_view body, json& out, ApiError& error) {
  if (too_deep(body)) {
    error = ApiError{400, "the body nests arrays and objects deeper than " + std::to_string(kMaxDepth)};
    return false;
  }
  out = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (out.is_discarded()) {
    error = ApiError{400, "the body is not valid JSON"};
    return false;
  }
  if (!out.is_object()) {
    error = ApiError{400, "the body must be a JSON object"};
    return false;
  }
  return true;
}

// Reads the fields of one JSON object; the first error is kept and later reads do nothing.
class Fields {
 public:
  explicit Fields(const json& object) : object_(object) {}

  bool ok() const { return ok_; }
  const ApiError& error() const { return error_; }
  void fail(ApiError e) {
    if (ok_) error_ = std::move(e);
    ok_ = false;
  }
  // The field, nullptr when absent or null. Marks it as read.
  const json* get(const std::string& name) {
    seen_.insert(name);
    auto it = object_.find(name);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }
  bool present(const std::string& name) { return get(name) != nullptr; }

  void boolean(const std::string& name, bool& out) {
    const json* v = get(name);
    if (!v || !ok_) return;
    if (!v->is_boolean()) return fail(bad(name, "must be true or false"));
    out = v->get<bool>();
  }
  void text(const std::string& name, std::string& out) {
    const json* v = get(name);
    if (!v || !ok_) return;
    if (!v->is_string()) return fail(bad(name, "must be a string"));
    out = v->get<std::string>();
  }
  // A number in [lo, hi]; `open_lo`: lo itself excluded.
  template <class T>
  void number(const std::string& name, T& out, double lo, double hi, bool open_lo = false) {
    const json* v = get(name);
    if (!v || !ok_) return;
    if (!v->is_number()) return fail(bad(name, "must be a number"));
    const double d = v->get<double>();
    if (!std::isfinite(d) || d < lo || d > hi || (open_lo && d == lo))
      return fail(bad(name, runtime::json_number(d) + " is outside " + (open_lo ? "(" : "[") +
                                runtime::json_number(lo) + ", " + runtime::json_number(hi) + "]"));
    out = static_cast<T>(d);
  }
  // An integer in [lo, hi].
  void integer(const std::string& name, int64_t& out, int64_t lo, int64_t hi) {
    const json* v = get(name);
    if (!v || !ok_) return;
    if (!v->is_number_integer()) return fail(bad(name, "must be an integer"));
    const int64_t i =
        v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : v->get<int64_t>();
    if (i < lo || i > hi)
      return fail(
          bad(name, std::to_string(i) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]"));
    out = i;
  }
  // Names of the object's fields no read asked for.
  std::vector<std::string> unread() const {
    std::vector<std::string> out;
    for (auto it = object_.begin(); it != object_.end(); ++it)
      if (!seen_.count(it.key())) out.push_back(it.key());
    return out;
  }

 private:
  const json& object_;
  std::set<std::string> seen_;
  bool ok_ = true;
  ApiError error_;
};

// `model`, when given, must be the served one (404 otherwise, as OpenAI answers).
void check_model(Fields& f, const ModelLimits& limits) {
  std::string model;
  f.text("model", model);
  if (f.ok() && !model.empty() && model != limits.name)
    f.fail(ApiError{404, "The model '" + model + "' does not exist (this server serves '" + limits.name + "')",
                    "invalid_request_error", "model", "model_not_found"});
}

// Token ids: integers within int32 (the scheduler checks them against the vocabulary).
bool token_ids(const json& v, std::vector<int32_t>& out) {
  if (!v.is_array() || v.empty()) return false;
  for (const json& t : v) {
    if (!t.is_number_integer()) return false;
    const int64_t i = t.is_number_unsigned() && t.get<uint64_t>() > uint64_t(INT32_MAX) ? -1 : t.get<int64_t>();
    if (i < 0 || i > INT32_MAX) return false;
    out.push_back(static_cast<int32_t>(i));
  }
  return true;
}

// `prompt`: a string, strings, token ids, or lists of token ids; one GenerateRequest each.
void read_prompts(Fields& f, std::vector<GenerateRequest>& out) {
  const json* v = f.get("prompt");
  if (!f.ok()) return;
  if (!v) return f.fail(bad("prompt", "required"));
  const char* shape = "must be a string, an array of strings, an array of token ids or an array of such arrays";
  if (v->is_string()) {
    out.emplace_back().prompt_text = v->get<std::string>();
    return;
  }
  if (!v->is_array() || v->empty()) return f.fail(bad("prompt", shape));
  if ((*v)[0].is_number()) {
    if (!token_ids(*v, out.emplace_back().prompt_tokens))
      return f.fail(bad("prompt", "token ids must be integers in [0, 2^31)"));
    return;
  }
  if (v->size() > kMaxPrompts) return f.fail(bad("prompt", "more than " + std::to_string(kMaxPrompts) + " prompts"));
  for (const json& p : *v) {
    GenerateRequest& r = out.emplace_back();
    if (p.is_string()) {
      r.prompt_text = p.get<std::string>();
    } else if (p.is_array()) {
      if (!token_ids(p, r.prompt_tokens)) return f.fail(bad("prompt", "token ids must be integers in [0, 2^31)"));
    } else {
      return f.fail(bad("prompt", shape));
    }
  }
}

// One message's content: a string, null, or text parts (joined by "\n", as vLLM does).
bool message_content(const json& c, std::optional<std::string>& out, std::string& error) {
  if (c.is_null()) return true;
  if (c.is_string()) {
    out = c.get<std::string>();
    return true;
  }
  if (!c.is_array()) {
    error = "content must be a string, null or an array of text parts";
    return false;
  }
  std::string text;
  for (const json& part : c) {
    auto type = part.is_object() ? part.find("type") : part.end();
    if (!part.is_object() || type == part.end() || !type->is_string()) {
      error = "content parts must be objects with a \"type\"";
      return false;
    }
    if (type->get<std::string>() != "text") {
      error = "content part type '" + type->get<std::string>() + "' is not supported (text only)";
      return false;
    }
    auto t = part.find("text");
    if (t == part.end() || !t->is_string()) {
      error = "a text part needs a string \"text\"";
      return false;
    }
    text += (text.empty() ? "" : "\n") + t->get<std::string>();
  }
  out = std::move(text);
  return true;
}

bool read_message(const json& m, ChatMessage& out, std::string& error) {
  if (!m.is_object()) {
    error = "must be an object";
    return false;
  }
  auto str = [&](const char* key, std::string& dst, bool required) {
    auto it = m.find(key);
    if (it == m.end() || it->is_null()) {
      if (required) error = std::string(key) + " is required";
      return !required;
    }
    if (!it->is_string()) {
      error = std::string(key) + " must be a string";
      return false;
    }
    dst = it->get<std::string>();
    return true;
  };
  if (!str("role", out.role, true) || !str("name", out.name, false) || !str("tool_call_id", out.tool_call_id, false))
    return false;
  if (auto c = m.find("content"); c != m.end() && !message_content(*c, out.content, error)) return false;
  if (auto tc = m.find("tool_calls"); tc != m.end() && !tc->is_null()) {
    if (!tc->is_array()) {
      error = "tool_calls must be an array";
      return false;
    }
    out.tool_calls_json = tc->dump(-1, ' ', false, json::error_handler_t::replace);
  }
  return true;
}

// `messages`, `tools`, `tool_choice`, `add_generation_prompt`: one GenerateRequest.
void read_chat(Fields& f, std::vector<GenerateRequest>& out) {
  const json* v = f.get("messages");
  if (!f.ok()) return;
  if (!v) return f.fail(bad("messages", "required"));
  if (!v->is_array() || v->empty()) return f.fail(bad("messages", "must be a non-empty array of messages"));
  if (v->size() > kMaxMessages)
    return f.fail(bad("messages", "more than " + std::to_string(kMaxMessages) + " messages"));
  GenerateRequest& r = out.emplace_back();
  for (size_t i = 0; i < v->size(); ++i) {
    std::string error;
    if (!read_message((*v)[i], r.messages.emplace_back(), error))
      return f.fail(bad("messages[" + std::to_string(i) + "]", error));
  }
  std::string choice = "auto";
  if (const json* c = f.get("tool_choice")) {
    if (!c->is_string()) return f.fail(unsupported("tool_choice", "a named function"));
    choice = c->get<std::string>();
    if (choice == "required") return f.fail(unsupported("tool_choice", "\"required\""));
    if (choice != "auto" && choice != "none") return f.fail(bad("tool_choice", "must be \"auto\" or \"none\""));
  }
  if (const json* t = f.get("tools")) {
    if (!t->is_array()) return f.fail(bad("tools", "must be an array of tool schemas"));
    if (choice != "none" && !t->empty()) r.tools_json = t->dump(-1, ' ', false, json::error_handler_t::replace);
  }
  f.boolean("add_generation_prompt", r.add_generation_prompt);
  f.get("parallel_tool_calls");  // one call or several: the model's choice either way
}

// Fields that would change the answer and that tandem does not do: an error unless neutral.
void refuse_unsupported(Fields& f, ApiKind kind) {
  if (const json* v = f.get("best_of"); v && !(v->is_number_integer() && v->get<int64_t>() == 1))
    return f.fail(unsupported("best_of", "best_of other than 1"));
  if (const json* v = f.get("response_format")) {
    auto type = v->is_object() ? v->find("type") : v->end();
    if (!v->is_object() || type == v->end() || *type != "text")
      return f.fail(unsupported("response_format", "a response_format other than {\"type\":\"text\"}"));
  }
  if (const json* v = f.get("suffix"); v && !(v->is_string() && v->get<std::string>().empty()))
    return f.fail(unsupported("suffix", "suffix"));
  if (const json* v = f.get("min_tokens"); v && !(v->is_number_integer() && v->get<int64_t>() == 0))
    return f.fail(unsupported("min_tokens", "min_tokens"));
  if (kind == ApiKind::kCompletion) {
    bool echo = false;
    f.boolean("echo", echo);
    if (echo) return f.fail(unsupported("echo", "echo"));
  }
}

// A token id as OpenAI's logit_bias keys spell it: decimal digits, within int32.
bool token_key(const std::string& key, int32_t& out) {
  if (key.empty() || key.size() > 10) return false;
  int64_t v = 0;
  for (char c : key) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v > INT32_MAX) return false;
  out = static_cast<int32_t>(v);
  return true;
}

// `logit_bias`: an object of token id (a string, as OpenAI) -> bias in [-100, 100], at most
// model::kMaxLogitBias entries (OpenAI's limit), ids below the vocabulary size when known.
void read_logit_bias(Fields& f, const ModelLimits& limits, GenerateRequest& r) {
  const json* v = f.get("logit_bias");
  if (!v || !f.ok()) return;
  if (!v->is_object()) return f.fail(bad("logit_bias", "must be an object of token id -> bias"));
  if (v->size() > model::kMaxLogitBias)
    return f.fail(bad("logit_bias", std::to_string(v->size()) + " entries, at most " +
                                        std::to_string(model::kMaxLogitBias) + " (OpenAI's limit)"));
  for (auto it = v->begin(); it != v->end(); ++it) {
    int32_t token = 0;
    if (!token_key(it.key(), token))
      return f.fail(bad("logit_bias", "key '" + it.key() + "' is not a token id (a non-negative integer)"));
    if (limits.vocab_size > 0 && static_cast<uint32_t>(token) >= limits.vocab_size)
      return f.fail(bad("logit_bias",
                        "token id " + it.key() + " is outside the vocabulary of " + std::to_string(limits.vocab_size)));
    const double b = it->is_number() ? it->get<double>() : NAN;
    if (!(b >= -model::kMaxLogitBiasValue && b <= model::kMaxLogitBiasValue))
      return f.fail(bad("logit_bias", "the bias of token " + it.key() + " must be a number in [-100, 100]"));
    r.logit_bias.emplace_back(token, static_cast<float>(b));
  }
}

// The sampling fields, into `r`.
void read_sampling(Fields& f, const ModelLimits& limits, GenerateRequest& r) {
  f.number("temperature", r.temperature, 0, 100);
  f.number("top_p", r.top_p, 0, 1, /*open_lo=*/true);
  int64_t top_k = 0;
  f.integer("top_k", top_k, -1, INT32_MAX);
  r.top_k = top_k < 0 ? 0 : static_cast<int32_t>(top_k);  // -1 (vLLM's "off") is 0 here
  f.number("min_p", r.min_p, 0, 1);
  f.number("repetition_penalty", r.repetition_penalty, 0, 100, /*open_lo=*/true);
  f.number("presence_penalty", r.presence_penalty, -2, 2);
  f.number("frequency_penalty", r.frequency_penalty, -2, 2);
  read_logit_bias(f, limits, r);
  int64_t seed = 0;
  f.integer("seed", seed, INT64_MIN, INT64_MAX);
  r.seed = static_cast<uint64_t>(seed);
  f.boolean("ignore_eos", r.ignore_eos);
  // llama.cpp's server's name for the most drafts a round (0: this request does not speculate).
  int64_t n_max = -1;
  f.integer("speculative.n_max", n_max, 0, UINT32_MAX);  // the scheduler refuses more than it takes
  if (n_max >= 0) r.spec_tokens = static_cast<uint32_t>(n_max);
  f.boolean("include_stop_str_in_output", r.include_stop_string);
  int64_t priority = 0;
  f.integer("priority", priority, INT32_MIN, INT32_MAX);
  r.priority = static_cast<int32_t>(priority);
  if (const json* v = f.get("stop"); v && f.ok()) {
    if (v->is_string()) {
      r.stop_strings.push_back(v->get<std::string>());
    } else if (v->is_array() && v->size() <= kMaxStops) {
      for (const json& s : *v) {
        if (!s.is_string()) return f.fail(bad("stop", "must be a string or an array of strings"));
        r.stop_strings.push_back(s.get<std::string>());
      }
    } else {
      return f.fail(bad("stop", "must be a string or an array of at most " + std::to_string(kMaxStops) + " strings"));
    }
    for (const std::string& s : r.stop_strings)
      if (s.empty()) return f.fail(bad("stop", "an empty stop string"));
  }
}

// max_tokens / max_completion_tokens, logprobs / top_logprobs, n, stream, stream_options.
void read_shape(Fields& f, ApiKind kind, const ModelLimits& limits, ApiRequest& out, GenerateRequest& r) {
  int64_t max_tokens = 0;
  f.integer("max_tokens", max_tokens, 1, limits.context_length ? limits.context_length : INT32_MAX);
  if (kind == ApiKind::kChat)
    f.integer("max_completion_tokens", max_tokens, 1, limits.context_length ? limits.context_length : INT32_MAX);
  out.max_tokens_given = max_tokens > 0;
  if (out.max_tokens_given) r.max_tokens = static_cast<uint32_t>(max_tokens);
  int64_t top = -1;
  if (kind == ApiKind::kCompletion) {
    f.integer("logprobs", top, 0, model::kMaxTopLogprobs);
  } else {
    bool logprobs = false;
    f.boolean("logprobs", logprobs);
    int64_t n = 0;
    f.integer("top_logprobs", n, 0, model::kMaxTopLogprobs);
    if (f.ok() && n > 0 && !logprobs) f.fail(bad("top_logprobs", "needs \"logprobs\": true"));
    top = logprobs ? n : -1;
  }
  out.logprobs = static_cast<int32_t>(top);
  r.logprobs = top >= 0;
  r.top_logprobs = top > 0 ? static_cast<int32_t>(top) : 0;
  int64_t n = 1;
  f.integer("n", n, 1, limits.max_n);
  out.n = static_cast<uint32_t>(n);
  f.boolean("stream", out.stream);
  if (const json* so = f.get("stream_options"); so && f.ok()) {
    if (!so->is_object()) return f.fail(bad("stream_options", "must be an object"));
    auto usage = so->find("include_usage");
    if (usage != so->end() && !usage->is_null() && !usage->is_boolean())
      return f.fail(bad("stream_options.include_usage", "must be true or false"));
    out.include_usage = out.stream && usage != so->end() && usage->is_boolean() && usage->get<bool>();
  }
}

}  // namespace

std::string principal_of_user(std::string_view user) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : user) {
    const bool plain = c > ' ' && c <= '~' && c != '%';
    if (out.size() + (plain ? 1 : 3) > runtime::kMaxPrincipalBytes) break;
    if (plain) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string error_body(const ApiError& e) {
  json body = {{"error",
                {{"message", e.message},
                 {"type", e.type},
                 {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                 {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

Parsed parse_request(std::string_view body, ApiKind kind, const ModelLimits& limits) {
  Parsed out;
  out.request.kind = kind;
  json root;
  if (!parse_object(body, root, out.error)) return out;
  Fields f(root);
  check_model(f, limits);
  std::vector<GenerateRequest> prompts;
  if (kind == ApiKind::kCompletion)
    read_prompts(f, prompts);
  else
    read_chat(f, prompts);
  GenerateRequest like;
  read_sampling(f, limits, like);
  read_shape(f, kind, limits, out.request, like);
  refuse_unsupported(f, kind);
  f.text("user", out.request.user);
  for (const char* ignored :
       {"store", "metadata", "service_tier", "stream_options", "logprobs", "top_logprobs", "modalities", "prediction",
        "reasoning_effort", "skip_special_tokens", "spaces_between_special_tokens", "continue_final_message", "echo"})
    f.get(ignored);
  if (!f.ok()) {
    out.error = f.error();
    return out;
  }
  if (prompts.size() * out.request.n > kMaxChoices) {
    out.error = bad("n", "prompts x n = " + std::to_string(prompts.size() * out.request.n) + " choices, more than " +
                             std::to_string(kMaxChoices));
    return out;
  }
  for (GenerateRequest& p : prompts)
    for (uint32_t j = 0; j < out.request.n; ++j) {
      GenerateRequest r = like;
      r.prompt_text = p.prompt_text;
      r.prompt_tokens = p.prompt_tokens;
      r.messages = p.messages;
      r.tools_json = p.tools_json;
      r.add_generation_prompt = p.add_generation_prompt;
      r.seed = like.seed + j;  // n > 1 with sampling: each choice its own draw, reproducible
      out.request.requests.push_back(std::move(r));
    }
  out.ignored_fields = f.unread();
  out.ok = true;
  return out;
}

TokenizeBody parse_tokenize(std::string_view body, const ModelLimits& limits) {
  TokenizeBody out;
  json root;
  if (!parse_object(body, root, out.error)) return out;
  Fields f(root);
  check_model(f, limits);
  bool add_special = true;
  f.boolean("add_special_tokens", add_special);
  out.request.no_bos = !add_special;
  if (f.present("messages")) {
    std::vector<GenerateRequest> chat;
    read_chat(f, chat);
    if (f.ok()) {
      out.request.messages = std::move(chat[0].messages);
      out.request.tools_json = std::move(chat[0].tools_json);
      out.request.add_generation_prompt = chat[0].add_generation_prompt;
    }
  } else {
    f.text("prompt", out.request.text);
    if (f.ok() && !f.present("prompt")) f.fail(bad("prompt", "required (or messages)"));
  }
  out.ok = f.ok();
  if (!out.ok) out.error = f.error();
  return out;
}

DetokenizeBody parse_detokenize(std::string_view body, const ModelLimits& limits) {
  DetokenizeBody out;
  json root;
  if (!parse_object(body, root, out.error)) return out;
  Fields f(root);
  check_model(f, limits);
  const json* tokens = f.get("tokens");
  if (f.ok() && (!tokens || !(tokens->is_array() && (tokens->empty() || token_ids(*tokens, out.tokens)))))
    f.fail(bad("tokens", "must be an array of token ids (integers in [0, 2^31))"));
  out.ok = f.ok();
  if (!out.ok) out.error = f.error();
  return out;
}

}  // namespace tandem::gateway
