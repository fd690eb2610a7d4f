#pragma once

// Internal to backends/train/*.cpp: small text and JSON helpers the training sources share when
// building error messages and reading saved state. Not part of the public API.
// Torch-free, so lr_schedule.cpp stays free of libtorch headers.

#include <nlohmann/json.hpp>

#include <cstddef>
#include <sstream>
#include <string>
#include <type_traits>

namespace rlforge::backends::detail {

/// `s` between single quotes, for naming a value in an error message.
inline std::string in_quotes(const std::string& s) {
  return "'" + s + "'";
}

/// A shape as "[d0, d1, ...]"; `Sizes` is any indexable sequence of integers with size()
/// (at::IntArrayRef, std::vector<int64_t>).
template <class Sizes> std::string shape_text(const Sizes& sizes) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < sizes.size(); ++i)
    out << (i ? ", " : "") << sizes[i];
  out << ']';
  return out.str();
}

/// `x` with 17 significant digits, enough to tell any two doubles apart.
inline std::string number_text(double x) {
  std::ostringstream out;
  out.precision(17);
  out << x;
  return out.str();
}

/// Whether the JSON value `v` can be read as a `T`: a string for std::string, an integer for
/// integral types, any number otherwise.
template <class T> bool json_holds(const nlohmann::json& v) {
  if constexpr (std::is_same_v<T, std::string>)
    return v.is_string();
  else if constexpr (std::is_integral_v<T>)
    return v.is_number_integer();
  else
    return v.is_number();
}

} // namespace rlforge::backends::detail
