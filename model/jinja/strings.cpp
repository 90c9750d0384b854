#include "model/jinja/strings.h"

#include <algorithm>

#include "model/jinja/lexer.h"
#include "model/jinja/value.h"

namespace tandem::model::jinja {
namespace {

size_t char_length(std::string_view s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  return std::min(n, s.size() - i);
}

uint32_t decode(std::string_view c) {
  const auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(c[i])); };
  switch (c.size()) {
    case 2: return ((b(0) & 0x1f) << 6) | (b(1) & 0x3f);
    case 3: return ((b(0) & 0x0f) << 12) | ((b(1) & 0x3f) << 6) | (b(2) & 0x3f);
    case 4: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3f) << 12) | ((b(2) & 0x3f) << 6) | (b(3) & 0x3f);
    default: return b(0);
  }
}

// Latin Extended-A pairs: upper case at even code points, except U+0139..U+0148 and U+0179..U+017E.
bool latin_a_upper_is_odd(uint32_t cp) { return (cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17e); }
bool in_latin_a(uint32_t cp) {
  return (cp >= 0x100 && cp <= 0x12f) || (cp >= 0x132 && cp <= 0x137) || (cp >= 0x139 && cp <= 0x148) ||
         (cp >= 0x14a && cp <= 0x177) || (cp >= 0x179 && cp <= 0x17e);
}

uint32_t upper_cp(uint32_t cp) {
  if (cp >= 'a' && cp <= 'z') return cp - 32;
  if (cp < 0x80) return cp;
  if ((cp >= 0xe0 && cp <= 0xfe && cp != 0xf7) || (cp >= 0x3b1 && cp <= 0x3cb && cp != 0x3c2) ||
      (cp >= 0x430 && cp <= 0x44f)) {
    return cp - 32;
  }
  if (cp == 0xff) return 0x178;
  if (cp == 0xb5) return 0x39c;
  if (cp == 0x3c2) return 0x3a3;
  if (cp == 0x3ac) return 0x386;
  if (cp >= 0x3ad && cp <= 0x3af) return cp - 37;
  if (cp == 0x3cc) return 0x38c;
  if (cp == 0x3cd || cp == 0x3ce) return cp - 63;
  if (cp >= 0x450 && cp <= 0x45f) return cp - 80;
  if (in_latin_a(cp) && (cp % 2 == 1) != latin_a_upper_is_odd(cp)) return cp - 1;
  return cp;
}

uint32_t lower_cp(uint32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + 32;
  if (cp < 0x80) return cp;
  if ((cp >= 0xc0 && cp <= 0xde && cp != 0xd7) || (cp >= 0x391 && cp <= 0x3ab && cp != 0x3a2) ||
      (cp >= 0x410 && cp <= 0x42f)) {
    return cp + 32;
  }
  if (cp == 0x178) return 0xff;
  if (cp == 0x386) return 0x3ac;
  if (cp >= 0x388 && cp <= 0x38a) return cp + 37;
  if (cp == 0x38c) return 0x3cc;
  if (cp == 0x38e || cp == 0x38f) return cp + 63;
  if (cp >= 0x400 && cp <= 0x40f) return cp + 80;
  if (in_latin_a(cp) && (cp % 2 == 1) == latin_a_upper_is_odd(cp)) return cp + 1;
  return cp;
}

bool is_cased(uint32_t cp) { return upper_cp(cp) != cp || lower_cp(cp) != cp || cp == 0xdf; }

void append_upper(std::string& out, std::string_view c) {
  const uint32_t cp = decode(c);
  if (cp == 0xdf) {
    out += "SS";
  } else if (const uint32_t u = upper_cp(cp); u != cp) {
    append_utf8(out, u);
  } else {
    out += c;
  }
}

void append_lower(std::string& out, std::string_view c) {
  const uint32_t cp = decode(c);
  if (const uint32_t l = lower_cp(cp); l != cp) {
    append_utf8(out, l);
  } else {
    out += c;
  }
}

}  // namespace

std::vector<std::string> splitlines(std::string_view s) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\n' && s[i] != '\r') continue;
    lines.emplace_back(s.substr(start, i - start));
    if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
    start = i + 1;
  }
  if (start < s.size()) lines.emplace_back(s.substr(start));
  return lines;
}

