#include "scheduler/stops.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/chat_output.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tests/test_util.h"

namespace tandem::scheduler {
namespace {

using Seq = std::vector<int32_t>;

std::vector<uint32_t> feed_all(StopTokenMatcher& m, const Seq& tokens) {
  std::vector<uint32_t> out;
  for (int32_t t : tokens) out.push_back(m.feed(t));
  return out;
}

// The longest pattern that is a suffix of `history`, or 0: what feed() must return.
uint32_t longest_suffix_match(const Seq& history, const std::vector<Seq>& patterns) {
  uint32_t best = 0;
  for (const Seq& p : patterns) {
    if (p.size() > history.size() || p.size() <= best) continue;
    if (std::equal(p.begin(), p.end(), history.end() - static_cast<std::ptrdiff_t>(p.size()))) {
      best = static_cast<uint32_t>(p.size());
    }
  }
  return best;
}

TEST(StopTokenMatcher, DefaultMatchesNothing) {
  StopTokenMatcher m;
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.feed(1), 0u);
  auto built = StopTokenMatcher::build({});
  ASSERT_TRUE(built.is_ok());
  EXPECT_TRUE(built->empty());
  EXPECT_EQ(built->feed(0), 0u);
}

TEST(StopTokenMatcher, OverlappingPatterns) {
  auto m = StopTokenMatcher::build({{1, 2, 3}, {2, 3}, {3, 4}});
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_FALSE(m->empty());
  // 1 2 3: {1,2,3} and {2,3} end at 3; the longest is reported. Then 4 completes {3,4}
  // through the failure link from the {1,2,3} node.
  EXPECT_EQ(feed_all(*m, {1, 2, 3, 4}), (std::vector<uint32_t>{0, 0, 3, 2}));
  // {2,3} alone, then {3,4} overlapping it.
  EXPECT_EQ(feed_all(*m, {5, 2, 3, 4, 3}), (std::vector<uint32_t>{0, 0, 2, 2, 0}));
  // A failed attempt at {1,2,3} that falls back into {2,3}: 1 2 2 3.
  EXPECT_EQ(feed_all(*m, {1, 2, 2, 3}), (std::vector<uint32_t>{0, 0, 0, 2}));
}

TEST(StopTokenMatcher, ReportsTheLongestMatch) {
  auto m = StopTokenMatcher::build({{3}, {2, 3}, {1, 2, 3}, {9, 1, 2, 3, 7}});
  ASSERT_TRUE(m.is_ok());
  EXPECT_EQ(feed_all(*m, {1, 2, 3}), (std::vector<uint32_t>{0, 0, 3}));
  EXPECT_EQ(feed_all(*m, {8, 2, 3}), (std::vector<uint32_t>{0, 0, 2}));
  EXPECT_EQ(feed_all(*m, {8, 3}), (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(feed_all(*m, {9, 1, 2, 3, 7}), (std::vector<uint32_t>{0, 0, 0, 3, 5}));
}

TEST(StopTokenMatcher, PatternSpanningManyFeeds) {
  Seq long_stop;
  for (int i = 0; i < static_cast<int>(kMaxStopSequenceTokens); ++i) long_stop.push_back(1000 + i % 7);
  auto m = StopTokenMatcher::build({long_stop, {-5, 42}});
  ASSERT_TRUE(m.is_ok());
  // Noise, then a near miss (all but the last token, then a wrong one), then the real thing.
  for (int t : {5, 6, 1000, 1001}) EXPECT_EQ(m->feed(t), 0u);
  for (size_t i = 0; i + 1 < long_stop.size(); ++i) EXPECT_EQ(m->feed(long_stop[i]), 0u);
  EXPECT_EQ(m->feed(1), 0u);
  for (size_t i = 0; i + 1 < long_stop.size(); ++i) EXPECT_EQ(m->feed(long_stop[i]), 0u) << i;
  EXPECT_EQ(m->feed(long_stop.back()), kMaxStopSequenceTokens);
  EXPECT_EQ(m->feed(-5), 0u);  // negative ids are just symbols
  EXPECT_EQ(m->feed(42), 2u);
}

TEST(StopTokenMatcher, MatchesABruteForceReference) {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::uniform_int_distribution<int> sym(0, 3), len(1, 5), count(1, static_cast<int>(kMaxStopSequences));
    std::vector<Seq> patterns(count(rng));
    for (Seq& p : patterns) {
      p.resize(len(rng));
      for (int32_t& t : p) t = sym(rng);
    }
    auto m = StopTokenMatcher::build(patterns);
    ASSERT_TRUE(m.is_ok());
    Seq history;
    for (int i = 0; i < 300; ++i) {
      history.push_back(sym(rng));
      ASSERT_EQ(m->feed(history.back()), longest_suffix_match(history, patterns)) << "round " << round << " i " << i;
    }
  }
}

TEST(StopTokenMatcher, BuildErrors) {
  std::vector<Seq> too_many(kMaxStopSequences + 1, Seq{1});
  auto r = StopTokenMatcher::build(too_many);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "stop_token_sequences: 17 given, at most 16");

  r = StopTokenMatcher::build({{1}, {}});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "stop_token_sequences[1]: empty");

