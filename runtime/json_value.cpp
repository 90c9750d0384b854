#include "runtime/json_value.h"

#include <charconv>
#include <cstdlib>
#include <cstring>

#include "runtime/utf8.h"

namespace tandem::runtime {

double JsonValue::as_double() const {
  switch (kind()) {
    case Kind::kInt: return static_cast<double>(as_int());
    case Kind::kUint: return static_cast<double>(as_uint());
    default: return std::get<double>(v_);
  }
}

const JsonValue* JsonValue::find(std::string_view key) const {
  if (!is_object()) return nullptr;
  const Object& members = as_object();
  for (auto it = members.rbegin(); it != members.rend(); ++it)
    if (it->first == key) return &it->second;
  return nullptr;
}

namespace {
const JsonValue kNull;
}  // namespace

const JsonValue& JsonValue::operator[](std::string_view key) const {
  const JsonValue* v = find(key);
  return v ? *v : kNull;
}

const JsonValue& JsonValue::operator[](size_t index) const {
  return is_array() && index < as_array().size() ? as_array()[index] : kNull;
}

namespace {

// A recursive-descent parser over the whole text. Each step returns false after recording the
// first error; the value being built is then discarded.
class Parser {
 public:
  Parser(std::string_view text, int max_depth) : s_(text), max_depth_(max_depth) {}

  Result<JsonValue> document() {
    JsonValue v;
    if (value(v, 0)) {
      skip_space();
      if (pos_ == s_.size()) return v;
      fail("trailing characters after the value");
    }
    return Status::invalid("invalid JSON at offset " + std::to_string(error_at_) + ": " + error_);
  }

 private:
  bool fail(const char* what) { return fail_at(pos_, what); }
  bool fail_at(size_t at, const char* what) {
    error_at_ = at;
    error_ = what;
    return false;
  }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  // True (and consumed) when the next character after whitespace is c.
  bool accept(char c) {
    skip_space();
    if (pos_ >= s_.size() || s_[pos_] != c) return false;
    ++pos_;
    return true;
  }

  bool value(JsonValue& out, int depth);
  bool array(JsonValue& out, int depth);
  bool object(JsonValue& out, int depth);
  bool literal(JsonValue& out);
  bool number(JsonValue& out);
  bool string(std::string& out);
  bool escape(std::string& out);
  bool hex4(uint32_t& out);

