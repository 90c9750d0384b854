// Chat templates: a conversation -> the prompt text a model was trained on, by rendering the
// model's `tokenizer.chat_template` (Jinja) as Hugging Face transformers does
// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, its tojson and
// {% generation %}, globals raise_exception and strftime_now). The interpreter is ours
// (model/jinja/); tests/model/chat_template_test.cpp holds it to python3-jinja2's bytes.
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/status.h"
#include "model/jinja/value.h"
#include "model/tokenizer.h"

namespace tandem::model {

namespace jinja {
struct Program;
}

// What a template sees. `messages` is a list of dicts (role, content: str, None or a list of
// parts, and optionally tool_calls, tool_call_id, name, reasoning_content...); `tools` a list
// of JSON-schema dicts, or None as transformers passes when there are none.
struct ChatInput {
  jinja::Value messages = jinja::Value::list({});
  jinja::Value tools = jinja::Value::none();
  bool add_generation_prompt = false;
  std::string bos_token, eos_token;
  // What strftime_now() formats (local time); the current time when absent. Tests fix it.
  std::optional<std::time_t> now;
};

// {"messages": [...], "tools": [...], "add_generation_prompt": bool, "bos_token": str,
// "eos_token": str} (all but messages optional), or a bare messages array. Errors name the
// field: messages not a list, a message without a string role, content neither a string,
// null nor a list, tool_calls not a list, tool_call_id or name not strings.
Result<ChatInput> parse_chat_input(std::string_view json);

// Every message's role is one that chat templates know: system, user, assistant, tool, and
// developer (OpenAI's system) and ipython (Llama 3.1's tool results). A typo ("asistant") would
// otherwise render as whatever the template does with a role it does not expect, often silently
// nothing. The error names the message and the role.
[[nodiscard]] Status check_roles(const ChatInput& input);

// The pieces a template sees as bos_token and eos_token ("<s>", "<|endoftext|>"); "" when the
// vocabulary has none.
std::string bos_piece(const Tokenizer& tokenizer);
std::string eos_piece(const Tokenizer& tokenizer);

// A rendered conversation as prompt ids: control tokens written by the template are recognised
// (user text only reaches the model through the template, as with any chat server), and BOS is
// added when the vocabulary asks for it and `add_bos`, unless the text already starts with the
// BOS piece (templates that write {{ bos_token }}), so it appears once. Errors: encode()'s.
Result<std::vector<int32_t>> encode_rendered_chat(const Tokenizer& tokenizer, std::string_view rendered, bool add_bos);

class ChatTemplate {
 public:
  // Errors: the template's syntax, a tag or (outside an `if`) a filter or test this
  // interpreter does not have, each named with its line.
  static Result<ChatTemplate> parse(std::string_view source);

  // The rendered prompt. Errors: raise_exception's message as the template gave it, or what
  // failed (an undefined value used, a type error, a method the sandbox refuses, an
  // unsupported filter argument...), never a partial prompt.
  Result<std::string> render(const ChatInput& input) const;

 private:
  std::shared_ptr<const jinja::Program> program_;
};

}  // namespace tandem::model