  r = StopTokenMatcher::build({Seq(kMaxStopSequenceTokens + 1, 3)});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "stop_token_sequences[0]: 65 tokens, at most 64");

  EXPECT_TRUE(StopTokenMatcher::build(std::vector<Seq>(kMaxStopSequences, Seq(kMaxStopSequenceTokens, 3))).is_ok());
}

// ---- Detokenizer ----

class DetokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto file = model::GgufFile::open(test::model_file("tiny"));
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    file_ = std::move(*file);
    auto tok = model::Tokenizer::from_gguf(*file_);
    ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
    tok_ = std::make_unique<model::Tokenizer>(std::move(*tok));
    ASSERT_TRUE(tok_->can_encode());
  }

  Seq tokens(const std::string& bytes) const {
    auto ids = tok_->encode(bytes, false);
    EXPECT_TRUE(ids.is_ok());
    return *ids;
  }

  // Pushes the tokens of `bytes` one at a time; returns the output of each push.
  std::vector<std::string> pieces(Detokenizer& d, const std::string& bytes) const {
    std::vector<std::string> out;
    for (int32_t t : tokens(bytes)) {
      std::string piece;
      d.push(t, piece);
      out.push_back(piece);
    }
    return out;
  }

  std::unique_ptr<model::GgufFile> file_;
  std::unique_ptr<model::Tokenizer> tok_;
};

using Pieces = std::vector<std::string>;

TEST_F(DetokenizerTest, AsciiPassesThrough) {
  Detokenizer d(*tok_);
  EXPECT_EQ(pieces(d, "hi!"), (Pieces{"h", "i", "!"}));
  std::string rest;
  d.flush(rest);
  EXPECT_EQ(rest, "");
}

TEST_F(DetokenizerTest, MultiByteCharactersWaitUntilComplete) {
  Detokenizer d(*tok_);
  EXPECT_EQ(pieces(d, "a\xc3\xa9"), (Pieces{"a", "", "\xc3\xa9"}));                    // é
  EXPECT_EQ(pieces(d, "\xe2\x82\xac"), (Pieces{"", "", "\xe2\x82\xac"}));              // €
  EXPECT_EQ(pieces(d, "\xf0\x9f\x98\x80"), (Pieces{"", "", "", "\xf0\x9f\x98\x80"}));  // 😀
}

TEST_F(DetokenizerTest, ControlTokensAddNothing) {
  Detokenizer d(*tok_);
  std::string out;
  d.push(tokens("\xc3")[0], out);
  d.push(tok_->bos_id(), out);
  d.push(tok_->eos_id(), out);
  EXPECT_EQ(out, "");
  d.push(tokens("\xa9")[0], out);
  EXPECT_EQ(out, "\xc3\xa9");
}

TEST_F(DetokenizerTest, InvalidBytesAreReleasedNotHeld) {
  Detokenizer d(*tok_);
  EXPECT_EQ(pieces(d, "\xff"), (Pieces{"\xff"}));  // never valid
  EXPECT_EQ(pieces(d, "\xa9"), (Pieces{"\xa9"}));  // a stray continuation byte
  EXPECT_EQ(pieces(d,
                   "\xc3"
                   "A"),
            (Pieces{"",
                    "\xc3"
                    "A"}));  // broken 2-byte character
  EXPECT_EQ(pieces(d,
                   "\xe2\x82"
                   "x"),
            (Pieces{"", "", "\xe2\x82x"}));
  EXPECT_EQ(pieces(d, "\xed\xa0"), (Pieces{"", "\xed\xa0"}));  // surrogate: ED then A0
  EXPECT_EQ(pieces(d, "\xc0\xaf"), (Pieces{"\xc0", "\xaf"}));  // overlong lead
  EXPECT_EQ(pieces(d, "\xf4\x90"), (Pieces{"", "\xf4\x90"}));  // above U+10FFFF
  // A broken sequence followed by the start of a real character: the start waits.
  EXPECT_EQ(pieces(d, "\xe2\xc3\xa9"), (Pieces{"", "\xe2", "\xc3\xa9"}));
  std::string rest;
  d.flush(rest);
  EXPECT_EQ(rest, "");
}