  std::string_view s_;
  int max_depth_;
  size_t pos_ = 0;
  size_t error_at_ = 0;
  std::string error_;
};

bool Parser::value(JsonValue& out, int depth) {
  skip_space();
  if (pos_ >= s_.size()) return fail("unexpected end of input, expected a value");
  switch (s_[pos_]) {
    case '[': return array(out, depth + 1);
    case '{': return object(out, depth + 1);
    case '"': {
      std::string s;
      if (!string(s)) return false;
      out = JsonValue(std::move(s));
      return true;
    }
    case 't':
    case 'f':
    case 'n': return literal(out);
    default: return number(out);
  }
}

bool Parser::array(JsonValue& out, int depth) {
  if (depth > max_depth_) return fail("nested too deeply");
  ++pos_;  // [
  JsonValue::Array items;
  if (!accept(']')) {
    do {
      if (!value(items.emplace_back(), depth)) return false;
    } while (accept(','));
    if (!accept(']')) return fail("expected ',' or ']' in an array");
  }
  out = JsonValue(std::move(items));
  return true;
}

bool Parser::object(JsonValue& out, int depth) {
  if (depth > max_depth_) return fail("nested too deeply");
  ++pos_;  // {
  JsonValue::Object members;
  if (!accept('}')) {
    do {
      skip_space();
      if (pos_ >= s_.size() || s_[pos_] != '"') return fail("expected a string key");
      auto& [key, member] = members.emplace_back();
      if (!string(key)) return false;
      if (!accept(':')) return fail("expected ':' after a key");
      if (!value(member, depth)) return false;
    } while (accept(','));
    if (!accept('}')) return fail("expected ',' or '}' in an object");
  }
  out = JsonValue(std::move(members));
  return true;
}

bool Parser::literal(JsonValue& out) {
  for (const auto& [word, v] :
       {std::pair{"true", JsonValue(true)}, {"false", JsonValue(false)}, {"null", JsonValue()}}) {
    if (s_.substr(pos_, std::strlen(word)) == word) {
      pos_ += std::strlen(word);
      out = v;
      return true;
    }
  }
  return fail("expected a value");
}

// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
bool Parser::number(JsonValue& out) {
  const size_t start = pos_;
  const auto is_digit = [&] { return pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9'; };
  const auto digits = [&] {
    if (!is_digit()) return false;
    while (is_digit()) ++pos_;
    return true;
  };
  if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
  if (pos_ < s_.size() && s_[pos_] == '0') {
    ++pos_;
    if (is_digit()) return fail("leading zero in a number");
  } else if (!digits()) {
    return fail(pos_ == start ? "expected a value" : "expected a digit");
  }
  bool integer = true;
  if (pos_ < s_.size() && s_[pos_] == '.') {
    ++pos_;
    if (!digits()) return fail("expected a digit after '.'");
    integer = false;
  }
  if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
    ++pos_;
    if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
    if (!digits()) return fail("expected a digit in the exponent");
    integer = false;
  }
  const char* first = s_.data() + start;
  const char* last = s_.data() + pos_;
  if (integer) {
    int64_t i;
    if (std::from_chars(first, last, i).ec == std::errc()) return out = JsonValue(i), true;
    uint64_t u;
    if (std::from_chars(first, last, u).ec == std::errc()) return out = JsonValue(u), true;
  }
  out = JsonValue(std::strtod(std::string(first, last).c_str(), nullptr));  // out of range: +-inf, as Python
  return true;
}

bool Parser::hex4(uint32_t& out) {
  out = 0;
  for (int k = 0; k < 4; ++k, ++pos_) {
    const char c = pos_ < s_.size() ? s_[pos_] : '\0';
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
    if (d < 0) return fail("expected 4 hex digits after \\u");
    out = out * 16 + static_cast<uint32_t>(d);
  }
  return true;
}

// After the backslash.
bool Parser::escape(std::string& out) {
  const size_t at = pos_ - 1;
  static const char kSimple[] = "\"\"\\\\//b\bf\fn\nr\rt\t";
  const char e = pos_ < s_.size() ? s_[pos_++] : '\0';
  if (const char* hit = std::strchr(kSimple, e); hit && e && (hit - kSimple) % 2 == 0) {
    out += hit[1];
    return true;
  }
  if (e != 'u') return fail_at(at, "invalid escape");
  uint32_t cp;
  if (!hex4(cp)) return false;
  if (cp >= 0xdc00 && cp < 0xe000) return fail_at(at, "lone low surrogate escape");
  if (cp >= 0xd800 && cp < 0xdc00) {
    uint32_t low;
    if (s_.substr(pos_, 2) != "\\u") return fail_at(at, "high surrogate escape without its low surrogate");
    pos_ += 2;
    if (!hex4(low)) return false;
    if (low < 0xdc00 || low >= 0xe000) return fail_at(at, "high surrogate escape without its low surrogate");
    cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
  }
  append_utf8(out, cp);
  return true;
}

bool Parser::string(std::string& out) {
  ++pos_;  // "
  for (;;) {
    if (pos_ >= s_.size()) return fail("unterminated string");
    const unsigned char c = static_cast<unsigned char>(s_[pos_]);
    if (c == '"') {
      ++pos_;
      return true;
    }
    if (c < 0x20) return fail("control character in a string");
    if (c == '\\') {
      ++pos_;
      if (!escape(out)) return false;
    } else if (c < 0x80) {
      out += static_cast<char>(c);
      ++pos_;
    } else if (const size_t n = utf8_sequence_length(s_, pos_)) {
      out.append(s_.substr(pos_, n));
      pos_ += n;
    } else {
      return fail("invalid UTF-8");
    }
  }
}

}  // namespace

Result<JsonValue> parse_json(std::string_view text, int max_depth) { return Parser(text, max_depth).document(); }

}  // namespace tandem::runtime
