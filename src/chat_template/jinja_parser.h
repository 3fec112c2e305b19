// The Jinja parser: tokens to a syntax tree, with jinja2's grammar and operator precedence.
#pragma once

#include "chat_template/jinja_ast.h"

#include <string_view>

namespace jambo::chat_template {

// Parses a source normalized by normalize_newlines(); throws SyntaxError (an unknown tag, filter or
// test is a syntax error, as jinja2 reports it when it compiles the template).
Body parse_template(std::string_view source);

}  // namespace jambo::chat_template