TEST_F(DetokenizerTest, FlushReleasesAnIncompleteEnd) {
  Detokenizer d(*tok_);
  EXPECT_EQ(pieces(d, "a\xf0\x9f\x98"), (Pieces{"a", "", "", ""}));
  std::string rest;
  d.flush(rest);
  EXPECT_EQ(rest, "\xf0\x9f\x98");
  rest.clear();
  d.flush(rest);
  EXPECT_EQ(rest, "");
}

// An independent UTF-8 reader: for each byte, whether it lies strictly inside a valid
// multi-byte character (where no output may end).
std::vector<bool> inside_characters(const std::string& s) {
  std::vector<bool> inside(s.size() + 1, false);
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool valid = len >= 1 && i + len <= s.size();
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; valid && k < len; ++k) {
      const unsigned char b = static_cast<unsigned char>(s[i + k]);
      valid = (b & 0xC0) == 0x80;
      cp = (cp << 6) | (b & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    valid = valid && cp >= kMin[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    if (!valid) len = 1;
    for (size_t k = 1; k < len; ++k) inside[i + k] = true;
    i += len;
  }
  return inside;
}

TEST_F(DetokenizerTest, RandomBytesRoundTripWithoutSplittingCharacters) {
  std::mt19937 rng(11);
  const std::vector<std::string> chars = {
      "a", " ", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "\xed\x9f\xbf", "\xf4\x8f\xbf\xbf"};
  for (int round = 0; round < 300; ++round) {
    // Valid characters mixed with random bytes (often invalid), and truncated characters.
    std::string bytes;
    const int n = std::uniform_int_distribution<int>(0, 40)(rng);
    for (int i = 0; i < n; ++i) {
      const int kind = std::uniform_int_distribution<int>(0, 3)(rng);
      const std::string& c = chars[std::uniform_int_distribution<size_t>(0, chars.size() - 1)(rng)];
      if (kind == 0) {
        bytes += static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng));
      } else if (kind == 1) {
        bytes += c.substr(0, std::uniform_int_distribution<size_t>(1, c.size())(rng));
      } else {
        bytes += c;
      }
    }
    const std::vector<bool> inside = inside_characters(bytes);
    Detokenizer d(*tok_);
    std::string all;
    size_t pushed = 0;
    for (int32_t t : tokens(bytes)) {
      std::string piece;
      d.push(t, piece);
      ++pushed;
      all += piece;
      ASSERT_FALSE(inside[all.size()]) << "round " << round << ": an output ends inside a character";
      ASSERT_LE(pushed - all.size(), 3u) << "round " << round << ": more than an incomplete character held";
    }
    d.flush(all);
    ASSERT_EQ(all, bytes) << "round " << round;
  }
}

// ---- StopStringMatcher ----

struct Fed {
  std::string text;
  bool stopped = false;
};

Fed feed_pieces(StopStringMatcher& m, const std::vector<std::string>& pieces, bool flush = true) {
  Fed r;
  for (const std::string& p : pieces) r.stopped = m.feed(p, r.text);
  if (flush) m.flush(r.text);
  return r;
}

StopStringMatcher make(std::vector<std::string> stops, bool include = false) {
  auto m = StopStringMatcher::build(std::move(stops), include);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return std::move(m).value();
}

TEST(StopStringMatcher, DefaultPassesEverything) {
  StopStringMatcher m;
  EXPECT_TRUE(m.empty());
  std::string out;
  EXPECT_FALSE(m.feed("abc", out));
  m.flush(out);
  EXPECT_EQ(out, "abc");
}

