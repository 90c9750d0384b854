// The chat output parser: each format's tool calls as the real templates write them, reasoning
// blocks, markers split at every byte, malformed calls as content, and the one-shot parse equal
// to every streamed split.
#include "model/chat_output.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/make_model.h"
#include "model/tokenizer.h"
#include "model/vocab_import.h"
#include "runtime/json.h"
#include "runtime/json_value.h"
#include "tests/test_util.h"

#include "tests/counted_allocations.h"  // a warmed-up parser allocates nothing per token

namespace tandem::model {
namespace {

namespace fs = std::filesystem;

ChatOutputFormat format_of(ToolCallFormat tools, bool reasoning = false, bool starts_in_reasoning = false) {
  ChatOutputFormat f;
  f.tools = tools;
  f.reasoning = reasoning;
  f.starts_in_reasoning = starts_in_reasoning;
  return f;
}

// A message as one line per field, so a failure shows what differs.
std::string describe(const ChatOutputMessage& m) {
  std::string s = "reasoning=[" + m.reasoning + "]\ncontent=[" + m.content + "]\n";
  for (const ToolCall& c : m.tool_calls) s += "call " + c.id + " " + c.name + " " + c.arguments + "\n";
  return s + "finish=" + m.finish_reason;
}

// Feeds `pieces` one by one and merges the deltas. Each call's first delta must carry its id and
// name, later ones neither, and indices come in order.
ChatOutputMessage run_pieces(const ChatOutputFormat& f, const std::vector<std::string_view>& pieces,
                             GenerationEnd end = GenerationEnd::kStop) {
  ChatOutputParser parser(f, "chatcmpl-1");
  ChatDelta delta;
  ChatOutputMessage m;
  const auto check = [&] {
    for (const ToolCallDelta& d : delta.tool_calls()) {
      const bool first = d.index == m.tool_calls.size();
      EXPECT_TRUE(first || d.index + 1 == m.tool_calls.size()) << "index " << d.index;
      EXPECT_EQ(!d.id.empty(), first);
      EXPECT_EQ(!d.name.empty(), first);
      if (first) m.tool_calls.push_back({d.id, d.name, ""});
      m.tool_calls[d.index].arguments += d.arguments;
    }
    m.reasoning += delta.reasoning;
    m.content += delta.content;
  };
  for (std::string_view piece : pieces) {
    delta.clear();
    parser.feed(piece, delta);
    check();
  }
  delta.clear();
  m.finish_reason = parser.finish(end, delta);
  check();
  return m;
}

// The message of `text` fed whole, after checking that every split of it into two and three
// pieces (texts up to 200 bytes) and byte by byte gives the same message.
ChatOutputMessage parse_every_split(const ChatOutputFormat& f, std::string_view text,
                                    GenerationEnd end = GenerationEnd::kStop) {
  const ChatOutputMessage whole = run_pieces(f, {text}, end);
  EXPECT_EQ(describe(whole), describe(parse_chat_output(f, "chatcmpl-1", text, end)));
  const std::string expected = describe(whole);
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(text.substr(i, 1));
  EXPECT_EQ(describe(run_pieces(f, bytes, end)), expected) << "byte by byte";
  for (size_t i = 0; i <= text.size(); ++i) {
    EXPECT_EQ(describe(run_pieces(f, {text.substr(0, i), text.substr(i)}, end)), expected) << "split at " << i;
    if (text.size() > 200) continue;
    for (size_t j = i; j <= text.size(); ++j) {
      const std::string got = describe(run_pieces(f, {text.substr(0, i), text.substr(i, j - i), text.substr(j)}, end));
      if (got != expected) {
        ADD_FAILURE() << "split at " << i << " and " << j << ":\n" << got << "\nexpected:\n" << expected;
        return whole;
      }
    }
  }
  return whole;
}

bool valid_json(const std::string& s) { return static_cast<bool>(runtime::parse_json(s)); }

constexpr std::string_view kArgs = R"({"city": "Paris", "opts": {"unit": "c", "days": [1, 2]}})";

TEST(ChatOutput, HermesCallAfterContent) {
  const std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + std::string(kArgs) +
      "}\n</tool_call>";
  const ChatOutputMessage m = parse_every_split(format_of(ToolCallFormat::kHermes), text);
  EXPECT_EQ(m.content, "Let me check.\n");
  EXPECT_EQ(m.reasoning, "");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "get_weather");
  EXPECT_EQ(m.tool_calls[0].arguments, kArgs);
  EXPECT_EQ(m.finish_reason, "tool_calls");
  EXPECT_TRUE(m.tool_calls[0].id.starts_with("call_"));
  EXPECT_EQ(m.tool_calls[0].id.size(), 5u + 24u);
}

TEST(ChatOutput, HoldsBackOnlyTheLongestMarkerPrefix) {
  ChatOutputParser parser(format_of(ToolCallFormat::kHermes, true), "r");
  ChatDelta d;
  parser.feed("<think>a </thin", d);
  EXPECT_EQ(d.reasoning, "a ");
  EXPECT_EQ(parser.held_bytes(), 6u);
  parser.feed("g</", d);
  EXPECT_EQ(d.reasoning, "a </thing");
  EXPECT_EQ(parser.held_bytes(), 2u);
  parser.feed("think>x <<tool_", d);
  EXPECT_EQ(d.content, "x <");
  EXPECT_EQ(parser.held_bytes(), 6u);
  parser.feed("call", d);
  EXPECT_EQ(parser.held_bytes(), 10u);
  parser.feed("s>", d);  // not the marker after all: released at once
  EXPECT_EQ(d.content, "x <<tool_calls>");
  EXPECT_EQ(parser.held_bytes(), 0u);
  EXPECT_EQ(parser.finish(GenerationEnd::kStop, d), "stop");
}

TEST(ChatOutput, ArgumentStringsWithBracesAndEscapes) {
  const std::string args = R"({"q": "a } b { \" \\", "n": {"x": "]", "y": [{"z": "\\\""}]}, "u": "\u00e9 ü"})";
  ASSERT_TRUE(valid_json(args));
  const std::string text = "<tool_call>{\"name\": \"search\", \"arguments\": " + args + "}</tool_call>";
  const ChatOutputMessage m = parse_every_split(format_of(ToolCallFormat::kHermes), text);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, args);
  EXPECT_EQ(m.content, "");
}

