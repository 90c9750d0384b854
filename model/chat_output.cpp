#include "model/chat_output.h"

#include <algorithm>
#include <array>

#include "model/tokenizer.h"

namespace tandem::model {

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kR1CallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kR1CallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kR1CallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kR1CallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kR1Sep = "<｜tool▁sep｜>";
constexpr size_t kMaxNameBytes = 64;  // OpenAI's limit on function names
constexpr size_t kMaxKeyBytes = 16;

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
         c == '.' || c == ':';
}

// A held header, closer or block parsed from its start: kMore while it is a valid prefix.
enum class Parse { kOk, kMore, kFail };

struct Cursor {
  std::string_view s;
  size_t p = 0;

  bool at_end() const { return p >= s.size(); }
  void blanks() {
    while (p < s.size() && is_blank(s[p])) ++p;
  }
  Parse lit(std::string_view l) {
    const size_t n = std::min(l.size(), s.size() - p);
    if (s.compare(p, n, l, 0, n) != 0) return Parse::kFail;
    if (n < l.size()) return Parse::kMore;
    p += n;
    return Parse::kOk;
  }
  // [A-Za-z0-9_.:-]{1,64} ending before `end` (any blank when end is '\0').
  Parse name(char end, std::string_view& out) {
    const size_t begin = p;
    while (p < s.size() && is_name_char(s[p])) {
      if (p - begin >= kMaxNameBytes) return Parse::kFail;
      ++p;
    }
    if (p >= s.size()) return Parse::kMore;
    if (p == begin || (end == '\0' ? !is_blank(s[p]) : s[p] != end)) return Parse::kFail;
    out = s.substr(begin, p - begin);
    return Parse::kOk;
  }
  // A JSON object key of lower-case letters and '_': "name", "arguments"...
  Parse key(std::string_view& out) {
    if (Parse r = lit("\""); r != Parse::kOk) return r;
    const size_t begin = p;
    while (p < s.size() && ((s[p] >= 'a' && s[p] <= 'z') || s[p] == '_')) {
      if (p - begin >= kMaxKeyBytes) return Parse::kFail;
      ++p;
    }
    if (p >= s.size()) return Parse::kMore;
    if (s[p] != '"') return Parse::kFail;
    out = s.substr(begin, p - begin);
    ++p;
    return Parse::kOk;
  }
  // Blanks, then `l`.
  Parse after_blanks(std::string_view l) {
    blanks();
    return lit(l);
  }
};

#define TANDEM_PARSE(expr)                                       \
  do {                                                           \
    if (Parse r_ = (expr); r_ != Parse::kOk) return {r_, 0, {}}; \
  } while (0)

struct HeldParse {
  Parse status = Parse::kMore;
  size_t end = 0;         // kOk: where the parsed syntax ends (the arguments' '{' for a header)
  std::string_view name;  // a header's function name
};

// The arguments object's first byte: after blanks, '{'.
HeldParse arguments_start(Cursor& c, std::string_view name) {
  c.blanks();
  if (c.at_end()) return {Parse::kMore, 0, {}};
  if (c.s[c.p] != '{') return {Parse::kFail, 0, {}};
  return {Parse::kOk, c.p, name};
}

// {"name": "N", "arguments": {   (or "parameters"; Llama's optional leading "type": "function")
HeldParse parse_json_header(std::string_view h) {
  Cursor c{h};
  std::string_view key, name;
  TANDEM_PARSE(c.after_blanks("{"));
  c.blanks();
  TANDEM_PARSE(c.key(key));
  if (key == "type") {
    TANDEM_PARSE(c.after_blanks(":"));
    TANDEM_PARSE(c.after_blanks("\"function\""));
    TANDEM_PARSE(c.after_blanks(","));
    c.blanks();
    TANDEM_PARSE(c.key(key));
  }
  if (key != "name") return {Parse::kFail, 0, {}};
  TANDEM_PARSE(c.after_blanks(":"));
  TANDEM_PARSE(c.after_blanks("\""));
  TANDEM_PARSE(c.name('"', name));
  ++c.p;
  TANDEM_PARSE(c.after_blanks(","));
  c.blanks();
  TANDEM_PARSE(c.key(key));
  if (key != "arguments" && key != "parameters") return {Parse::kFail, 0, {}};
  TANDEM_PARSE(c.after_blanks(":"));
  return arguments_start(c, name);
}

// N>{    (after "<function=")
HeldParse parse_functionary_header(std::string_view h) {
  Cursor c{h};
  std::string_view name;
  TANDEM_PARSE(c.name('>', name));
  ++c.p;
  return arguments_start(c, name);
}