std::vector<std::string_view> code_points(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = char_length(s, i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

size_t code_point_count(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i += char_length(s, i)) ++n;
  return n;
}

std::string to_upper(std::string_view s) {
  std::string out;
  for (auto c : code_points(s)) append_upper(out, c);
  return out;
}

std::string to_lower(std::string_view s) {
  std::string out;
  for (auto c : code_points(s)) append_lower(out, c);
  return out;
}

std::string to_title(std::string_view s) {
  std::string out;
  bool previous_cased = false;
  for (auto c : code_points(s)) {
    const uint32_t cp = decode(c);
    previous_cased ? append_lower(out, c) : append_upper(out, c);
    previous_cased = is_cased(cp);
  }
  return out;
}

std::string to_capitalized(std::string_view s) {
  std::string out;
  bool first = true;
  for (auto c : code_points(s)) {
    first ? append_upper(out, c) : append_lower(out, c);
    first = false;
  }
  return out;
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  if (!chars) {
    if (left) s = lstrip_space(s);
    if (right) s = rstrip_space(s);
    return std::string(s);
  }
  auto points = code_points(s);
  const auto set = code_points(*chars);
  const auto in_set = [&](std::string_view c) { return std::find(set.begin(), set.end(), c) != set.end(); };
  size_t begin = 0, end = points.size();
  while (left && begin < end && in_set(points[begin])) ++begin;
  while (right && end > begin && in_set(points[end - 1])) --end;
  std::string out;
  for (size_t i = begin; i < end; ++i) out += points[i];
  return out;
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw Error("empty separator");
    size_t start = 0;
    for (size_t at; (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) &&
                    (at = s.find(*sep, start)) != std::string_view::npos;) {
      out.emplace_back(s.substr(start, at - start));
      start = at + sep->size();
    }
    out.emplace_back(s.substr(start));
    return out;
  }
  for (s = lstrip_space(s); !s.empty(); s = lstrip_space(s)) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      out.emplace_back(rstrip_space(s));
      break;
    }
    size_t end = 0;
    while (end < s.size() && !whitespace_at(s, end)) end += char_length(s, end);
    out.emplace_back(s.substr(0, end));
    s = s.substr(end);
  }
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  if (maxsplit < 0 || !sep) {
    if (maxsplit >= 0) throw Error("unsupported: rsplit without a separator but with maxsplit");
    return split(s, sep, maxsplit);
  }
  if (sep->empty()) throw Error("empty separator");
  std::vector<std::string> out;
  size_t end = s.size();
  while (static_cast<int64_t>(out.size()) < maxsplit) {
    const size_t at = end >= sep->size() ? s.rfind(*sep, end - sep->size()) : std::string_view::npos;
    if (at == std::string_view::npos) break;
    out.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
    end = at;
  }
  out.emplace_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

std::string replace(std::string_view s, std::string_view from, std::string_view to, int64_t count) {
  std::string out;
  if (from.empty()) {
    auto points = code_points(s);
    int64_t done = 0;
    for (auto c : points) {
      if (count < 0 || done++ < count) out += to;
      out += c;
    }
    if (count < 0 || done < count) out += to;
    return out;
  }
  size_t start = 0;
  for (int64_t done = 0; count < 0 || done < count; ++done) {
    const size_t at = s.find(from, start);
    if (at == std::string_view::npos) break;
    out.append(s.substr(start, at - start));
    out.append(to);
    start = at + from.size();
  }
  out.append(s.substr(start));
  return out;
}

std::vector<size_t> slice_indices(size_t size, std::optional<int64_t> start, std::optional<int64_t> stop,
                                  std::optional<int64_t> step) {
  const int64_t n = static_cast<int64_t>(size), st = step.value_or(1);
  if (st == 0) throw Error("slice step cannot be zero");
  const auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v < 0 ? *v + n : *v;
    if (st > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t b = clamp(start, st > 0 ? 0 : n - 1), e = clamp(stop, st > 0 ? n : -1);
  std::vector<size_t> out;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) out.push_back(static_cast<size_t>(i));
  return out;
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace tandem::model::jinja
