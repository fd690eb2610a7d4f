#pragma once
// What every example driver's command line shares (CLI11): the help layout ("usage: PROG
// [OPTIONS]", each flag with its value, default and meaning, then what the program does and its
// examples) and the strict reading of numeric flag values. Header-only, CLI11 and the standard
// library only, so the drivers' option libraries (examples/grpo/options.cpp) use it without CAF
// or torch.
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

#include <CLI/CLI.hpp>

namespace rlforge::examples {

/// Sets `app`'s help layout: the usage line first (lower-case "usage:", as the other programs
/// of rlforge print it), the options, then `about` and `examples` (command lines, one per line).
inline void describe(CLI::App& app, const std::string& about, const std::string& examples) {
  app.set_help_flag("-h,--help", "print this help and exit");
  app.get_formatter()->label("Usage", "usage");
  app.footer(about + "\n\nexample:\n" + examples);
}

/// `text` as an integer in [lo, hi], wholly (no trailing characters); false otherwise.
inline bool parse_integer(const std::string& text, long long lo, long long hi, long long& out) {
  if (text.empty())
    return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi)
    return false;
  out = v;
  return true;
}

/// `text` as a finite number, wholly; false otherwise.
inline bool parse_number(const std::string& text, double& out) {
  if (text.empty())
    return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v))
    return false;
  out = v;
  return true;
}

} // namespace rlforge::examples
