#include "chat/value.hpp"

#include <cmath>

#include "chat/py_format.hpp"
#include "chat/unicode.hpp"

namespace rlforge::chat::detail {

value value::undefined(std::string hint) {
  value v;
  v.data_ = undefined_value{std::move(hint)};
  return v;
}

value value::none() {
  value v;
  v.data_ = nullptr;
  return v;
}

value value::boolean(bool x) {
  value v;
  v.data_ = x;
  return v;
}

value value::integer(int64_t x) {
  value v;
  v.data_ = x;
  return v;
}

value value::floating(double x) {
  value v;
  v.data_ = x;
  return v;
}

value value::string(std::string x) {
  value v;
  v.data_ = std::move(x);
  return v;
}

value value::list(value_list x) {
  value v;
  v.data_ = std::shared_ptr<const value_list>(std::make_shared<value_list>(std::move(x)));
  return v;
}

value value::dict(value_dict x) {
  value v;
  v.data_ = std::shared_ptr<const value_dict>(std::make_shared<value_dict>(std::move(x)));
  return v;
}

value value::object(std::shared_ptr<object_data> x) {
  value v;
  v.data_ = std::move(x);
  return v;
}

value value::function(std::string name, std::function<value(call_args&)> body) {
  value v;
  v.data_ = std::shared_ptr<const function_data>(
      std::make_shared<function_data>(function_data{std::move(name), std::move(body)}));
  return v;
}

const void* value::identity() const noexcept {
  switch (type()) {
  case kind::list:
    return std::get<std::shared_ptr<const value_list>>(data_).get();
  case kind::dict:
    return std::get<std::shared_ptr<const value_dict>>(data_).get();
  case kind::object:
    return std::get<std::shared_ptr<object_data>>(data_).get();
  case kind::function:
    return std::get<std::shared_ptr<const function_data>>(data_).get();
  default:
    return nullptr;
  }
}

const value* value_dict::find(std::string_view key) const {
  auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

void value_dict::set(const std::string& key, value v) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    items_[it->second].second = std::move(v);
    return;
  }
  index_.emplace(key, items_.size());
  items_.emplace_back(key, std::move(v));
}

std::string type_name(const value& x) {
  using k = value::kind;
  switch (x.type()) {
  case k::undefined:
    return "Undefined";
  case k::none:
    return "NoneType";
  case k::boolean:
    return "bool";
  case k::integer:
    return "int";
  case k::floating:
    return "float";
  case k::string:
    return "str";
  case k::list:
    return "list";
  case k::dict:
    return "dict";
  case k::object:
    return x.as_object().type_name;
  case k::function:
    return "function";
  }
  return "object";
}

bool truthy(const value& x) {
  using k = value::kind;
  switch (x.type()) {
  case k::undefined:
  case k::none:
    return false;
  case k::boolean:
    return x.as_bool();
  case k::integer:
    return x.as_int() != 0;
  case k::floating:
    return x.as_float() != 0.0;
  case k::string:
    return !x.as_string().empty();
  case k::list:
    return !x.as_list().empty();
  case k::dict:
    return x.as_dict().size() != 0;
  case k::object:
  case k::function:
    return true;
  }
  return false;
}

std::string to_str(const value& x, source_position where) {
  using k = value::kind;
  switch (x.type()) {
  case k::undefined:
    return "";
  case k::none:
    return "None";
  case k::boolean:
    return x.as_bool() ? "True" : "False";
  case k::integer:
    return std::to_string(x.as_int());
  case k::floating:
    return float_repr(x.as_float());
  case k::string:
    return x.as_string();
  default:
    throw template_error(error_kind::unsupported,
                         "converting a " + type_name(x) +
                             " to text (Python's repr) is not supported; use |tojson",
                         where);
  }
}

namespace {

bool is_number(const value& x) {
  return x.is(value::kind::boolean) || x.is(value::kind::integer) || x.is(value::kind::floating);
}

bool is_integral(const value& x) {
  return x.is(value::kind::boolean) || x.is(value::kind::integer);
}

int64_t integral(const value& x) {
  return x.is(value::kind::boolean) ? (x.as_bool() ? 1 : 0) : x.as_int();
}

double numeric(const value& x) {
  return x.is(value::kind::floating) ? x.as_float() : static_cast<double>(integral(x));
}

} // namespace

bool equals(const value& a, const value& b) {
  using k = value::kind;
  if (is_number(a) && is_number(b)) {
    if (is_integral(a) && is_integral(b))
      return integral(a) == integral(b);
    return numeric(a) == numeric(b);
  }
  if (a.type() != b.type())
    return false;
  switch (a.type()) {
  case k::undefined:
  case k::none:
    return true;
  case k::string:
    return a.as_string() == b.as_string();
  case k::list: {
    const auto& x = a.as_list();
    const auto& y = b.as_list();
    if (x.size() != y.size())
      return false;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (!equals(x[i], y[i]))
        return false;
    return true;
  }
  case k::dict: {
    const auto& x = a.as_dict();
    const auto& y = b.as_dict();
    if (x.size() != y.size())
      return false;
    for (const auto& [key, v] : x.items()) {
      const value* other = y.find(key);
      if (other == nullptr || !equals(v, *other))
        return false;
    }
    return true;
  }
  default:
    return a.identity() == b.identity();
  }
}

int compare(const value& a, const value& b, source_position where) {
  if (is_number(a) && is_number(b)) {
    if (is_integral(a) && is_integral(b)) {
      const int64_t x = integral(a), y = integral(b);
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    const double x = numeric(a), y = numeric(b);
    if (std::isnan(x) || std::isnan(y))
      return 2; // unordered: every comparison but != is false
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is(value::kind::string) && b.is(value::kind::string)) {
    // UTF-8 byte order is code point order.
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is(value::kind::list) && b.is(value::kind::list)) {
    const auto& x = a.as_list();
    const auto& y = b.as_list();
    for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i]))
        continue;
      return compare(x[i], y[i], where);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  throw template_error(error_kind::runtime,
                       "'<' not supported between instances of '" + type_name(a) + "' and '" +
                           type_name(b) + "'",
                       where);
}

value from_json(const nlohmann::ordered_json& x) {
  using t = nlohmann::ordered_json::value_t;
  switch (x.type()) {
  case t::null:
  case t::discarded:
    return value::none();
  case t::boolean:
    return value::boolean(x.get<bool>());
  case t::number_integer:
    return value::integer(x.get<int64_t>());
  case t::number_unsigned: {
    const auto u = x.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX))
      throw template_error(error_kind::unsupported,
                           "integer " + std::to_string(u) + " is larger than 2^63-1");
    return value::integer(static_cast<int64_t>(u));
  }
  case t::number_float:
    return value::floating(x.get<double>());
  case t::string: {
    auto s = x.get<std::string>();
    if (!valid_utf8(s))
      throw template_error(error_kind::runtime, "a string of the input is not valid UTF-8");
    return value::string(std::move(s));
  }
  case t::array: {
    value_list items;
    items.reserve(x.size());
    for (const auto& item : x)
      items.push_back(from_json(item));
    return value::list(std::move(items));
  }
  case t::object: {
    value_dict d;
    for (auto it = x.begin(); it != x.end(); ++it)
      d.set(it.key(), from_json(it.value()));
    return value::dict(std::move(d));
  }
  case t::binary:
    break;
  }
  throw template_error(error_kind::unsupported, "binary JSON values are not supported");
}

} // namespace rlforge::chat::detail