// function<｜tool▁sep｜>N\n```json\n{    (after "<｜tool▁call▁begin｜>")
HeldParse parse_r1_header(std::string_view h) {
  Cursor c{h};
  std::string_view type, name;
  TANDEM_PARSE(c.name('<', type));
  TANDEM_PARSE(c.lit(kR1Sep));
  TANDEM_PARSE(c.name('\0', name));
  TANDEM_PARSE(c.after_blanks("```"));
  if (!c.at_end() && c.s[c.p] == 'j') TANDEM_PARSE(c.lit("json"));
  return arguments_start(c, name);
}

// What follows the arguments object up to the call's closer.
HeldParse parse_trailer(ToolCallFormat format, std::string_view h) {
  Cursor c{h};
  switch (format) {
    case ToolCallFormat::kHermes:
      c.blanks();
      if (c.at_end()) return {};
      if (c.s[c.p] == '}') ++c.p;  // the wrapper's brace; tolerated when missing
      TANDEM_PARSE(c.after_blanks(kHermesClose));
      break;
    case ToolCallFormat::kLlama3Json: TANDEM_PARSE(c.after_blanks("}")); break;
    case ToolCallFormat::kFunctionaryV31: TANDEM_PARSE(c.after_blanks(kFunctionClose)); break;
    case ToolCallFormat::kDeepSeekR1:
      TANDEM_PARSE(c.after_blanks("```"));
      TANDEM_PARSE(c.after_blanks(kR1CallEnd));
      break;
    case ToolCallFormat::kNone: return {Parse::kFail, 0, {}};
  }
  return {Parse::kOk, c.p, {}};
}

// Inside DeepSeek's calls block: blanks, then the next call's opener (name = "call") or the
// block's end (name = "end").
HeldParse parse_r1_block(std::string_view h) {
  Cursor c{h};
  c.blanks();
  const size_t at = c.p;
  const Parse call = c.lit(kR1CallBegin);
  if (call == Parse::kOk) return {Parse::kOk, c.p, "call"};
  c.p = at;
  const Parse end = c.lit(kR1CallsEnd);
  if (end == Parse::kOk) return {Parse::kOk, c.p, "end"};
  return {call == Parse::kMore || end == Parse::kMore ? Parse::kMore : Parse::kFail, at, {}};
}

#undef TANDEM_PARSE

uint64_t fnv1a(std::string_view s, uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void append_hex(uint64_t v, int digits, std::string& out) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (int i = digits - 1; i >= 0; --i) out.push_back(kHex[(v >> (4 * i)) & 15]);
}

}  // namespace

const char* tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kNone: return "none";
    case ToolCallFormat::kHermes: return "hermes";
    case ToolCallFormat::kLlama3Json: return "llama3_json";
    case ToolCallFormat::kDeepSeekR1: return "deepseek_r1";
    case ToolCallFormat::kFunctionaryV31: return "functionary_v3.1";
  }
  return "none";
}

ChatOutputFormat detect_chat_output_format(std::string_view source) {
  ChatOutputFormat f;
  const auto has = [&](std::string_view s) { return source.find(s) != std::string_view::npos; };
  if (has(kR1CallsBegin)) {
    f.tools = ToolCallFormat::kDeepSeekR1;
  } else if (has(kFunctionOpen)) {
    f.tools = ToolCallFormat::kFunctionaryV31;
  } else if (has(kHermesOpen)) {
    f.tools = ToolCallFormat::kHermes;
  } else if (has("<|start_header_id|>") && has("\"parameters\"")) {
    f.tools = ToolCallFormat::kLlama3Json;
  }
  f.reasoning = has(kThinkOpen);
  const size_t prompt = source.rfind("add_generation_prompt");
  if (f.reasoning && prompt != std::string_view::npos) {
    const size_t open = source.find(kThinkOpen, prompt);
    f.starts_in_reasoning = open != std::string_view::npos && source.find(kThinkClose, open) == std::string_view::npos;
  }
  return f;
}

bool prompt_opens_reasoning(std::string_view prompt) {
  const size_t open = prompt.rfind(kThinkOpen);
  const size_t close = prompt.rfind(kThinkClose);
  return open != std::string_view::npos && (close == std::string_view::npos || close < open);
}

