#pragma once

#include <string>
#include <string_view>

#include "strings/utf8.hpp"

/// UTF-8 helpers with Python's `str` semantics: strings are sequences of code points, and
/// "whitespace" is what `str.isspace()` accepts. Reentrant.
namespace rlforge::chat::detail {

/// True when `text` is well-formed UTF-8 (no overlong forms, surrogates or code points past
/// U+10FFFF).
bool valid_utf8(std::string_view text) noexcept;

/// The code points of `text`, which must be valid UTF-8 (see `valid_utf8`).
std::u32string decode_utf8(std::string_view text);

/// Appends the UTF-8 encoding of a code point to a string (the one encoder, strings/).
using strings::append_utf8;

/// The UTF-8 encoding of `text`.
std::string encode_utf8(std::u32string_view text);

/// Python's `str.isspace()` for one code point.
bool is_space(char32_t cp) noexcept;

/// Python's `str.splitlines()` line boundaries: \n \r \v \f \x1c \x1d \x1e \x85 U+2028 U+2029.
bool is_line_break(char32_t cp) noexcept;

/// Number of code points of valid UTF-8 `text`.
std::size_t code_point_count(std::string_view text) noexcept;

} // namespace rlforge::chat::detail