TEST(ChatOutput, ManyCallsInOneMessage) {
  std::string text = "Calling all of them.";
  for (int i = 0; i < 12; ++i) {
    text += "\n<tool_call>\n{\"name\": \"f" + std::to_string(i) + "\", \"arguments\": {\"i\": " + std::to_string(i) +
            ", \"nested\": {\"deep\": [[{}]]}}}\n</tool_call>";
  }
  const ChatOutputMessage m = parse_every_split(format_of(ToolCallFormat::kHermes), text);
  EXPECT_EQ(m.content, "Calling all of them.\n");  // text before an opener is content
  ASSERT_EQ(m.tool_calls.size(), 12u);
  std::set<std::string> ids;
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(m.tool_calls[i].name, "f" + std::to_string(i));
    EXPECT_EQ(m.tool_calls[i].arguments, "{\"i\": " + std::to_string(i) + ", \"nested\": {\"deep\": [[{}]]}}");
    ids.insert(m.tool_calls[i].id);
  }
  EXPECT_EQ(ids.size(), 12u);
  // The same request id gives the same ids; another gives others.
  EXPECT_EQ(
      parse_chat_output(format_of(ToolCallFormat::kHermes), "chatcmpl-1", text, GenerationEnd::kStop).tool_calls[3].id,
      m.tool_calls[3].id);
  EXPECT_NE(
      parse_chat_output(format_of(ToolCallFormat::kHermes), "chatcmpl-2", text, GenerationEnd::kStop).tool_calls[3].id,
      m.tool_calls[3].id);
}

