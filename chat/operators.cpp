#include "chat/operators.hpp"

#include <cmath>

#include "chat/arguments.hpp"
#include "chat/unicode.hpp"

namespace rlforge::chat::detail {

namespace {

using k = value::kind;

bool integral(const value& x) {
  return x.is(k::integer) || x.is(k::boolean);
}

bool numeric(const value& x) {
  return integral(x) || x.is(k::floating);
}

int64_t to_int(const value& x) {
  return x.is(k::boolean) ? (x.as_bool() ? 1 : 0) : x.as_int();
}

double to_double(const value& x) {
  return x.is(k::floating) ? x.as_float() : static_cast<double>(to_int(x));
}

[[noreturn]] void unsupported_operands(const std::string& op, const value& a, const value& b,
                                       source_position where) {
  throw template_error(error_kind::runtime,
                       "unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" +
                           type_name(b) + "'",
                       where);
}

[[noreturn]] void overflow(const std::string& op, source_position where) {
  throw template_error(error_kind::unsupported,
                       "integer overflow in '" + op + "' (only 64-bit integers are supported)",
                       where);
}

[[noreturn]] void zero_division(source_position where) {
  throw template_error(error_kind::runtime, "division by zero", where);
}

value repeat(const value& seq, int64_t times, source_position where) {
  if (times <= 0)
    return seq.is(k::string) ? value::string("") : value::list({});
  if (seq.is(k::string)) {
    const auto& s = seq.as_string();
    if (s.size() * static_cast<std::size_t>(times) > (std::size_t{1} << 30))
      throw template_error(error_kind::runtime, "string repetition result is too large", where);
    std::string out;
    for (int64_t i = 0; i < times; ++i)
      out += s;
    return value::string(std::move(out));
  }
  const auto& items = seq.as_list();
  if (items.size() * static_cast<std::size_t>(times) > (std::size_t{1} << 24))
    throw template_error(error_kind::runtime, "list repetition result is too large", where);
  value_list out;
  for (int64_t i = 0; i < times; ++i)
    out.insert(out.end(), items.begin(), items.end());
  return value::list(std::move(out));
}

value int_pow(int64_t base, int64_t exp, source_position where) {
  int64_t result = 1;
  while (exp > 0) {
    if (exp & 1) {
      if (__builtin_mul_overflow(result, base, &result))
        overflow("**", where);
    }
    exp >>= 1;
    if (exp > 0 && __builtin_mul_overflow(base, base, &base))
      overflow("**", where);
  }
  return value::integer(result);
}

} // namespace

value binary_op(const std::string& op, const value& a, const value& b, source_position where) {
  if (op == "~")
    return value::string(to_str(a, where) + to_str(b, where));
  if (a.is_undefined())
    fail_undefined(a, where);
  if (b.is_undefined())
    fail_undefined(b, where);
  if (numeric(a) && numeric(b)) {
    if (integral(a) && integral(b)) {
      const int64_t x = to_int(a), y = to_int(b);
      int64_t r = 0;
      if (op == "+") {
        if (__builtin_add_overflow(x, y, &r))
          overflow(op, where);
        return value::integer(r);
      }
      if (op == "-") {
        if (__builtin_sub_overflow(x, y, &r))
          overflow(op, where);
        return value::integer(r);
      }
      if (op == "*") {
        if (__builtin_mul_overflow(x, y, &r))
          overflow(op, where);
        return value::integer(r);
      }
      if (op == "/") {
        if (y == 0)
          zero_division(where);
        return value::floating(static_cast<double>(x) / static_cast<double>(y));
      }
      if (op == "//" || op == "%") {
        if (y == 0)
          zero_division(where);
        if (x == INT64_MIN && y == -1)
          overflow(op, where);
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          q -= 1;
          m += y;
        }
        return value::integer(op == "//" ? q : m);
      }
      if (op == "**") {
        if (y < 0) {
          if (x == 0)
            zero_division(where);
          return value::floating(std::pow(static_cast<double>(x), static_cast<double>(y)));
        }
        return int_pow(x, y, where);
      }
    } else {
      const double x = to_double(a), y = to_double(b);
      if (op == "+")
        return value::floating(x + y);
      if (op == "-")
        return value::floating(x - y);
      if (op == "*")
        return value::floating(x * y);
      if (op == "/") {
        if (y == 0)
          zero_division(where);
        return value::floating(x / y);
      }
      if (op == "//" || op == "%") {
        if (y == 0)
          zero_division(where);
        // CPython's float divmod.
        double m = std::fmod(x, y);
        double div = (x - m) / y;
        if (m != 0) {
          if ((y < 0) != (m < 0)) {
            m += y;
            div -= 1.0;
          }
        } else {
          m = std::copysign(0.0, y);
        }
        if (op == "%")
          return value::floating(m);
        double floor_div = 0.0;
        if (div != 0) {
          floor_div = std::floor(div);
          if (div - floor_div > 0.5)
            floor_div += 1.0;
        } else {
          floor_div = std::copysign(0.0, x / y);
        }
        return value::floating(floor_div);
      }
      if (op == "**") {
        if (x == 0 && y < 0)
          zero_division(where);
        const double r = std::pow(x, y);
        if (std::isnan(r) && !std::isnan(x) && !std::isnan(y))
          throw template_error(error_kind::unsupported,
                               "'**' with a complex result is not supported", where);
        return value::floating(r);
      }
    }
  }
  if (op == "+") {
    if (a.is(k::string) && b.is(k::string))
      return value::string(a.as_string() + b.as_string());
    if (a.is(k::list) && b.is(k::list)) {
      value_list out = a.as_list();
      out.insert(out.end(), b.as_list().begin(), b.as_list().end());
      return value::list(std::move(out));
    }
  }
  if (op == "*") {
    if ((a.is(k::string) || a.is(k::list)) && integral(b))
      return repeat(a, to_int(b), where);
    if (integral(a) && (b.is(k::string) || b.is(k::list)))
      return repeat(b, to_int(a), where);
  }
  if (op == "%" && a.is(k::string))
    throw template_error(error_kind::unsupported,
                         "printf-style string formatting ('%' on a str) is not supported", where);
  unsupported_operands(op, a, b, where);
}

