#pragma once

#include <string>

#include "chat/ast.hpp"
#include "chat/value.hpp"

/// The evaluator: walks a parsed template with a set of variables and returns the text.
///
/// Scoping follows Jinja: the template's top level is one scope (its `set`s are visible to the
/// rest of the template), each for loop and each macro call opens a child scope whose `set`s do
/// not leak out (use `namespace()` to carry state out of a loop), and `if` opens none. Lookups go
/// from the innermost scope out to the render's variables, then the globals
/// (chat/globals.hpp). A name found nowhere is Undefined.
///
/// Thread safety: `render` is reentrant; concurrent renders of the same tree are safe.
namespace rlforge::chat::detail {

/// Renders `program` with `variables` (which shadow the globals). Throws template_error.
std::string render(const stmt_list& program, const value_dict& variables);

} // namespace rlforge::chat::detail
