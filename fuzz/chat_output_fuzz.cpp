// Model output text through the chat output parser, cut into random pieces: the merged deltas
// must equal the one-shot parse, each call's first delta alone carries its id and name, no byte
// comes out twice, at most kMaxHeldBytes are held, and pieces of whole UTF-8 characters give
// deltas of whole characters. Input: [format byte][split seed byte][text]; the format byte's
// low bits pick the tool-call format (modulo 5), bit 3 turns reasoning on, bit 4 starts inside it.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "model/chat_output.h"
#include "runtime/utf8.h"

namespace {

using namespace tandem::model;
using tandem::runtime::utf8_valid;

#define INVARIANT(ok) check_at(ok, #ok)
void check_at(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "chat_output_fuzz: invariant broken: %s\n", what);
  std::abort();
}

// Merges one delta into `m`, checking its shape: each entry continues the latest call or opens
// the next one (a delta may hold several calls: text the parser held back can complete more
// than one at once, and OpenAI's chunks allow a list).
void merge_checked(const ChatDelta& d, ChatOutputMessage& m, bool whole_chars) {
  size_t calls = m.tool_calls.size();
  for (const ToolCallDelta& c : d.tool_calls()) {
    const bool first = c.index == calls;
    INVARIANT(first || c.index + 1 == calls);
    INVARIANT(first == !c.id.empty() && first == !c.name.empty());
    calls += first;
    if (whole_chars) INVARIANT(utf8_valid(c.arguments));
  }
  if (whole_chars) INVARIANT(utf8_valid(d.content) && utf8_valid(d.reasoning));
  m.merge(d);
}

size_t output_bytes(const ChatOutputMessage& m) {
  size_t n = m.content.size() + m.reasoning.size();
  for (const ToolCall& c : m.tool_calls) n += c.arguments.size();
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  ChatOutputFormat format;
  format.tools = static_cast<ToolCallFormat>(data[0] % 8 % 5);
  format.reasoning = data[0] & 8;
  format.starts_in_reasoning = data[0] & 16;
  uint32_t rng = data[1] * 2654435761u + 1;
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
  const bool whole_chars = utf8_valid(text);
  const GenerationEnd end = static_cast<GenerationEnd>(data[1] % 4);

  const ChatOutputMessage once = parse_chat_output(format, "fuzz", text, end);
  ChatOutputParser parser(format, "fuzz");
  ChatDelta delta;
  ChatOutputMessage streamed;
  for (size_t i = 0; i < text.size();) {
    rng = rng * 1664525u + 1013904223u;
    size_t n = 1 + (rng >> 16) % 24;
    if (n > text.size() - i) n = text.size() - i;
    while (whole_chars && i + n < text.size() && (static_cast<unsigned char>(text[i + n]) & 0xC0) == 0x80) ++n;
    delta.clear();
    parser.feed(text.substr(i, n), delta);
    merge_checked(delta, streamed, whole_chars);
    INVARIANT(parser.held_bytes() <= ChatOutputParser::kMaxHeldBytes);
    i += n;
  }
  delta.clear();
  streamed.finish_reason = parser.finish(end, delta);
  merge_checked(delta, streamed, whole_chars);

  INVARIANT(streamed.content == once.content && streamed.reasoning == once.reasoning);
  INVARIANT(streamed.finish_reason == once.finish_reason && streamed.tool_calls.size() == once.tool_calls.size());
  for (size_t i = 0; i < once.tool_calls.size(); ++i) {
    const ToolCall &a = streamed.tool_calls[i], &b = once.tool_calls[i];
    INVARIANT(a.id == b.id && a.name == b.name && a.arguments == b.arguments);
  }
  INVARIANT(output_bytes(once) <= text.size());
  if (format.tools == ToolCallFormat::kNone && !format.reasoning) INVARIANT(once.content == text);
  INVARIANT(once.finish_reason != "tool_calls" || (end == GenerationEnd::kStop && !once.tool_calls.empty()));
  return 0;
}
