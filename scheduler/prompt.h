// A request's prompt before it is token ids: text, or a conversation for the model's chat
// template; and what makes it ids (PromptRenderer, thread-safe: the scheduler runs it on its
// prompt threads, off the planning thread, see prompt_pool.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "runtime/status.h"
#include "tandem/v1/client.pb.h"

namespace tandem::scheduler {

struct PromptInput {
  std::string text;              // when chat is empty
  std::optional<v1::Chat> chat;  // rendered with the chat template
  bool add_bos = true;
  size_t bytes() const;  // the text, or every message's and the tools' bytes
};

// A conversation's messages at most: far above any real one, and it bounds the framing a
// conversation adds to its bytes (max_client_message_bytes in admission.h).
inline constexpr size_t kMaxChatMessages = 4096;

// Every message's and the tools' bytes (what max_bytes bounds), counted on the wire message.
size_t chat_bytes(const v1::Chat& chat);

// A Submit's or TokenizeQuery's prompt when it is text or a conversation (not token ids).
// Errors (kInvalidArgument, naming the field and the limit): empty text or no messages, more
// than kMaxChatMessages messages, more than `max_bytes` (text, or a conversation's messages
// and tools together). The limits are checked before anything is copied. Nothing is parsed or
// tokenized here: that is PromptRenderer's (off the planning thread).
Result<PromptInput> prompt_input(const std::string& text, const v1::Chat* chat, bool no_bos, size_t max_bytes);

class PromptRenderer {
 public:
  // `template_source`: the model's tokenizer.chat_template, none when it has none.
  PromptRenderer(model::Tokenizer tokenizer, const std::optional<std::string>& template_source);

  const model::Tokenizer& tokenizer() const { return tokenizer_; }

  // The prompt's ids. Text: encoded as a Submit's text always was (BOS unless no_bos).
  // A conversation: messages checked (roles, tool_calls and tools as JSON arrays), rendered
  // with add_generation_prompt unless no_generation_prompt, bos_token/eos_token the
  // vocabulary's pieces, then encoded by model::encode_rendered_chat. Errors
  // (kInvalidArgument) start with the field: "prompt: ..." (the tokenizer's message),
  // "messages: the model has no chat template (tokenizer.chat_template)", "messages: the
  // model's chat template does not parse: ...", "messages[2]: unknown role 'asistant' ...",
  // "messages[1].tool_calls_json: ...", "tools_json: ...", "messages: chat template: <what it
  // raised or what failed>". Safe from several threads at once.
  Result<std::vector<int32_t>> render(const PromptInput& in) const;

 private:
  Result<std::vector<int32_t>> render_chat(const v1::Chat& chat, bool add_bos) const;

  model::Tokenizer tokenizer_;
  std::optional<model::ChatTemplate> template_;
  std::string no_template_;  // why template_ is empty
};

}  // namespace tandem::scheduler
