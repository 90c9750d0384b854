// Jinja's builtin filters and tests, Python's str/dict/list methods, and range(): each as
// jinja2 3.1 and CPython define it, for the arguments chat templates pass. A filter or test not
// in the tables is "No filter named ..."; an argument form not handled is an error naming it.
#pragma once

#include <initializer_list>
#include <map>
#include <string>
#include <utility>

#include "model/jinja/interpreter.h"
#include "model/jinja/value.h"

namespace tandem::model::jinja {

using FilterFn = Value (*)(Interpreter&, const Value& input, Call& args);
using TestFn = bool (*)(Interpreter&, const Value& input, Call& args);

// Builtins by name: those whose C++ function is named after them (an X-macro list in their
// file), then aliases of those functions.
template <class Fn>
class NameTable {
 public:
  using Entry = std::pair<const char*, Fn>;
  NameTable(std::initializer_list<Entry> named, std::initializer_list<Entry> aliases) {
    for (const auto& list : {named, aliases}) {
      for (const auto& [name, fn] : list) map_.emplace(name, fn);
    }
  }
  Fn find(const std::string& name) const {
    const auto it = map_.find(name);
    return it == map_.end() ? nullptr : it->second;
  }

 private:
  std::map<std::string, Fn, std::less<>> map_;
};

FilterFn find_filter(const std::string& name);  // null when unknown
TestFn find_test(const std::string& name);

// obj.name as a bound method of a builtin type; an Undefined whose hint says "unsafe" for the
// methods the immutable sandbox refuses (list.append, dict.update, ...); a hintless Undefined
// when the type has no such method.
Value method(Interpreter& in, const Value& obj, const std::string& name);

Value builtin_range(Call& c);

}  // namespace tandem::model::jinja
