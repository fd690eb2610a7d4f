#include "chat/predicates.hpp"

#include "chat/arguments.hpp"
#include "chat/operators.hpp"

namespace rlforge::chat::detail {

namespace {

using k = value::kind;

int64_t integer_operand(const value& x, const std::string& test, source_position where) {
  if (x.is_undefined())
    fail_undefined(x, where);
  if (x.is(k::boolean))
    return x.as_bool() ? 1 : 0;
  if (!x.is(k::integer))
    throw template_error(error_kind::unsupported,
                         "test '" + test + "' on a " + type_name(x) + " is not supported", where);
  return x.as_int();
}

} // namespace

bool is_known_test(const std::string& name) {
  static const char* const names[] = {
      "defined", "undefined", "none",        "boolean", "true",     "false",    "integer",
      "float",   "number",    "string",      "mapping", "iterable", "sequence", "callable",
      "odd",     "even",      "divisibleby", "eq",      "equalto",  "==",       "ne",
      "!=",      "lt",        "le",          "gt",      "ge",       "in"};
  for (const char* n : names)
    if (name == n)
      return true;
  return false;
}

bool apply_test(const std::string& name, const value& x, call_args& args) {
  const auto where = args.where;
  const std::string fn = "test " + name;
  auto no_args = [&] { bind(args, {}, fn); };
  if (name == "defined" || name == "undefined") {
    no_args();
    return x.is_undefined() == (name == "undefined");
  }
  if (name == "none") {
    no_args();
    return x.is(k::none);
  }
  if (name == "boolean") {
    no_args();
    return x.is(k::boolean);
  }
  if (name == "true" || name == "false") {
    no_args();
    return x.is(k::boolean) && x.as_bool() == (name == "true");
  }
  if (name == "integer") {
    no_args();
    return x.is(k::integer);
  }
  if (name == "float") {
    no_args();
    return x.is(k::floating);
  }
  if (name == "number") {
    no_args();
    return x.is(k::integer) || x.is(k::floating) || x.is(k::boolean);
  }
  if (name == "string") {
    no_args();
    return x.is(k::string);
  }
  if (name == "mapping") {
    no_args();
    return x.is(k::dict);
  }
  if (name == "iterable") {
    // Python: iter(x) works for str, list, dict and Jinja's Undefined.
    no_args();
    return x.is(k::string) || x.is(k::list) || x.is(k::dict) || x.is_undefined();
  }
  if (name == "sequence") {
    // Jinja: len(x) and x.__getitem__ exist (Undefined has both).
    no_args();
    return x.is(k::string) || x.is(k::list) || x.is(k::dict) || x.is_undefined();
  }
  if (name == "callable") {
    // Jinja's Undefined defines __call__ (to raise), so Python calls it callable.
    no_args();
    return x.is(k::function) || x.is_undefined();
  }
  if (name == "odd" || name == "even") {
    no_args();
    const int64_t v = integer_operand(x, name, where);
    const int64_t r = ((v % 2) + 2) % 2;
    return name == "odd" ? r == 1 : r == 0;
  }
  if (name == "divisibleby") {
    auto p = bind(args, {{"num", true}}, fn);
    const int64_t v = integer_operand(x, name, where);
    const int64_t d = integer_operand(*p[0], name, where);
    if (d == 0)
      throw template_error(error_kind::runtime, "divisibleby: division by zero", where);
    return v % d == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==" || name == "ne" || name == "!=") {
    auto p = bind(args, {{"other", true}}, fn);
    const bool eq = equals(x, *p[0]);
    return (name == "ne" || name == "!=") ? !eq : eq;
  }
  if (name == "lt" || name == "le" || name == "gt" || name == "ge") {
    auto p = bind(args, {{"other", true}}, fn);
    if (x.is_undefined())
      fail_undefined(x, where);
    if (p[0]->is_undefined())
      fail_undefined(*p[0], where);
    const int c = compare(x, *p[0], where);
    if (c == 2)
      return false;
    if (name == "lt")
      return c < 0;
    if (name == "le")
      return c <= 0;
    if (name == "gt")
      return c > 0;
    return c >= 0;
  }
  if (name == "in") {
    auto p = bind(args, {{"seq", true}}, fn);
    return contains(*p[0], x, where);
  }
  throw template_error(error_kind::unsupported, "test '" + name + "' is not supported", where);
}

} // namespace rlforge::chat::detail
