// Jinja's builtin filters (jinja2/filters.py) and HF's tojson.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "model/jinja/builtins.h"
#include "model/jinja/json.h"
#include "model/jinja/parser.h"
#include "model/jinja/strings.h"

namespace tandem::model::jinja {
namespace {

std::string str_arg(const Call& c, size_t pos, const std::string& name, const std::string& fallback) {
  const Value v = c.arg(pos, name, Value(fallback));
  if (v.is_undefined()) v.fail_undefined();
  return v.to_str();
}

// environment.getitem along a dotted path ("function.name", "0"), as make_attrgetter does.
Value attribute_of(Interpreter& in, const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  for (;;) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && part.size() < 19 && part.find_first_not_of("0123456789") == std::string::npos;
    v = digits ? in.getitem(v, Value(static_cast<int64_t>(std::stoll(part)))) : in.getitem(v, Value(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

Value f_tojson(Interpreter&, const Value& in, Call& c) {
  JsonStyle style;
  style.ensure_ascii = c.arg(0, "ensure_ascii", Value(false)).truthy();
  const Value indent = c.arg(1, "indent", Value::none());
  if (indent.is_string()) {
    style.indent = indent.str();
  } else if (indent.kind() == Kind::kInt) {
    style.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, indent.as_int())), ' ');
  } else if (!indent.is_none()) {
    throw Error("tojson: unsupported indent of type " + indent.type_name());
  }
  if (style.indent) style.item_separator = ",";
  if (const Value sep = c.arg(2, "separators", Value::none()); !sep.is_none()) {
    if (!sep.is_list() || sep.items().size() != 2) throw Error("tojson: separators must be a pair of strings");
    style.item_separator = sep.items()[0].to_str();
    style.key_separator = sep.items()[1].to_str();
  }
  style.sort_keys = c.arg(3, "sort_keys", Value(false)).truthy();
  return Value(to_json(in, style));
}

Value f_length(Interpreter&, const Value& in, Call&) {
  switch (in.kind()) {
    case Kind::kUndefined: return Value(int64_t{0});
    case Kind::kString: return Value(static_cast<int64_t>(code_point_count(in.str())));
    case Kind::kList:
      if (in.is_generator()) throw Error("object of type 'generator' has no len()");
      return Value(static_cast<int64_t>(in.items().size()));
    case Kind::kDict:
    case Kind::kNamespace: return Value(static_cast<int64_t>(in.entries().items.size()));
    default: throw Error("object of type '" + in.type_name() + "' has no len()");
  }
}

Value f_trim(Interpreter&, const Value& in, Call& c) {
  const Value chars = c.arg(0, "chars", Value::none());
  return Value(strip(in.to_str(), chars.is_none() ? std::nullopt : std::optional(chars.to_str()), true, true));
}

Value f_string(Interpreter&, const Value& in, Call&) { return in.is_string() ? in : Value(in.to_str()); }
Value f_safe(Interpreter&, const Value& in, Call&) { return Value(in.to_str(), true); }
Value f_escape(Interpreter&, const Value& in, Call&) {
  return in.is_safe() ? in : Value(html_escape(in.to_str()), true);
}
Value f_upper(Interpreter&, const Value& in, Call&) { return Value(to_upper(in.to_str())); }
Value f_lower(Interpreter&, const Value& in, Call&) { return Value(to_lower(in.to_str())); }
Value f_capitalize(Interpreter&, const Value& in, Call&) { return Value(to_capitalized(in.to_str())); }
Value f_title(Interpreter&, const Value& in, Call&) { return Value(to_title(in.to_str())); }

Value f_default(Interpreter&, const Value& in, Call& c) {
  const bool boolean = c.arg(1, "boolean", Value(false)).truthy();
  if (in.is_undefined() || (boolean && !in.truthy())) return c.arg(0, "default_value", Value(""));
  return in;
}

Value f_items(Interpreter&, const Value& in, Call&) {
  if (in.is_undefined()) return Value::list({});
  if (!in.is_dict()) throw Error("Can only get item pairs from a mapping.");
  List pairs;
  for (const auto& [k, v] : in.entries().items) pairs.push_back(Value::list({k, v}, true));
  return Value::list(std::move(pairs));
}

Value f_list(Interpreter&, const Value& in, Call&) { return Value::list(iterate(in)); }

Value f_first(Interpreter&, const Value& in, Call&) {
  const List items = iterate(in);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(Interpreter&, const Value& in, Call&) {
  if (in.is_generator()) throw Error("'generator' object is not reversible");
  const List items = iterate(in);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value f_join(Interpreter& interp, const Value& in, Call& c) {
  const std::string sep = str_arg(c, 0, "d", "");
  const Value attribute = c.arg(1, "attribute", Value::none());
  std::string out;
  bool first = true;
  for (const Value& item : iterate(in)) {
    if (!first) out += sep;
    first = false;
    out += (attribute.is_none() ? item : attribute_of(interp, item, attribute.to_str())).to_str();
  }
  return Value(std::move(out));
}

Value f_replace(Interpreter&, const Value& in, Call& c) {
  const Value count = c.arg(2, "count", Value::none());
  return Value(
      replace(in.to_str(), str_arg(c, 0, "old", ""), str_arg(c, 1, "new", ""), count.is_none() ? -1 : count.as_int()),
      in.is_safe());
}

Value f_indent(Interpreter&, const Value& in, Call& c) {
  const Value width = c.arg(0, "width", Value(int64_t{4}));
  const std::string indention =
      width.is_string() ? width.str() : std::string(static_cast<size_t>(std::max<int64_t>(0, width.as_int())), ' ');
  const bool first = c.arg(1, "first", Value(false)).truthy(), blank = c.arg(2, "blank", Value(false)).truthy();
  const std::string s = in.to_str() + "\n";
  const std::vector<std::string> lines = splitlines(s);
  std::string rv = lines.empty() ? "" : lines[0];
  for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (blank || !lines[i].empty() ? indention : "") + lines[i];
  if (first) rv = indention + rv;
  return Value(std::move(rv), in.is_safe());
}

Value f_int(Interpreter&, const Value& in, Call& c) {
  const Value fallback = c.arg(0, "default", Value(int64_t{0}));
  if (in.kind() == Kind::kFloat) return Value(static_cast<int64_t>(in.as_float()));
  if (in.is_number()) return Value(in.as_int());
  if (!in.is_string()) return fallback;
  const std::string s(strip(in.str(), std::nullopt, true, true));
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (!s.empty() && *end == 0 && errno == 0) return Value(static_cast<int64_t>(v));
  const double d = std::strtod(s.c_str(), &end);
  if (!s.empty() && *end == 0 && std::isfinite(d)) return Value(static_cast<int64_t>(d));
  return fallback;
}

Value f_float(Interpreter&, const Value& in, Call& c) {
  const Value fallback = c.arg(0, "default", Value(0.0));
  if (in.is_number()) return Value(in.as_float());
  if (!in.is_string()) return fallback;
  const std::string s(strip(in.str(), std::nullopt, true, true));
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  return !s.empty() && *end == 0 ? Value(d) : fallback;
}

Value f_abs(Interpreter&, const Value& in, Call&) {
  if (!in.is_number()) throw Error("bad operand type for abs(): '" + in.type_name() + "'");
  return in.kind() == Kind::kFloat ? Value(std::fabs(in.as_float()))
                                   : Value(static_cast<int64_t>(std::llabs(in.as_int())));
}

Value f_reverse(Interpreter&, const Value& in, Call&) {
  if (in.is_string()) {
    auto points = code_points(in.str());
    std::string out;
    for (auto it = points.rbegin(); it != points.rend(); ++it) out += *it;
    return Value(std::move(out));
  }
  List items = iterate(in);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_attr(Interpreter& interp, const Value& in, Call& c) { return interp.getattr(in, str_arg(c, 0, "name", "")); }

// select/reject(test, args...) and selectattr/rejectattr(attribute, test, args...).
Value select_items(Interpreter& interp, const Value& in, Call& c, bool by_attribute, bool keep) {
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (c.args.empty()) throw Error("selectattr/rejectattr: missing attribute");
    attribute = c.args[next++].to_str();
  }
  std::string test_name;
  if (next < c.args.size()) test_name = c.args[next++].to_str();
  Call test_args;
  test_args.args.assign(c.args.begin() + static_cast<std::ptrdiff_t>(next), c.args.end());
  test_args.kwargs = c.kwargs;
  List out;
  for (const Value& item : in.truthy() ? iterate(in) : List{}) {  // `if value:` first, as Jinja
    const Value v = by_attribute ? attribute_of(interp, item, attribute) : item;
    const bool passed = test_name.empty() ? v.truthy() : interp.test(test_name, v, test_args);
    if (passed == keep) out.push_back(item);
  }
  return Value::generator(std::move(out));
}

Value f_select(Interpreter& i, const Value& in, Call& c) { return select_items(i, in, c, false, true); }
Value f_reject(Interpreter& i, const Value& in, Call& c) { return select_items(i, in, c, false, false); }
Value f_selectattr(Interpreter& i, const Value& in, Call& c) { return select_items(i, in, c, true, true); }
Value f_rejectattr(Interpreter& i, const Value& in, Call& c) { return select_items(i, in, c, true, false); }

Value f_map(Interpreter& interp, const Value& in, Call& c) {
  List out;
  if (!in.truthy()) return Value::generator({});
  if (c.args.empty()) {
    const Value attribute = c.arg(99, "attribute");
    if (attribute.is_undefined()) throw Error("map: give a filter name or attribute=");
    const Value fallback = c.arg(99, "default");
    for (const Value& item : iterate(in)) {
      Value v = attribute_of(interp, item, attribute.to_str());
      out.push_back(v.is_undefined() && !fallback.is_undefined() ? fallback : v);
    }
    return Value::generator(std::move(out));
  }
  const std::string name = c.args[0].to_str();
  Call filter_args;
  filter_args.args.assign(c.args.begin() + 1, c.args.end());
  filter_args.kwargs = c.kwargs;
  for (const Value& item : iterate(in)) out.push_back(interp.filter(name, item, filter_args));
  return Value::generator(std::move(out));
}

// The key sort, unique, min and max compare by: the attribute, lower-cased unless case_sensitive.
Value sort_key(Interpreter& interp, const Value& item, const Value& attribute, bool case_sensitive) {
  Value v = attribute.is_none() || attribute.is_undefined() ? item : attribute_of(interp, item, attribute.to_str());
  return !case_sensitive && v.is_string() ? Value(to_lower(v.str())) : v;
}

Value f_sort(Interpreter& interp, const Value& in, Call& c) {
  const bool reverse = c.arg(0, "reverse", Value(false)).truthy();
  const bool case_sensitive = c.arg(1, "case_sensitive", Value(false)).truthy();
  const Value attribute = c.arg(2, "attribute", Value::none());
  List items = iterate(in);
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    const int r =
        compare(sort_key(interp, a, attribute, case_sensitive), sort_key(interp, b, attribute, case_sensitive));
    return reverse ? r > 0 : r < 0;
  });
  return Value::list(std::move(items));
}

Value f_dictsort(Interpreter& interp, const Value& in, Call& c) {
  const bool case_sensitive = c.arg(0, "case_sensitive", Value(false)).truthy();
  const std::string by = str_arg(c, 1, "by", "key");
  const bool reverse = c.arg(2, "reverse", Value(false)).truthy();
  if (by != "key" && by != "value") throw Error("You can only sort by either \"key\" or \"value\"");
  Call none;
  List pairs = f_items(interp, in, none).items();
  const size_t at = by == "key" ? 0 : 1;
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& a, const Value& b) {
    const int r = compare(sort_key(interp, a.items()[at], Value::none(), case_sensitive),
                          sort_key(interp, b.items()[at], Value::none(), case_sensitive));
    return reverse ? r > 0 : r < 0;
  });
  return Value::list(std::move(pairs));
}

