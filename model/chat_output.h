// A chat model's output text -> what OpenAI's chat.completion(.chunk) carries: `reasoning_content`
// (the think block), `content`, and `tool_calls` (index, id, function name, `arguments` streamed
// as JSON text). One ChatOutputParser per request, fed the detokenized text as tokens arrive; the
// gateway turns each ChatDelta into one SSE chunk. Non-streaming is the same machine fed the
// whole text (parse_chat_output), so a streamed message and a one-shot message never differ.
//
// Use (the gateway): once per model, `fmt = detect_chat_output_format(template source)` and
// `bind_control_markers(tokenizer, fmt)`; per request (one per choice), a copy with
// tools = kNone when the request offers no tools or says tool_choice "none", a
// `ChatOutputParser parser(fmt, request_id)` and one reused ChatDelta: per token event
// `delta.clear(); parser.feed_token(id, text, delta)` and a chunk when !delta.empty(); on the
// final event `parser.feed(final.text, delta)` (the scheduler's held-back bytes), then
// `finish_reason = parser.finish(end, delta)` for the last chunk. Not streaming: the same
// calls, with ChatOutputMessage::merge() of each delta.
//
// Formats (ToolCallFormat), as the templates of ../shared/data/templates/ write them:
//   kHermes        Qwen 2.5/3, Hermes 2 Pro: <tool_call>{"name": N, "arguments": {...}}</tool_call>
//   kLlama3Json    Llama 3.1/3.2: {"name": N, "parameters": {...}} at the start of the reply
//                  or after `<|python_tag|>` anywhere; several separated by `;` or blanks
//   kDeepSeekR1    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>N\n```json\n{...}\n```
//                  <｜tool▁call▁end｜>...<｜tool▁calls▁end｜> (a call without the block's opener too)
//   kFunctionaryV31  Functionary medium v3.1: <function=N>{...}</function>
// The JSON formats need "name" before the arguments, as every template writes them; "arguments"
// and "parameters" are both accepted as the arguments key, and Llama's optional leading
// "type": "function". Not parsed (their text stays content):
// Functionary v3.2's `>>>N`, Firefunction's `functools[...]`, Command R's `Action:` block, Llama
// 3.1's built-in `<|python_tag|>tool.call(...)` and Functionary's `<|python_tag|>` code.
//
// Detection (detect_chat_output_format): by the literal markers in the template's source, first
// match wins: `<｜tool▁calls▁begin｜>` -> kDeepSeekR1; `<function=` -> kFunctionaryV31;
// `<tool_call>` -> kHermes; `<|start_header_id|>` with `"parameters"` -> kLlama3Json; else kNone.
// Reasoning is on when the source contains `<think>`; the output starts inside the think block
// when, after the template's last `add_generation_prompt`, a `<think>` is written with no
// `</think>` after it (DeepSeek R1 opens the block in the prompt; Qwen 3's `<think>\n\n</think>`
// for enable_thinking=false does not count). That is a guess per template: R1's templates open
// no block after tool results, so a caller that renders the prompt should decide per request
// with prompt_opens_reasoning(). A request without `tools`, or with tool_choice "none", should
// get tools = kNone: calls are then content (as vLLM parses calls only when tools are offered).
//
// Semantics:
//   - Reasoning: `<think>` counts only at the start of the output (after blanks); in a block
//     opened by the prompt, a repeated `<think>` at its start is dropped. Without `</think>`
//     everything is reasoning (as vLLM's and llama.cpp's R1 parsers). Blanks are dropped at
//     the start of the reasoning, of the content after `</think>` or after a tool call, and
//     of the output when reasoning or tool calls are on; with neither (kNone, no reasoning)
//     the content is the text, byte for byte.
//   - Tool calls: a call starts at its format's opener in the content (never in the
//     reasoning). The opener and the header up to the first byte of the arguments object are
//     held back (at most kMaxHeldBytes); when they parse, the call is committed: one delta
//     gives index, id and name, and from then the arguments object's bytes go out as they
//     arrive, verbatim, up to the `}` that balances it (braces inside strings and escapes do
//     not count). A header that does not parse (not JSON, a name outside [A-Za-z0-9_.:-]{1,64},
//     another key, arguments not an object, too long) is content: its opener is released as
//     content and the bytes after it are scanned again. A committed call stands: when its
//     closer does not follow (Hermes' wrapper `}` may be missing), the call ends there and the
//     text from there is content; a stream that ends inside the arguments leaves them as
//     written (finish_reason says why).
//   - Markers split across tokens: only the longest suffix of the text that is a prefix of a
//     marker is held back; everything before it is released in the same feed.
//   - Stop strings and max_tokens are applied by the scheduler (scheduler/stops.h) to the raw
//     text before it reaches this parser, in every state, as vLLM and llama.cpp's server do:
//     a stop string inside the think block ends the request there, the reasoning so far is
//     reasoning_content and content is empty. finish() then flushes: held marker prefixes go
//     to the open text (reasoning or content), a held tool-call header goes to content.
//     finish_reason: "tool_calls" when the request stopped (EOS or stop string) after a call
//     was committed and not inside a call's arguments; otherwise the scheduler's reason
//     ("stop", "length", ...). max_tokens counts every token, the reasoning's too (as OpenAI's
//     max_completion_tokens).
//   - Tool call ids are "call_" + 24 hex digits of a hash of (request id, index): the same
//     request id gives the same ids, streamed or not.
//
// Cost: O(n) in the output's length (held text is re-parsed once per feed, at most
// kMaxHeldBytes); one held buffer per parser, reused; no allocation per feed beyond growth of
// the caller's ChatDelta strings, which clear() keeps, except one copy of the held text when an
// opener turns out not to be a call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::model {

