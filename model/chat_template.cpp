#include "model/chat_template.h"

#include <algorithm>

#include "model/jinja/interpreter.h"
#include "model/jinja/json.h"
#include "model/jinja/parser.h"

namespace tandem::model {
namespace {

using jinja::Dict;
using jinja::Kind;
using jinja::Value;

Status check_message(const Value& m, size_t i) {
  const std::string at = "messages[" + std::to_string(i) + "]";
  if (!m.is_dict()) return Status::invalid(at + " is not an object");
  const Value* role = m.entries().find(Value("role"));
  if (!role || !role->is_string()) return Status::invalid(at + " has no string 'role'");
  if (const Value* content = m.entries().find(Value("content"));
      content && !content->is_string() && !content->is_none() && !content->is_list()) {
    return Status::invalid(at + ".content is neither a string, null nor a list of parts");
  }
  if (const Value* calls = m.entries().find(Value("tool_calls")); calls && !calls->is_list() && !calls->is_none()) {
    return Status::invalid(at + ".tool_calls is not a list");
  }
  for (const char* key : {"tool_call_id", "name"}) {
    if (const Value* v = m.entries().find(Value(key)); v && !v->is_string()) {
      return Status::invalid(at + "." + key + " is not a string");
    }
  }
  return Status::ok();
}

Status check_chat_input(const ChatInput& in) {
  if (!in.messages.is_list()) return Status::invalid("messages is not a list");
  for (size_t i = 0; i < in.messages.items().size(); ++i)
    TANDEM_RETURN_IF_ERROR(check_message(in.messages.items()[i], i));
  if (!in.tools.is_list() && !in.tools.is_none()) return Status::invalid("tools is neither a list nor null");
  return Status::ok();
}

Result<ChatInput> chat_input_from(const Value& doc) {
  ChatInput in;
  if (doc.is_list()) {
    in.messages = doc;
  } else if (doc.is_dict()) {
    const Dict& d = doc.entries();
    const Value* messages = d.find(Value("messages"));
    if (!messages) return Status::invalid("no 'messages' field");
    in.messages = *messages;
    if (const Value* tools = d.find(Value("tools"))) in.tools = *tools;
    if (const Value* agp = d.find(Value("add_generation_prompt"))) {
      if (agp->kind() != Kind::kBool) return Status::invalid("add_generation_prompt is not a boolean");
      in.add_generation_prompt = agp->as_bool();
    }
    for (const auto& [key, field] : {std::pair{"bos_token", &in.bos_token}, {"eos_token", &in.eos_token}}) {
      const Value* v = d.find(Value(key));
      if (v && !v->is_string()) return Status::invalid(std::string(key) + " is not a string");
      if (v) *field = v->str();
    }
  } else {
    return Status::invalid("expected a messages array or an object with 'messages'");
  }
  TANDEM_RETURN_IF_ERROR(check_chat_input(in));
  return in;
}

Value strftime_now(std::optional<std::time_t> now) {
  return Value::function("strftime_now", [now](jinja::Call& c) {
    const Value fmt = c.arg(0, "format");
    if (!fmt.is_string()) throw jinja::Error("strftime_now() takes a format string");
    const std::time_t t = now ? *now : std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[512];
    const size_t n = std::strftime(buf, sizeof buf, fmt.str().c_str(), &tm);
    if (n == 0 && !fmt.str().empty()) throw jinja::Error("strftime_now(): format too long or empty result");
    return Value(std::string(buf, n));
  });
}

}  // namespace

Result<ChatInput> parse_chat_input(std::string_view json) {
  try {
    return chat_input_from(jinja::parse_json(json));
  } catch (const jinja::Error& e) {
    return Status::invalid(e.what());
  }
}

Status check_roles(const ChatInput& input) {
  static constexpr std::string_view kRoles[] = {"system", "user", "assistant", "tool", "developer", "ipython"};
  if (!input.messages.is_list()) return Status::invalid("messages is not a list");
  for (size_t i = 0; i < input.messages.items().size(); ++i) {
    const Value& m = input.messages.items()[i];
    const Value* role = m.is_dict() ? m.entries().find(Value("role")) : nullptr;
    if (!role || !role->is_string()) continue;  // check_message's error, when rendered
    if (std::find(std::begin(kRoles), std::end(kRoles), role->str()) == std::end(kRoles))
      return Status::invalid("messages[" + std::to_string(i) + "]: unknown role '" + role->str() +
                             "' (system, user, assistant, tool, developer or ipython)");
  }
  return Status::ok();
}

std::string bos_piece(const Tokenizer& tokenizer) {
  return tokenizer.bos_id() < 0 ? std::string() : tokenizer.piece(tokenizer.bos_id());
}

std::string eos_piece(const Tokenizer& tokenizer) {
  return tokenizer.eos_id() < 0 ? std::string() : tokenizer.piece(tokenizer.eos_id());
}

Result<std::vector<int32_t>> encode_rendered_chat(const Tokenizer& tokenizer, std::string_view rendered, bool add_bos) {
  const std::string bos = bos_piece(tokenizer);
  const bool has_bos = !bos.empty() && rendered.starts_with(bos);
  return tokenizer.encode(rendered, EncodeOptions{.add_special = add_bos && !has_bos, .parse_special = true});
}

Result<ChatTemplate> ChatTemplate::parse(std::string_view source) {
  try {
    ChatTemplate t;
    t.program_ = std::make_shared<const jinja::Program>(jinja::parse(source));
    return t;
  } catch (const jinja::Error& e) {
    return Status::invalid(std::string("chat template: ") + e.what());
  } catch (const std::exception& e) {  // a bug of ours, reported and contained
    return Status::error(Code::kInternal, std::string("chat template: ") + e.what());
  }
}

Result<std::string> ChatTemplate::render(const ChatInput& input) const {
  TANDEM_RETURN_IF_ERROR(check_chat_input(input));
  jinja::Dict globals;
  globals.set(Value("messages"), input.messages);
  globals.set(Value("tools"), input.tools);
  globals.set(Value("add_generation_prompt"), Value(input.add_generation_prompt));
  globals.set(Value("bos_token"), Value(input.bos_token));
  globals.set(Value("eos_token"), Value(input.eos_token));
  globals.set(Value("raise_exception"), Value::function("raise_exception", [](jinja::Call& c) -> Value {
                throw jinja::Error(c.arg(0, "message").to_str());
              }));
  globals.set(Value("strftime_now"), strftime_now(input.now));
  try {
    return jinja::Interpreter(std::move(globals)).render(*program_);
  } catch (const jinja::Error& e) {
    return Status::invalid(std::string("chat template: ") + e.what());
  } catch (const std::exception& e) {  // a bug of ours (or std::bad_alloc), reported and contained
    return Status::error(Code::kInternal, std::string("chat template: ") + e.what());
  }
}

}  // namespace tandem::model
