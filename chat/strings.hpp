#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/error.hpp"

/// Python `str` algorithms on UTF-8 text, by code point: strip, split, replace, case mapping.
/// Reentrant.
namespace rlforge::chat::detail {

/// `s.strip(chars)` / `lstrip` / `rstrip`; no `chars`: Python whitespace.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right);

/// `s.split(sep, maxsplit)` (`rsplit` when `from_right`); no `sep`: runs of whitespace. An empty
/// `sep` throws template_error (runtime) "empty separator".
std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit, bool from_right, source_position where);

/// `s.replace(old, new, count)` (count < 0: all).
std::string py_replace(std::string_view s, std::string_view old, std::string_view replacement,
                       int64_t count);

/// `s.upper()` / `s.lower()`. Only ASCII case mapping is implemented: text with other letters is
/// refused (error_kind::unsupported) rather than mapped differently from Python.
std::string py_case(std::string_view s, bool upper, source_position where);

} // namespace rlforge::chat::detail