TEST(StopStringMatcher, HoldsBackAcrossPieces) {
  StopStringMatcher m = make({"STOP"});
  EXPECT_FALSE(m.empty());
  std::string out;
  EXPECT_FALSE(m.feed("abcS", out));
  EXPECT_EQ(out, "abc");  // "S" may start the stop
  EXPECT_FALSE(m.feed("T", out));
  EXPECT_EQ(out, "abc");
  EXPECT_FALSE(m.feed("O", out));
  EXPECT_EQ(out, "abc");
  EXPECT_TRUE(m.feed("P and more", out));
  EXPECT_EQ(out, "abc");
  // Later calls do nothing.
  EXPECT_TRUE(m.feed("xyz", out));
  m.flush(out);
  EXPECT_EQ(out, "abc");
}

TEST(StopStringMatcher, ReleasesWhatTurnsOutNotToBeAStop) {
  StopStringMatcher m = make({"STOP"});
  std::string out;
  EXPECT_FALSE(m.feed("ST", out));
  EXPECT_EQ(out, "");
  EXPECT_FALSE(m.feed("X", out));
  EXPECT_EQ(out, "STX");
  // A held prefix that restarts: "SST" -> the first S is decided, "ST" still waits.
  out.clear();
  EXPECT_FALSE(m.feed("S", out));
  EXPECT_FALSE(m.feed("ST", out));
  EXPECT_EQ(out, "S");
  EXPECT_TRUE(m.feed("OP", out));
  EXPECT_EQ(out, "S");
}

TEST(StopStringMatcher, IncludeStop) {
  StopStringMatcher m = make({"STOP"}, true);
  Fed r = feed_pieces(m, {"ab", "ST", "OPcd", "ef"});
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "abSTOP");
}

TEST(StopStringMatcher, PrefixOfAStopIsReleasedAtFlush) {
  StopStringMatcher m = make({"STOP", "\n\n"});
  std::string out;
  EXPECT_FALSE(m.feed("end STO", out));
  EXPECT_EQ(out, "end ");
  m.flush(out);
  EXPECT_EQ(out, "end STO");
  StopStringMatcher n = make({"\n\n"});
  Fed r = feed_pieces(n, {"line\n"});
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(r.text, "line\n");
}

std::string released(std::vector<std::string> stops, bool include, const std::string& text) {
  StopStringMatcher m = make(std::move(stops), include);
  return feed_pieces(m, {text}).text;
}

TEST(StopStringMatcher, FirstToCompleteWinsThenLongest) {
  // "bc" completes before "abcd" does.
  EXPECT_EQ(released({"abcd", "bc"}, false, "xabcd"), "xa");
  // Both end at the same byte: the longer one is cut (or kept whole).
  EXPECT_EQ(released({"bc", "abc"}, false, "xabc"), "x");
  EXPECT_EQ(released({"bc", "abc"}, true, "xabcz"), "xabc");
  // Overlapping self-prefix: "aab" in "aaab", one byte at a time.
  StopStringMatcher m = make({"aab"});
  EXPECT_EQ(feed_pieces(m, {"a", "a", "a", "b"}).text, "a");
}

TEST(StopStringMatcher, MultiByteStops) {
  StopStringMatcher m = make({"\xc3\xa9t\xc3\xa9"});  // "été"
  Fed r = feed_pieces(m, {"un \xc3", "\xa9", "t", "\xc3", "\xa9 !"});
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "un ");
}

// The result does not depend on how the text is cut, and what is released never runs
// ahead of what a whole-text search decides.
TEST(StopStringMatcher, ChunkingDoesNotMatter) {
  std::mt19937 rng(3);
  auto rand_str = [&](int max_len) {
    std::string s(std::uniform_int_distribution<int>(1, max_len)(rng), 'a');
    for (char& c : s) c = static_cast<char>('a' + std::uniform_int_distribution<int>(0, 2)(rng));
    return s;
  };
  for (int round = 0; round < 500; ++round) {
    std::vector<std::string> stops(std::uniform_int_distribution<int>(1, 4)(rng));
    for (std::string& s : stops) s = rand_str(4);
    const std::string text = rand_str(40);
    const bool include = round % 2 == 1;
    // Reference: the stop that ends first (then the longest) in the whole text.
    size_t best_end = std::string::npos, best_len = 0;
    for (const std::string& s : stops) {
      const size_t pos = text.find(s);
      if (pos == std::string::npos) continue;
      const size_t end = pos + s.size();
      if (end < best_end || (end == best_end && s.size() > best_len)) best_end = end, best_len = s.size();
    }
    const bool want_stop = best_end != std::string::npos;
    const std::string want = !want_stop ? text : text.substr(0, include ? best_end : best_end - best_len);

    StopStringMatcher m = make(stops, include);
    std::string out;
    bool stopped = false;
    for (size_t i = 0; i < text.size();) {
      const size_t n = std::uniform_int_distribution<size_t>(0, 5)(rng);
      stopped = m.feed(std::string_view(text).substr(i, n), out);
      i += n;
      ASSERT_EQ(want.compare(0, out.size(), out), 0) << "round " << round << ": released " << out << ", want " << want;
    }
    m.flush(out);
    ASSERT_EQ(stopped, want_stop) << "round " << round;
    ASSERT_EQ(out, want) << "round " << round << " text " << text;
  }
}

