#pragma once

// Internal to backends/train/*.cpp: small text and JSON helpers the training sources share when
// building error messages and reading saved state. Not part of the public API.
// Torch-free, so lr_schedule.cpp stays free of libtorch headers.

#include <nlohmann/json.hpp>

#include "strings/format.hpp"

#include <cstddef>
#include <sstream>
#include <string>
#include <type_traits>

namespace rlforge::backends::detail {

/// The messages' text helpers (strings/format.hpp): 'name', "[d0, d1]", and the shortest text
/// that reads back as exactly a double.
using strings::in_quotes;
using strings::number_text;
using strings::shape_text;

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
