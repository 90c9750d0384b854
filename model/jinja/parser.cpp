#include "model/jinja/parser.h"

#include <string>

#include "model/jinja/lexer.h"

namespace tandem::model::jinja {
namespace {

using T = Token::Type;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}
  Body parse_template() {
    Body body = parse_body({});
    if (cur().type != T::kEnd) fail("unexpected '" + block_name_ + "'");
    return body;
  }

 private:
  const Token& cur() const { return tokens_[pos_]; }
  const Token& peek(size_t n = 1) const { return tokens_[std::min(pos_ + n, tokens_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == T::kOp && cur().text == op; }
  bool is_name(const char* name) const { return cur().type == T::kName && cur().text == name; }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    ++pos_;
    return true;
  }
  bool accept_name(const char* name) {
    if (!is_name(name)) return false;
    ++pos_;
    return true;
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) fail(std::string("expected '") + op + "'");
  }
  std::string expect_name() {
    if (cur().type != T::kName) fail("expected a name");
    return tokens_[pos_++].text;
  }
  void expect_block_end() {
    if (cur().type != T::kBlockEnd) fail("expected end of statement block");
    ++pos_;
  }
  [[noreturn]] void fail(const std::string& what) const {
    std::string got = cur().type == T::kEnd ? "end of template"
                      : cur().text.empty()  ? "a delimiter"
                                            : "'" + cur().text + "'";
    throw Error("template syntax error at line " + std::to_string(cur().line) + ": " + what + " (got " + got + ")");
  }
  ExprPtr node(Expr::Kind kind) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = cur().line;
    return e;
  }

  Body parse_body(const std::vector<std::string>& end_tags);
  std::unique_ptr<Stmt> parse_statement();
  std::unique_ptr<Stmt> parse_if();
  std::unique_ptr<Stmt> parse_for();
  std::unique_ptr<Stmt> parse_set();
  std::unique_ptr<Stmt> parse_macro();
  std::unique_ptr<Stmt> parse_call_block();
  std::unique_ptr<Stmt> parse_filter_block();
  void parse_params(std::vector<std::pair<std::string, ExprPtr>>& params);
  std::vector<std::string> parse_targets(bool* attribute);

  ExprPtr parse_tuple(bool with_condition = true, bool explicit_parens = false);
  ExprPtr parse_expression(bool with_condition = true);
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_keyword_chain(const char* op, ExprPtr (Parser::*operand)());
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_binary(int level);
  ExprPtr parse_unary(bool with_filter = true);
  ExprPtr parse_primary();
  ExprPtr parse_collection(const char* close, Expr::Kind kind);
  ExprPtr parse_postfix(ExprPtr e);
  ExprPtr parse_filters(ExprPtr e);
  ExprPtr parse_subscript(ExprPtr e);
  ExprPtr parse_filter(ExprPtr input);
  ExprPtr parse_test(ExprPtr input);
  void parse_call_args(Expr& call);

  // Nesting of statements and parenthesised expressions: bounded (as the interpreter's depth)
  // so that a deep template fails with an error instead of overflowing the stack.
  struct Nesting {
    explicit Nesting(Parser& p) : parser(p) {
      if (++parser.depth_ > 200) parser.fail("nesting deeper than 200");
    }
    ~Nesting() { --parser.depth_; }
    Parser& parser;
  };

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  std::string block_name_;  // the tag that ended the last body
};

// Statements and text until `{% <one of end_tags>`; leaves pos_ on that tag's name.
Body Parser::parse_body(const std::vector<std::string>& end_tags) {
  Body body;
  for (;;) {
    const Token& t = cur();
    if (t.type == T::kEnd) {
      if (!end_tags.empty()) fail("missing '{% " + end_tags.back() + " %}'");
      return body;
    }
    if (t.type == T::kText) {
      auto s = std::make_unique<Stmt>();
      s->kind = Stmt::Kind::kText;
      s->text = t.text;
      body.push_back(std::move(s));
      ++pos_;
    } else if (t.type == T::kVarBegin) {
      auto s = std::make_unique<Stmt>();
      s->kind = Stmt::Kind::kOutput;
      s->line = t.line;
      ++pos_;
      s->expr = parse_tuple();
      if (cur().type != T::kVarEnd) fail("expected end of print statement");
      ++pos_;
      body.push_back(std::move(s));
    } else if (t.type == T::kBlockBegin) {
      ++pos_;
      if (cur().type == T::kName) {
        for (const auto& tag : end_tags) {
          if (cur().text == tag) {
            block_name_ = tag;
            return body;
          }
        }
      }
      body.push_back(parse_statement());
    } else {
      fail("unexpected token");
    }
  }
}

