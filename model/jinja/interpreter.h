// Runs a parsed template (model/jinja/ast.h) against variables: Jinja's scoping (a for loop's
// body and a macro's body get their own scope each time they run; `if` does not), loop.*,
// macros with caller(), break/continue, and the attribute and item lookup rules of Jinja's
// sandbox (a missing attribute is Undefined; methods that modify a list or dict are refused).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/jinja/ast.h"
#include "model/jinja/value.h"

namespace tandem::model::jinja {

struct Scope;
using ScopePtr = std::shared_ptr<Scope>;
struct Scope {
  ScopePtr parent;
  std::vector<std::pair<std::string, Value>> vars;
  const Value* find(const std::string& name) const;
  void set(const std::string& name, Value value);
};

class Interpreter {
 public:
  // `globals` are visible everywhere (the render's variables and functions).
  explicit Interpreter(Dict globals);
  // The template's output; throws Error.
  std::string render(const Program& program);

  Value eval(const Expr& e, const ScopePtr& scope);
  // What the builtins (filters, tests, methods) call back into.
  Value call(const Value& callee, Call& call);
  Value filter(const std::string& name, const Value& input, Call& args);
  bool test(const std::string& name, const Value& input, Call& args);
  Value getattr(const Value& obj, const std::string& name);
  Value getitem(const Value& obj, const Value& key);

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  Flow exec(const Body& body, const ScopePtr& scope, std::string& out);
  Flow exec_statement(const Stmt& s, const ScopePtr& scope, std::string& out);
  Flow exec_for(const Stmt& s, const ScopePtr& scope, std::string& out);
  void exec_set(const Stmt& s, const ScopePtr& scope);
  void exec_call_block(const Stmt& s, const ScopePtr& scope, std::string& out);
  Value make_macro(const Stmt& s, const ScopePtr& scope, const std::string& name);
  Value eval_name(const Expr& e, const ScopePtr& scope);
  Value eval_filter(const Expr& e, const ScopePtr& scope, const Value* block_input);
  Value eval_slice(const Expr& e, const ScopePtr& scope);
  Value eval_compare(const Expr& e, const ScopePtr& scope);
  Call eval_args(const Expr& e, const ScopePtr& scope, size_t first);
  void bind(const ScopePtr& scope, const std::vector<std::string>& targets, const Value& v);

  ScopePtr globals_;
  int64_t steps_ = 0;  // statements run and expressions evaluated, bounded (kMaxSteps)
  int depth_ = 0;      // nested calls and statements: bounded so a template cannot exhaust the stack
};

// What one render may spend: a template that loops without end or grows its output without
// bound fails with an error naming the limit instead of holding a thread or exhausting memory.
inline constexpr int64_t kMaxSteps = 20'000'000;
inline constexpr size_t kMaxStringBytes = 64u << 20;

// `v`, or an error when it is a string over kMaxStringBytes.
const Value& check_size(const Value& v);

// Items of an iterable as a for loop sees them (dict keys, string characters; Undefined is empty).
List iterate(const Value& v);
// Python's binary operators (`+` honours Markup: the plain side is escaped) and `in`.
Value binary(const std::string& op, const Value& a, const Value& b);
bool contains(const Value& container, const Value& item);

}  // namespace tandem::model::jinja
