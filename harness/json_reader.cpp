#include "harness/json_reader.h"

#include <cstdlib>

namespace tandem::bench {

void JsonCursor::ws() {
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
}

bool JsonCursor::eat(char c) {
  ws();
  if (i >= s.size() || s[i] != c) return false;
  ++i;
  return true;
}

namespace {

void append_utf8(std::string& out, unsigned cp) {
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

}  // namespace

bool JsonCursor::string(std::string& out) {
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

bool JsonCursor::number(double& out) {
  ws();
  const char* begin = s.c_str() + i;
  char* end = nullptr;
  out = std::strtod(begin, &end);
  if (end == begin) return false;
  i += static_cast<size_t>(end - begin);
  return true;
}

bool JsonCursor::skip() {
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

std::optional<JsonCursor> json_field(const std::string& json, const char* key) {
  const std::string pattern = std::string("\"") + key + "\"";
  const size_t at = json.find(pattern);
  if (at == std::string::npos) return std::nullopt;
  JsonCursor c{json, at + pattern.size()};
  if (!c.eat(':')) return std::nullopt;
  return c;
}

}  // namespace tandem::bench
