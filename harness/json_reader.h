// A minimal JSON reader for what the harness reads: dataset lines and SSE chunks (flat fields).
// runtime/json.h is the writer; nothing else in tandem reads JSON.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace tandem::bench {

// Reads values from `s` starting at `i`; each call skips leading whitespace, and on failure
// leaves `i` somewhere inside the value it gave up on.
struct JsonCursor {
  const std::string& s;
  size_t i = 0;

  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  }
  // True (and consumed) when the next character is c.
  bool eat(char c) {
    ws();
    if (i >= s.size() || s[i] != c) return false;
    ++i;
    return true;
  }
  // A string literal, escapes decoded (\uXXXX to UTF-8; surrogates passed through, 3 bytes each).
  bool string(std::string& out) {
    if (!eat('"')) return false;
    out.clear();
    while (i < s.size()) {
      const char c = s[i++];
      if (c == '"') return true;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i >= s.size()) return false;
      switch (const char e = s[i++]) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u':
          if (i + 4 > s.size()) return false;
          append_utf8(out, static_cast<unsigned>(std::strtoul(s.substr(i, 4).c_str(), nullptr, 16)));
          i += 4;
          break;
        default: out += e;
      }
    }
    return false;
  }
  bool number(double& out) {
    ws();
    const char* begin = s.c_str() + i;
    char* end = nullptr;
    out = std::strtod(begin, &end);
    if (end == begin) return false;
    i += static_cast<size_t>(end - begin);
    return true;
  }
  // Any value (nesting bounded by the input length).
  bool skip() {
    ws();
    if (i >= s.size()) return false;
    if (s[i] == '"') {
      std::string tmp;
      return string(tmp);
    }
    if (s[i] != '{' && s[i] != '[') {
      while (i < s.size() && s[i] != ',' && s[i] != '}' && s[i] != ']') ++i;
      return true;
    }
    int depth = 0;
    bool in_str = false;
    for (; i < s.size(); ++i) {
      const char c = s[i];
      if (in_str) {
        if (c == '\\')
          ++i;
        else if (c == '"')
          in_str = false;
      } else if (c == '"') {
        in_str = true;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if ((c == '}' || c == ']') && --depth == 0) {
        ++i;
        return true;
      }
    }
    return false;
  }

 private:
  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {  // surrogates are passed through as-is (3 bytes each); prompts rarely hold them
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
};

// A cursor just past `"key":` at the first occurrence of `"key"` in `json`, or nothing.
inline std::optional<JsonCursor> json_field(const std::string& json, const char* key) {
  const std::string pattern = std::string("\"") + key + "\"";
  const size_t at = json.find(pattern);
  if (at == std::string::npos) return std::nullopt;
  JsonCursor c{json, at + pattern.size()};
  if (!c.eat(':')) return std::nullopt;
  return c;
}

}  // namespace tandem::bench