std::unique_ptr<Stmt> Parser::parse_statement() {
  Nesting nesting(*this);
  if (cur().type != T::kName) fail("expected a statement name");
  const std::string name = cur().text;
  const int line = cur().line;
  std::unique_ptr<Stmt> s;
  if (name == "if") {
    s = parse_if();
  } else if (name == "for") {
    s = parse_for();
  } else if (name == "set") {
    s = parse_set();
  } else if (name == "macro") {
    s = parse_macro();
  } else if (name == "call") {
    s = parse_call_block();
  } else if (name == "filter") {
    s = parse_filter_block();
  } else if (name == "break" || name == "continue" || name == "generation") {
    ++pos_;
    expect_block_end();
    s = std::make_unique<Stmt>();
    s->kind = name == "break"      ? Stmt::Kind::kBreak
              : name == "continue" ? Stmt::Kind::kContinue
                                   : Stmt::Kind::kGeneration;
    if (s->kind == Stmt::Kind::kGeneration) {
      s->body = parse_body({"endgeneration"});
      ++pos_;
      expect_block_end();
    }
  } else {
    fail("unsupported tag '" + name + "'");
  }
  s->line = line;
  return s;
}

std::unique_ptr<Stmt> Parser::parse_if() {
  auto s = std::make_unique<Stmt>();
  s->kind = Stmt::Kind::kIf;
  ++pos_;  // if
  for (;;) {
    ExprPtr condition = parse_tuple(false);
    expect_block_end();
    Body body = parse_body({"elif", "else", "endif"});
    s->branches.emplace_back(std::move(condition), std::move(body));
    const std::string tag = expect_name();
    if (tag == "elif") continue;
    if (tag == "else") {
      expect_block_end();
      s->branches.emplace_back(nullptr, parse_body({"endif"}));
      ++pos_;
    }
    expect_block_end();
    return s;
  }
}

std::vector<std::string> Parser::parse_targets(bool* attribute) {
  std::vector<std::string> names;
  const bool parens = accept_op("(");
  names.push_back(expect_name());
  if (attribute && !parens && accept_op(".")) {
    *attribute = true;
    names.push_back(expect_name());
    return names;
  }
  while (accept_op(",")) {
    if (cur().type != T::kName) break;
    names.push_back(expect_name());
  }
  if (parens) expect_op(")");
  return names;
}

std::unique_ptr<Stmt> Parser::parse_for() {
  auto s = std::make_unique<Stmt>();
  s->kind = Stmt::Kind::kFor;
  ++pos_;  // for
  s->targets = parse_targets(nullptr);
  if (!accept_name("in")) fail("expected 'in'");
  s->expr = parse_tuple(false);
  if (accept_name("if")) s->condition = parse_expression();
  if (is_name("recursive")) fail("unsupported: recursive for loops");
  expect_block_end();
  s->body = parse_body({"endfor", "else"});
  if (expect_name() == "else") {
    expect_block_end();
    s->else_body = parse_body({"endfor"});
    ++pos_;
  }
  expect_block_end();
  return s;
}

std::unique_ptr<Stmt> Parser::parse_set() {
  auto s = std::make_unique<Stmt>();
  ++pos_;  // set
  s->targets = parse_targets(&s->attribute);
  if (accept_op("=")) {
    s->kind = Stmt::Kind::kSet;
    s->expr = parse_tuple();
    expect_block_end();
    return s;
  }
  if (s->attribute || s->targets.size() != 1) fail("expected '='");
  s->kind = Stmt::Kind::kSetBlock;
  if (is_op("|")) s->expr = parse_filter(nullptr);
  expect_block_end();
  s->body = parse_body({"endset"});
  ++pos_;
  expect_block_end();
  return s;
}

void Parser::parse_params(std::vector<std::pair<std::string, ExprPtr>>& params) {
  expect_op("(");
  while (!accept_op(")")) {
    if (!params.empty()) expect_op(",");
    if (accept_op(")")) break;
    std::string name = expect_name();
    ExprPtr fallback = accept_op("=") ? parse_expression() : nullptr;
    params.emplace_back(std::move(name), std::move(fallback));
  }
}