TEST(ChatOutput, MalformedCallsAreContent) {
  const ChatOutputFormat f = format_of(ToolCallFormat::kHermes);
  for (std::string_view text : {
           "<tool_call>\nnot json\n</tool_call>",
           "<tool_call>{\"name\": \"get weather\", \"arguments\": {}}</tool_call>",  // a space in the name
           "<tool_call>{\"nam\": \"f\", \"arguments\": {}}</tool_call>",
           "<tool_call>{\"name\": \"f\", \"args\": {}}</tool_call>",
           "<tool_call>{\"name\": \"f\", \"arguments\": \"{}\"}</tool_call>",  // arguments not an object
           "a <tool_call b",
           "<tool_call><tool_call",
           "</tool_call> <tool_c",
       }) {
    const ChatOutputMessage m = parse_every_split(f, text);
    EXPECT_EQ(m.content, text);
    EXPECT_TRUE(m.tool_calls.empty()) << text;
    EXPECT_EQ(m.finish_reason, "stop");
  }
  // A malformed opener, then a good call: the first is content, the second a call.
  const ChatOutputMessage m = parse_every_split(
      f, "<tool_call>oops</tool_call>\n<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>");
  EXPECT_EQ(m.content, "<tool_call>oops</tool_call>\n");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"a\": 1}");
}

TEST(ChatOutput, HeaderPastTheHoldLimitIsContent) {
  const std::string text = "<tool_call>{" + std::string(ChatOutputParser::kMaxHeldBytes, ' ') + "\"name\": \"f\"";
  const ChatOutputMessage m = run_pieces(format_of(ToolCallFormat::kHermes), {text});
  EXPECT_EQ(m.content, text);
  EXPECT_TRUE(m.tool_calls.empty());
}

TEST(ChatOutput, TruncatedOutput) {
  const ChatOutputFormat f = format_of(ToolCallFormat::kHermes);
  // Cut in the header: not a call.
  ChatOutputMessage m = parse_every_split(f, "Sure. <tool_call>\n{\"name\": \"f\", \"argu", GenerationEnd::kLength);
  EXPECT_EQ(m.content, "Sure. <tool_call>\n{\"name\": \"f\", \"argu");
  EXPECT_EQ(m.finish_reason, "length");
  // Cut in the arguments: the call stands with what was written.
  m = parse_every_split(f, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, ", GenerationEnd::kLength);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"a\": [1, ");
  EXPECT_EQ(m.content, "");
  EXPECT_EQ(m.finish_reason, "length");
  // Cut in the closer (a stop string "</tool_call>"): the call is whole.
  m = parse_every_split(f, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.content, "");
  EXPECT_EQ(m.finish_reason, "tool_calls");
}

TEST(ChatOutput, ReasoningThenCall) {
  // Qwen 3: the model opens the think block itself.
  const std::string text =
      "<think>\nThe user wants weather; call get_weather.\n</think>\n\n<tool_call>\n{\"name\": "
      "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  const ChatOutputMessage m = parse_every_split(format_of(ToolCallFormat::kHermes, true), text);
  EXPECT_EQ(m.reasoning, "The user wants weather; call get_weather.\n");
  EXPECT_EQ(m.content, "");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"city\": \"Paris\"}");
}

TEST(ChatOutput, ReasoningOnlyAtTheStart) {
  const ChatOutputFormat f = format_of(ToolCallFormat::kNone, true);
  ChatOutputMessage m = parse_every_split(f, "  <think>a < b </thin</think>\n\nThe answer.");
  EXPECT_EQ(m.reasoning, "a < b </thin");
  EXPECT_EQ(m.content, "The answer.");
  m = parse_every_split(f, "No thinking. <think>x</think>");
  EXPECT_EQ(m.reasoning, "");
  EXPECT_EQ(m.content, "No thinking. <think>x</think>");
  m = parse_every_split(f, "<thinking>");
  EXPECT_EQ(m.content, "<thinking>");
  m = parse_every_split(f, "<thi");
  EXPECT_EQ(m.content, "<thi");
  // Without reasoning, <think> is text.
  m = parse_every_split(format_of(ToolCallFormat::kNone), "\n <think>x</think>y");
  EXPECT_EQ(m.content, "\n <think>x</think>y");
}

TEST(ChatOutput, StopStringInsideThinkBlock) {
  // The scheduler applies stop strings to the raw text (scheduler/stops.h): a stop inside the
  // think block ends the request there; what came before is reasoning.
  const ChatOutputFormat f = format_of(ToolCallFormat::kDeepSeekR1, true, true);
  const ChatOutputMessage m = parse_every_split(f, "Okay, the user asks about </thi");
  EXPECT_EQ(m.reasoning, "Okay, the user asks about </thi");
  EXPECT_EQ(m.content, "");
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.finish_reason, "stop");
  EXPECT_EQ(parse_every_split(f, "Okay", GenerationEnd::kLength).finish_reason, "length");
}

