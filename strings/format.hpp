#pragma once

#include <cstdint>
#include <string>
#include <vector>

/// The text helpers of rlforge's messages, one of each: errors quote names as 'name', write
/// numbers so that they read back exactly, list valid values as "a, b, c" and shapes as
/// "[2, 3]". Standard C++ only. Every function is pure and thread-safe.
namespace rlforge::strings {

/// `s` in single quotes: 'name'.
std::string in_quotes(const std::string& s);

/// The shortest decimal text that reads back as exactly `x` ("0.1", "1e-12", "3"); "nan", "inf"
/// and "-inf" for the non-finite values.
std::string number_text(double x);

/// `items` separated by ", "; `if_empty` when there are none.
std::string join(const std::vector<std::string>& items, const std::string& if_empty = "");

/// `unix_ms` (milliseconds since the epoch) as UTC in ISO 8601 with milliseconds:
/// "2026-01-02T03:04:05.678Z".
std::string iso_time(int64_t unix_ms);

/// A shape as "[d0, d1, ...]"; `Sizes` is any indexable sequence of integers with size()
/// (std::vector<int64_t>, at::IntArrayRef, ...).
template <class Sizes> std::string shape_text(const Sizes& sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i)
    out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

} // namespace rlforge::strings
