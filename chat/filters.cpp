#include "chat/filters.hpp"

#include <algorithm>

#include "chat/arguments.hpp"
#include "chat/methods.hpp"
#include "chat/operators.hpp"
#include "chat/predicates.hpp"
#include "chat/py_format.hpp"
#include "chat/strings.hpp"
#include "chat/unicode.hpp"

namespace rlforge::chat::detail {

namespace {

using k = value::kind;

value tojson(const value& x, call_args& args) {
  if (!args.positional.empty())
    throw template_error(error_kind::unsupported,
                         "tojson with positional arguments is not supported (pass indent=..., "
                         "sort_keys=..., separators=..., ensure_ascii=... by name)",
                         args.where);
  auto p = bind(args, {{"ensure_ascii"}, {"indent"}, {"separators"}, {"sort_keys"}}, "tojson");
  json_style style;
  if (p[0])
    style.ensure_ascii = truthy(*p[0]);
  if (p[1] && !p[1]->is(k::none)) {
    style.indented = true;
    if (p[1]->is(k::string)) {
      style.indent = p[1]->as_string();
    } else {
      const int64_t n = require_int(*p[1], "tojson indent", args.where);
      style.indent = std::string(static_cast<std::size_t>(std::max<int64_t>(n, 0)), ' ');
    }
    style.item_separator = ",";
  }
  if (p[2] && !p[2]->is(k::none)) {
    if (!p[2]->is(k::list) || p[2]->as_list().size() != 2)
      throw template_error(error_kind::runtime, "tojson separators must be a pair of strings",
                           args.where);
    style.item_separator = require_string(p[2]->as_list()[0], "tojson separator", args.where);
    style.key_separator = require_string(p[2]->as_list()[1], "tojson separator", args.where);
  }
  if (p[3])
    style.sort_keys = truthy(*p[3]);
  return value::string(json_dumps(x, style, args.where));
}

std::size_t length_of(const value& x, source_position where) {
  switch (x.type()) {
  case k::undefined:
    return 0;
  case k::string:
    return code_point_count(x.as_string());
  case k::list:
    return x.as_list().size();
  case k::dict:
    return x.as_dict().size();
  default:
    throw template_error(error_kind::runtime, "object of type '" + type_name(x) + "' has no len()",
                         where);
  }
}

value join(const value& x, call_args& args) {
  auto p = bind(args, {{"d"}, {"attribute"}}, "join");
  const std::string sep = p[0] ? to_str(*p[0], args.where) : "";
  std::string out;
  bool first = true;
  for (const auto& item : iterate(x, args.where)) {
    if (!first)
      out += sep;
    first = false;
    const value v = p[1] && !p[1]->is(k::none) ? get_item(item, *p[1], args.where) : item;
    out += to_str(v, args.where);
  }
  return value::string(std::move(out));
}

value indent(const value& x, call_args& args) {
  auto p = bind(args, {{"width"}, {"first"}, {"blank"}}, "indent");
  std::string pad = "    ";
  if (p[0]) {
    if (p[0]->is(k::string))
      pad = p[0]->as_string();
    else
      pad = std::string(static_cast<std::size_t>(
                            std::max<int64_t>(require_int(*p[0], "indent width", args.where), 0)),
                        ' ');
  }
  const bool first = p[1] && truthy(*p[1]);
  const bool blank = p[2] && truthy(*p[2]);
  // Jinja: s += "\n"; lines = s.splitlines(); the first line stays as it is, later lines get the
  // indentation when non-empty (or always with blank=True); first=True indents the result.
  const std::u32string text = decode_utf8(to_str(x, args.where) + "\n");
  std::vector<std::u32string> lines;
  std::u32string line;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char32_t c = text[i];
    if (is_line_break(c)) {
      if (c == U'\r' && i + 1 < text.size() && text[i + 1] == U'\n')
        ++i;
      lines.push_back(line);
      line.clear();
    } else {
      line.push_back(c);
    }
  }
  if (!line.empty())
    lines.push_back(line);
  std::string out = first ? pad : "";
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out += "\n";
      if (blank || !lines[i].empty())
        out += pad;
    }
    out += encode_utf8(lines[i]);
  }
  return value::string(std::move(out));
}

/// select/reject/selectattr/rejectattr: the test and its arguments follow in `args`.
value select(const value& x, call_args& args, bool by_attribute, bool keep) {
  const std::string fn =
      by_attribute ? (keep ? "selectattr" : "rejectattr") : (keep ? "select" : "reject");
  if (!args.keyword.empty())
    throw template_error(error_kind::unsupported, fn + " with keyword arguments is not supported",
                         args.where);
  std::size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (args.positional.empty())
      throw template_error(error_kind::runtime, fn + "() missing the attribute", args.where);
    attribute = require_string(args.positional[0], fn + "() attribute", args.where);
    next = 1;
  }
  std::string test;
  if (next < args.positional.size()) {
    test = require_string(args.positional[next], fn + "() test name", args.where);
    ++next;
  }
  value_list out;
  for (const auto& item : iterate(x, args.where)) {
    value subject = item;
    if (by_attribute) {
      // Jinja's attribute path: dots separate attributes, integers index.
      std::size_t start = 0;
      while (true) {
        const std::size_t dot = attribute.find('.', start);
        const std::string part = attribute.substr(start, dot - start);
        const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
          return c >= '0' && c <= '9';
        });
        subject = digits ? get_item(subject, value::integer(std::stoll(part)), args.where)
                         : get_item(subject, value::string(part), args.where);
        if (dot == std::string::npos || subject.is_undefined())
          break;
        start = dot + 1;
      }
    }
    bool passed;
    if (test.empty()) {
      passed = truthy(subject);
    } else {
      call_args test_args;
      test_args.where = args.where;
      test_args.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(next),
                                  args.positional.end());
      passed = apply_test(test, subject, test_args);
    }
    if (passed == keep)
      out.push_back(item);
  }
  return value::list(std::move(out));
}