TEST(ChatOutput, DeepSeekR1) {
  const ChatOutputFormat f = format_of(ToolCallFormat::kDeepSeekR1, true, true);
  const std::string text =
      "<think>\nTwo "
      "tools.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```"
      "json\n" +
      std::string(kArgs) +
      "\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{\"tz\": "
      "\"CET\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  const ChatOutputMessage m = parse_every_split(f, text);
  EXPECT_EQ(m.reasoning, "Two tools.\n");
  EXPECT_EQ(m.content, "");
  ASSERT_EQ(m.tool_calls.size(), 2u);
  EXPECT_EQ(m.tool_calls[0].name, "get_weather");
  EXPECT_EQ(m.tool_calls[0].arguments, kArgs);
  EXPECT_EQ(m.tool_calls[1].name, "get_time");
  EXPECT_EQ(m.tool_calls[1].arguments, "{\"tz\": \"CET\"}");
  // A block that holds no call is content.
  const ChatOutputMessage bad = parse_every_split(f, "Hmm.</think>Sure<｜tool▁calls▁begin｜>no call");
  EXPECT_EQ(bad.reasoning, "Hmm.");
  EXPECT_EQ(bad.content, "Sure<｜tool▁calls▁begin｜>no call");
  EXPECT_TRUE(bad.tool_calls.empty());
}

TEST(ChatOutput, Llama3Json) {
  const ChatOutputFormat f = format_of(ToolCallFormat::kLlama3Json);
  ChatOutputMessage m =
      parse_every_split(f, "\n{\"name\": \"get_weather\", \"parameters\": " + std::string(kArgs) + "}");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, kArgs);
  EXPECT_EQ(m.content, "");
  m = parse_every_split(
      f,
      "<|python_tag|>{\"type\": \"function\", \"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", "
      "\"arguments\": {\"x\": \"}\"}}");
  ASSERT_EQ(m.tool_calls.size(), 2u);
  EXPECT_EQ(m.tool_calls[0].name, "a");
  EXPECT_EQ(m.tool_calls[0].arguments, "{}");
  EXPECT_EQ(m.tool_calls[1].name, "b");
  EXPECT_EQ(m.tool_calls[1].arguments, "{\"x\": \"}\"}");
  // JSON that is not a call, and braces that are not at the start, are content.
  for (std::string_view text : {"{\"answer\": 42}", "{\"name\": \"Bob\", \"age\": 3}", "The set {1, 2}.", "{"}) {
    m = parse_every_split(f, text);
    EXPECT_EQ(m.content, text);
    EXPECT_TRUE(m.tool_calls.empty());
  }
  // The python tag after text opens a call.
  m = parse_every_split(f, "Let me look.<|python_tag|>{\"name\": \"s\", \"parameters\": {\"q\": 1}}");
  EXPECT_EQ(m.content, "Let me look.");
  ASSERT_EQ(m.tool_calls.size(), 1u);
}

TEST(ChatOutput, FunctionaryV31) {
  const ChatOutputFormat f = format_of(ToolCallFormat::kFunctionaryV31);
  const std::string text = "Checking.<function=get_weather>" + std::string(kArgs) +
                           "</function><function=get_time>{\"tz\": \"CET\"}</function>";
  const ChatOutputMessage m = parse_every_split(f, text);
  EXPECT_EQ(m.content, "Checking.");
  ASSERT_EQ(m.tool_calls.size(), 2u);
  EXPECT_EQ(m.tool_calls[0].arguments, kArgs);
  EXPECT_EQ(m.tool_calls[1].name, "get_time");
  const ChatOutputMessage bad = parse_every_split(f, "<function=get weather>{}</function>");
  EXPECT_EQ(bad.content, "<function=get weather>{}</function>");
}

TEST(ChatOutput, ControlMarkerTokens) {
  ChatOutputFormat f = format_of(ToolCallFormat::kLlama3Json);
  f.control_markers = {{128010, "<|python_tag|>"}};
  ChatOutputParser parser(f, "r");
  ChatDelta d;
  ChatOutputMessage m;
  parser.feed_token(40, "Ok.", d);
  parser.feed_token(128010, "", d);  // the detokenizer drops control tokens
  parser.feed_token(90, "{\"name\": \"f\", \"parameters\": {}}", d);
  m.finish_reason = parser.finish(GenerationEnd::kStop, d);
  m.merge(d);
  EXPECT_EQ(m.content, "Ok.");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "f");
}

