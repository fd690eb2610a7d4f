#pragma once

#include <vector>

#include "chat/ast.hpp"
#include "chat/lexer.hpp"

/// The parser: tokens (chat/lexer.hpp) to a statement list (chat/ast.hpp), with Jinja's grammar
/// and operator precedence (lowest first: `x if c else y`, `or`, `and`, `not`, comparisons and
/// `in`, `+ -`, `~`, `* / // %`, `**`, unary `- +`, then filters `|`, tests `is`, calls,
/// attributes and subscripts). Tags: if/elif/else, for (with `if` filter and `else`), set (plain,
/// namespace attribute, tuple, block), macro, break, continue, and transformers' generation.
/// Every other tag is refused (error_kind::unsupported) naming it and where it is. Reentrant.
namespace rlforge::chat::detail {

/// Parses a whole template. Throws template_error (syntax or unsupported).
stmt_list parse(const std::vector<token>& tokens);

} // namespace rlforge::chat::detail
