#pragma once

#include <exception>
#include <string>

namespace rlforge::backends {

/// The first line of an exception's message, for error text: torch's `c10::Error::what()`
/// appends a C++ backtrace, which is dropped (`what_without_backtrace`).
std::string exception_first_line(const std::exception& e);

} // namespace rlforge::backends