Value f_unique(Interpreter& interp, const Value& in, Call& c) {
  const bool case_sensitive = c.arg(0, "case_sensitive", Value(false)).truthy();
  const Value attribute = c.arg(1, "attribute", Value::none());
  List out, seen;
  for (const Value& item : iterate(in)) {
    const Value key = sort_key(interp, item, attribute, case_sensitive);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, key); })) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value min_or_max(Interpreter& interp, const Value& in, Call& c, bool max) {
  const bool case_sensitive = c.arg(0, "case_sensitive", Value(false)).truthy();
  const Value attribute = c.arg(1, "attribute", Value::none());
  const List items = iterate(in);
  if (items.empty())
    return Value::undefined(max ? "No aggregated item, sequence was empty."
                                : "No aggregated item, sequence was empty.");
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    const int r = compare(sort_key(interp, items[i], attribute, case_sensitive),
                          sort_key(interp, items[best], attribute, case_sensitive));
    if (max ? r > 0 : r < 0) best = i;
  }
  return items[best];
}

Value f_min(Interpreter& i, const Value& in, Call& c) { return min_or_max(i, in, c, false); }
Value f_max(Interpreter& i, const Value& in, Call& c) { return min_or_max(i, in, c, true); }

Value f_sum(Interpreter& interp, const Value& in, Call& c) {
  const Value attribute = c.arg(0, "attribute", Value::none());
  Value total = c.arg(1, "start", Value(int64_t{0}));
  for (const Value& item : iterate(in)) {
    total = binary("+", total, attribute.is_none() ? item : attribute_of(interp, item, attribute.to_str()));
  }
  return total;
}

