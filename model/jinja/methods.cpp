// Python's methods of str, dict and list as the immutable sandbox allows them, and range().
#include <algorithm>
#include <cstring>

#include "model/jinja/builtins.h"
#include "model/jinja/strings.h"

namespace tandem::model::jinja {
namespace {

std::optional<std::string> optional_str(const Value& v) {
  if (v.is_none() || v.is_undefined()) return std::nullopt;
  if (!v.is_string()) throw Error("must be str or None, not " + v.type_name());
  return v.str();
}

std::string need_str(const Value& v, const char* what) {
  if (!v.is_string()) throw Error(std::string(what) + " arg must be str, not " + v.type_name());
  return v.str();
}

Value string_list(const std::vector<std::string>& parts) {
  List out;
  for (const auto& p : parts) out.emplace_back(p);
  return Value::list(std::move(out));
}

// str.startswith / str.endswith with a str or a tuple of them.
bool affix(const std::string& s, const Value& what, bool prefix) {
  const List options = what.is_tuple() ? what.items() : List{what};
  for (const Value& o : options) {
    const std::string a = need_str(o, prefix ? "startswith" : "endswith");
    if (a.size() <= s.size() &&
        (prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0)) {
      return true;
    }
  }
  return false;
}

// str.format: {} {0} {name} with {{ }} escapes; conversions and format specs are refused.
std::string format(const std::string& f, const Call& c) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] == '}' && i + 1 < f.size() && f[i + 1] == '}') {
      out += '}';
      ++i;
      continue;
    }
    if (f[i] != '{') {
      out += f[i];
      continue;
    }
    if (i + 1 < f.size() && f[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const size_t end = f.find('}', i);
    if (end == std::string::npos) throw Error("Single '{' encountered in format string");
    const std::string field = f.substr(i + 1, end - i - 1);
    if (field.find_first_of("!:.[") != std::string::npos) throw Error("unsupported: str.format field '" + field + "'");
    Value v;
    if (field.empty() || std::isdigit(static_cast<unsigned char>(field[0]))) {
      if (field.size() > 9) throw Error("Replacement index " + field + " out of range");
      const size_t index = field.empty() ? auto_index++ : std::stoul(field);
      if (index >= c.args.size()) throw Error("Replacement index " + std::to_string(index) + " out of range");
      v = c.args[index];
    } else {
      v = c.arg(SIZE_MAX, field);
      if (v.is_undefined()) throw Error("KeyError: '" + field + "'");
    }
    out += v.to_str();
    i = end;
  }
  return out;
}

Value string_method(const Value& obj, const std::string& name) {
  const std::string s = obj.str();
  using F = std::function<Value(Call&)>;
  static const char* const kNames[] = {"strip",    "lstrip",  "rstrip",  "split",     "rsplit",     "startswith",
                                       "endswith", "upper",   "lower",   "title",     "capitalize", "replace",
                                       "format",   "join",    "find",    "rfind",     "count",      "isdigit",
                                       "isspace",  "isalpha", "isalnum", "splitlines"};
  if (std::none_of(std::begin(kNames), std::end(kNames), [&](const char* n) { return name == n; })) return Value();
  F f;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    f = [s, name](Call& c) {
      return Value(strip(s, optional_str(c.arg(0, "chars")), name != "rstrip", name != "lstrip"));
    };
  } else if (name == "split" || name == "rsplit") {
    f = [s, name](Call& c) {
      const auto sep = optional_str(c.arg(0, "sep"));
      const int64_t maxsplit = c.arg(1, "maxsplit", Value(int64_t{-1})).as_int();
      return string_list(name == "split" ? split(s, sep, maxsplit) : rsplit(s, sep, maxsplit));
    };
  } else if (name == "startswith" || name == "endswith") {
    f = [s, name](Call& c) { return Value(affix(s, c.arg(0, "prefix"), name == "startswith")); };
  } else if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    f = [s, name](Call&) {
      return Value(name == "upper"   ? to_upper(s)
                   : name == "lower" ? to_lower(s)
                   : name == "title" ? to_title(s)
                                     : to_capitalized(s));
    };
  } else if (name == "replace") {
    f = [s](Call& c) {
      return Value(replace(s, need_str(c.arg(0, "old"), "replace"), need_str(c.arg(1, "new"), "replace"),
                           c.arg(2, "count", Value(int64_t{-1})).as_int()));
    };
  } else if (name == "format") {
    f = [s](Call& c) { return Value(format(s, c)); };
  } else if (name == "join") {
    f = [s](Call& c) {
      std::string out;
      bool first = true;
      for (const Value& v : iterate(c.arg(0, "iterable"))) {
        if (!first) out += s;
        first = false;
        out += need_str(v, "join");
      }
      return Value(std::move(out));
    };
  } else if (name == "find" || name == "rfind" || name == "count") {
    f = [s, name](Call& c) {
      const std::string sub = need_str(c.arg(0, "sub"), name.c_str());
      if (name == "count") {
        if (sub.empty()) return Value(static_cast<int64_t>(code_point_count(s) + 1));
        int64_t n = 0;
        for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
        return Value(n);
      }
      const size_t at = name == "find" ? s.find(sub) : s.rfind(sub);
      return Value(at == std::string::npos ? int64_t{-1} : static_cast<int64_t>(code_point_count(s.substr(0, at))));
    };
  } else if (name == "splitlines") {
    f = [s](Call&) { return string_list(splitlines(s)); };
  } else {
    f = [s, name](Call&) {
      if (s.empty()) return Value(false);
      for (unsigned char ch : s) {
        const bool ok = name == "isdigit"   ? std::isdigit(ch)
                        : name == "isspace" ? std::isspace(ch)
                        : name == "isalpha" ? std::isalpha(ch) || ch >= 0x80
                                            : std::isalnum(ch) || ch >= 0x80;
        if (!ok) return Value(false);
      }
      return Value(true);
    };
  }
  return Value::function("str." + name, std::move(f));
}

