// Reading JSON: a small value model and a strict RFC 8259 parser, the one reader of tandem
// (datasets and SSE chunks in the harness, chat-template inputs in model/jinja). runtime/json.h
// is the writer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "runtime/status.h"

namespace tandem::runtime {

// A JSON value. Numbers keep what the text says: an integer (no fraction, no exponent) is kInt
// when it fits int64, kUint when it fits only uint64, else kDouble (as is any number with a
// fraction or exponent, so 1.0 stays a double). Objects keep their members in document order,
// duplicate keys included.
class JsonValue {
 public:
  enum class Kind { kNull, kBool, kInt, kUint, kDouble, kString, kArray, kObject };  // the variant's order
  using Array = std::vector<JsonValue>;
  using Object = std::vector<std::pair<std::string, JsonValue>>;

  JsonValue() = default;  // null
  explicit JsonValue(bool b) : v_(b) {}
  explicit JsonValue(int64_t i) : v_(i) {}
  explicit JsonValue(uint64_t u) : v_(u) {}
  explicit JsonValue(double d) : v_(d) {}
  explicit JsonValue(std::string s) : v_(std::move(s)) {}
  explicit JsonValue(Array a) : v_(std::move(a)) {}
  explicit JsonValue(Object o) : v_(std::move(o)) {}

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_null() const { return kind() == Kind::kNull; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_integer() const { return kind() == Kind::kInt || kind() == Kind::kUint; }
  bool is_number() const { return is_integer() || kind() == Kind::kDouble; }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_array() const { return kind() == Kind::kArray; }
  bool is_object() const { return kind() == Kind::kObject; }

  // The accessors require the kind they name (std::bad_variant_access otherwise), except
  // as_double, which takes any number (a kUint or large kInt rounded to the nearest double).
  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  uint64_t as_uint() const { return std::get<uint64_t>(v_); }
  double as_double() const;
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const Array& as_array() const { return std::get<Array>(v_); }
  const Object& as_object() const { return std::get<Object>(v_); }

  // The value of the last member named `key` (duplicates: the last wins, as in Python's
  // json.loads), or nullptr when this is not an object or has no such member.
  const JsonValue* find(std::string_view key) const;
  // Lookups that chain: the member or element, or a null value when there is none (not an
  // object/array, no such key, index out of range).
  const JsonValue& operator[](std::string_view key) const;
  const JsonValue& operator[](size_t index) const;

 private:
  std::variant<std::monostate, bool, int64_t, uint64_t, double, std::string, Array, Object> v_;
};

// The limit on nested arrays and objects: deep enough for any message list or tool schema,
// shallow enough that the recursive parser (and whoever walks its result) keeps to its stack.
inline constexpr int kJsonMaxDepth = 256;

// Parses one JSON text (RFC 8259, whitespace around it allowed, nothing after it). Strings are
// decoded to UTF-8: \uXXXX escapes with surrogate pairs joined; a lone surrogate escape, raw
// control characters and invalid UTF-8 are errors (stricter than Python, which keeps lone
// surrogates). An error is kInvalidArgument "invalid JSON at offset N: <problem>", N the byte
// offset where the problem was found.
Result<JsonValue> parse_json(std::string_view text, int max_depth = kJsonMaxDepth);

}  // namespace tandem::runtime
