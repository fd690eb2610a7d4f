#pragma once

#include <string>
#include <string_view>

#include "chat/value.hpp"

/// Python's text forms that chat templates reach: `repr(float)` and `json.dumps` as the `tojson`
/// filter of transformers calls it (`ensure_ascii`, `indent`, `separators`, `sort_keys`; no HTML
/// escaping). Reentrant.
namespace rlforge::chat::detail {

/// `repr(x)` of a Python float: the shortest digits that round-trip, fixed notation for decimal
/// exponents in [-4, 16), scientific otherwise ("1e+16", "1.5e-05"), "inf", "-inf", "nan".
std::string float_repr(double x);

/// Options of `json.dumps`.
struct json_style {
  bool ensure_ascii = false;
  bool indented = false; ///< indent is not None
  std::string indent;    ///< one level of indentation (spaces for an integer indent)
  bool custom_separators = false;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};

/// `json.dumps(x, ...)`. None, booleans, numbers (floats by repr; NaN, Infinity, -Infinity),
/// strings, lists and dicts serialise; Undefined, namespaces, loop objects and callables are not
/// JSON serialisable in Python and throw error_kind::runtime naming the type and `where`.
std::string json_dumps(const value& x, const json_style& style, source_position where);

/// A JSON string literal of UTF-8 `text` as Python's json module writes it.
std::string json_quote(std::string_view text, bool ensure_ascii);

} // namespace rlforge::chat::detail