class Tokenizer;

enum class ToolCallFormat { kNone, kHermes, kLlama3Json, kDeepSeekR1, kFunctionaryV31 };

// "none", "hermes", "llama3_json", "deepseek_r1", "functionary_v3.1".
const char* tool_call_format_name(ToolCallFormat format);

struct ChatOutputFormat {
  ToolCallFormat tools = ToolCallFormat::kNone;
  bool reasoning = false;            // split a leading <think>...</think> off as reasoning
  bool starts_in_reasoning = false;  // the prompt opened the think block
  // Control tokens (ids) that stand for a marker this format parses and that the detokenizer
  // drops (e.g. Llama 3.1's <|python_tag|>): feed_token() puts the marker's text in their
  // place. Filled by bind_control_markers(); empty: markers arrive as text only.
  std::vector<std::pair<int32_t, std::string>> control_markers;
};

// The format a template's output is in; see the header comment for the rules.
ChatOutputFormat detect_chat_output_format(std::string_view template_source);

// True when the rendered prompt leaves a think block open (its last `<think>` comes after its
// last `</think>`): the output starts inside the reasoning.
bool prompt_opens_reasoning(std::string_view rendered_prompt);

// Records in `format` the control tokens of `tokenizer` whose piece is one of the format's
// markers (decoded as nothing without special pieces), so feed_token() can restore them.
void bind_control_markers(const Tokenizer& tokenizer, ChatOutputFormat& format);

struct ToolCallDelta {
  uint32_t index = 0;
  std::string id, name;   // set in the call's first delta only
  std::string arguments;  // the next piece of the arguments' JSON text
};

// What one feed produced: the fields of one chat.completion.chunk's `delta`. Reuse one per
// request: clear() keeps every string's capacity.
struct ChatDelta {
  std::string reasoning, content;
  std::vector<ToolCallDelta> tool_call_storage;  // [0, n_tool_calls) are this delta's
  size_t n_tool_calls = 0;

  void clear();
  bool empty() const { return reasoning.empty() && content.empty() && n_tool_calls == 0; }
  std::span<const ToolCallDelta> tool_calls() const { return {tool_call_storage.data(), n_tool_calls}; }
};

// How the generation ended, as the scheduler reports it.
enum class GenerationEnd { kStop, kLength, kCancelled, kError };

struct ToolCall {
  std::string id, name, arguments;
};

// A whole message: every delta merged.
struct ChatOutputMessage {
  std::string reasoning, content;
  std::vector<ToolCall> tool_calls;
  std::string finish_reason;

