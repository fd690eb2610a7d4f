#pragma once

#include <string>
#include <vector>

#include "chat/value.hpp"

/// Python's operators on template values, as Jinja evaluates them: arithmetic with Python's
/// int/float rules (floor division and modulo round toward negative infinity, `/` gives a float),
/// `+` on str/list, `*` repetition, `~` concatenation through str(), membership and iteration.
/// Integers are 64-bit: an overflow is refused rather than wrapped. Reentrant.
namespace rlforge::chat::detail {

/// `a <op> b` for op in + - * / // % ** ~. Throws template_error naming the operator and types.
value binary_op(const std::string& op, const value& a, const value& b, source_position where);

/// `-x` and `+x` on numbers (a bool counts as 0/1).
value unary_op(char op, const value& x, source_position where);

/// Python `item in container`: substring for str, element for list, key for dict; nothing is in
/// Undefined. Other containers throw.
bool contains(const value& container, const value& item, source_position where);

/// The elements a for loop or filter walks: list items, dict keys, the characters of a str;
/// Undefined is empty. Other values throw "'int' object is not iterable".
std::vector<value> iterate(const value& x, source_position where);

} // namespace rlforge::chat::detail
