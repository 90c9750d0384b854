// The values a chat template computes with: Python's data model as Jinja sees it (None, bool,
// int, float, str, list, tuple, dict, callables, namespace(), and Jinja's Undefined), with
// Python's equality, truth, ordering and str() so a render matches python3-jinja2 byte for byte.
// Lists, dicts and namespaces are shared by reference, as in Python.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tandem::model::jinja {

// A template error: the interpreter throws it inside and its public entry points return it as
// a Status; no exception leaves the interpreter.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Value;
struct Call;
using List = std::vector<Value>;
using Function = std::function<Value(Call&)>;

enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction, kNamespace };

// An insertion-ordered dict (Python 3.7+ order); keys compare as Python's do (1 == 1.0 == True).
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  void set(const Value& key, Value value);
};

class Value {
 public:
  Value() = default;                         // Undefined
  static Value undefined(std::string hint);  // hint: what using it reports ("'x' is undefined")
  static Value none();
  Value(bool b);
  Value(int64_t i);
  Value(int i) : Value(static_cast<int64_t>(i)) {}
  Value(double d);
  Value(std::string s, bool safe = false);
  Value(const char* s) : Value(std::string(s)) {}
  static Value list(List items, bool tuple = false);
  // What map/select/reject return in Jinja: iterable once (iterate() empties it), always true,
  // with no len() and no JSON form.
  static Value generator(List items);
  static Value dict(Dict d = {});
  static Value function(std::string name, Function f);
  static Value ns(Dict attributes);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && tuple_; }
  bool is_generator() const { return kind_ == Kind::kList && generator_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_safe() const { return safe_; }  // a Markup string (the safe filter): `+` escapes the other side

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_float() const { return kind_ == Kind::kFloat ? d_ : static_cast<double>(i_); }
  const std::string& str() const { return s_; }  // string, or the undefined hint, or the function name
  List& items() const { return *list_; }         // list or tuple
  Dict& entries() const { return *dict_; }       // dict or namespace
  const Function& fn() const { return *fn_; }
  // Raises the error this Undefined stands for.
  [[noreturn]] void fail_undefined() const;

  bool truthy() const;
  std::string type_name() const;  // Python's: 'str', 'dict', 'NoneType', ...
  // str(x) as Python prints it (Undefined prints as nothing).
  std::string to_str() const;
  // repr(x), as inside a printed list or dict.
  std::string repr() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false, tuple_ = false, generator_ = false, safe_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  std::string s_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Function> fn_;
};

// Python's ==, and <, > on numbers, strings and lists (TypeError otherwise).
bool equal(const Value& a, const Value& b);
int compare(const Value& a, const Value& b);
// Python's float repr: shortest round-trip digits, "1.0", "1e-05", "1e+16".
std::string float_repr(double d);

// A call's arguments, positional then keyword, as evaluated.
struct Call {
  List args;
  std::vector<std::pair<std::string, Value>> kwargs;
  // The argument by position or name, or `fallback` when neither was given.
  Value arg(size_t position, const std::string& name, Value fallback = Value()) const;
};

}  // namespace tandem::model::jinja