Value dict_method(const Value& obj, const std::string& name) {
  if (name == "get") {
    return Value::function("dict.get", [obj](Call& c) {
      const Value* v = obj.entries().find(c.arg(0, "key"));
      return v ? *v : c.arg(1, "default", Value::none());
    });
  }
  if (name == "items" || name == "keys" || name == "values") {
    return Value::function("dict." + name, [obj, name](Call&) {
      List out;
      for (const auto& [k, v] : obj.entries().items) {
        out.push_back(name == "items" ? Value::list({k, v}, true) : name == "keys" ? k : v);
      }
      return Value::list(std::move(out));
    });
  }
  for (const char* unsafe : {"pop", "popitem", "setdefault", "update", "clear"}) {
    if (name == unsafe) return Value::undefined("access to attribute '" + name + "' of 'dict' object is unsafe.");
  }
  return Value();
}

Value list_method(const Value& obj, const std::string& name) {
  if (name == "index" || name == "count") {
    return Value::function("list." + name, [obj, name](Call& c) {
      const Value x = c.arg(0, "value");
      int64_t n = 0;
      for (size_t i = 0; i < obj.items().size(); ++i) {
        if (!equal(obj.items()[i], x)) continue;
        if (name == "index") return Value(static_cast<int64_t>(i));
        ++n;
      }
      if (name == "index") throw Error(x.repr() + " is not in list");
      return Value(n);
    });
  }
  for (const char* unsafe : {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear"}) {
    if (name == unsafe) {
      return Value::undefined("access to attribute '" + name + "' of '" + obj.type_name() + "' object is unsafe.");
    }
  }
  return Value();
}

}  // namespace

Value method(Interpreter&, const Value& obj, const std::string& name) {
  if (obj.is_string()) return string_method(obj, name);
  if (obj.is_dict()) return dict_method(obj, name);
  if (obj.is_list()) return list_method(obj, name);
  return Value();
}

Value builtin_range(Call& c) {
  if (c.args.empty() || c.args.size() > 3) throw Error("range expected 1 to 3 arguments");
  for (const Value& a : c.args) {
    if (a.kind() != Kind::kInt && a.kind() != Kind::kBool)
      throw Error("range: '" + a.type_name() + "' object cannot be interpreted as an integer");
  }
  const int64_t start = c.args.size() > 1 ? c.args[0].as_int() : 0;
  const int64_t stop = c.args.size() > 1 ? c.args[1].as_int() : c.args[0].as_int();
  const int64_t step = c.args.size() > 2 ? c.args[2].as_int() : 1;
  if (step == 0) throw Error("range() arg 3 must not be zero");
  List out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (out.size() >= 100000) throw Error("range too big: more than 100000 items (MAX_RANGE)");
    out.emplace_back(i);
  }
  return Value::list(std::move(out));
}

}  // namespace tandem::model::jinja
