// Jinja's builtin filters and tests, Python's str/dict/list methods, and range(): each as
// jinja2 3.1 and CPython define it, for the arguments chat templates pass. A filter or test not
// in the tables is "No filter named ..."; an argument form not handled is an error naming it.
#pragma once

#include <string>

#include "model/jinja/interpreter.h"
#include "model/jinja/value.h"

namespace tandem::model::jinja {

using FilterFn = Value (*)(Interpreter&, const Value& input, Call& args);
using TestFn = bool (*)(Interpreter&, const Value& input, Call& args);

FilterFn find_filter(const std::string& name);  // null when unknown
TestFn find_test(const std::string& name);

// obj.name as a bound method of a builtin type; an Undefined whose hint says "unsafe" for the
// methods the immutable sandbox refuses (list.append, dict.update, ...); a hintless Undefined
// when the type has no such method.
Value method(Interpreter& in, const Value& obj, const std::string& name);

Value builtin_range(Call& c);

}  // namespace tandem::model::jinja
