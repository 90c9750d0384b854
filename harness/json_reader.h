// A minimal JSON reader for what the harness reads: dataset lines and SSE chunks (flat fields).
// runtime/json.h is the writer; nothing else in tandem reads JSON.
#pragma once

#include <optional>
#include <string>

namespace tandem::bench {

// Reads values from `s` starting at `i`; each call skips leading whitespace, and on failure
// leaves `i` somewhere inside the value it gave up on.
struct JsonCursor {
  const std::string& s;
  size_t i = 0;

  void ws();
  bool eat(char c);  // true (and consumed) when the next character is c
  // A string literal, escapes decoded (\uXXXX to UTF-8; surrogates passed through, 3 bytes each).
  bool string(std::string& out);
  bool number(double& out);
  bool skip();  // any value (nesting bounded by the input length)
};

// A cursor just past `"key":` at the first occurrence of `"key"` in `json`, or nothing.
std::optional<JsonCursor> json_field(const std::string& json, const char* key);

}  // namespace tandem::bench
