// Tokens -> the statement tree (model/jinja/ast.h), with Jinja's operator precedence. The
// statements are the ones chat templates use; any other tag (extends, include, import, block,
// with, ...) is an error naming it. As in Jinja, an unknown filter or test is a compile error
// unless it sits under an `if` (then it fails only when evaluated).
#pragma once

#include <string_view>

#include "model/jinja/ast.h"

namespace tandem::model::jinja {

// Throws Error naming the line and what was expected.
Program parse(std::string_view source);

// The builtins the parser accepts (model/jinja/builtins.cpp).
bool has_filter(const std::string& name);
bool has_test(const std::string& name);

}  // namespace tandem::model::jinja
