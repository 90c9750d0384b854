// Jinja's builtin tests (jinja2/tests.py), as `x is name(args)` sees them.
#include <map>

#include "model/jinja/builtins.h"
#include "model/jinja/parser.h"
#include "model/jinja/strings.h"

namespace tandem::model::jinja {
namespace {

Value operand(const Call& c) {
  if (c.args.empty() && c.kwargs.empty()) throw Error("test needs an argument");
  return c.arg(0, c.kwargs.empty() ? "" : c.kwargs[0].first);
}

bool t_defined(Interpreter&, const Value& v, Call&) { return !v.is_undefined(); }
bool t_undefined(Interpreter&, const Value& v, Call&) { return v.is_undefined(); }
bool t_none(Interpreter&, const Value& v, Call&) { return v.is_none(); }
bool t_boolean(Interpreter&, const Value& v, Call&) { return v.kind() == Kind::kBool; }
bool t_true(Interpreter&, const Value& v, Call&) { return v.kind() == Kind::kBool && v.as_bool(); }
bool t_false(Interpreter&, const Value& v, Call&) { return v.kind() == Kind::kBool && !v.as_bool(); }
bool t_integer(Interpreter&, const Value& v, Call&) { return v.kind() == Kind::kInt; }
bool t_float(Interpreter&, const Value& v, Call&) { return v.kind() == Kind::kFloat; }
bool t_number(Interpreter&, const Value& v, Call&) { return v.is_number(); }
bool t_string(Interpreter&, const Value& v, Call&) { return v.is_string(); }
bool t_mapping(Interpreter&, const Value& v, Call&) { return v.is_dict(); }
bool t_iterable(Interpreter&, const Value& v, Call&) {
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}
bool t_sequence(Interpreter&, const Value& v, Call&) {
  return v.is_undefined() || v.is_string() || (v.is_list() && !v.is_generator()) || v.is_dict();
}
bool t_callable(Interpreter&, const Value& v, Call&) { return v.kind() == Kind::kFunction; }
bool t_escaped(Interpreter&, const Value& v, Call&) { return v.is_safe(); }
bool t_eq(Interpreter&, const Value& v, Call& c) { return equal(v, operand(c)); }
bool t_ne(Interpreter&, const Value& v, Call& c) { return !equal(v, operand(c)); }
bool t_lt(Interpreter&, const Value& v, Call& c) { return compare(v, operand(c)) < 0; }
bool t_le(Interpreter&, const Value& v, Call& c) { return compare(v, operand(c)) <= 0; }
bool t_gt(Interpreter&, const Value& v, Call& c) { return compare(v, operand(c)) > 0; }
bool t_ge(Interpreter&, const Value& v, Call& c) { return compare(v, operand(c)) >= 0; }
bool t_in(Interpreter&, const Value& v, Call& c) { return contains(operand(c), v); }
bool t_sameas(Interpreter&, const Value& v, Call& c) {
  const Value other = operand(c);
  if (v.is_list() || v.is_dict() || v.kind() == Kind::kNamespace || v.kind() == Kind::kFunction) {
    return v.kind() == other.kind() && &v.entries() == &other.entries();
  }
  return v.kind() == other.kind() && equal(v, other);
}
bool integer_or_fail(const Value& v) {
  if (v.kind() != Kind::kInt && v.kind() != Kind::kBool)
    throw Error("not all arguments converted during string formatting");
  return true;
}
bool t_odd(Interpreter&, const Value& v, Call&) { return integer_or_fail(v) && v.as_int() % 2 != 0; }
bool t_even(Interpreter&, const Value& v, Call&) { return integer_or_fail(v) && v.as_int() % 2 == 0; }
bool t_divisibleby(Interpreter&, const Value& v, Call& c) {
  const Value n = operand(c);
  if (n.as_int() == 0) throw Error("integer division or modulo by zero");
  return integer_or_fail(v) && v.as_int() % n.as_int() == 0;
}
bool t_lower(Interpreter&, const Value& v, Call&) { return v.to_str() == to_lower(v.to_str()); }
bool t_upper(Interpreter&, const Value& v, Call&) { return v.to_str() == to_upper(v.to_str()); }
bool t_filter(Interpreter&, const Value& v, Call&) { return v.is_string() && has_filter(v.str()); }
bool t_test(Interpreter&, const Value& v, Call&) { return v.is_string() && has_test(v.str()); }

// The tests named as their functions (t_NAME), and the aliases below.
// clang-format off
#define TANDEM_JINJA_TESTS(X) \
  X(boolean) X(callable) X(defined) X(divisibleby) X(eq) X(escaped) X(even) X(false) X(filter) X(float) X(ge) \
  X(gt) X(in) X(integer) X(iterable) X(le) X(lower) X(lt) X(mapping) X(ne) X(none) X(number) X(odd) X(sameas) \
  X(sequence) X(string) X(test) X(true) X(undefined) X(upper)
// clang-format on

}  // namespace

TestFn find_test(const std::string& name) {
#define TANDEM_NAMED(name) {#name, t_##name},
  static const NameTable<TestFn> table({TANDEM_JINJA_TESTS(TANDEM_NAMED)}, {{"!=", t_ne},
                                                                            {"<", t_lt},
                                                                            {"<=", t_le},
                                                                            {"==", t_eq},
                                                                            {">", t_gt},
                                                                            {">=", t_ge},
                                                                            {"equalto", t_eq},
                                                                            {"greaterthan", t_gt},
                                                                            {"lessthan", t_lt}});
#undef TANDEM_NAMED
  return table.find(name);
}

bool has_test(const std::string& name) { return find_test(name) != nullptr; }

}  // namespace tandem::model::jinja
