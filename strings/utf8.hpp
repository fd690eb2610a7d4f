#pragma once

#include <string>

/// UTF-8 encoding of one code point, the one encoder of every layer (text/'s tokenizers,
/// chat/'s templates). Standard C++ only; pure and thread-safe.
namespace rlforge::strings {

/// Appends the UTF-8 encoding of the Unicode scalar value `c` (at most U+10FFFF, not a
/// surrogate: callers decode valid UTF-8 or build code points themselves) to `out`.
void append_utf8(std::string& out, char32_t c);

} // namespace rlforge::strings