  // Appends a delta's pieces (a call's first delta adds the call).
  void merge(const ChatDelta& delta);
};

class ChatOutputParser {
 public:
  // At most this many bytes are held back at once (a tool call's opener and header, blanks
  // between calls, a closer): past it, the held text is not a tool call and becomes content.
  static constexpr size_t kMaxHeldBytes = 512;

  // `request_id` seeds the tool call ids.
  ChatOutputParser(ChatOutputFormat format, std::string_view request_id);

  // The next piece of the output text (any split, even inside a marker or a UTF-8
  // character). Appends what can be released now to `out` (which the caller clears between
  // chunks, or not: pieces only append). Every byte fed goes to at most one output string;
  // fed whole UTF-8 characters (as the scheduler's detokenizer sends them), every delta's
  // strings hold whole characters (held text always starts at an ASCII marker byte).
  void feed(std::string_view text, ChatDelta& out);
  // A generated token and the text the detokenizer gave for it: a bound control marker
  // (ChatOutputFormat::control_markers) whose text is empty is fed as its marker text.
  void feed_token(int32_t token, std::string_view text, ChatDelta& out);
  // The end of the output: releases what is held (see the header comment) and returns the
  // finish_reason: "tool_calls", "stop", "length", "cancelled" or "error". Later feeds are
  // ignored.
  std::string_view finish(GenerationEnd end, ChatDelta& out);

  uint32_t tool_calls_started() const { return n_calls_; }
  // Bytes held back now: never more than kMaxHeldBytes.
  size_t held_bytes() const { return held_.size(); }

 private:
  // kStart, kReasoningStart and kContentStart drop blanks and look for a marker at that place
  // only; kReasoning and kContent scan text for markers; kHeader, kTrailer and kBlock (inside
  // DeepSeek's <｜tool▁calls▁begin｜>) hold their bytes and parse them; kArguments streams.
  enum class State {
    kStart,
    kReasoningStart,
    kReasoning,
    kContentStart,
    kContent,
    kHeader,
    kArguments,
    kTrailer,
    kBlock,
    kBetweenCalls,
    kFinished
  };
  enum class Keep { kDrop, kOpener, kHeaderText };  // what entering a marker's state does with it
  struct Marker {
    std::string_view text;
    State next;
    Keep keep;
  };
  struct Markers {
    const Marker* begin = nullptr;
    size_t size = 0;
  };

  void run(std::string_view in, ChatDelta& out);
  size_t step(std::string_view in, ChatDelta& out);
  size_t on_prefix(std::string_view in, Markers markers, ChatDelta& out);
  size_t on_text(std::string_view in, std::string& text_out, Markers markers);
  size_t on_held(std::string_view in, ChatDelta& out);
  size_t on_arguments(std::string_view in, ChatDelta& out);
  void enter(const Marker& marker);
  // Held text that turned out not to be syntax: held_[0, opener_) goes to content, the rest is
  // scanned again from `rescan`.
  void reject(State rescan, ChatDelta& out);
  void commit_call(std::string_view name, ChatDelta& out);
  ToolCallDelta& call_delta(ChatDelta& out);
  Markers prefix_markers() const;
  Markers text_markers() const;

  ChatOutputFormat format_;
  uint64_t id_seed_ = 0;
  State state_ = State::kStart;
  std::string held_;   // bytes not released yet: a marker prefix, or an opener and header
  size_t opener_ = 0;  // held_[0, opener_) is the opener rejected text starts with
  uint32_t n_calls_ = 0;
  // The arguments object's scanner: bracket depth, inside a string, after a backslash.
  uint32_t depth_ = 0;
  bool in_string_ = false, escaped_ = false;
  std::string_view finish_reason_;
};

// The whole output at once: the same machine fed everything, then finished. For text that
// holds its markers; a control-token marker is not in the detokenized text, so a caller with
// token events feeds them through feed_token() (and merges the deltas) instead.
ChatOutputMessage parse_chat_output(const ChatOutputFormat& format, std::string_view request_id, std::string_view text,
                                    GenerationEnd end);

}  // namespace tandem::model