std::unique_ptr<Stmt> Parser::parse_macro() {
  auto s = std::make_unique<Stmt>();
  s->kind = Stmt::Kind::kMacro;
  ++pos_;  // macro
  s->text = expect_name();
  parse_params(s->params);
  expect_block_end();
  s->body = parse_body({"endmacro"});
  ++pos_;
  expect_block_end();
  return s;
}

std::unique_ptr<Stmt> Parser::parse_call_block() {
  auto s = std::make_unique<Stmt>();
  s->kind = Stmt::Kind::kCallBlock;
  ++pos_;  // call
  if (is_op("(")) parse_params(s->params);
  s->expr = parse_expression();
  if (s->expr->kind != Expr::Kind::kCall) fail("expected a call");
  expect_block_end();
  s->body = parse_body({"endcall"});
  ++pos_;
  expect_block_end();
  return s;
}

std::unique_ptr<Stmt> Parser::parse_filter_block() {
  auto s = std::make_unique<Stmt>();
  s->kind = Stmt::Kind::kFilterBlock;
  s->expr = parse_filter(nullptr);  // the tag's name stands where a '|' would
  expect_block_end();
  s->body = parse_body({"endfilter"});
  ++pos_;
  expect_block_end();
  return s;
}

ExprPtr Parser::parse_tuple(bool with_condition, bool explicit_parens) {
  ExprPtr first;
  auto tuple = node(Expr::Kind::kTuple);
  bool is_tuple = false;
  for (;;) {
    if (is_tuple && (cur().type == T::kBlockEnd || cur().type == T::kVarEnd || is_op(")"))) break;
    if (explicit_parens && !is_tuple && is_op(")")) return tuple;  // ()
    ExprPtr e = parse_expression(with_condition);
    if (!accept_op(",")) {
      if (!is_tuple) return e;
      tuple->children.push_back(std::move(e));
      break;
    }
    is_tuple = true;
    tuple->children.push_back(std::move(e));
  }
  return tuple;
}

ExprPtr Parser::parse_expression(bool with_condition) {
  ExprPtr e = parse_or();
  while (with_condition && is_name("if")) {
    ++pos_;
    auto c = node(Expr::Kind::kCondition);
    c->children.push_back(parse_or());
    c->children.push_back(std::move(e));
    c->children.push_back(accept_name("else") ? parse_expression() : nullptr);
    e = std::move(c);
  }
  return e;
}

ExprPtr Parser::parse_or() { return parse_keyword_chain("or", &Parser::parse_and); }

ExprPtr Parser::parse_and() { return parse_keyword_chain("and", &Parser::parse_not); }

// `operand (op operand)*` for the keyword operator `op`, left-associative.
ExprPtr Parser::parse_keyword_chain(const char* op, ExprPtr (Parser::*operand)()) {
  ExprPtr left = (this->*operand)();
  while (is_name(op)) {
    auto b = node(Expr::Kind::kBinary);
    ++pos_;
    b->name = op;
    b->children.push_back(std::move(left));
    b->children.push_back((this->*operand)());
    left = std::move(b);
  }
  return left;
}

ExprPtr Parser::parse_not() {
  if (!is_name("not")) return parse_compare();
  auto u = node(Expr::Kind::kUnary);
  ++pos_;
  u->name = "not";
  u->children.push_back(parse_not());
  return u;
}

ExprPtr Parser::parse_compare() {
  ExprPtr first = parse_binary(0);
  auto c = node(Expr::Kind::kCompare);
  for (;;) {
    std::string op;
    if (cur().type == T::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" ||
                                 cur().text == "<=" || cur().text == ">=")) {
      op = tokens_[pos_++].text;
    } else if (accept_name("in")) {
      op = "in";
    } else if (is_name("not") && peek().type == T::kName && peek().text == "in") {
      pos_ += 2;
      op = "notin";
    } else {
      break;
    }
    c->ops.push_back(op);
    c->children.push_back(parse_binary(0));
  }
  if (c->ops.empty()) return first;
  c->children.insert(c->children.begin(), std::move(first));
  return c;
}

// Levels, loosest first: + -, ~, * / // %, **.
ExprPtr Parser::parse_binary(int level) {
  static const std::vector<std::vector<std::string>> kLevels = {{"+", "-"}, {"~"}, {"*", "/", "//", "%"}, {"**"}};
  if (level == 4) return parse_unary();
  ExprPtr left = parse_binary(level + 1);
  for (;;) {
    if (cur().type != T::kOp) return left;
    const auto& ops = kLevels[level];
    if (std::find(ops.begin(), ops.end(), cur().text) == ops.end()) return left;
    auto b = node(Expr::Kind::kBinary);
    b->name = tokens_[pos_++].text;
    b->children.push_back(std::move(left));
    b->children.push_back(parse_binary(level + 1));
    left = std::move(b);
  }
}