value unary_op(char op, const value& x, source_position where) {
  if (x.is_undefined())
    fail_undefined(x, where);
  if (x.is(k::floating))
    return value::floating(op == '-' ? -x.as_float() : x.as_float());
  if (integral(x)) {
    const int64_t v = to_int(x);
    if (op == '-' && v == INT64_MIN)
      overflow("-", where);
    return value::integer(op == '-' ? -v : v);
  }
  throw template_error(error_kind::runtime,
                       std::string("bad operand type for unary ") + op + ": '" + type_name(x) + "'",
                       where);
}

bool contains(const value& container, const value& item, source_position where) {
  switch (container.type()) {
  case k::undefined:
    return false;
  case k::string:
    if (!item.is(k::string))
      throw template_error(error_kind::runtime,
                           "'in <string>' requires string as left operand, not " + type_name(item),
                           where);
    return container.as_string().find(item.as_string()) != std::string::npos;
  case k::list:
    for (const auto& x : container.as_list())
      if (equals(x, item))
        return true;
    return false;
  case k::dict:
    if (item.is(k::list) || item.is(k::dict))
      throw template_error(error_kind::runtime, "unhashable type: '" + type_name(item) + "'",
                           where);
    return item.is(k::string) && container.as_dict().find(item.as_string()) != nullptr;
  default:
    throw template_error(error_kind::runtime,
                         "argument of type '" + type_name(container) + "' is not iterable", where);
  }
}

std::vector<value> iterate(const value& x, source_position where) {
  std::vector<value> out;
  switch (x.type()) {
  case k::undefined:
    return out;
  case k::list:
    return x.as_list();
  case k::dict:
    for (const auto& kv : x.as_dict().items())
      out.push_back(value::string(kv.first));
    return out;
  case k::string:
    for (char32_t cp : decode_utf8(x.as_string())) {
      std::string s;
      append_utf8(s, cp);
      out.push_back(value::string(std::move(s)));
    }
    return out;
  default:
    throw template_error(error_kind::runtime, "'" + type_name(x) + "' object is not iterable",
                         where);
  }
}

} // namespace rlforge::chat::detail
