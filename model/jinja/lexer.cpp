#include "model/jinja/lexer.h"

#include <algorithm>
#include <cstring>

#include "model/jinja/strings.h"
#include "model/jinja/value.h"

namespace tandem::model::jinja {

size_t whitespace_at(std::string_view s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return 1;
  if (c < 0x80 || i + 1 >= s.size()) return 0;
  const unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
  if (c == 0xc2) return c1 == 0x85 || c1 == 0xa0 ? 2 : 0;
  if (i + 2 >= s.size()) return 0;
  const unsigned char c2 = static_cast<unsigned char>(s[i + 2]);
  const unsigned cp = ((c & 0x0f) << 12) | ((c1 & 0x3f) << 6) | (c2 & 0x3f);
  if ((c & 0xf0) != 0xe0) return 0;
  const bool space = cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
                     cp == 0x205f || cp == 0x3000;
  return space ? 3 : 0;
}

std::string_view lstrip_space(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t n = whitespace_at(s, i);
    if (!n) break;
    i += n;
  }
  return s.substr(i);
}

std::string_view rstrip_space(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;  // the start of the last character
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80 && end - start < 4) --start;
    if (whitespace_at(s, start) != end - start) break;
    end = start;
  }
  return s.substr(0, end);
}

namespace {

// Source with \r\n and \r as \n and one trailing newline dropped (keep_trailing_newline=False).
std::string normalize(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {}
  std::vector<Token> run();

 private:
  enum class Tag { kVariable, kBlock, kComment };
  void emit(Token::Type type, std::string text) { out_.push_back({type, std::move(text), line_}); }
  void advance_to(size_t pos) {
    line_ += static_cast<int>(std::count(src_.begin() + pos_, src_.begin() + pos, '\n'));
    pos_ = pos;
  }
  void emit_text(std::string_view text, char sign, Tag tag);
  bool skip_raw();
  void lex_comment();
  void lex_tag(Tag tag);
  size_t end_of_tag(Tag tag, char* sign) const;
  void after_end(char sign, bool block_like);
  void lex_token();
  void lex_string();
  void lex_number();
  [[noreturn]] void fail(const std::string& what) const {
    throw Error("template syntax error at line " + std::to_string(line_) + ": " + what);
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> out_;
  std::vector<char> braces_;
};

std::vector<Token> Lexer::run() {
  while (pos_ < src_.size()) {
    size_t at = pos_;
    Tag tag = Tag::kBlock;
    for (;; ++at) {
      at = src_.find('{', at);
      if (at == std::string::npos || at + 1 >= src_.size()) break;
      const char c = src_[at + 1];
      if (c == '{' || c == '%' || c == '#') {
        tag = c == '{' ? Tag::kVariable : c == '%' ? Tag::kBlock : Tag::kComment;
        break;
      }
    }
    if (at == std::string::npos || at + 1 >= src_.size()) {
      emit(Token::Type::kText, src_.substr(pos_));
      break;
    }
    const char sign = at + 2 < src_.size() && (src_[at + 2] == '-' || src_[at + 2] == '+') ? src_[at + 2] : 0;
    emit_text(std::string_view(src_).substr(pos_, at - pos_), sign, tag);
    advance_to(at + 2 + (sign ? 1 : 0));
    if (tag == Tag::kBlock && skip_raw()) continue;
    if (tag == Tag::kComment) {
      lex_comment();
    } else {
      lex_tag(tag);
    }
  }
  emit(Token::Type::kEnd, "");
  return std::move(out_);
}

void Lexer::emit_text(std::string_view text, char sign, Tag tag) {
  if (sign == '-') {
    text = rstrip_space(text);
  } else if (sign != '+' && tag != Tag::kVariable) {
    const size_t nl = text.rfind('\n');
    const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
    if ((l_pos > 0 || line_starting_) && text.find_first_not_of(" \t", l_pos) == std::string_view::npos) {
      text = text.substr(0, l_pos);
    }
  }
  if (!text.empty()) emit(Token::Type::kText, std::string(text));
}

// After `{%`: a {% raw %} ... {% endraw %} block becomes text as it stands.
bool Lexer::skip_raw() {
  size_t p = pos_;
  while (p < src_.size() && std::strchr(" \t\n", src_[p])) ++p;
  if (src_.compare(p, 3, "raw") != 0) return false;
  p += 3;
  while (p < src_.size() && std::strchr(" \t\n", src_[p])) ++p;
  char sign = 0;
  if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
  if (src_.compare(p, 2, "%}") != 0) return false;
  advance_to(p + 2);
  after_end(sign, true);
  for (size_t at = pos_;; ++at) {
    at = src_.find("{%", at);
    if (at == std::string::npos) fail("missing end of raw directive");
    size_t q = at + 2;
    const char open_sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q++] : 0;
    while (q < src_.size() && std::strchr(" \t\n", src_[q])) ++q;
    if (src_.compare(q, 6, "endraw") != 0) continue;
    q += 6;
    while (q < src_.size() && std::strchr(" \t\n", src_[q])) ++q;
    char close_sign = 0;
    if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) close_sign = src_[q++];
    if (src_.compare(q, 2, "%}") != 0) continue;
    emit_text(std::string_view(src_).substr(pos_, at - pos_), open_sign, Tag::kBlock);
    advance_to(q + 2);
    after_end(close_sign, true);
    return true;
  }
}

void Lexer::lex_comment() {
  const size_t end = src_.find("#}", pos_);
  if (end == std::string::npos) fail("missing end of comment tag");
  const char sign = end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
  advance_to(end + 2);
  after_end(sign, true);
}

