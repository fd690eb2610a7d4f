#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "chat/value.hpp"

/// Python-style binding of call arguments to named parameters, shared by filters, tests,
/// methods and global functions. Reentrant.
namespace rlforge::chat::detail {

struct param {
  const char* name;
  bool required = false;
};

/// Binds `args` (positional first, then keywords by name) to `params`; an unbound optional
/// parameter is empty. Throws template_error (runtime) naming `function` for too many
/// positional arguments, an unknown or repeated keyword, or a missing required argument.
std::vector<std::optional<value>> bind(const call_args& args, std::initializer_list<param> params,
                                       const std::string& function);

/// Throws template_error (runtime) unless `x` is a str; `what` names the argument.
const std::string& require_string(const value& x, const std::string& what, source_position where);

/// Throws template_error (runtime) unless `x` is an int (or bool); `what` names the argument.
int64_t require_int(const value& x, const std::string& what, source_position where);

/// The error for using Undefined where Jinja's Undefined raises: its hint ("'x' is undefined").
[[noreturn]] void fail_undefined(const value& x, source_position where);

} // namespace rlforge::chat::detail
