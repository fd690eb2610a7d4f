#pragma once

#include <functional>
#include <string>

#include "chat/value.hpp"

/// Jinja's filters (`x | name(args)`) that chat templates use, with the semantics Python Jinja
/// and transformers give them:
///
/// | filter | notes |
/// |---|---|
/// | `safe`, `string` | str(x) (lists/dicts refused: their Python repr is not reproduced) |
/// | `trim(chars=None)` | str(x).strip(chars) |
/// | `tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False)` | transformers'
/// json.dumps, keyword arguments only | | `length`, `count` | len(x); Undefined has length 0 | |
/// `default(value='', boolean=False)`, `d` | value when x is Undefined (or falsy with boolean) | |
/// `items` | a dict's (key, value) pairs; Undefined gives none | | `first`, `last`, `list`,
/// `reverse`, `join(d='', attribute=None)` | on str, list, dict keys | | `upper`, `lower` (ASCII),
/// `replace(old, new, count=None)`, `indent(width=4, first=False, blank=False)` | str | |
/// `map(attribute=..., default=...)`, `map('filter', ...)` | | | `select`/`reject(test, ...)`,
/// `selectattr`/`rejectattr(attribute, test, ...)` | | | `unique`, `sort`, `dictsort` and the rest
/// of Jinja's list | refused (error_kind::unsupported) naming the filter |
///
/// Reentrant.
namespace rlforge::chat::detail {

/// True for the filters listed above (the parser refuses any other name when it compiles a
/// template).
bool is_known_filter(const std::string& name);

/// Applies filter `name` to `subject` with `args` (its `where` is the filter's position).
value apply_filter(const std::string& name, const value& subject, call_args& args);

} // namespace rlforge::chat::detail
