#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "strings/utf8.hpp"

/// UTF-8 validation, decoding and lossy conversion (RFC 3629: no overlong forms, no surrogates,
/// nothing above U+10FFFF). Pure functions, safe to call from any thread.
namespace rlforge::text::unicode {

/// The UTF-8 of U+FFFD, the replacement character.
inline constexpr std::string_view replacement_utf8 = "\xEF\xBF\xBD";

/// The byte offset of the first byte of `s` that does not start a valid UTF-8 sequence, or
/// `std::string_view::npos` when all of `s` is valid.
size_t find_invalid_utf8(std::string_view s) noexcept;

/// Throws `tokenizer_error` ("<what>: invalid UTF-8 at byte N (0xXX)") unless `s` is valid UTF-8.
void require_valid_utf8(std::string_view s, std::string_view what);

/// The length of the sequence that starts with `lead` in valid UTF-8 (1 to 4).
inline size_t sequence_length(unsigned char lead) noexcept {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

/// Decodes the code point starting at `s[i]` of valid UTF-8 and moves `i` past it.
char32_t next_code_point(std::string_view s, size_t& i) noexcept;

/// The last code point of valid, non-empty UTF-8 `s`.
char32_t last_code_point(std::string_view s) noexcept;

/// Appends the UTF-8 encoding of the Unicode scalar value `c` (the one encoder, strings/).
using strings::append_utf8;

/// `bytes` as valid UTF-8: each maximal ill-formed subsequence becomes one U+FFFD (the Unicode
/// "substitution of maximal subparts" practice, as Rust's `String::from_utf8_lossy`).
std::string from_utf8_lossy(std::string_view bytes);

/// The number of code points of valid UTF-8 `s`.
size_t count_code_points(std::string_view s) noexcept;

} // namespace rlforge::text::unicode