// A byte-level vocabulary with Llama 3.1's <|python_tag|> and <think> as control tokens and
// Qwen's <tool_call> as a user-defined one, in a model file read back.
struct MarkerVocabulary {
  std::unique_ptr<GgufFile> file;
  Tokenizer tokenizer;
  int32_t python_tag = 0, tool_call = 0, think = 0;
};
MarkerVocabulary marker_vocabulary() {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  append_byte_level_tokens(tokens, types);
  MarkerVocabulary v;
  for (auto [piece, type, id] : {std::tuple{"<|python_tag|>", 3, &v.python_tag},
                                 std::tuple{"<tool_call>", 4, &v.tool_call}, std::tuple{"<think>", 3, &v.think}}) {
    *id = static_cast<int32_t>(tokens.size());
    tokens.emplace_back(piece);
    types.push_back(type);
  }
  const auto value = [](GgufValueType type, auto v, GgufValueType array_type = GgufValueType::kU8) {
    return GgufValue{type, array_type, std::move(v)};
  };
  VocabularyKeys keys;
  keys.size = static_cast<uint32_t>(tokens.size());
  keys.keys = {{"tokenizer.ggml.model", value(GgufValueType::kString, std::string("llama"))},
               {"tokenizer.ggml.tokens", value(GgufValueType::kArray, tokens, GgufValueType::kString)},
               {"tokenizer.ggml.scores",
                value(GgufValueType::kArray, std::vector<double>(tokens.size(), 0.0), GgufValueType::kF32)},
               {"tokenizer.ggml.token_type",
                value(GgufValueType::kArray, std::vector<int64_t>(types.begin(), types.end()), GgufValueType::kI32)},
               {"tokenizer.ggml.bos_token_id", value(GgufValueType::kU32, uint64_t{1})},
               {"tokenizer.ggml.eos_token_id", value(GgufValueType::kU32, uint64_t{2})}};
  auto config = preset_config("tiny");
  EXPECT_TRUE(config);
  config->vocab_size = keys.size;
  config->tied_embeddings = true;
  const std::string path = test::temp_dir() + "/markers.gguf";
  const Status st = make_model(*config, 1, path, TensorType::kF32, std::nullopt, &keys);
  EXPECT_TRUE(st) << st.to_string();
  auto file = GgufFile::open(path);
  EXPECT_TRUE(file) << file.status().to_string();
  if (!file) return v;
  v.file = std::move(*file);
  auto tok = Tokenizer::from_gguf(*v.file);
  EXPECT_TRUE(tok) << tok.status().to_string();
  if (tok) v.tokenizer = std::move(*tok);
  return v;
}

// The real pipeline: tokens decoded as the scheduler decodes them (control tokens give no
// text), fed with their ids: bound control markers come back, user-defined ones are text.
TEST(ChatOutput, BindsControlMarkersOfAVocabulary) {
  const MarkerVocabulary v = marker_vocabulary();
  ASSERT_TRUE(v.file);
  const auto bytes = [](std::string_view s) {
    std::vector<int32_t> ids;
    for (unsigned char c : s) ids.push_back(3 + c);
    return ids;
  };
  struct Case {
    ChatOutputFormat format;
    std::vector<std::pair<int32_t, std::string>> bound;
    std::vector<int32_t> ids;
  };
  std::vector<int32_t> llama = bytes("Ok.");
  llama.push_back(v.python_tag);
  for (int32_t id : bytes(R"({"name": "f", "arguments": {"a": 1}})")) llama.push_back(id);
  std::vector<int32_t> qwen = {v.think};
  for (int32_t id : bytes("Hmm.</think>Ok.")) qwen.push_back(id);
  qwen.push_back(v.tool_call);
  for (int32_t id : bytes(R"({"name": "f", "arguments": {"a": 1}}</tool_call>)")) qwen.push_back(id);
  for (const Case& c : {Case{format_of(ToolCallFormat::kLlama3Json), {{v.python_tag, "<|python_tag|>"}}, llama},
                        Case{format_of(ToolCallFormat::kHermes, true), {{v.think, "<think>"}}, qwen}}) {
    ChatOutputFormat f = c.format;
    bind_control_markers(v.tokenizer, f);
    EXPECT_EQ(f.control_markers, c.bound);
    StreamDecoder decoder(v.tokenizer);
    ChatOutputParser parser(f, "r");
    ChatDelta d;
    ChatOutputMessage m;
    std::string piece;
    for (int32_t id : c.ids) {
      piece.clear();
      decoder.push(id, piece);
      parser.feed_token(id, piece, d);
    }
    m.finish_reason = parser.finish(GenerationEnd::kStop, d);
    m.merge(d);
    EXPECT_EQ(m.reasoning, f.reasoning ? "Hmm." : "");
    EXPECT_EQ(m.content, "Ok.");
    ASSERT_EQ(m.tool_calls.size(), 1u);
    EXPECT_EQ(m.tool_calls[0].arguments, "{\"a\": 1}");
  }
}

