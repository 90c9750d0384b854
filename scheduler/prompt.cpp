#include "scheduler/prompt.h"

#include <utility>

#include "model/jinja/json.h"

namespace tandem::scheduler {

namespace {

using model::jinja::Dict;
using model::jinja::Value;

// JSON text that must be an array; `field` names it in errors.
Result<Value> json_array(const std::string& json, const std::string& field) {
  try {
    Value v = model::jinja::parse_json(json);
    if (!v.is_list()) return Status::invalid(field + ": not a JSON array");
    return v;
  } catch (const model::jinja::Error& e) {
    return Status::invalid(field + ": " + e.what());
  }
}

Result<model::ChatInput> chat_input(const v1::Chat& chat) {
  model::ChatInput in;
  model::jinja::List messages;
  messages.reserve(chat.messages_size());
  for (int i = 0; i < chat.messages_size(); ++i) {
    const v1::ChatMessage& m = chat.messages(i);
    Dict d;
    d.set(Value("role"), Value(m.role()));
    d.set(Value("content"), m.has_content() ? Value(m.content()) : Value::none());
    if (!m.name().empty()) d.set(Value("name"), Value(m.name()));
    if (!m.tool_call_id().empty()) d.set(Value("tool_call_id"), Value(m.tool_call_id()));
    if (!m.tool_calls_json().empty()) {
      auto calls = json_array(m.tool_calls_json(), "messages[" + std::to_string(i) + "].tool_calls_json");
      if (!calls) return calls.status();
      d.set(Value("tool_calls"), std::move(calls.value()));
    }
    messages.push_back(Value::dict(std::move(d)));
  }
  in.messages = Value::list(std::move(messages));
  if (!chat.tools_json().empty()) {
    auto tools = json_array(chat.tools_json(), "tools_json");
    if (!tools) return tools.status();
    in.tools = std::move(tools.value());
  }
  in.add_generation_prompt = !chat.no_generation_prompt();
  return in;
}

}  // namespace

size_t chat_bytes(const v1::Chat& chat) {
  size_t n = chat.tools_json().size();
  for (const v1::ChatMessage& m : chat.messages())
    n += m.role().size() + m.content().size() + m.name().size() + m.tool_call_id().size() + m.tool_calls_json().size();
  return n;
}

size_t PromptInput::bytes() const { return chat ? chat_bytes(*chat) : text.size(); }

Result<PromptInput> prompt_input(const std::string& text, const v1::Chat* chat, bool no_bos, size_t max_bytes) {
  if (chat && chat->messages().empty()) return Status::invalid("messages: empty");
  if (!chat && text.empty()) return Status::invalid("prompt: empty");
  if (chat && static_cast<size_t>(chat->messages_size()) > kMaxChatMessages) {
    return Status::invalid("messages: " + std::to_string(chat->messages_size()) + " messages, at most " +
                           std::to_string(kMaxChatMessages));
  }
  // Checked on the wire message: nothing large is copied before it is known to fit.
  const size_t bytes = chat ? chat_bytes(*chat) : text.size();
  if (bytes > max_bytes) {
    return Status::invalid(std::string(chat ? "messages" : "prompt") + ": " + (chat ? "conversation" : "text") +
                           " of " + std::to_string(bytes) + " bytes, at most " + std::to_string(max_bytes) +
                           (chat ? " (messages and tools_json together)" : ""));
  }
  PromptInput in;
  in.add_bos = !no_bos;
  if (chat)
    in.chat = *chat;
  else
    in.text = text;
  return in;
}

PromptRenderer::PromptRenderer(model::Tokenizer tokenizer, const std::optional<std::string>& template_source)
    : tokenizer_(std::move(tokenizer)) {
  if (!template_source) {
    no_template_ = "messages: the model has no chat template (tokenizer.chat_template)";
    return;
  }
  auto parsed = model::ChatTemplate::parse(*template_source);
  if (parsed) {
    template_ = std::move(parsed.value());
  } else {
    no_template_ = "messages: the model's chat template does not parse: " + parsed.status().message();
  }
}

Result<std::vector<int32_t>> PromptRenderer::render(const PromptInput& in) const {
  if (in.chat) return render_chat(*in.chat, in.add_bos);
  auto ids = tokenizer_.encode(in.text, in.add_bos);
  if (!ids) return Status::error(ids.status().code(), "prompt: " + ids.status().message());
  return ids;
}

Result<std::vector<int32_t>> PromptRenderer::render_chat(const v1::Chat& chat, bool add_bos) const {
  if (!template_) return Status::invalid(no_template_);
  auto in = chat_input(chat);
  if (!in) return in.status();
  if (Status st = model::check_roles(*in); !st) return Status::invalid(st.message());
  in->bos_token = model::bos_piece(tokenizer_);
  in->eos_token = model::eos_piece(tokenizer_);
  auto rendered = template_->render(*in);
  if (!rendered) return Status::invalid("messages: " + rendered.status().message());
  auto ids = model::encode_rendered_chat(tokenizer_, *rendered, add_bos);
  if (!ids) return Status::error(ids.status().code(), "messages: " + ids.status().message());
  return ids;
}

}  // namespace tandem::scheduler
