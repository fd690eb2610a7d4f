#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "chat/error.hpp"

/// The lexer of the template language: Jinja's syntax with the settings transformers renders
/// chat templates with (trim_blocks, lstrip_blocks, no trailing newline kept). Whitespace control
/// (`{%-`, `-%}`, `{{-`, `-}}`, `{#-`, `-#}`, `{%+`, `+%}`) and comments are resolved here: the
/// parser sees text with the stripping already applied. Reentrant.
namespace rlforge::chat::detail {

enum class token_kind {
  text,           ///< literal output
  variable_begin, ///< {{
  variable_end,   ///< }}
  block_begin,    ///< {%
  block_end,      ///< %}
  name,           ///< identifier or keyword
  string,         ///< string literal, escapes decoded
  integer,
  floating,
  op,  ///< operator or punctuation: + - * / // % ** ~ == != < <= > >= = ( ) [ ] { } , . : |
  end, ///< end of the template
};

struct token {
  token_kind kind = token_kind::end;
  std::string text; ///< text, name, decoded string or operator
  int64_t integer = 0;
  double floating = 0;
  source_position where;
};

/// Python's `splitlines` normalisation Jinja applies to a template: every line break (\r\n, \r,
/// \v, \f, \x1c-\x1e, \x85, U+2028, U+2029) becomes \n and one trailing line break is dropped.
std::string normalize_newlines(std::string_view source);

/// The tokens of `source` (already normalised), ending with one `end` token. Throws
/// template_error (syntax) naming the problem and position, or (unsupported) for `{% raw %}`.
std::vector<token> tokenize(std::string_view source);

} // namespace rlforge::chat::detail