ExprPtr Parser::parse_unary(bool with_filter) {
  Nesting nesting(*this);
  ExprPtr e;
  if (is_op("-") || is_op("+")) {
    e = node(Expr::Kind::kUnary);
    e->name = tokens_[pos_++].text;
    e->children.push_back(parse_unary(false));
  } else {
    e = parse_primary();
  }
  e = parse_postfix(std::move(e));
  return with_filter ? parse_filters(std::move(e)) : std::move(e);
}

ExprPtr Parser::parse_primary() {
  const Token& t = cur();
  ExprPtr e = node(Expr::Kind::kConst);
  switch (t.type) {
    case T::kName:
      ++pos_;
      if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
        e->value = Value(t.text[0] == 't' || t.text[0] == 'T');
      } else if (t.text == "none" || t.text == "None") {
        e->value = Value::none();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = t.text;
      }
      return e;
    case T::kString: {
      std::string s;
      while (cur().type == T::kString) s += tokens_[pos_++].text;
      e->value = Value(std::move(s));
      return e;
    }
    case T::kInt:
      ++pos_;
      try {
        e->value = Value(static_cast<int64_t>(std::stoll(t.text)));
      } catch (const std::out_of_range&) {
        fail("integer literal out of range");
      }
      return e;
    case T::kFloat:
      ++pos_;
      e->value = Value(std::strtod(t.text.c_str(), nullptr));
      return e;
    case T::kOp:
      if (accept_op("(")) {
        ExprPtr inner = parse_tuple(true, true);
        expect_op(")");
        return inner;
      }
      if (accept_op("[")) return parse_collection("]", Expr::Kind::kList);
      if (accept_op("{")) return parse_collection("}", Expr::Kind::kDict);
      break;
    default: break;
  }
  fail("unexpected token in expression");
}

ExprPtr Parser::parse_collection(const char* close, Expr::Kind kind) {
  ExprPtr e = node(kind);
  while (!accept_op(close)) {
    if (!e->children.empty()) {
      expect_op(",");
      if (accept_op(close)) break;
    }
    e->children.push_back(parse_expression());
    if (kind == Expr::Kind::kDict) {
      expect_op(":");
      e->children.push_back(parse_expression());
    }
  }
  return e;
}

ExprPtr Parser::parse_postfix(ExprPtr e) {
  for (;;) {
    if (is_op(".") || is_op("[")) {
      e = parse_subscript(std::move(e));
    } else if (is_op("(")) {
      auto call = node(Expr::Kind::kCall);
      call->children.push_back(std::move(e));
      parse_call_args(*call);
      e = std::move(call);
    } else {
      return e;
    }
  }
}

