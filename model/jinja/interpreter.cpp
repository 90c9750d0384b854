#include "model/jinja/interpreter.h"

#include "model/jinja/builtins.h"
#include "model/jinja/strings.h"

namespace tandem::model::jinja {
namespace {

// Deep enough for real templates' macro recursion (JSON-schema renderers), shallow enough for
// the stack of a sanitized build.
constexpr int kMaxDepth = 200;

struct DepthGuard {
  explicit DepthGuard(int& d) : depth(d) {
    if (++depth > kMaxDepth) {
      --depth;
      throw Error("template nesting deeper than " + std::to_string(kMaxDepth) + " (recursion?)");
    }
  }
  ~DepthGuard() { --depth; }
  int& depth;
};

ScopePtr child_of(const ScopePtr& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

}  // namespace

const Value* Scope::find(const std::string& name) const {
  for (const Scope* s = this; s; s = s->parent.get()) {
    for (const auto& [k, v] : s->vars) {
      if (k == name) return &v;
    }
  }
  return nullptr;
}

void Scope::set(const std::string& name, Value value) {
  for (auto& [k, v] : vars) {
    if (k == name) {
      v = std::move(value);
      return;
    }
  }
  vars.emplace_back(name, std::move(value));
}

Interpreter::Interpreter(Dict globals) : globals_(std::make_shared<Scope>()) {
  for (auto& [k, v] : globals.items) globals_->set(k.str(), std::move(v));
  globals_->set("namespace", Value::function("namespace", [](Call& c) {
                  Dict attributes;
                  for (const Value& a : c.args) {
                    if (!a.is_dict()) throw Error("namespace() takes a mapping as positional argument");
                    for (const auto& [k, v] : a.entries().items) attributes.set(k, v);
                  }
                  for (const auto& [k, v] : c.kwargs) attributes.set(Value(k), v);
                  return Value::ns(std::move(attributes));
                }));
  globals_->set("range", Value::function("range", builtin_range));
  globals_->set("dict", Value::function("dict", [](Call& c) {
                  Dict d;
                  for (const auto& [k, v] : c.kwargs) d.set(Value(k), v);
                  return Value::dict(std::move(d));
                }));
}

std::string Interpreter::render(const Program& program) {
  std::string out;
  exec(program.body, child_of(globals_), out);
  return out;
}

Interpreter::Flow Interpreter::exec(const Body& body, const ScopePtr& scope, std::string& out) {
  for (const auto& s : body) {
    if (const Flow f = exec_statement(*s, scope, out); f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec_statement(const Stmt& s, const ScopePtr& scope, std::string& out) {
  DepthGuard guard(depth_);
  if (++steps_ > kMaxSteps) throw Error("template ran more than " + std::to_string(kMaxSteps) + " steps");
  if (out.size() > kMaxStringBytes) throw Error("template output over " + std::to_string(kMaxStringBytes) + " bytes");
  switch (s.kind) {
    case Stmt::Kind::kText: out += s.text; break;
    case Stmt::Kind::kOutput: out += eval(*s.expr, scope).to_str(); break;
    case Stmt::Kind::kIf:
      for (const auto& [condition, body] : s.branches) {
        if (!condition || eval(*condition, scope).truthy()) return exec(body, scope, out);
      }
      break;
    case Stmt::Kind::kFor: return exec_for(s, scope, out);
    case Stmt::Kind::kSet:
    case Stmt::Kind::kSetBlock: exec_set(s, scope); break;
    case Stmt::Kind::kMacro: scope->set(s.text, make_macro(s, scope, s.text)); break;
    case Stmt::Kind::kCallBlock: exec_call_block(s, scope, out); break;
    case Stmt::Kind::kFilterBlock: {
      std::string body;
      exec(s.body, child_of(scope), body);
      const Value input(std::move(body));
      out += eval_filter(*s.expr, scope, &input).to_str();
      break;
    }
    case Stmt::Kind::kBreak: return Flow::kBreak;
    case Stmt::Kind::kContinue: return Flow::kContinue;
    case Stmt::Kind::kGeneration: return exec(s.body, scope, out);
  }
  return Flow::kNormal;
}

void Interpreter::bind(const ScopePtr& scope, const std::vector<std::string>& targets, const Value& v) {
  if (targets.size() == 1) return scope->set(targets[0], v);
  const List items = iterate(v);
  if (items.size() != targets.size()) {
    throw Error(items.size() < targets.size()
                    ? "not enough values to unpack (expected " + std::to_string(targets.size()) + ", got " +
                          std::to_string(items.size()) + ")"
                    : "too many values to unpack (expected " + std::to_string(targets.size()) + ")");
  }
  for (size_t i = 0; i < targets.size(); ++i) scope->set(targets[i], items[i]);
}

Interpreter::Flow Interpreter::exec_for(const Stmt& s, const ScopePtr& scope, std::string& out) {
  List items = iterate(eval(*s.expr, scope));
  if (s.condition) {
    List kept;
    for (Value& item : items) {
      auto filter_scope = child_of(scope);
      bind(filter_scope, s.targets, item);
      if (eval(*s.condition, filter_scope).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    exec(s.else_body, child_of(scope), out);
    return Flow::kNormal;
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    auto body_scope = child_of(scope);
    bind(body_scope, s.targets, items[i]);
    Dict loop;
    loop.set("index", i + 1);
    loop.set("index0", i);
    loop.set("revindex", n - i);
    loop.set("revindex0", n - i - 1);
    loop.set("first", i == 0);
    loop.set("last", i == n - 1);
    loop.set("length", n);
    loop.set("depth", 1);
    loop.set("depth0", 0);
    if (i > 0) loop.set("previtem", items[i - 1]);
    if (i + 1 < n) loop.set("nextitem", items[i + 1]);
    loop.set("cycle", Value::function("cycle", [i](Call& c) {
               if (c.args.empty()) throw Error("no items for cycling given");
               return c.args[static_cast<size_t>(i) % c.args.size()];
             }));
    body_scope->set("loop", Value::dict(std::move(loop)));
    const Flow f = exec(s.body, body_scope, out);
    if (f == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

void Interpreter::exec_set(const Stmt& s, const ScopePtr& scope) {
  Value v;
  if (s.kind == Stmt::Kind::kSetBlock) {
    std::string body;
    exec(s.body, child_of(scope), body);
    v = Value(std::move(body));
    if (s.expr) v = eval_filter(*s.expr, scope, &v);
  } else {
    v = eval(*s.expr, scope);
  }
  if (!s.attribute) return bind(scope, s.targets, v);
  const Value* target = scope->find(s.targets[0]);
  if (!target || target->kind() != Kind::kNamespace) throw Error("cannot assign attribute on non-namespace object");
  target->entries().set(Value(s.targets[1]), std::move(v));
}

Value Interpreter::make_macro(const Stmt& s, const ScopePtr& scope, const std::string& name) {
  // The macro holds its scope weakly: it is stored in that scope, and a strong pointer would
  // make a cycle that outlives the render.
  std::weak_ptr<Scope> weak = scope;
  return Value::function(name, [this, &s, weak, name](Call& c) {
    const ScopePtr scope = weak.lock();
    if (!scope) throw Error("macro '" + name + "' called after its scope ended");
    auto frame = child_of(scope);
    List varargs;
    for (size_t i = 0; i < c.args.size(); ++i) {
      if (i < s.params.size()) {
        frame->set(s.params[i].first, c.args[i]);
      } else {
        varargs.push_back(c.args[i]);
      }
    }
    Dict kwargs;
    for (const auto& kw : c.kwargs) {
      const std::string& k = kw.first;
      const bool is_param = std::any_of(s.params.begin(), s.params.end(), [&](const auto& p) { return p.first == k; });
      if (is_param || k == "caller") {
        frame->set(k, kw.second);
      } else {
        kwargs.set(Value(k), kw.second);
      }
    }
    for (size_t i = c.args.size(); i < s.params.size(); ++i) {
      const std::string& param = s.params[i].first;
      const ExprPtr& fallback = s.params[i].second;
      if (std::any_of(c.kwargs.begin(), c.kwargs.end(), [&](const auto& kw) { return kw.first == param; })) continue;
      frame->set(param,
                 fallback ? eval(*fallback, frame) : Value::undefined("parameter '" + param + "' was not provided"));
    }
    frame->set("varargs", Value::list(std::move(varargs), true));
    frame->set("kwargs", Value::dict(std::move(kwargs)));
    std::string out;
    exec(s.body, frame, out);
    return Value(std::move(out));
  });
}

void Interpreter::exec_call_block(const Stmt& s, const ScopePtr& scope, std::string& out) {
  const Expr& call_expr = *s.expr;
  const Value callee = eval(*call_expr.children[0], scope);
  Call c = eval_args(call_expr, scope, 1);
  c.kwargs.emplace_back("caller", make_macro(s, scope, "caller"));
  out += call(callee, c).to_str();
}

Value Interpreter::eval(const Expr& e, const ScopePtr& scope) {
  DepthGuard guard(depth_);
  if (++steps_ > kMaxSteps) throw Error("template ran more than " + std::to_string(kMaxSteps) + " steps");
  switch (e.kind) {
    case Expr::Kind::kConst: return e.value;
    case Expr::Kind::kName: return eval_name(e, scope);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      List items;
      for (const auto& c : e.children) items.push_back(eval(*c, scope));
      return Value::list(std::move(items), e.kind == Expr::Kind::kTuple);
    }
    case Expr::Kind::kDict: {
      Dict d;
      for (size_t i = 0; i + 1 < e.children.size(); i += 2)
        d.set(eval(*e.children[i], scope), eval(*e.children[i + 1], scope));
      return Value::dict(std::move(d));
    }
    case Expr::Kind::kAttr: return getattr(eval(*e.children[0], scope), e.name);
    case Expr::Kind::kItem: return getitem(eval(*e.children[0], scope), eval(*e.children[1], scope));
    case Expr::Kind::kSlice: return eval_slice(e, scope);
    case Expr::Kind::kCall: {
      const Value callee = eval(*e.children[0], scope);
      Call c = eval_args(e, scope, 1);
      return call(callee, c);
    }
    case Expr::Kind::kFilter: return eval_filter(e, scope, nullptr);
    case Expr::Kind::kTest: {
      const Value input = eval(*e.children[0], scope);
      Call c = eval_args(e, scope, 1);
      if (!e.known) throw Error("No test named '" + e.name + "' found.");
      return Value(test(e.name, input, c));
    }
    case Expr::Kind::kUnary: {
      const Value v = eval(*e.children[0], scope);
      if (e.name == "not") return Value(!v.truthy());
      if (v.is_undefined()) v.fail_undefined();
      if (!v.is_number()) throw Error("bad operand type for unary " + e.name + ": '" + v.type_name() + "'");
      if (e.name == "+") return v.kind() == Kind::kFloat ? v : Value(v.as_int());
      return v.kind() == Kind::kFloat ? Value(-v.as_float()) : Value(-v.as_int());
    }
    case Expr::Kind::kBinary: {
      const Value left = eval(*e.children[0], scope);
      if (e.name == "and") return left.truthy() ? eval(*e.children[1], scope) : left;
      if (e.name == "or") return left.truthy() ? left : eval(*e.children[1], scope);
      return binary(e.name, left, eval(*e.children[1], scope));
    }
    case Expr::Kind::kCompare: return eval_compare(e, scope);
    case Expr::Kind::kCondition:
      if (eval(*e.children[0], scope).truthy()) return eval(*e.children[1], scope);
      return e.children[2]
                 ? eval(*e.children[2], scope)
                 : Value::undefined("the inline if-expression evaluated to false and no else section was defined.");
  }
  return Value();
}

Value Interpreter::eval_name(const Expr& e, const ScopePtr& scope) {
  if (const Value* v = scope->find(e.name)) return *v;
  return Value::undefined("'" + e.name + "' is undefined");
}

Call Interpreter::eval_args(const Expr& e, const ScopePtr& scope, size_t first) {
  Call c;
  for (size_t i = first; i < e.children.size(); ++i) c.args.push_back(eval(*e.children[i], scope));
  for (const auto& [k, v] : e.kwargs) c.kwargs.emplace_back(k, eval(*v, scope));
  return c;
}

Value Interpreter::eval_filter(const Expr& e, const ScopePtr& scope, const Value* block_input) {
  const Expr* base = e.children[0].get();
  const Value input = !base                                              ? *block_input
                      : base->kind == Expr::Kind::kFilter && block_input ? eval_filter(*base, scope, block_input)
                                                                         : eval(*base, scope);
  Call c = eval_args(e, scope, 1);
  if (!e.known) throw Error("No filter named '" + e.name + "' found.");
  return filter(e.name, input, c);
}

Value Interpreter::eval_slice(const Expr& e, const ScopePtr& scope) {
  const Value obj = eval(*e.children[0], scope);
  std::optional<int64_t> parts[3];
  for (int i = 0; i < 3; ++i) {
    if (!e.children[i + 1]) continue;
    const Value v = eval(*e.children[i + 1], scope);
    if (v.is_none()) continue;
    if (v.kind() != Kind::kInt && v.kind() != Kind::kBool) throw Error("slice indices must be integers or None");
    parts[i] = v.as_int();
  }
  if (obj.is_undefined()) obj.fail_undefined();
  if (obj.is_string()) {
    const auto points = code_points(obj.str());
    std::string out;
    for (size_t i : slice_indices(points.size(), parts[0], parts[1], parts[2])) out += points[i];
    return Value(std::move(out), obj.is_safe());
  }
  if (!obj.is_list() || obj.is_generator()) throw Error("'" + obj.type_name() + "' object is not subscriptable");
  List out;
  for (size_t i : slice_indices(obj.items().size(), parts[0], parts[1], parts[2])) out.push_back(obj.items()[i]);
  return Value::list(std::move(out), obj.is_tuple());
}

Value Interpreter::eval_compare(const Expr& e, const ScopePtr& scope) {
  Value left = eval(*e.children[0], scope);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.children[i + 1], scope);
    const std::string& op = e.ops[i];
    bool ok;
    if (op == "==") {
      ok = equal(left, right);
    } else if (op == "!=") {
      ok = !equal(left, right);
    } else if (op == "in" || op == "notin") {
      ok = contains(right, left) == (op == "in");
    } else {
      const int c = compare(left, right);
      ok = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
    }
    if (!ok) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

Value Interpreter::call(const Value& callee, Call& c) {
  DepthGuard guard(depth_);
  if (callee.is_undefined()) callee.fail_undefined();
  if (callee.kind() != Kind::kFunction) throw Error("'" + callee.type_name() + "' object is not callable");
  Value v = callee.fn()(c);
  check_size(v);
  return v;
}

Value Interpreter::filter(const std::string& name, const Value& input, Call& args) {
  const FilterFn f = find_filter(name);
  if (!f) throw Error("No filter named '" + name + "' found.");
  Value v = f(*this, input, args);
  check_size(v);
  return v;
}

bool Interpreter::test(const std::string& name, const Value& input, Call& args) {
  const TestFn t = find_test(name);
  if (!t) throw Error("No test named '" + name + "' found.");
  return t(*this, input, args);
}

Value Interpreter::getattr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Kind::kUndefined: obj.fail_undefined();
    case Kind::kNamespace:
      if (const Value* v = obj.entries().find(Value(name))) return *v;
      return Value::undefined("'Namespace object' has no attribute '" + name + "'");
    case Kind::kDict: {
      if (Value m = method(*this, obj, name); !m.is_undefined() || !m.str().empty()) return m;
      if (const Value* v = obj.entries().find(Value(name))) return *v;
      return Value::undefined("'dict object' has no attribute '" + name + "'");
    }
    case Kind::kNone: return Value::undefined("'None' has no attribute '" + name + "'");
    default: {
      if (Value m = method(*this, obj, name); !m.is_undefined() || !m.str().empty()) return m;
      return Value::undefined("'" + obj.type_name() + " object' has no attribute '" + name + "'");
    }
  }
}

Value Interpreter::getitem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) obj.fail_undefined();
  if (obj.is_dict() || obj.kind() == Kind::kNamespace) {
    if (const Value* v = obj.entries().find(key)) return *v;
  } else if (((obj.is_list() && !obj.is_generator()) || obj.is_string()) &&
             (key.kind() == Kind::kInt || key.kind() == Kind::kBool)) {
    const int64_t size = static_cast<int64_t>(obj.is_list() ? obj.items().size() : code_point_count(obj.str()));
    const int64_t i = key.as_int() < 0 ? key.as_int() + size : key.as_int();
    if (i >= 0 && i < size) {
      if (obj.is_list()) return obj.items()[static_cast<size_t>(i)];
      return Value(std::string(code_points(obj.str())[static_cast<size_t>(i)]));
    }
  }
  if (key.is_string() && obj.kind() != Kind::kDict) return getattr(obj, key.str());
  if (key.is_string()) {
    if (Value m = method(*this, obj, key.str()); !m.is_undefined() || !m.str().empty()) return m;
  }
  const std::string owner = obj.is_none() ? "None" : "'" + obj.type_name() + " object'";
  return Value::undefined(owner + " has no element " + key.repr());
}

}  // namespace tandem::model::jinja