void bind_control_markers(const Tokenizer& tokenizer, ChatOutputFormat& format) {
  std::vector<std::string_view> markers;
  switch (format.tools) {
    case ToolCallFormat::kHermes: markers = {kHermesOpen, kHermesClose}; break;
    case ToolCallFormat::kLlama3Json: markers = {kPythonTag}; break;
    case ToolCallFormat::kFunctionaryV31: break;
    case ToolCallFormat::kDeepSeekR1: markers = {kR1CallsBegin, kR1CallsEnd, kR1CallBegin, kR1CallEnd, kR1Sep}; break;
    case ToolCallFormat::kNone: break;
  }
  if (format.reasoning) markers.insert(markers.end(), {kThinkOpen, kThinkClose});
  format.control_markers.clear();
  std::string plain;
  for (uint32_t t = 0; t < tokenizer.vocab_size(); ++t) {
    const std::string& piece = tokenizer.piece(static_cast<int32_t>(t));
    if (std::find(markers.begin(), markers.end(), piece) == markers.end()) continue;
    plain.clear();
    tokenizer.append_token_text(static_cast<int32_t>(t), false, plain);
    if (plain.empty()) format.control_markers.emplace_back(static_cast<int32_t>(t), piece);
  }
}

void ChatDelta::clear() {
  reasoning.clear();
  content.clear();
  n_tool_calls = 0;
}

void ChatOutputMessage::merge(const ChatDelta& delta) {
  reasoning += delta.reasoning;
  content += delta.content;
  for (const ToolCallDelta& d : delta.tool_calls()) {
    if (!d.id.empty()) tool_calls.push_back({d.id, d.name, ""});
    if (d.index < tool_calls.size()) tool_calls[d.index].arguments += d.arguments;
  }
}

ChatOutputParser::ChatOutputParser(ChatOutputFormat format, std::string_view request_id)
    : format_(std::move(format)), id_seed_(fnv1a(request_id)) {
  held_.reserve(kMaxHeldBytes);
  if (format_.reasoning && format_.starts_in_reasoning) state_ = State::kReasoningStart;
}

void ChatOutputParser::feed(std::string_view text, ChatDelta& out) {
  if (state_ != State::kFinished) run(text, out);
}

void ChatOutputParser::feed_token(int32_t token, std::string_view text, ChatDelta& out) {
  if (text.empty()) {
    for (const auto& [id, marker] : format_.control_markers) {
      if (id == token) return feed(marker, out);
    }
  }
  feed(text, out);
}

void ChatOutputParser::run(std::string_view in, ChatDelta& out) {
  while (!in.empty()) in.remove_prefix(step(in, out));
}

size_t ChatOutputParser::step(std::string_view in, ChatDelta& out) {
  switch (state_) {
    case State::kStart:
      if (!format_.reasoning) {  // blanks are dropped only where something may start at once
        state_ = format_.tools == ToolCallFormat::kNone ? State::kContent : State::kContentStart;
        return 0;
      }
      [[fallthrough]];
    case State::kReasoningStart:
    case State::kContentStart: return on_prefix(in, prefix_markers(), out);
    case State::kReasoning: {
      static constexpr Marker kClose[] = {{kThinkClose, State::kContentStart, Keep::kDrop}};
      return on_text(in, out.reasoning, {kClose, 1});
    }
    case State::kContent: return on_text(in, out.content, text_markers());
    case State::kHeader:
    case State::kTrailer:
    case State::kBlock: return on_held(in, out);
    case State::kArguments: return on_arguments(in, out);
    case State::kBetweenCalls: {
      size_t i = 0;
      while (i < in.size() && (is_blank(in[i]) || in[i] == ';')) ++i;
      if (i < in.size()) state_ = State::kContentStart;
      return i;
    }
    case State::kFinished: return in.size();
  }
  return in.size();
}

ChatOutputParser::Markers ChatOutputParser::prefix_markers() const {
  static constexpr Marker kThink[] = {{kThinkOpen, State::kReasoningStart, Keep::kDrop}};
  static constexpr Marker kLlama[] = {{"{", State::kHeader, Keep::kHeaderText},
                                      {kPythonTag, State::kHeader, Keep::kOpener}};
  if (state_ != State::kContentStart) return {kThink, 1};
  if (format_.tools == ToolCallFormat::kLlama3Json) return {kLlama, 2};
  return {};
}

ChatOutputParser::Markers ChatOutputParser::text_markers() const {
  static constexpr Marker kHermes[] = {{kHermesOpen, State::kHeader, Keep::kOpener}};
  static constexpr Marker kLlama[] = {{kPythonTag, State::kHeader, Keep::kOpener}};
  static constexpr Marker kFunctionary[] = {{kFunctionOpen, State::kHeader, Keep::kOpener}};
  static constexpr Marker kR1[] = {{kR1CallsBegin, State::kBlock, Keep::kOpener},
                                   {kR1CallBegin, State::kHeader, Keep::kOpener}};
  switch (format_.tools) {
    case ToolCallFormat::kHermes: return {kHermes, 1};
    case ToolCallFormat::kLlama3Json: return {kLlama, 1};
    case ToolCallFormat::kFunctionaryV31: return {kFunctionary, 1};
    case ToolCallFormat::kDeepSeekR1: return {kR1, 2};
    case ToolCallFormat::kNone: break;
  }
  return {};
}