ExprPtr Parser::parse_filters(ExprPtr e) {
  for (;;) {
    if (is_op("|")) {
      e = parse_filter(std::move(e));
    } else if (is_name("is")) {
      e = parse_test(std::move(e));
    } else if (is_op("(")) {
      e = parse_postfix(std::move(e));
    } else {
      return e;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr e) {
  if (accept_op(".")) {
    auto item = node(cur().type == T::kInt ? Expr::Kind::kItem : Expr::Kind::kAttr);
    item->children.push_back(std::move(e));
    if (cur().type == T::kInt) {
      auto index = node(Expr::Kind::kConst);
      const std::string digits = tokens_[pos_++].text;
      if (digits.size() > 18) fail("index out of range");
      index->value = Value(static_cast<int64_t>(std::stoll(digits)));
      item->children.push_back(std::move(index));
    } else {
      item->name = expect_name();
    }
    return item;
  }
  expect_op("[");
  ExprPtr parts[3];
  int colons = 0;
  for (;;) {
    if (is_op("]")) break;
    if (accept_op(":")) {
      if (++colons > 2) fail("too many ':' in a slice");
      continue;
    }
    if (parts[colons]) fail("expected ':' or ']'");
    parts[colons] = parse_expression();
    if (colons == 0 && is_op(",")) fail("unsupported: tuple subscripts");
  }
  ++pos_;
  auto item = node(colons ? Expr::Kind::kSlice : Expr::Kind::kItem);
  item->children.push_back(std::move(e));
  if (!colons && !parts[0]) fail("expected a subscript");
  for (int i = 0; i <= (colons ? 2 : 0); ++i) item->children.push_back(std::move(parts[i]));
  return item;
}

void Parser::parse_call_args(Expr& call) {
  expect_op("(");
  bool first = true;
  while (!accept_op(")")) {
    if (!first) {
      expect_op(",");
      if (accept_op(")")) break;
    }
    first = false;
    if (is_op("*") || is_op("**")) fail("unsupported: *args and **kwargs in calls");
    if (cur().type == T::kName && peek().type == T::kOp && peek().text == "=") {
      std::string name = tokens_[pos_].text;
      pos_ += 2;
      call.kwargs.emplace_back(std::move(name), parse_expression());
    } else {
      if (!call.kwargs.empty()) fail("positional argument after a keyword argument");
      call.children.push_back(parse_expression());
    }
  }
}

ExprPtr Parser::parse_filter(ExprPtr input) {
  do {
    ++pos_;  // '|' (or the `filter` tag's name)
    auto f = node(Expr::Kind::kFilter);
    f->name = expect_name();
    while (accept_op(".")) f->name += "." + expect_name();
    f->known = has_filter(f->name);
    f->children.push_back(std::move(input));
    if (is_op("(")) parse_call_args(*f);
    input = std::move(f);
  } while (is_op("|"));
  return input;
}

ExprPtr Parser::parse_test(ExprPtr input) {
  ++pos_;  // is
  const bool negated = accept_name("not");
  auto t = node(Expr::Kind::kTest);
  t->name = expect_name();
  while (accept_op(".")) t->name += "." + expect_name();
  t->known = has_test(t->name);
  t->children.push_back(std::move(input));
  if (is_op("(")) {
    parse_call_args(*t);
  } else if ((cur().type == T::kName || cur().type == T::kString || cur().type == T::kInt || cur().type == T::kFloat ||
              is_op("(") || is_op("[") || is_op("{")) &&
             !is_name("else") && !is_name("or") && !is_name("and")) {
    if (is_name("is")) fail("you cannot chain multiple tests with is");
    t->children.push_back(parse_postfix(parse_primary()));
  }
  if (!negated) return t;
  auto n = node(Expr::Kind::kUnary);
  n->name = "not";
  n->children.push_back(std::move(t));
  return n;
}

// Jinja's compiler: an unknown filter or test fails the compile unless an `if` or a
// conditional expression encloses it within its frame (for, macro, call and filter bodies,
// set blocks start new frames).
void check_names(const Expr* e, bool soft) {
  if (!e) return;
  if (e->kind == Expr::Kind::kCondition) soft = true;
  if (!e->known && !soft) {
    throw Error("template syntax error at line " + std::to_string(e->line) + ": no " +
                (e->kind == Expr::Kind::kFilter ? "filter" : "test") + " named '" + e->name + "'");
  }
  for (const auto& c : e->children) check_names(c.get(), soft);
  for (const auto& [k, v] : e->kwargs) check_names(v.get(), soft);
}

void check_names(const Body& body, bool soft) {
  for (const auto& s : body) {
    switch (s->kind) {
      case Stmt::Kind::kIf:
        for (const auto& [condition, branch] : s->branches) {
          check_names(condition.get(), true);
          check_names(branch, true);
        }
        break;
      case Stmt::Kind::kFor:
        check_names(s->expr.get(), soft);
        check_names(s->condition.get(), false);
        check_names(s->body, false);
        check_names(s->else_body, false);
        break;
      case Stmt::Kind::kMacro:
      case Stmt::Kind::kCallBlock:
        for (const auto& [name, fallback] : s->params) check_names(fallback.get(), false);
        if (s->kind == Stmt::Kind::kCallBlock) check_names(s->expr.get(), soft);
        check_names(s->body, false);
        break;
      case Stmt::Kind::kFilterBlock:
      case Stmt::Kind::kSetBlock:
        check_names(s->expr.get(), soft);
        check_names(s->body, false);
        break;
      default: check_names(s->expr.get(), soft); check_names(s->body, soft);
    }
  }
}

}  // namespace

Program parse(std::string_view source) {
  Program p{Parser(tokenize(source)).parse_template()};
  check_names(p.body, false);
  return p;
}

}  // namespace tandem::model::jinja
