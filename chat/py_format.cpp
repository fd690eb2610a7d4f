#include "chat/py_format.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "chat/unicode.hpp"

namespace rlforge::chat::detail {

std::string float_repr(double x) {
  if (std::isnan(x))
    return "nan";
  if (std::isinf(x))
    return x < 0 ? "-inf" : "inf";
  if (x == 0)
    return std::signbit(x) ? "-0.0" : "0.0";
  // The shortest %e form that reads back as the same double: Python's repr digits.
  char buf[64];
  for (int precision = 0; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*e", precision, x);
    if (std::strtod(buf, nullptr) == x)
      break;
  }
  std::string s = buf;
  const bool negative = s[0] == '-';
  if (negative)
    s.erase(0, 1);
  const auto e_pos = s.find('e');
  const int exponent = std::atoi(s.c_str() + e_pos + 1);
  std::string digits;
  for (std::size_t i = 0; i < e_pos; ++i)
    if (s[i] != '.')
      digits.push_back(s[i]);
  while (digits.size() > 1 && digits.back() == '0')
    digits.pop_back();
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent >= 0) {
      const auto int_len = static_cast<std::size_t>(exponent) + 1;
      if (digits.size() <= int_len) {
        out += digits + std::string(int_len - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, int_len) + "." + digits.substr(int_len);
      }
    } else {
      out += "0." + std::string(static_cast<std::size_t>(-exponent - 1), '0') + digits;
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1)
    out += "." + digits.substr(1);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof exp_buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  out += exp_buf;
  return out;
}

namespace {

void append_u_escape(char32_t unit, std::string& out) {
  static const char hex[] = "0123456789abcdef";
  out += "\\u";
  for (int shift = 12; shift >= 0; shift -= 4)
    out += hex[(unit >> shift) & 0xF];
}

} // namespace

std::string json_quote(std::string_view text, bool ensure_ascii) {
  std::string out = "\"";
  for (char32_t cp : decode_utf8(text)) {
    switch (cp) {
    case U'"':
      out += "\\\"";
      continue;
    case U'\\':
      out += "\\\\";
      continue;
    case U'\n':
      out += "\\n";
      continue;
    case U'\r':
      out += "\\r";
      continue;
    case U'\t':
      out += "\\t";
      continue;
    case U'\b':
      out += "\\b";
      continue;
    case U'\f':
      out += "\\f";
      continue;
    default:
      break;
    }
    if (cp < 0x20) {
      append_u_escape(cp, out);
    } else if (ensure_ascii && cp > 0x7E) {
      if (cp >= 0x10000) {
        const char32_t v = cp - 0x10000;
        append_u_escape(0xD800 + (v >> 10), out);
        append_u_escape(0xDC00 + (v & 0x3FF), out);
      } else {
        append_u_escape(cp, out);
      }
    } else {
      append_utf8(out, cp);
    }
  }
  out += '"';
  return out;
}

namespace {

void dump(const value& x, const json_style& style, int depth, source_position where,
          std::string& out) {
  using k = value::kind;
  switch (x.type()) {
  case k::none:
    out += "null";
    return;
  case k::boolean:
    out += x.as_bool() ? "true" : "false";
    return;
  case k::integer:
    out += std::to_string(x.as_int());
    return;
  case k::floating: {
    const double d = x.as_float();
    if (std::isnan(d))
      out += "NaN";
    else if (std::isinf(d))
      out += d < 0 ? "-Infinity" : "Infinity";
    else
      out += float_repr(d);
    return;
  }
  case k::string:
    out += json_quote(x.as_string(), style.ensure_ascii);
    return;
  case k::list:
  case k::dict:
    break;
  default:
    throw template_error(error_kind::runtime,
                         "tojson: Object of type " + type_name(x) + " is not JSON serializable",
                         where);
  }
  const bool is_list = x.is(k::list);
  const std::size_t n = is_list ? x.as_list().size() : x.as_dict().size();
  if (n == 0) {
    out += is_list ? "[]" : "{}";
    return;
  }
  std::string item_sep = style.item_separator;
  std::string newline_indent;
  if (style.indented) {
    newline_indent = "\n";
    for (int i = 0; i <= depth; ++i)
      newline_indent += style.indent;
    item_sep += newline_indent;
  }
  out += is_list ? '[' : '{';
  out += newline_indent;
  if (is_list) {
    bool first = true;
    for (const auto& item : x.as_list()) {
      if (!first)
        out += item_sep;
      first = false;
      dump(item, style, depth + 1, where, out);
    }
  } else {
    std::vector<const std::pair<std::string, value>*> entries;
    for (const auto& kv : x.as_dict().items())
      entries.push_back(&kv);
    if (style.sort_keys)
      std::stable_sort(entries.begin(), entries.end(),
                       [](const auto* a, const auto* b) { return a->first < b->first; });
    bool first = true;
    for (const auto* kv : entries) {
      if (!first)
        out += item_sep;
      first = false;
      out += json_quote(kv->first, style.ensure_ascii);
      out += style.key_separator;
      dump(kv->second, style, depth + 1, where, out);
    }
  }
  if (style.indented) {
    out += '\n';
    for (int i = 0; i < depth; ++i)
      out += style.indent;
  }
  out += is_list ? ']' : '}';
}

} // namespace

std::string json_dumps(const value& x, const json_style& style, source_position where) {
  std::string out;
  dump(x, style, 0, where, out);
  return out;
}

} // namespace rlforge::chat::detail