value map(const value& x, call_args& args) {
  const bool by_attribute = std::any_of(args.keyword.begin(), args.keyword.end(),
                                        [](const auto& kv) { return kv.first == "attribute"; });
  value_list out;
  if (by_attribute) {
    auto p = bind(args, {{"attribute", true}, {"default"}}, "map");
    for (const auto& item : iterate(x, args.where)) {
      value v = get_item(item, *p[0], args.where);
      if (v.is_undefined() && p[1])
        v = *p[1];
      out.push_back(std::move(v));
    }
    return value::list(std::move(out));
  }
  if (args.positional.empty())
    throw template_error(error_kind::runtime,
                         "map() needs a filter name or attribute=", args.where);
  const std::string filter = require_string(args.positional[0], "map() filter name", args.where);
  for (const auto& item : iterate(x, args.where)) {
    call_args inner;
    inner.where = args.where;
    inner.positional.assign(args.positional.begin() + 1, args.positional.end());
    inner.keyword = args.keyword;
    out.push_back(apply_filter(filter, item, inner));
  }
  return value::list(std::move(out));
}

} // namespace

bool is_known_filter(const std::string& name) {
  static const char* const names[] = {
      "tojson",  "default", "d",    "length", "count",   "safe",       "string",    "trim",
      "items",   "first",   "last", "list",   "reverse", "join",       "upper",     "lower",
      "replace", "indent",  "map",  "select", "reject",  "selectattr", "rejectattr"};
  for (const char* n : names)
    if (name == n)
      return true;
  return false;
}

value apply_filter(const std::string& name, const value& x, call_args& args) {
  const auto where = args.where;
  if (name == "tojson")
    return tojson(x, args);
  if (name == "default" || name == "d") {
    auto p = bind(args, {{"default_value"}, {"boolean"}}, name);
    const bool use_default = x.is_undefined() || (p[1] && truthy(*p[1]) && !truthy(x));
    if (!use_default)
      return x;
    return p[0] ? *p[0] : value::string("");
  }
  if (name == "length" || name == "count") {
    bind(args, {}, name);
    return value::integer(static_cast<int64_t>(length_of(x, where)));
  }
  if (name == "safe" || name == "string") {
    bind(args, {}, name);
    return value::string(to_str(x, where));
  }
  if (name == "trim") {
    auto p = bind(args, {{"chars"}}, name);
    std::optional<std::string> chars;
    if (p[0] && !p[0]->is(k::none))
      chars = require_string(*p[0], "trim() chars", where);
    return value::string(py_strip(to_str(x, where), chars, true, true));
  }
  if (name == "items") {
    bind(args, {}, name);
    if (x.is_undefined())
      return value::list({});
    if (!x.is(k::dict))
      throw template_error(
          error_kind::runtime,
          "items filter: can only get item pairs from a mapping, not " + type_name(x), where);
    value_list out;
    for (const auto& [key, v] : x.as_dict().items())
      out.push_back(value::list({value::string(key), v}));
    return value::list(std::move(out));
  }
  if (name == "first" || name == "last") {
    bind(args, {}, name);
    auto items = iterate(x, where);
    if (items.empty())
      return value::undefined("No " + name + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    bind(args, {}, name);
    return value::list(iterate(x, where));
  }
  if (name == "reverse") {
    bind(args, {}, name);
    if (x.is(k::string)) {
      std::u32string cps = decode_utf8(x.as_string());
      std::reverse(cps.begin(), cps.end());
      return value::string(encode_utf8(cps));
    }
    auto items = iterate(x, where);
    std::reverse(items.begin(), items.end());
    return value::list(std::move(items));
  }
  if (name == "join")
    return join(x, args);
  if (name == "upper" || name == "lower") {
    bind(args, {}, name);
    return value::string(py_case(to_str(x, where), name == "upper", where));
  }
  if (name == "replace") {
    auto p = bind(args, {{"old", true}, {"new", true}, {"count"}}, name);
    const int64_t count =
        p[2] && !p[2]->is(k::none) ? require_int(*p[2], "replace() count", where) : -1;
    return value::string(
        py_replace(to_str(x, where), to_str(*p[0], where), to_str(*p[1], where), count));
  }
  if (name == "indent")
    return indent(x, args);
  if (name == "map")
    return map(x, args);
  if (name == "select" || name == "reject")
    return select(x, args, false, name == "select");
  if (name == "selectattr" || name == "rejectattr")
    return select(x, args, true, name == "selectattr");
  throw template_error(error_kind::unsupported, "filter '" + name + "' is not supported", where);
}

} // namespace rlforge::chat::detail