TEST(StopStringMatcher, BuildErrors) {
  auto r = StopStringMatcher::build(std::vector<std::string>(kMaxStopStrings + 1, "x"), false);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "stop_strings: 17 given, at most 16");
  r = StopStringMatcher::build({"a", ""}, false);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "stop_strings[1]: empty");
  r = StopStringMatcher::build({std::string(kMaxStopStringBytes + 1, 'z')}, false);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "stop_strings[0]: 257 bytes, at most 256");
  EXPECT_TRUE(
      StopStringMatcher::build(std::vector<std::string>(kMaxStopStrings, std::string(kMaxStopStringBytes, 'z')), false)
          .is_ok());
}

// The gateway's pipeline: stop strings cut the raw text (here, as the scheduler's StopStringMatcher
// does) before the chat output parser splits it, so a stop string applies in every state. Each
// split of the text into two pieces gives the same message.
model::ChatOutputMessage stop_then_parse(std::string_view text, const std::string& stop,
                                         const model::ChatOutputFormat& format, size_t split) {
  auto stops = StopStringMatcher::build({stop}, false);
  EXPECT_TRUE(stops);
  model::ChatOutputParser parser(format, "req");
  model::ChatDelta delta;
  model::ChatOutputMessage m;
  std::string emit;
  bool stopped = false;
  for (std::string_view piece : {text.substr(0, split), text.substr(split)}) {
    if (stopped) break;
    emit.clear();
    stopped = stops->feed(piece, emit);
    parser.feed(emit, delta);
  }
  emit.clear();
  stops->flush(emit);
  parser.feed(emit, delta);
  m.finish_reason = parser.finish(stopped ? model::GenerationEnd::kStop : model::GenerationEnd::kLength, delta);
  m.merge(delta);
  return m;
}

TEST(StopStringMatcher, StopInsideAThinkBlockEndsTheRequestThere) {
  const model::ChatOutputFormat r1{model::ToolCallFormat::kDeepSeekR1, true, true, {}};
  const std::string text = "Let me think. FINAL: no.</think>\n\nThe answer is 4.";
  for (size_t split = 0; split <= text.size(); ++split) {
    const model::ChatOutputMessage m = stop_then_parse(text, "FINAL", r1, split);
    EXPECT_EQ(m.reasoning, "Let me think. ") << split;
    EXPECT_EQ(m.content, "") << split;
    EXPECT_EQ(m.finish_reason, "stop") << split;
  }
  // The same stop string in the content ends it there, after the whole reasoning.
  const model::ChatOutputMessage m = stop_then_parse("Think.</think>Answer FINAL more", "FINAL", r1, 9);
  EXPECT_EQ(m.reasoning, "Think.");
  EXPECT_EQ(m.content, "Answer ");
  // Inside a call's arguments: the call is cut, and the finish reason is "stop", not "tool_calls".
  const model::ChatOutputFormat hermes{model::ToolCallFormat::kHermes, false, false, {}};
  const model::ChatOutputMessage cut =
      stop_then_parse("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"STOP\"}}</tool_call>", "STOP", hermes, 20);
  ASSERT_EQ(cut.tool_calls.size(), 1u);
  EXPECT_EQ(cut.tool_calls[0].arguments, "{\"a\": \"");
  EXPECT_EQ(cut.finish_reason, "stop");
}

}  // namespace
}  // namespace tandem::scheduler
