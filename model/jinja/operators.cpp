// Python's operators on values (declared in interpreter.h).
#include <cmath>

#include "model/jinja/interpreter.h"
#include "model/jinja/strings.h"

namespace tandem::model::jinja {
namespace {

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  throw Error("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
}

Value add(const Value& a, const Value& b) {
  if (a.is_string() && b.is_string()) {
    if (a.is_safe() || b.is_safe()) {
      return Value((a.is_safe() ? a.str() : html_escape(a.str())) + (b.is_safe() ? b.str() : html_escape(b.str())),
                   true);
    }
    return Value(a.str() + b.str());
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple() && !a.is_generator() && !b.is_generator()) {
    List items = a.items();
    items.insert(items.end(), b.items().begin(), b.items().end());
    return Value::list(std::move(items), a.is_tuple());
  }
  if (a.is_string()) throw Error("can only concatenate str (not \"" + b.type_name() + "\") to str");
  if (a.is_list())
    throw Error("can only concatenate " + a.type_name() + " (not \"" + b.type_name() + "\") to " + a.type_name());
  unsupported("+", a, b);
}

Value repeat(const Value& seq, int64_t n) {
  const size_t unit = seq.is_string() ? seq.str().size() : seq.items().size() * sizeof(Value);
  if (n > 0 && unit > 0 && static_cast<uint64_t>(n) > kMaxStringBytes / unit) {
    throw Error("repetition over " + std::to_string(kMaxStringBytes) + " bytes");
  }
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value(std::move(out), seq.is_safe());
  }
  List items;
  for (int64_t i = 0; i < n; ++i) items.insert(items.end(), seq.items().begin(), seq.items().end());
  return Value::list(std::move(items), seq.is_tuple());
}

double floor_mod(double a, double b) {
  const double m = std::fmod(a, b);
  return m != 0 && ((m < 0) != (b < 0)) ? m + b : m;
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  const bool floats = a.kind() == Kind::kFloat || b.kind() == Kind::kFloat;
  if (op == "/") {
    if (b.as_float() == 0) throw Error("division by zero");
    return Value(a.as_float() / b.as_float());
  }
  if (op == "//" || op == "%") {
    if (b.as_float() == 0) throw Error(op == "%" ? "integer modulo by zero" : "integer division or modulo by zero");
    if (floats) {
      return op == "%" ? Value(floor_mod(a.as_float(), b.as_float())) : Value(std::floor(a.as_float() / b.as_float()));
    }
    const int64_t x = a.as_int(), y = b.as_int();
    int64_t q = x / y;
    if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
    return op == "//" ? Value(q) : Value(x - q * y);
  }
  if (op == "**") {
    if (!floats && b.as_int() >= 0) {
      int64_t r = 1;
      for (int64_t i = 0; i < b.as_int() && i < 64; ++i) r *= a.as_int();
      return Value(r);
    }
    return Value(std::pow(a.as_float(), b.as_float()));
  }
  if (floats) {
    const double x = a.as_float(), y = b.as_float();
    return Value(op == "+" ? x + y : op == "-" ? x - y : x * y);
  }
  const int64_t x = a.as_int(), y = b.as_int();
  return Value(op == "+" ? x + y : op == "-" ? x - y : x * y);
}

// "%s" % value: printf-style formatting, the conversions chat templates use.
Value percent_format(const Value& fmt, const Value& args) {
  const List values = args.is_tuple() ? args.items() : List{args};
  std::string out;
  size_t next = 0;
  const std::string& f = fmt.str();
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') {
      out += f[i];
      continue;
    }
    if (++i >= f.size()) throw Error("incomplete format");
    if (f[i] == '%') {
      out += '%';
      continue;
    }
    if (next >= values.size()) throw Error("not enough arguments for format string");
    const Value& v = values[next++];
    if (f[i] == 's') {
      out += v.to_str();
    } else if (f[i] == 'r') {
      out += v.repr();
    } else if (f[i] == 'd' || f[i] == 'i') {
      if (!v.is_number()) throw Error("%d format: a real number is required, not " + v.type_name());
      out += std::to_string(v.kind() == Kind::kFloat ? static_cast<int64_t>(v.as_float()) : v.as_int());
    } else {
      throw Error(std::string("unsupported format character '") + f[i] + "'");
    }
  }
  if (next < values.size()) throw Error("not all arguments converted during string formatting");
  return Value(std::move(out));
}

}  // namespace

static Value binary_unchecked(const std::string& op, const Value& a, const Value& b);

List iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return {};
    case Kind::kList: return v.is_generator() ? std::move(v.items()) : v.items();
    case Kind::kDict: {
      List keys;
      for (const auto& [k, _] : v.entries().items) keys.push_back(k);
      return keys;
    }
    case Kind::kString: {
      List chars;
      for (auto c : code_points(v.str())) chars.emplace_back(std::string(c));
      return chars;
    }
    default: throw Error("'" + v.type_name() + "' object is not iterable");
  }
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kUndefined: return false;
    case Kind::kString:
      if (!item.is_string()) throw Error("'in <string>' requires string as left operand, not " + item.type_name());
      return container.str().find(item.str()) != std::string::npos;
    case Kind::kList:
      for (const Value& v : iterate(container)) {
        if (equal(v, item)) return true;
      }
      return false;
    case Kind::kDict: return container.entries().find(item) != nullptr;
    default: throw Error("argument of type '" + container.type_name() + "' is not iterable");
  }
}

const Value& check_size(const Value& v) {
  if (v.is_string() && v.str().size() > kMaxStringBytes) {
    throw Error("string over " + std::to_string(kMaxStringBytes) + " bytes");
  }
  return v;
}

Value binary(const std::string& op, const Value& a, const Value& b) {
  Value v = binary_unchecked(op, a, b);
  check_size(v);
  return v;
}

static Value binary_unchecked(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return Value(a.to_str() + b.to_str());
  if (a.is_undefined()) a.fail_undefined();
  if (b.is_undefined()) b.fail_undefined();
  if (op == "+" && !(a.is_number() && b.is_number())) return add(a, b);
  if (op == "*" && (a.is_string() || a.is_list()) && (b.kind() == Kind::kInt || b.kind() == Kind::kBool)) {
    return repeat(a, b.as_int());
  }
  if (op == "*" && (b.is_string() || b.is_list()) && (a.kind() == Kind::kInt || a.kind() == Kind::kBool)) {
    return repeat(b, a.as_int());
  }
  if (op == "%" && a.is_string()) return percent_format(a, b);
  if (!a.is_number() || !b.is_number()) unsupported(op, a, b);
  return arithmetic(op, a, b);
}

}  // namespace tandem::model::jinja
