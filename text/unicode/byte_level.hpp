#pragma once

#include <cstdint>
#include <string>
#include <string_view>

/// GPT-2's reversible mapping of the 256 byte values onto printable characters, which byte-level
/// BPE vocabularies are written in. Computed by GPT-2's rule (printable Latin-1 bytes map to
/// themselves, the others to U+0100 upwards in byte order). Pure functions, thread-safe.
namespace rlforge::text::unicode {

/// The character byte `b` is written as (U+0021..U+0143).
char32_t byte_to_char(uint8_t b) noexcept;

/// The UTF-8 of `byte_to_char(b)` (one or two bytes).
std::string_view byte_to_utf8(uint8_t b) noexcept;

/// The byte written as `c`, or -1 when `c` is not one of the 256 characters.
int char_to_byte(char32_t c) noexcept;

/// Appends `raw` with every byte replaced by its character.
void append_byte_level(std::string& out, std::string_view raw);

} // namespace rlforge::text::unicode