// What follows a closing delimiter: `-` eats all whitespace, `+` nothing, else (blocks and
// comments, trim_blocks) one newline.
void Lexer::after_end(char sign, bool block_like) {
  size_t p = pos_;
  if (sign == '-') {
    while (p < src_.size()) {
      const size_t n = whitespace_at(src_, p);
      if (!n) break;
      p += n;
    }
  } else if (sign != '+' && block_like && p < src_.size() && src_[p] == '\n') {
    ++p;
  }
  advance_to(p);
  line_starting_ = pos_ > 0 && src_[pos_ - 1] == '\n';
}

// The position of the closing delimiter's sign or first character, when it starts at pos_.
size_t Lexer::end_of_tag(Tag tag, char* sign) const {
  const char* close = tag == Tag::kVariable ? "}}" : "%}";
  if (!braces_.empty()) return std::string::npos;
  if (src_.compare(pos_, 2, close) == 0) {
    *sign = 0;
    return pos_ + 2;
  }
  if ((src_[pos_] == '-' || src_[pos_] == '+') && src_.compare(pos_ + 1, 2, close) == 0) {
    if (tag == Tag::kVariable && src_[pos_] == '+') return std::string::npos;
    *sign = src_[pos_];
    return pos_ + 3;
  }
  return std::string::npos;
}

void Lexer::lex_tag(Tag tag) {
  emit(tag == Tag::kVariable ? Token::Type::kVarBegin : Token::Type::kBlockBegin, "");
  braces_.clear();
  for (;;) {
    while (pos_ < src_.size() && std::strchr(" \t\n\r\f\v", src_[pos_])) advance_to(pos_ + 1);
    if (pos_ >= src_.size()) fail(tag == Tag::kVariable ? "unexpected end of template in {{" : "unexpected end in {%");
    char sign = 0;
    const size_t end = end_of_tag(tag, &sign);
    if (end != std::string::npos) {
      emit(tag == Tag::kVariable ? Token::Type::kVarEnd : Token::Type::kBlockEnd, "");
      advance_to(end);
      after_end(sign, tag == Tag::kBlock);
      return;
    }
    lex_token();
  }
}

void Lexer::lex_token() {
  const char c = src_[pos_];
  if (c == '\'' || c == '"') return lex_string();
  if (c >= '0' && c <= '9') return lex_number();
  if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
    size_t end = pos_;
    while (end < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) ++end;
    emit(Token::Type::kName, src_.substr(pos_, end - pos_));
    return advance_to(end);
  }
  static const char* const kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
                                     "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};
  for (const char* op : kOps) {
    if (src_.compare(pos_, std::strlen(op), op) != 0) continue;
    if (std::strchr("([{", op[0]) && op[1] == 0) braces_.push_back(op[0]);
    if (std::strchr(")]}", op[0]) && op[1] == 0) {
      if (braces_.empty()) fail(std::string("unexpected '") + op + "'");
      braces_.pop_back();
    }
    emit(Token::Type::kOp, op);
    return advance_to(pos_ + std::strlen(op));
  }
  fail(std::string("unexpected char '") + c + "'");
}

// A string literal, its escapes decoded as Python's unicode-escape codec does.
void Lexer::lex_string() {
  const char quote = src_[pos_];
  std::string value;
  size_t p = pos_ + 1;
  for (;; ++p) {
    if (p >= src_.size()) fail("unterminated string");
    const char c = src_[p];
    if (c == quote) break;
    if (c != '\\') {
      value += c;
      continue;
    }
    if (++p >= src_.size()) fail("unterminated string");
    const char e = src_[p];
    static const char kSimple[] = "\\\\''\"\"a\ab\bf\fn\nr\rt\tv\v";
    if (const char* hit = std::strchr(kSimple, e); hit && e != 0 && (hit - kSimple) % 2 == 0) {
      value += hit[1];
    } else if (e == '\n') {
      // a backslash-newline joins the lines
    } else if (e == 'x' || e == 'u' || e == 'U') {
      const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
      if (p + digits >= src_.size()) fail("truncated \\" + std::string(1, e) + " escape");
      const std::string hex = src_.substr(p + 1, digits);
      if (hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
        fail("bad \\" + std::string(1, e) + " escape");
      append_utf8(value, static_cast<uint32_t>(std::stoul(hex, nullptr, 16)));
      p += digits;
    } else if (e >= '0' && e <= '7') {
      uint32_t cp = 0;
      size_t n = 0;
      while (n < 3 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7') cp = cp * 8 + (src_[p++] - '0'), ++n;
      --p;
      append_utf8(value, cp);
    } else {
      value += '\\';
      value += e;
    }
  }
  emit(Token::Type::kString, std::move(value));
  advance_to(p + 1);
}

// Integers and floats (`1_000`, `1.5`, `2e3`), underscores dropped.
void Lexer::lex_number() {
  size_t p = pos_;
  auto digits = [&] {
    while (p < src_.size() &&
           (std::isdigit(static_cast<unsigned char>(src_[p])) ||
            (src_[p] == '_' && p + 1 < src_.size() && std::isdigit(static_cast<unsigned char>(src_[p + 1]))))) {
      ++p;
    }
  };
  digits();
  bool is_float = false;
  if (p + 1 < src_.size() && src_[p] == '.' && std::isdigit(static_cast<unsigned char>(src_[p + 1]))) {
    ++p;
    digits();
    is_float = true;
  }
  if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
    size_t q = p + 1;
    if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
    if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
      p = q;
      digits();
      is_float = true;
    }
  }
  std::string text = src_.substr(pos_, p - pos_);
  text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
  emit(is_float ? Token::Type::kFloat : Token::Type::kInt, std::move(text));
  advance_to(p);
}

}  // namespace

std::vector<Token> tokenize(std::string_view source) { return Lexer(normalize(source)).run(); }

}  // namespace tandem::model::jinja