void ChatOutputParser::enter(const Marker& marker) {
  state_ = marker.next;
  switch (marker.keep) {
    case Keep::kDrop: held_.clear(); break;
    case Keep::kOpener: opener_ = held_.size(); break;
    case Keep::kHeaderText: opener_ = 0; break;
  }
}

// Blanks are dropped; then the text must start with one of `markers`, else the state becomes
// the one that follows (reasoning or content) and the bytes read are scanned again there.
size_t ChatOutputParser::on_prefix(std::string_view in, Markers markers, ChatDelta& out) {
  const State otherwise = state_ == State::kStart          ? State::kContentStart
                          : state_ == State::kContentStart ? State::kContent
                                                           : State::kReasoning;
  size_t i = 0;
  if (held_.empty()) {
    while (i < in.size() && is_blank(in[i])) ++i;
    if (i == in.size()) return i;
    const char c = in[i];
    if (std::none_of(markers.begin, markers.begin + markers.size, [c](const Marker& m) { return m.text[0] == c; })) {
      state_ = otherwise;
      return i;
    }
  }
  while (i < in.size()) {
    held_.push_back(in[i++]);
    bool prefix = false;
    for (size_t m = 0; m < markers.size; ++m) {
      const std::string_view text = markers.begin[m].text;
      if (held_ == text) {
        enter(markers.begin[m]);
        return i;
      }
      prefix = prefix || text.starts_with(held_);
    }
    if (!prefix) {
      opener_ = 0;
      reject(otherwise, out);
      return i;
    }
  }
  return i;
}

// Text up to a marker goes to `text_out`; only the longest suffix that may begin a marker is
// held back.
size_t ChatOutputParser::on_text(std::string_view in, std::string& text_out, Markers markers) {
  std::array<char, 4> firsts{};
  for (size_t m = 0; m < markers.size; ++m) firsts[m] = markers.begin[m].text[0];
  const std::string_view first_bytes(firsts.data(), markers.size);
  size_t i = 0;
  if (held_.empty()) {
    i = markers.size == 0 ? std::string_view::npos : in.find_first_of(first_bytes);
    if (i == std::string_view::npos) {
      text_out.append(in);
      return in.size();
    }
    text_out.append(in.substr(0, i));
  }
  while (i < in.size()) {
    held_.push_back(in[i++]);
    size_t keep_from = 0;  // the longest suffix of held_ that is a prefix of a marker
    for (; keep_from < held_.size(); ++keep_from) {
      const std::string_view tail = std::string_view(held_).substr(keep_from);
      const Marker* m = std::find_if(markers.begin, markers.begin + markers.size,
                                     [tail](const Marker& m) { return m.text.starts_with(tail); });
      if (m == markers.begin + markers.size) continue;
      text_out.append(held_, 0, keep_from);
      held_.erase(0, keep_from);
      if (m->text.size() == held_.size()) enter(*m);
      return i;
    }
    text_out.append(held_);
    held_.clear();
    return i;
  }
  return i;
}

// Header, closer or DeepSeek's block: bytes are held until their syntax parses or fails.
size_t ChatOutputParser::on_held(std::string_view in, ChatDelta& out) {
  const size_t before = held_.size();
  const size_t take = std::min(in.size(), kMaxHeldBytes - std::min(before, kMaxHeldBytes));
  held_.append(in.substr(0, take));
  const std::string_view h = std::string_view(held_).substr(opener_);
  HeldParse r;
  if (state_ == State::kHeader) {
    switch (format_.tools) {
      case ToolCallFormat::kFunctionaryV31: r = parse_functionary_header(h); break;
      case ToolCallFormat::kDeepSeekR1: r = parse_r1_header(h); break;
      default: r = parse_json_header(h); break;
    }
  } else if (state_ == State::kTrailer) {
    r = parse_trailer(format_.tools, h);
  } else {
    r = parse_r1_block(h);
  }
  if (r.status == Parse::kMore && held_.size() < kMaxHeldBytes) return take;
  if (r.status != Parse::kOk) {
    reject(state_ == State::kHeader ? State::kContent : State::kContentStart, out);
    return take;
  }
  const size_t used = opener_ + r.end - before;  // bytes of `in` that belong to the syntax
  if (state_ == State::kHeader) {
    commit_call(r.name, out);
    held_.clear();
    opener_ = 0;
    state_ = State::kArguments;
    depth_ = 0;
    in_string_ = escaped_ = false;
  } else if (state_ == State::kTrailer) {
    held_.clear();
    opener_ = 0;
    state_ = format_.tools == ToolCallFormat::kDeepSeekR1   ? State::kBlock
             : format_.tools == ToolCallFormat::kLlama3Json ? State::kBetweenCalls
                                                            : State::kContentStart;
  } else if (r.name == "call") {
    held_.resize(opener_ + r.end);
    opener_ = held_.size();
    state_ = State::kHeader;
  } else {
    held_.clear();
    opener_ = 0;
    state_ = State::kContentStart;
  }
  return used;
}

