#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "chat/error.hpp"

/// A compiled Jinja template, rendered with the semantics transformers gives chat templates
/// (Python Jinja with trim_blocks and lstrip_blocks, transformers' `tojson`, `raise_exception`
/// and `strftime_now`).
///
/// The supported subset: text, `{{ }}`, comments, whitespace control (`{%-`, `-%}`, `{{-`,
/// `-}}`, `{#-`, `-#}`, `{%+`, `+%}`); tags if/elif/else, for (tuple targets, `if` filter,
/// `else`, `loop.*`), set (names, tuples, namespace attributes, block set), macro (positional,
/// keyword and default parameters), break, continue, generation; literals (str, int, float, bool,
/// none, list, tuple, dict); operators `+ - * / // % ** ~`, comparisons (chained), `in`,
/// `not in`, `and`, `or`, `not`, `x if c else y`, attributes, subscripts and slices; the filters
/// of chat/filters.hpp, tests of chat/predicates.hpp, methods of chat/methods.hpp and functions of
/// chat/globals.hpp. Anything else — a tag, filter, test, method or function outside that list,
/// printing a list or dict (whose Python repr is not reproduced), non-ASCII case mapping, integer
/// overflow — is refused with a template_error naming it and its line and column, never rendered
/// differently from Python.
///
/// Strings are UTF-8 and indexed by code point, as Python does.
///
/// Thread safety: immutable after construction; `render` may run concurrently on one instance.
namespace rlforge::chat {

namespace detail {
struct compiled_template;
}

class jinja_template {
public:
  /// Compiles `source`. Throws template_error (syntax, unsupported) naming what and where, or
  /// (config) when `source` is not valid UTF-8.
  explicit jinja_template(std::string_view source);

  /// Renders with `variables`, a JSON object whose members become template variables (objects
  /// keep their member order, as a Python dict would). Throws template_error.
  std::string render(const nlohmann::ordered_json& variables) const;

private:
  std::shared_ptr<const detail::compiled_template> compiled_;
};

} // namespace rlforge::chat
