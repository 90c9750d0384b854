// Python's str methods over UTF-8 text, by code point as Python counts: len, indexing and
// slicing, case mapping (ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic: the scripts a
// chat template's upper/lower/title meet; other letters are left as they are), strip and split.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/utf8.h"

namespace tandem::model::jinja {

std::vector<std::string_view> code_points(std::string_view s);
using runtime::append_utf8;
// str.splitlines() for \n, \r\n and \r (no line ends kept).
std::vector<std::string> splitlines(std::string_view s);
size_t code_point_count(std::string_view s);
std::string to_upper(std::string_view s);
std::string to_lower(std::string_view s);
std::string to_title(std::string_view s);        // str.title()
std::string to_capitalized(std::string_view s);  // str.capitalize()
// str.strip/lstrip/rstrip: Python whitespace when `chars` is absent, else any of its characters.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// str.split(sep, maxsplit): on runs of whitespace when sep is absent. Error on an empty sep.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::string replace(std::string_view s, std::string_view from, std::string_view to, int64_t count);
// Python's slice indices clamped as list[start:stop:step] does, for a sequence of `size`.
std::vector<size_t> slice_indices(size_t size, std::optional<int64_t> start, std::optional<int64_t> stop,
                                  std::optional<int64_t> step);
std::string html_escape(std::string_view s);  // markupsafe.escape

}  // namespace tandem::model::jinja
