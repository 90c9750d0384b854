// Template source -> tokens, as Jinja's lexer splits it with trim_blocks and lstrip_blocks on:
// text between tags (with `{%-`/`-%}` whitespace control, the first newline after a block or
// comment tag dropped, a tag's own line's leading blanks dropped), then the tokens inside each
// `{{ }}` and `{% %}`. Comments vanish; {% raw %} bodies become text.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem::model::jinja {

struct Token {
  enum class Type { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEnd };
  Type type;
  std::string text;  // text, name, operator, the unescaped string, or the number's digits
  int line = 1;
};

// Throws Error (naming the line) on an unterminated tag, comment or string, or a stray character.
std::vector<Token> tokenize(std::string_view source);

// Python's str.isspace() for one code point, and the UTF-8 length of the whitespace at `s[i]`
// (0 when none): strip(), split() and Jinja's `-` whitespace control use Python's definition.
size_t whitespace_at(std::string_view s, size_t i);
// `s` without trailing / leading Python whitespace.
std::string_view rstrip_space(std::string_view s);
std::string_view lstrip_space(std::string_view s);

}  // namespace tandem::model::jinja