size_t ChatOutputParser::on_arguments(std::string_view in, ChatDelta& out) {
  size_t i = 0;
  bool closed = false;
  for (; i < in.size() && !closed; ++i) {
    const char c = in[i];
    if (in_string_) {
      if (escaped_) {
        escaped_ = false;
      } else if (c == '\\') {
        escaped_ = true;
      } else if (c == '"') {
        in_string_ = false;
      }
    } else if (c == '"') {
      in_string_ = true;
    } else if (c == '{' || c == '[') {
      ++depth_;
    } else if (c == '}' || c == ']') {
      closed = --depth_ == 0;
    }
  }
  call_delta(out).arguments.append(in.substr(0, i));
  if (closed) state_ = State::kTrailer;
  return i;
}

void ChatOutputParser::reject(State rescan, ChatDelta& out) {
  out.content.append(held_, 0, opener_);
  std::string rest = held_.substr(opener_);
  held_.clear();
  opener_ = 0;
  state_ = rescan;
  run(rest, out);
}

void ChatOutputParser::commit_call(std::string_view name, ChatDelta& out) {
  ++n_calls_;
  ToolCallDelta& d = call_delta(out);
  d.id.assign("call_");
  const uint64_t a = mix(id_seed_ ^ mix(n_calls_ - 1));
  append_hex(a, 16, d.id);
  append_hex(mix(a) >> 32, 8, d.id);
  d.name.assign(name);
}

ToolCallDelta& ChatOutputParser::call_delta(ChatDelta& out) {
  const uint32_t index = n_calls_ - 1;
  if (out.n_tool_calls > 0 && out.tool_call_storage[out.n_tool_calls - 1].index == index) {
    return out.tool_call_storage[out.n_tool_calls - 1];
  }
  if (out.n_tool_calls == out.tool_call_storage.size()) out.tool_call_storage.emplace_back();
  ToolCallDelta& d = out.tool_call_storage[out.n_tool_calls++];
  d.index = index;
  d.id.clear();
  d.name.clear();
  d.arguments.clear();
  return d;
}

std::string_view ChatOutputParser::finish(GenerationEnd end, ChatDelta& out) {
  if (state_ == State::kFinished) return finish_reason_;
  const bool call_cut = state_ == State::kArguments;
  // A held header is not a call: content, scanned again (which may hold another one).
  while (state_ == State::kHeader || (state_ == State::kBlock && opener_ > 0)) {
    reject(state_ == State::kHeader ? State::kContent : State::kContentStart, out);
  }
  switch (state_) {
    case State::kReasoningStart:
    case State::kReasoning: out.reasoning += held_; break;
    case State::kStart:
    case State::kContentStart:
    case State::kContent: out.content += held_; break;
    default: break;  // a closer or blanks after a committed call: syntax, dropped
  }
  held_.clear();
  state_ = State::kFinished;
  switch (end) {
    case GenerationEnd::kStop: finish_reason_ = n_calls_ > 0 && !call_cut ? "tool_calls" : "stop"; break;
    case GenerationEnd::kLength: finish_reason_ = "length"; break;
    case GenerationEnd::kCancelled: finish_reason_ = "cancelled"; break;
    case GenerationEnd::kError: finish_reason_ = "error"; break;
  }
  return finish_reason_;
}

ChatOutputMessage parse_chat_output(const ChatOutputFormat& format, std::string_view request_id, std::string_view text,
                                    GenerationEnd end) {
  ChatOutputParser parser(format, request_id);
  ChatDelta delta;
  ChatOutputMessage message;
  parser.feed(text, delta);
  message.finish_reason = parser.finish(end, delta);
  message.merge(delta);
  return message;
}

}  // namespace tandem::model
