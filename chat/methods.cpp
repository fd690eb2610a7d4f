#include "chat/methods.hpp"

#include <algorithm>
#include <set>

#include "chat/arguments.hpp"
#include "chat/operators.hpp"
#include "chat/strings.hpp"
#include "chat/unicode.hpp"

namespace rlforge::chat::detail {

namespace {

using k = value::kind;

const std::set<std::string>& python_str_methods() {
  static const std::set<std::string> names = {
      "capitalize",   "casefold",    "center",    "count",      "encode",       "endswith",
      "expandtabs",   "find",        "format",    "format_map", "index",        "isalnum",
      "isalpha",      "isascii",     "isdecimal", "isdigit",    "isidentifier", "islower",
      "isnumeric",    "isprintable", "isspace",   "istitle",    "isupper",      "join",
      "ljust",        "lower",       "lstrip",    "maketrans",  "partition",    "removeprefix",
      "removesuffix", "replace",     "rfind",     "rindex",     "rjust",        "rpartition",
      "rsplit",       "rstrip",      "split",     "splitlines", "startswith",   "strip",
      "swapcase",     "title",       "translate", "upper",      "zfill"};
  return names;
}

const std::set<std::string>& python_list_methods() {
  static const std::set<std::string> names = {"append", "clear",   "copy",   "count",
                                              "extend", "index",   "insert", "pop",
                                              "remove", "reverse", "sort"};
  return names;
}

const std::set<std::string>& python_dict_methods() {
  static const std::set<std::string> names = {"clear",      "copy",   "fromkeys", "get",
                                              "items",      "keys",   "pop",      "popitem",
                                              "setdefault", "update", "values"};
  return names;
}

[[noreturn]] void unsupported_method(const std::string& type, const std::string& name,
                                     source_position where) {
  throw template_error(error_kind::unsupported,
                       "method " + type + "." + name + "() is not supported", where);
}

std::optional<std::string> optional_string(const std::optional<value>& x, const std::string& what,
                                           source_position where) {
  if (!x || x->is(k::none))
    return std::nullopt;
  return require_string(*x, what, where);
}

bool affix_test(const std::string& s, const value& affix, bool prefix, const std::string& fn,
                source_position where) {
  auto test = [&](const std::string& a) {
    if (a.size() > s.size())
      return false;
    return prefix ? s.compare(0, a.size(), a) == 0
                  : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.is(k::string))
    return test(affix.as_string());
  if (affix.is(k::list)) {
    for (const auto& a : affix.as_list())
      if (test(require_string(a, fn + "() tuple element", where)))
        return true;
    return false;
  }
  throw template_error(error_kind::runtime,
                       fn + "() argument must be str or a tuple of str, not " + type_name(affix),
                       where);
}

value string_list(std::vector<std::string> parts) {
  value_list out;
  out.reserve(parts.size());
  for (auto& p : parts)
    out.push_back(value::string(std::move(p)));
  return value::list(std::move(out));
}

value str_method(const std::string& s, const std::string& name, source_position where) {
  const std::string fn = "str." + name;
  if (name == "startswith" || name == "endswith") {
    return value::function(fn, [s, name, fn](call_args& a) {
      if (a.positional.size() > 1 || !a.keyword.empty())
        throw template_error(error_kind::unsupported,
                             fn + "() with start/end arguments is not supported", a.where);
      auto p = bind(a, {{"prefix", true}}, fn);
      return value::boolean(affix_test(s, *p[0], name == "startswith", fn, a.where));
    });
  }
  if (name == "split" || name == "rsplit") {
    return value::function(fn, [s, name, fn](call_args& a) {
      auto p = bind(a, {{"sep"}, {"maxsplit"}}, fn);
      const auto sep = optional_string(p[0], fn + "() sep", a.where);
      const int64_t maxsplit = p[1] ? require_int(*p[1], fn + "() maxsplit", a.where) : -1;
      return string_list(py_split(s, sep, maxsplit, name == "rsplit", a.where));
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    return value::function(fn, [s, name, fn](call_args& a) {
      auto p = bind(a, {{"chars"}}, fn);
      const auto chars = optional_string(p[0], fn + "() chars", a.where);
      return value::string(py_strip(s, chars, name != "rstrip", name != "lstrip"));
    });
  }
  if (name == "upper" || name == "lower") {
    return value::function(fn, [s, name, fn](call_args& a) {
      bind(a, {}, fn);
      return value::string(py_case(s, name == "upper", a.where));
    });
  }
  if (name == "replace") {
    return value::function(fn, [s, fn](call_args& a) {
      auto p = bind(a, {{"old", true}, {"new", true}, {"count"}}, fn);
      const auto& old = require_string(*p[0], fn + "() old", a.where);
      const auto& repl = require_string(*p[1], fn + "() new", a.where);
      const int64_t count = p[2] ? require_int(*p[2], fn + "() count", a.where) : -1;
      return value::string(py_replace(s, old, repl, count));
    });
  }
  if (name == "join") {
    return value::function(fn, [s, fn](call_args& a) {
      auto p = bind(a, {{"iterable", true}}, fn);
      std::string out;
      bool first = true;
      for (const auto& item : iterate(*p[0], a.where)) {
        if (!first)
          out += s;
        first = false;
        out += require_string(item, fn + "() item", a.where);
      }
      return value::string(std::move(out));
    });
  }
  if (python_str_methods().count(name) != 0)
    unsupported_method("str", name, where);
  return value::undefined("'str object' has no attribute '" + name + "'");
}

value dict_method(const value& d, const std::string& name, source_position where) {
  const std::string fn = "dict." + name;
  if (name == "get") {
    return value::function(fn, [d, fn](call_args& a) {
      auto p = bind(a, {{"key", true}, {"default"}}, fn);
      if (p[0]->is(k::string))
        if (const value* v = d.as_dict().find(p[0]->as_string()))
          return *v;
      return p[1] ? *p[1] : value::none();
    });
  }
  if (name == "items" || name == "keys" || name == "values") {
    return value::function(fn, [d, name, fn](call_args& a) {
      bind(a, {}, fn);
      value_list out;
      for (const auto& [key, v] : d.as_dict().items()) {
        if (name == "items")
          out.push_back(value::list({value::string(key), v}));
        else if (name == "keys")
          out.push_back(value::string(key));
        else
          out.push_back(v);
      }
      return value::list(std::move(out));
    });
  }
  unsupported_method("dict", name, where);
}

std::string object_label(const value& obj) {
  return "'" + type_name(obj) + " object'";
}

} // namespace

value get_attribute(const value& obj, const std::string& name, source_position where) {
  switch (obj.type()) {
  case k::undefined:
    fail_undefined(obj, where);
  case k::dict:
    if (python_dict_methods().count(name) != 0)
      return dict_method(obj, name, where);
    if (const value* v = obj.as_dict().find(name))
      return *v;
    break;
  case k::string:
    return str_method(obj.as_string(), name, where);
  case k::list:
    if (python_list_methods().count(name) != 0)
      unsupported_method("list", name, where);
    break;
  case k::object: {
    const auto& o = obj.as_object();
    if (const value* v = o.attributes.find(name))
      return *v;
    if (o.type_name == "LoopContext" && (name == "cycle" || name == "changed"))
      throw template_error(error_kind::unsupported, "loop." + name + " is not supported", where);
    break;
  }
  default:
    break;
  }
  return value::undefined(object_label(obj) + " has no attribute '" + name + "'");
}

namespace {

std::optional<int64_t> index_of(const value& key) {
  if (key.is(k::integer))
    return key.as_int();
  if (key.is(k::boolean))
    return key.as_bool() ? 1 : 0;
  return std::nullopt;
}

} // namespace

value get_item(const value& obj, const value& key, source_position where) {
  switch (obj.type()) {
  case k::undefined:
    fail_undefined(obj, where);
  case k::dict:
    if (key.is(k::string)) {
      if (const value* v = obj.as_dict().find(key.as_string()))
        return *v;
      return get_attribute(obj, key.as_string(), where);
    }
    if (key.is(k::list) || key.is(k::dict))
      throw template_error(error_kind::runtime, "unhashable type: '" + type_name(key) + "'", where);
    break;
  case k::list:
  case k::string: {
    if (key.is(k::string))
      return get_attribute(obj, key.as_string(), where);
    const auto index = index_of(key);
    if (!index)
      break;
    if (obj.is(k::list)) {
      const auto& items = obj.as_list();
      const auto n = static_cast<int64_t>(items.size());
      const int64_t i = *index < 0 ? *index + n : *index;
      if (i >= 0 && i < n)
        return items[static_cast<std::size_t>(i)];
    } else {
      const std::u32string cps = decode_utf8(obj.as_string());
      const auto n = static_cast<int64_t>(cps.size());
      const int64_t i = *index < 0 ? *index + n : *index;
      if (i >= 0 && i < n) {
        std::string out;
        append_utf8(out, cps[static_cast<std::size_t>(i)]);
        return value::string(std::move(out));
      }
    }
    return value::undefined(object_label(obj) + " has no element " + std::to_string(*index));
  }
  case k::object:
    if (key.is(k::string))
      return get_attribute(obj, key.as_string(), where);
    break;
  default:
    break;
  }
  std::string shown = key.is(k::string) ? "'" + key.as_string() + "'" : type_name(key);
  if (key.is(k::integer))
    shown = std::to_string(key.as_int());
  return value::undefined(object_label(obj) + " has no element " + shown);
}

value get_slice(const value& obj, const std::optional<value>& start,
                const std::optional<value>& stop, const std::optional<value>& step,
                source_position where) {
  if (obj.is_undefined())
    fail_undefined(obj, where);
  if (!obj.is(k::list) && !obj.is(k::string))
    throw template_error(error_kind::runtime,
                         "'" + type_name(obj) + "' object is not subscriptable", where);
  auto get = [&](const std::optional<value>& x) -> std::optional<int64_t> {
    if (!x || x->is(k::none))
      return std::nullopt;
    return require_int(*x, "slice index", where);
  };
  const auto b = get(start), e = get(stop), s = get(step);
  const int64_t st = s.value_or(1);
  if (st == 0)
    throw template_error(error_kind::runtime, "slice step cannot be zero", where);
  std::u32string cps;
  int64_t n;
  if (obj.is(k::string)) {
    cps = decode_utf8(obj.as_string());
    n = static_cast<int64_t>(cps.size());
  } else {
    n = static_cast<int64_t>(obj.as_list().size());
  }
  // CPython's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v)
      return dflt;
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0)
        x = st < 0 ? -1 : 0;
    } else if (x >= n) {
      x = st < 0 ? n - 1 : n;
    }
    return x;
  };
  const int64_t from = adjust(b, st < 0 ? n - 1 : 0);
  const int64_t to = adjust(e, st < 0 ? -1 : n);
  std::vector<int64_t> picks;
  for (int64_t i = from; st > 0 ? i < to : i > to; i += st)
    picks.push_back(i);
  if (obj.is(k::string)) {
    std::string out;
    for (int64_t i : picks)
      append_utf8(out, cps[static_cast<std::size_t>(i)]);
    return value::string(std::move(out));
  }
  value_list out;
  for (int64_t i : picks)
    out.push_back(obj.as_list()[static_cast<std::size_t>(i)]);
  return value::list(std::move(out));
}

} // namespace rlforge::chat::detail
