// Writing JSON for the CLI's --json output: strings escaped (any bytes in: control
// characters escaped, invalid UTF-8 as \ufffd) and numbers that stay valid JSON.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>

namespace tandem::cli {

// Length of the well-formed UTF-8 sequence starting at s[i], 0 when it is not one
// (overlong forms, surrogates and code points past U+10FFFF are not well formed).
inline size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = at(i);
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  if (at(i + 1) < lo || at(i + 1) > hi) return 0;
  for (size_t k = 2; k < len; ++k)
    if ((at(i + k) & 0xC0) != 0x80) return 0;
  return len;
}

// Appends `s` as a JSON string literal.
inline void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    if (const size_t len = utf8_sequence_length(s, i)) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out += "\\ufffd";  // one replacement per byte that starts no well-formed character
      ++i;
    }
  }
  out += '"';
}

inline std::string json_string(std::string_view s) {
  std::string out;
  append_json_string(out, s);
  return out;
}

// A number with enough digits for a float logprob; null for NaN and infinities.
inline std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.7g", v);
  return buf;
}

}  // namespace tandem::cli
