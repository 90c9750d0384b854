#include "model/jinja/json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "runtime/json.h"
#include "runtime/json_value.h"
#include "model/jinja/strings.h"

namespace tandem::model::jinja {
namespace {

// Python's json.loads result as a Value: integers past int64 become floats (Python keeps them
// exact; no chat template meets one), duplicate keys keep the first key's place and the last
// value (Dict::set), as a Python dict built from the pairs does.
Value from_json(const runtime::JsonValue& j) {
  using K = runtime::JsonValue::Kind;
  switch (j.kind()) {
    case K::kNull: return Value::none();
    case K::kBool: return Value(j.as_bool());
    case K::kInt: return Value(j.as_int());
    case K::kUint:
    case K::kDouble: return Value(j.as_double());
    case K::kString: return Value(j.as_string());
    case K::kArray: {
      List items;
      items.reserve(j.as_array().size());
      for (const auto& e : j.as_array()) items.push_back(from_json(e));
      return Value::list(std::move(items));
    }
    case K::kObject: {
      Dict d;
      for (const auto& [k, v] : j.as_object()) d.set(Value(k), from_json(v));
      return Value::dict(std::move(d));
    }
  }
  return Value::none();
}

// Python's json string: with ensure_ascii=False as the one JSON writer (runtime/json.h) writes it.
void append_string(std::string& out, const std::string& s, bool ensure_ascii) {
  if (!ensure_ascii) return runtime::append_json_string(out, s);
  out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    char buf[16];
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else if (c < 0x80 || !ensure_ascii) {
      out += static_cast<char>(c);
    } else {
      const size_t n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
      uint32_t cp = c & (n == 4 ? 0x07 : n == 3 ? 0x0f : 0x1f);
      for (size_t k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
      i += n - 1;
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      }
      out += buf;
    }
  }
  out += '"';
}

std::string scalar_json(const Value& v) {
  switch (v.kind()) {
    case Kind::kNone: return "null";
    case Kind::kBool: return v.as_bool() ? "true" : "false";
    case Kind::kInt: return std::to_string(v.as_int());
    case Kind::kFloat: {
      const double d = v.as_float();
      if (std::isnan(d)) return "NaN";
      if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
      return float_repr(d);
    }
    default: throw Error("Object of type " + v.type_name() + " is not JSON serializable");
  }
}

void dump(std::string& out, const Value& v, const JsonStyle& style, int depth);

void newline(std::string& out, const JsonStyle& style, int depth) {
  out += '\n';
  for (int i = 0; i < depth; ++i) out += *style.indent;
}

void dump_dict(std::string& out, const Dict& d, const JsonStyle& style, int depth) {
  if (d.items.empty()) {
    out += "{}";
    return;
  }
  std::vector<std::pair<std::string, const Value*>> entries;
  for (const auto& [k, v] : d.items) {
    if (!k.is_string() && k.kind() != Kind::kNone && !k.is_number()) {
      throw Error("keys must be str, int, float, bool or None, not " + k.type_name());
    }
    entries.emplace_back(k.is_string() ? k.str() : scalar_json(k), &v);
  }
  if (style.sort_keys) {
    std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  }
  out += '{';
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i) out += style.item_separator;
    if (style.indent) newline(out, style, depth + 1);
    append_string(out, entries[i].first, style.ensure_ascii);
    out += style.key_separator;
    dump(out, *entries[i].second, style, depth + 1);
  }
  if (style.indent) newline(out, style, depth);
  out += '}';
}

void dump(std::string& out, const Value& v, const JsonStyle& style, int depth) {
  if (depth > 512) throw Error("maximum recursion depth exceeded while encoding JSON");
  if (v.is_string()) return append_string(out, v.str(), style.ensure_ascii);
  if (v.is_dict()) return dump_dict(out, v.entries(), style, depth);
  if (!v.is_list() || v.is_generator()) {
    out += scalar_json(v);
    return;
  }
  if (v.items().empty()) {
    out += "[]";
    return;
  }
  out += '[';
  for (size_t i = 0; i < v.items().size(); ++i) {
    if (i) out += style.item_separator;
    if (style.indent) newline(out, style, depth + 1);
    dump(out, v.items()[i], style, depth + 1);
  }
  if (style.indent) newline(out, style, depth);
  out += ']';
}

}  // namespace

Value parse_json(std::string_view text) {
  auto json = runtime::parse_json(text);
  if (!json) throw Error(json.status().message());
  return from_json(*json);
}

std::string to_json(const Value& value, const JsonStyle& style) {
  std::string out;
  dump(out, value, style, 0);
  return out;
}

}  // namespace tandem::model::jinja
