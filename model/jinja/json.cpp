#include "model/jinja/json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "runtime/json.h"
#include "model/jinja/strings.h"

namespace tandem::model::jinja {
namespace {

class JsonReader {
 public:
  explicit JsonReader(std::string_view text) : s_(text) {}
  Value document() {
    Value v = value(0);
    skip_space();
    if (pos_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error("invalid JSON at offset " + std::to_string(pos_) + ": " + what);
  }
  void skip_space() {
    while (pos_ < s_.size() && std::strchr(" \t\r\n", s_[pos_]) && s_[pos_]) ++pos_;
  }
  bool accept(char c) {
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!accept(c)) fail(std::string("expected '") + c + "'");
  }
  Value value(int depth);
  Value number();
  std::string string();
  void append_escape(std::string& out);

  std::string_view s_;
  size_t pos_ = 0;
};

Value JsonReader::value(int depth) {
  if (depth > 256) fail("nested too deeply");
  skip_space();
  if (pos_ >= s_.size()) fail("unexpected end");
  const char c = s_[pos_];
  if (c == '{') {
    ++pos_;
    Dict d;
    if (accept('}')) return Value::dict(std::move(d));
    do {
      skip_space();
      if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a key");
      Value key(string());
      expect(':');
      d.set(key, value(depth + 1));
    } while (accept(','));
    expect('}');
    return Value::dict(std::move(d));
  }
  if (c == '[') {
    ++pos_;
    List items;
    if (accept(']')) return Value::list(std::move(items));
    do items.push_back(value(depth + 1));
    while (accept(','));
    expect(']');
    return Value::list(std::move(items));
  }
  if (c == '"') return Value(string());
  for (const auto& [word, v] : {std::pair{"true", Value(true)}, {"false", Value(false)}, {"null", Value::none()}}) {
    if (s_.substr(pos_, std::strlen(word)) == word) {
      pos_ += std::strlen(word);
      return v;
    }
  }
  return number();
}

Value JsonReader::number() {
  const size_t start = pos_;
  if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
  const auto digits = [&] {
    const size_t from = pos_;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    if (pos_ == from) fail("expected a value");
  };
  digits();
  bool is_float = false;
  if (pos_ < s_.size() && s_[pos_] == '.') {
    ++pos_;
    digits();
    is_float = true;
  }
  if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
    ++pos_;
    if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
    digits();
    is_float = true;
  }
  const std::string text(s_.substr(start, pos_ - start));
  if (!is_float) {
    errno = 0;
    const long long v = std::strtoll(text.c_str(), nullptr, 10);
    if (errno != ERANGE) return Value(static_cast<int64_t>(v));
  }
  return Value(std::strtod(text.c_str(), nullptr));
}

void JsonReader::append_escape(std::string& out) {
  if (pos_ >= s_.size()) fail("unterminated string");
  const char e = s_[pos_++];
  static const char kSimple[] = "\"\"\\\\//b\bf\fn\nr\rt\t";
  if (const char* hit = std::strchr(kSimple, e); hit && e && (hit - kSimple) % 2 == 0) {
    out += hit[1];
    return;
  }
  if (e != 'u') fail("bad escape");
  const auto hex4 = [&] {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    const std::string h(s_.substr(pos_, 4));
    if (h.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) fail("bad \\u escape");
    pos_ += 4;
    return static_cast<uint32_t>(std::stoul(h, nullptr, 16));
  };
  uint32_t cp = hex4();
  if (cp >= 0xd800 && cp < 0xdc00 && s_.substr(pos_, 2) == "\\u") {
    pos_ += 2;
    const uint32_t low = hex4();
    if (low < 0xdc00 || low > 0xdfff) fail("unpaired surrogate");
    cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
  } else if (cp >= 0xd800 && cp < 0xe000) {
    fail("unpaired surrogate");
  }
  append_utf8(out, cp);
}

std::string JsonReader::string() {
  ++pos_;  // "
  std::string out;
  for (;;) {
    if (pos_ >= s_.size()) fail("unterminated string");
    const char c = s_[pos_++];
    if (c == '"') return out;
    if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
    if (c == '\\') {
      append_escape(out);
    } else {
      out += c;
    }
  }
}

// Python's json string: with ensure_ascii=False as the one JSON writer (runtime/json.h) writes it.
void append_string(std::string& out, const std::string& s, bool ensure_ascii) {
  if (!ensure_ascii) return runtime::append_json_string(out, s);
  out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    char buf[16];
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else if (c < 0x80 || !ensure_ascii) {
      out += static_cast<char>(c);
    } else {
      const size_t n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
      uint32_t cp = c & (n == 4 ? 0x07 : n == 3 ? 0x0f : 0x1f);
      for (size_t k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
      i += n - 1;
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      }
      out += buf;
    }
  }
  out += '"';
}

std::string scalar_json(const Value& v) {
  switch (v.kind()) {
    case Kind::kNone: return "null";
    case Kind::kBool: return v.as_bool() ? "true" : "false";
    case Kind::kInt: return std::to_string(v.as_int());
    case Kind::kFloat: {
      const double d = v.as_float();
      if (std::isnan(d)) return "NaN";
      if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
      return float_repr(d);
    }
    default: throw Error("Object of type " + v.type_name() + " is not JSON serializable");
  }
}

void dump(std::string& out, const Value& v, const JsonStyle& style, int depth);

void newline(std::string& out, const JsonStyle& style, int depth) {
  out += '\n';
  for (int i = 0; i < depth; ++i) out += *style.indent;
}

void dump_dict(std::string& out, const Dict& d, const JsonStyle& style, int depth) {
  if (d.items.empty()) {
    out += "{}";
    return;
  }
  std::vector<std::pair<std::string, const Value*>> entries;
  for (const auto& [k, v] : d.items) {
    if (!k.is_string() && k.kind() != Kind::kNone && !k.is_number()) {
      throw Error("keys must be str, int, float, bool or None, not " + k.type_name());
    }
    entries.emplace_back(k.is_string() ? k.str() : scalar_json(k), &v);
  }
  if (style.sort_keys) {
    std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  }
  out += '{';
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i) out += style.item_separator;
    if (style.indent) newline(out, style, depth + 1);
    append_string(out, entries[i].first, style.ensure_ascii);
    out += style.key_separator;
    dump(out, *entries[i].second, style, depth + 1);
  }
  if (style.indent) newline(out, style, depth);
  out += '}';
}

void dump(std::string& out, const Value& v, const JsonStyle& style, int depth) {
  if (depth > 512) throw Error("maximum recursion depth exceeded while encoding JSON");
  if (v.is_string()) return append_string(out, v.str(), style.ensure_ascii);
  if (v.is_dict()) return dump_dict(out, v.entries(), style, depth);
  if (!v.is_list() || v.is_generator()) {
    out += scalar_json(v);
    return;
  }
  if (v.items().empty()) {
    out += "[]";
    return;
  }
  out += '[';
  for (size_t i = 0; i < v.items().size(); ++i) {
    if (i) out += style.item_separator;
    if (style.indent) newline(out, style, depth + 1);
    dump(out, v.items()[i], style, depth + 1);
  }
  if (style.indent) newline(out, style, depth);
  out += ']';
}

}  // namespace

Value parse_json(std::string_view text) { return JsonReader(text).document(); }

std::string to_json(const Value& value, const JsonStyle& style) {
  std::string out;
  dump(out, value, style, 0);
  return out;
}

}  // namespace tandem::model::jinja
