// UTF-8 as RFC 3629 defines it (no overlongs, no surrogates, nothing past U+10FFFF):
// what the detokenizers and the JSON writers share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::runtime {

// A lead byte's sequence length (1 for ASCII, 0 when it can never start a character) and
// the allowed range of the second byte.
struct Utf8Lead {
  size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;
};

inline Utf8Lead utf8_lead(unsigned char c) {
  Utf8Lead l;
  if (c < 0x80) {
    l.len = 1;
  } else if (c >= 0xC2 && c <= 0xDF) {
    l.len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    l.len = 3;
    if (c == 0xE0) l.lo = 0xA0;
    if (c == 0xED) l.hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    l.len = 4;
    if (c == 0xF0) l.lo = 0x90;
    if (c == 0xF4) l.hi = 0x8F;
  }
  return l;
}

inline bool utf8_continues(const Utf8Lead& l, size_t k, unsigned char b) {
  return k == 1 ? (b >= l.lo && b <= l.hi) : (b >= 0x80 && b <= 0xBF);
}

// Length of the well-formed character starting at s[i], or 0 when there is none.
inline size_t utf8_sequence_length(std::string_view s, size_t i) {
  const Utf8Lead l = utf8_lead(static_cast<unsigned char>(s[i]));
  if (l.len == 0 || i + l.len > s.size()) return 0;
  for (size_t k = 1; k < l.len; ++k)
    if (!utf8_continues(l, k, static_cast<unsigned char>(s[i + k]))) return 0;
  return l.len;
}

// True when `s` is well-formed UTF-8 throughout.
inline bool utf8_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

// Appends code point `cp` (at most U+10FFFF) as UTF-8; a surrogate gets its 3-byte form, which is
// not well-formed UTF-8 (callers that must stay valid keep surrogates out).
inline void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

// The length of the prefix of `s` that can be released now: whole characters, and bytes
// that can never start or continue a valid character. What remains (at most 3 bytes) is
// the valid beginning of a character that the next bytes may complete.
inline size_t utf8_releasable_prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const Utf8Lead l = utf8_lead(static_cast<unsigned char>(s[i]));
    if (l.len <= 1) {  // ASCII, or a byte that never starts a character
      ++i;
      continue;
    }
    size_t k = 1;
    for (; k < l.len; ++k) {
      if (i + k >= s.size()) return i;  // valid so far, incomplete: wait for more
      if (!utf8_continues(l, k, static_cast<unsigned char>(s[i + k]))) break;
    }
    // Complete (k == len) or broken at byte k: either way s[i, i + k) is decided; a
    // breaking byte is looked at again as the start of the next character.
    i += k;
  }
  return i;
}

}  // namespace tandem::runtime
