// Writing JSON (the CLI's --json output, tandem bench's reports): strings escaped (any bytes in: control
// characters escaped, invalid UTF-8 as \ufffd) and numbers that stay valid JSON.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>

#include "runtime/utf8.h"

namespace tandem::runtime {

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

}  // namespace tandem::runtime