Value f_format(Interpreter&, const Value& in, Call& c) {
  if (!c.kwargs.empty()) throw Error("format: keyword arguments are not supported");
  return binary("%", Value(in.to_str()), Value::list(c.args, true));
}

Value f_round(Interpreter&, const Value& in, Call& c) {
  const int64_t precision = c.arg(0, "precision", Value(int64_t{0})).as_int();
  const std::string method = str_arg(c, 1, "method", "common");
  const double scale = std::pow(10.0, static_cast<double>(precision)), x = in.as_float() * scale;
  double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::round(x);
  if (method != "common" && method != "ceil" && method != "floor") throw Error("method must be common, ceil or floor");
  return Value(r / scale);
}

Value f_wordcount(Interpreter&, const Value& in, Call&) {
  return Value(static_cast<int64_t>(split(in.to_str(), std::nullopt, -1).size()));
}

// The filters named as their functions (f_NAME), and the aliases below.
// clang-format off
#define TANDEM_JINJA_FILTERS(X) \
  X(abs) X(attr) X(capitalize) X(default) X(dictsort) X(escape) X(first) X(float) X(format) X(indent) X(int) \
  X(items) X(join) X(last) X(length) X(list) X(lower) X(map) X(max) X(min) X(reject) X(rejectattr) X(replace) \
  X(reverse) X(round) X(safe) X(select) X(selectattr) X(sort) X(string) X(sum) X(title) X(tojson) X(trim) \
  X(unique) X(upper) X(wordcount)
// clang-format on

}  // namespace

FilterFn find_filter(const std::string& name) {
#define TANDEM_NAMED(name) {#name, f_##name},
  static const NameTable<FilterFn> table({TANDEM_JINJA_FILTERS(TANDEM_NAMED)},
                                         {{"count", f_length}, {"d", f_default}, {"e", f_escape}});
#undef TANDEM_NAMED
  return table.find(name);
}

bool has_filter(const std::string& name) { return find_filter(name) != nullptr; }

}  // namespace tandem::model::jinja
