// JSON <-> values: the reader for messages and tools given as JSON text, and Python's
// json.dumps, which HF's tojson filter is.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "model/jinja/value.h"

namespace tandem::model::jinja {

// RFC 8259 text -> Value, read by the one JSON parser (runtime/json_value.h) as Python's
// json.loads reads it: objects keep their key order, the last of duplicate keys wins, numbers
// with a fraction or exponent are floats. Throws Error naming the offset of the first problem.
Value parse_json(std::string_view text);

struct JsonStyle {
  std::optional<std::string> indent;  // None: one line
  std::string item_separator = ", ", key_separator = ": ";
  bool ensure_ascii = false, sort_keys = false;
};

// json.dumps(value, ...) byte for byte; Error for what JSON cannot hold (Undefined, functions).
std::string to_json(const Value& value, const JsonStyle& style);

}  // namespace tandem::model::jinja
