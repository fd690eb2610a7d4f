#pragma once
// How every example driver's --help reads (CLI11): "usage: PROG [OPTIONS]", each flag with its
// value, default and meaning, then what the program does and its examples. Header-only, CLI11
// only, so the drivers' option libraries (examples/grpo/options.cpp) use it without CAF or torch.
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

} // namespace rlforge::examples
