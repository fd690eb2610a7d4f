#include "chat/arguments.hpp"

#include <cstring>

namespace rlforge::chat::detail {

std::vector<std::optional<value>> bind(const call_args& args, std::initializer_list<param> params,
                                       const std::string& function) {
  std::vector<std::optional<value>> out(params.size());
  if (args.positional.size() > params.size())
    throw template_error(error_kind::runtime,
                         function + "() takes at most " + std::to_string(params.size()) +
                             " argument(s), " + std::to_string(args.positional.size()) + " given",
                         args.where);
  for (std::size_t i = 0; i < args.positional.size(); ++i)
    out[i] = args.positional[i];
  for (const auto& [key, v] : args.keyword) {
    std::size_t i = 0;
    bool found = false;
    for (const auto& p : params) {
      if (key == p.name) {
        found = true;
        break;
      }
      ++i;
    }
    if (!found)
      throw template_error(error_kind::runtime,
                           function + "() got an unexpected keyword argument '" + key + "'",
                           args.where);
    if (out[i])
      throw template_error(error_kind::runtime,
                           function + "() got multiple values for argument '" + key + "'",
                           args.where);
    out[i] = v;
  }
  std::size_t i = 0;
  for (const auto& p : params) {
    if (p.required && !out[i])
      throw template_error(error_kind::runtime,
                           function + "() missing required argument '" + p.name + "'", args.where);
    ++i;
  }
  return out;
}

const std::string& require_string(const value& x, const std::string& what, source_position where) {
  if (x.is_undefined())
    fail_undefined(x, where);
  if (!x.is(value::kind::string))
    throw template_error(error_kind::runtime, what + " must be a str, not " + type_name(x), where);
  return x.as_string();
}

int64_t require_int(const value& x, const std::string& what, source_position where) {
  if (x.is_undefined())
    fail_undefined(x, where);
  if (x.is(value::kind::boolean))
    return x.as_bool() ? 1 : 0;
  if (!x.is(value::kind::integer))
    throw template_error(error_kind::runtime, what + " must be an int, not " + type_name(x), where);
  return x.as_int();
}

void fail_undefined(const value& x, source_position where) {
  const std::string& hint = x.is_undefined() ? x.undefined_hint() : std::string();
  throw template_error(error_kind::runtime, hint.empty() ? "an undefined value was used" : hint,
                       where);
}

} // namespace rlforge::chat::detail
