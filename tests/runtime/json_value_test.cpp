// The one JSON reader: the value model and the strict parser (RFC 8259).
#include "runtime/json_value.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "runtime/json.h"

namespace tandem::runtime {
namespace {

using Kind = JsonValue::Kind;

JsonValue parse_ok(std::string_view text) {
  auto v = parse_json(text);
  EXPECT_TRUE(v) << text << ": " << v.status().to_string();
  return v ? std::move(v.value()) : JsonValue();
}

// The error's message, which names the offset and the problem.
std::string parse_error(std::string_view text) {
  auto v = parse_json(text);
  EXPECT_FALSE(v) << text;
  if (v) return "";
  EXPECT_EQ(v.status().code(), Code::kInvalidArgument);
  return v.status().message();
}

TEST(JsonValue, Scalars) {
  EXPECT_TRUE(parse_ok("null").is_null());
  EXPECT_TRUE(parse_ok(" true ").as_bool());
  EXPECT_FALSE(parse_ok("false").as_bool());
  EXPECT_EQ(parse_ok("\"hi\"").as_string(), "hi");
  EXPECT_EQ(parse_ok("\t\r\n 42 \n").as_int(), 42);
}

TEST(JsonValue, IntegersStayExactAndFloatsStayFloats) {
  EXPECT_EQ(parse_ok("-0").kind(), Kind::kInt);
  EXPECT_EQ(parse_ok("9223372036854775807").as_int(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(parse_ok("-9223372036854775808").as_int(), std::numeric_limits<int64_t>::min());
  const JsonValue big = parse_ok("18446744073709551615");
  EXPECT_EQ(big.kind(), Kind::kUint);
  EXPECT_EQ(big.as_uint(), std::numeric_limits<uint64_t>::max());
  EXPECT_TRUE(big.is_integer());
  EXPECT_EQ(parse_ok("18446744073709551616").kind(), Kind::kDouble);  // past uint64: the nearest double
  EXPECT_EQ(parse_ok("-9223372036854775809").kind(), Kind::kDouble);
  EXPECT_EQ(parse_ok("1.0").kind(), Kind::kDouble);
  EXPECT_EQ(parse_ok("1e2").kind(), Kind::kDouble);
  EXPECT_DOUBLE_EQ(parse_ok("-2.5E-3").as_double(), -0.0025);
  EXPECT_DOUBLE_EQ(parse_ok("7").as_double(), 7.0);
  EXPECT_TRUE(std::isinf(parse_ok("1e400").as_double()));  // as Python's json.loads
}

TEST(JsonValue, ObjectsKeepDocumentOrderAndTheLastDuplicateWins) {
  const JsonValue v = parse_ok(R"({"b": 1, "a": [true, null, {"c": "d"}], "b": 2})");
  ASSERT_TRUE(v.is_object());
  ASSERT_EQ(v.as_object().size(), 3u);
  EXPECT_EQ(v.as_object()[0].first, "b");
  EXPECT_EQ(v.as_object()[1].first, "a");
  EXPECT_EQ(v.find("b")->as_int(), 2);
  EXPECT_EQ(v["a"][2]["c"].as_string(), "d");
  EXPECT_EQ(v.find("z"), nullptr);
  EXPECT_TRUE(v["z"]["y"][7].is_null()) << "missing members and elements chain to null";
  EXPECT_TRUE(v["a"][3].is_null());
  EXPECT_TRUE(parse_ok("{}").as_object().empty());
  EXPECT_TRUE(parse_ok("[ ]").as_array().empty());
}

TEST(JsonValue, StringEscapesDecodeToUtf8) {
  EXPECT_EQ(parse_ok(R"("\"\\\/\b\f\n\r\t")").as_string(), "\"\\/\b\f\n\r\t");
  EXPECT_EQ(parse_ok(R"("\u0041\u00e9\u20AC")").as_string(), "A\xC3\xA9\xE2\x82\xAC");
  EXPECT_EQ(parse_ok(R"("\ud83d\ude00")").as_string(), "\xF0\x9F\x98\x80");  // a surrogate pair: U+1F600
  EXPECT_EQ(parse_ok(R"("\u0000")").as_string(), std::string(1, '\0'));
  EXPECT_EQ(parse_ok("\"caf\xC3\xA9 \xF0\x9F\x98\x80\"").as_string(), "caf\xC3\xA9 \xF0\x9F\x98\x80");
}

TEST(JsonValue, ErrorsNameTheOffsetAndTheProblem) {
  EXPECT_EQ(parse_error(""), "invalid JSON at offset 0: unexpected end of input, expected a value");
  EXPECT_EQ(parse_error("[1, 2,]"), "invalid JSON at offset 6: expected a value");
  EXPECT_EQ(parse_error("{\"a\" 1}"), "invalid JSON at offset 5: expected ':' after a key");
  EXPECT_EQ(parse_error("{1: 2}"), "invalid JSON at offset 1: expected a string key");
  EXPECT_EQ(parse_error("[1 2]"), "invalid JSON at offset 3: expected ',' or ']' in an array");
  EXPECT_EQ(parse_error("{\"a\": 1 \"b\"}"), "invalid JSON at offset 8: expected ',' or '}' in an object");
  EXPECT_EQ(parse_error("1 2"), "invalid JSON at offset 2: trailing characters after the value");
  EXPECT_EQ(parse_error("\"abc"), "invalid JSON at offset 4: unterminated string");
  EXPECT_EQ(parse_error("\"a\nb\""), "invalid JSON at offset 2: control character in a string");
  EXPECT_EQ(parse_error(R"("a\x")"), "invalid JSON at offset 2: invalid escape");
  EXPECT_EQ(parse_error(R"("\u12G4")"), "invalid JSON at offset 5: expected 4 hex digits after \\u");
  EXPECT_EQ(parse_error("tru"), "invalid JSON at offset 0: expected a value");
  EXPECT_EQ(parse_error("NaN"), "invalid JSON at offset 0: expected a value");
}

TEST(JsonValue, NumbersFollowTheGrammar) {
  EXPECT_EQ(parse_error("01"), "invalid JSON at offset 1: leading zero in a number");
  EXPECT_EQ(parse_error("-"), "invalid JSON at offset 1: expected a digit");
  EXPECT_EQ(parse_error("1."), "invalid JSON at offset 2: expected a digit after '.'");
  EXPECT_EQ(parse_error(".5"), "invalid JSON at offset 0: expected a value");
  EXPECT_EQ(parse_error("1e+"), "invalid JSON at offset 3: expected a digit in the exponent");
  EXPECT_EQ(parse_error("+1"), "invalid JSON at offset 0: expected a value");
  EXPECT_EQ(parse_error("0x10"), "invalid JSON at offset 1: trailing characters after the value");
}

TEST(JsonValue, LoneSurrogatesAndInvalidUtf8AreErrors) {
  EXPECT_EQ(parse_error(R"("a\ud83d")"), "invalid JSON at offset 2: high surrogate escape without its low surrogate");
  EXPECT_EQ(parse_error(R"("\ud83d\u0041")"),
            "invalid JSON at offset 1: high surrogate escape without its low surrogate");
  EXPECT_EQ(parse_error(R"("\ude00")"), "invalid JSON at offset 1: lone low surrogate escape");
  EXPECT_EQ(parse_error("\"a\xFF\""), "invalid JSON at offset 2: invalid UTF-8");
  EXPECT_EQ(parse_error("\"\xC0\xAF\""), "invalid JSON at offset 1: invalid UTF-8");      // overlong '/'
  EXPECT_EQ(parse_error("\"\xED\xA0\x80\""), "invalid JSON at offset 1: invalid UTF-8");  // an encoded surrogate
  EXPECT_EQ(parse_error("\"\xE2\x82\""), "invalid JSON at offset 1: invalid UTF-8");      // truncated
}

TEST(JsonValue, NestingIsBounded) {
  const std::string ok = std::string(kJsonMaxDepth, '[') + std::string(kJsonMaxDepth, ']');
  EXPECT_TRUE(parse_ok(ok).is_array());
  const std::string deep = std::string(kJsonMaxDepth + 1, '[') + std::string(kJsonMaxDepth + 1, ']');
  EXPECT_EQ(parse_error(deep), "invalid JSON at offset " + std::to_string(kJsonMaxDepth) + ": nested too deeply");
}

TEST(JsonValue, ReadsWhatTheWriterWrites) {
  const std::string text =
      "{\"s\":" + json_string("tab\t quote\" \xE2\x82\xAC \x01") + ",\"n\":" + json_number(0.25) + "}";
  const JsonValue v = parse_ok(text);
  EXPECT_EQ(v["s"].as_string(), "tab\t quote\" \xE2\x82\xAC \x01");
  EXPECT_DOUBLE_EQ(v["n"].as_double(), 0.25);
}

}  // namespace
}  // namespace tandem::runtime
