// Arbitrary bytes as a chat template (and, after a NUL byte, as the conversation's JSON),
// through the parser and the interpreter: any input must end in a rendered prompt or a Status,
// within the interpreter's step, depth and size bounds, with no sanitizer report.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "model/chat_template.h"

namespace {

constexpr std::string_view kConversation = R"({"messages": [
  {"role": "system", "content": "Be brief."},
  {"role": "user", "content": "Héllo 🚀"},
  {"role": "assistant", "content": null, "tool_calls": [{"id": "a1B2c3D4e", "type": "function",
    "function": {"name": "add", "arguments": {"a": 1, "b": [2.5, true, null]}}}]},
  {"role": "tool", "tool_call_id": "a1B2c3D4e", "name": "add", "content": "3.5"},
  {"role": "user", "content": ""}],
 "tools": [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}],
 "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view source = input.substr(0, nul);
  auto chat = tandem::model::parse_chat_input(nul == std::string_view::npos ? kConversation : input.substr(nul + 1));
  if (!chat) chat = tandem::model::parse_chat_input(kConversation);
  chat->now = 0;
  auto t = tandem::model::ChatTemplate::parse(source);
  if (!t) return 0;
  (void)t->render(*chat);
  return 0;
}
