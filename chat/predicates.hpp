#pragma once

#include <string>

#include "chat/value.hpp"

/// Jinja's tests (`x is name`), with Python's answers: defined, undefined, none, boolean, true,
/// false, integer, float, number, string, mapping, iterable, sequence, callable, odd, even,
/// divisibleby, eq/equalto/==, ne/!=, lt/<, le/<=, gt/>, ge/>=, in. Any other test is refused
/// (error_kind::unsupported) naming it. Reentrant.
namespace rlforge::chat::detail {

/// True for the tests listed above (the parser refuses any other name when it compiles a
/// template; `select`/`selectattr` check theirs when they run).
bool is_known_test(const std::string& name);

/// Applies test `name` to `subject` with the extra arguments in `args` (its `where` is the
/// test's position).
bool apply_test(const std::string& name, const value& subject, call_args& args);

} // namespace rlforge::chat::detail
