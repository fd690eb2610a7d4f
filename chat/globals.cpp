#include "chat/globals.hpp"

#include <ctime>

#include "chat/arguments.hpp"

namespace rlforge::chat::detail {

namespace {

using k = value::kind;

value range(call_args& a) {
  if (!a.keyword.empty())
    throw template_error(error_kind::runtime, "range() takes no keyword arguments", a.where);
  if (a.positional.empty() || a.positional.size() > 3)
    throw template_error(error_kind::runtime, "range() takes 1 to 3 arguments", a.where);
  int64_t start = 0, stop = 0, step = 1;
  if (a.positional.size() == 1) {
    stop = require_int(a.positional[0], "range() argument", a.where);
  } else {
    start = require_int(a.positional[0], "range() argument", a.where);
    stop = require_int(a.positional[1], "range() argument", a.where);
    if (a.positional.size() == 3)
      step = require_int(a.positional[2], "range() argument", a.where);
  }
  if (step == 0)
    throw template_error(error_kind::runtime, "range() arg 3 must not be zero", a.where);
  value_list out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (out.size() >= (std::size_t{1} << 20))
      throw template_error(error_kind::runtime, "range() is too long (over 2^20 items)", a.where);
    out.push_back(value::integer(i));
  }
  return value::list(std::move(out));
}

value make_namespace(call_args& a) {
  auto ns = std::make_shared<object_data>();
  ns->type_name = "namespace";
  ns->assignable = true;
  if (a.positional.size() > 1)
    throw template_error(error_kind::runtime, "namespace() takes at most 1 positional argument",
                         a.where);
  if (a.positional.size() == 1) {
    const value& init = a.positional[0];
    if (!init.is(k::dict))
      throw template_error(error_kind::runtime,
                           "namespace() positional argument must be a dict, not " + type_name(init),
                           a.where);
    for (const auto& [key, v] : init.as_dict().items())
      ns->attributes.set(key, v);
  }
  for (const auto& [key, v] : a.keyword)
    ns->attributes.set(key, v);
  return value::object(std::move(ns));
}

value make_dict(call_args& a) {
  if (!a.positional.empty())
    throw template_error(error_kind::unsupported,
                         "dict() with positional arguments is not supported", a.where);
  value_dict d;
  for (const auto& [key, v] : a.keyword)
    d.set(key, v);
  return value::dict(std::move(d));
}

value raise_exception(call_args& a) {
  auto p = bind(a, {{"message", true}}, "raise_exception");
  throw template_error(error_kind::raised, to_str(*p[0], a.where), a.where);
}

value strftime_now(call_args& a) {
  auto p = bind(a, {{"format", true}}, "strftime_now");
  const std::string& format = require_string(*p[0], "strftime_now() format", a.where);
  if (format.find("%f") != std::string::npos)
    throw template_error(error_kind::unsupported, "strftime_now: '%f' is not supported", a.where);
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::string buf(format.size() * 4 + 64, '\0');
  const std::size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &local);
  if (n == 0 && !format.empty())
    throw template_error(error_kind::runtime, "strftime_now: format produced no output", a.where);
  buf.resize(n);
  return value::string(std::move(buf));
}

value refused(const std::string& name) {
  return value::function(name, [name](call_args& a) -> value {
    throw template_error(error_kind::unsupported, "function '" + name + "' is not supported",
                         a.where);
  });
}

} // namespace

value_dict make_globals() {
  value_dict g;
  g.set("range", value::function("range", range));
  g.set("namespace", value::function("namespace", make_namespace));
  g.set("dict", value::function("dict", make_dict));
  g.set("raise_exception", value::function("raise_exception", raise_exception));
  g.set("strftime_now", value::function("strftime_now", strftime_now));
  for (const char* name : {"cycler", "joiner", "lipsum"})
    g.set(name, refused(name));
  return g;
}

} // namespace rlforge::chat::detail