TEST(ChatOutput, NoAllocationPerToken) {
  const ChatOutputFormat f = format_of(ToolCallFormat::kHermes, true);
  ChatOutputParser parser(f, "r");
  ChatDelta d;
  d.content.reserve(64);
  d.reasoning.reserve(64);
  parser.feed("<think>warm", d);
  d.clear();
  parser.feed("</think><tool_call>{\"name\": \"f\", \"arguments\": {\"warm\": 1}}</tool_call>", d);
  d.clear();
  d.tool_call_storage[0].arguments.reserve(64);
  const long before = test::g_allocations.load();
  for (int i = 0; i < 1000; ++i) {
    d.clear();
    parser.feed(" some content < not a marker ", d);
    d.clear();
    parser.feed(i % 2 ? "<tool_call>{\"name\": \"g\", \"arguments\": {\"k\": " : "[1, {\"x\": 2}]}}</tool_call>", d);
  }
  EXPECT_EQ(test::g_allocations.load() - before, 0);
}

TEST(ChatOutput, DetectsTheTemplatesFormats) {
  const fs::path dir = fs::path(TANDEM_SOURCE_DIR) / "../shared/data/templates";
  if (!fs::exists(dir)) GTEST_SKIP() << "no ../shared/data/templates";
  struct Case {
    const char* file;
    ToolCallFormat tools;
    bool reasoning, starts_in_reasoning;
  };
  for (const Case& c : {
           Case{"Qwen-Qwen2.5-7B-Instruct.jinja", ToolCallFormat::kHermes, false, false},
           Case{"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", ToolCallFormat::kHermes, false, false},
           Case{"meta-llama-Llama-3.1-8B-Instruct.jinja", ToolCallFormat::kLlama3Json, false, false},
           Case{"meta-llama-Llama-3.2-3B-Instruct.jinja", ToolCallFormat::kLlama3Json, false, false},
           Case{"deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", ToolCallFormat::kDeepSeekR1, true, true},
           Case{"llama-cpp-deepseek-r1.jinja", ToolCallFormat::kDeepSeekR1, true, true},
           Case{"meetkai-functionary-medium-v3.1.jinja", ToolCallFormat::kFunctionaryV31, false, false},
           Case{"fireworks-ai-llama-3-firefunction-v2.jinja", ToolCallFormat::kNone, false, false},
           Case{"CohereForAI-c4ai-command-r-plus-tool_use.jinja", ToolCallFormat::kNone, false, false},
           Case{"google-gemma-2-2b-it.jinja", ToolCallFormat::kNone, false, false},
       }) {
    const ChatOutputFormat f = detect_chat_output_format(test::read_file((dir / c.file).string()));
    EXPECT_EQ(tool_call_format_name(f.tools), std::string(tool_call_format_name(c.tools))) << c.file;
    EXPECT_EQ(f.reasoning, c.reasoning) << c.file;
    EXPECT_EQ(f.starts_in_reasoning, c.starts_in_reasoning) << c.file;
  }
  // Qwen 3's enable_thinking=false writes an empty block: the output does not start inside it.
  const ChatOutputFormat qwen3 = detect_chat_output_format(
      "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and "
      "enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %} <tool_call>");
  EXPECT_TRUE(qwen3.reasoning);
  EXPECT_FALSE(qwen3.starts_in_reasoning);
  EXPECT_TRUE(prompt_opens_reasoning("<｜User｜>hi<｜Assistant｜><think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
}

// Each template writes an assistant turn of tool calls as its model would; the parser, with
// the format detected from the same template, must give back the calls.
TEST(ChatOutput, ParsesWhatTheTemplatesWrite) {
  const fs::path dir = fs::path(TANDEM_SOURCE_DIR) / "../shared/data/templates";
  if (!fs::exists(dir)) GTEST_SKIP() << "no ../shared/data/templates";
  struct Case {
    const char* file;
    const char* header;  // opens the assistant's turn
    const char* end;     // ends it
    bool string_arguments;
    int calls;
    bool tools = true;  // llama.cpp's R1 template cannot render tools (tojson of a generator, as in python)
  };
  const std::string llama_header = "<|start_header_id|>assistant<|end_header_id|>\n\n";
  for (const Case& c : {
           Case{"Qwen-Qwen2.5-7B-Instruct.jinja", "<|im_start|>assistant", "<|im_end|>", false, 2},
           Case{"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "<|im_start|>assistant", "<|im_end|>", false, 2},
           Case{"meta-llama-Llama-3.1-8B-Instruct.jinja", llama_header.c_str(), "<|eot_id|>", false, 1},
           Case{"meta-llama-Llama-3.2-3B-Instruct.jinja", llama_header.c_str(), "<|eot_id|>", false, 1},
           Case{"deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", true, 2},
           Case{"llama-cpp-deepseek-r1.jinja", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", true, 2, false},
           Case{"meetkai-functionary-medium-v3.1.jinja", llama_header.c_str(), "<|eom_id|>", true, 2},
       }) {
    SCOPED_TRACE(c.file);
    const std::string source = test::read_file((dir / c.file).string());
    std::string calls;
    for (int i = 0; i < c.calls; ++i) {
      const std::string args = i == 0 ? std::string(kArgs) : "{\"tz\": \"CET\"}";
      calls += std::string(i ? "," : "") + R"({"id": "c)" + std::to_string(i) +
               R"(", "type": "function", "function": {"name": "tool_)" + std::to_string(i) + R"(", "arguments": )" +
               (c.string_arguments ? runtime::json_string(args) : args) + "}}";
    }
    auto input = parse_chat_input(R"({"messages": [{"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": null, "tool_calls": [)" +
                                  calls + R"(]}, {"role": "user", "content": "Thanks"}], "bos_token": "<s>")" +
                                  (c.tools ? R"(, "tools": [{"type": "function", "function": {"name": "tool_0",
          "description": "d", "parameters": {"type": "object", "properties": {}}}}]})"
                                           : "}"));
    ASSERT_TRUE(input) << input.status().message();
    input->now = 0;
    auto tmpl = ChatTemplate::parse(source);
    ASSERT_TRUE(tmpl) << tmpl.status().message();
    auto rendered = tmpl->render(*input);
    ASSERT_TRUE(rendered) << rendered.status().message();
    const size_t calls_at = rendered->rfind("tool_0");
    const size_t begin = rendered->rfind(c.header, calls_at);
    ASSERT_NE(begin, std::string::npos);
    const size_t text_begin = begin + std::string_view(c.header).size();
    std::string output = rendered->substr(text_begin, rendered->find(c.end, text_begin) - text_begin);
    const ChatOutputFormat f = detect_chat_output_format(source);
    if (f.starts_in_reasoning) output = "I should call the tools.\n</think>\n\n" + output;
    const ChatOutputMessage m = parse_every_split(f, output);
    EXPECT_EQ(m.content, "") << output;
    ASSERT_EQ(m.tool_calls.size(), size_t(c.calls)) << output;
    EXPECT_EQ(m.tool_calls[0].name, "tool_0");
    EXPECT_EQ(m.tool_calls[0].arguments, kArgs);
    if (c.calls > 1) {
      EXPECT_EQ(m.tool_calls[1].arguments, "{\"tz\": \"CET\"}");
    }
    EXPECT_EQ(m.finish_reason, "tool_calls");
  }
}

}  // namespace
}  // namespace tandem::model
