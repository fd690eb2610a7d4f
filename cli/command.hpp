#pragma once

#include <exception>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace rlforge::cli {

/// Command-line arguments after the subcommand name, e.g. {"--model", "DIR"}.
using args = std::vector<std::string>;

/// A subcommand returns the process exit code: 0 ok, 1 runtime failure, 2 bad usage. Errors are
/// printed to stderr as one line naming what was wrong.
using command_fn = std::function<int(const args&)>;

struct command {
  command_fn run;
  std::string summary; ///< one line for `rlforge --help`
};

/// All subcommands, by name. Each `cli/*_command.cpp` registers its own with a
/// `command_registrar` at static-initialisation time.
std::map<std::string, command>& commands();

struct command_registrar {
  command_registrar(std::string name, std::string summary, command_fn fn) {
    commands()[std::move(name)] = command{std::move(fn), std::move(summary)};
  }
};

/// A refusal a command reports as one line on stderr with its exit code: 2 for bad usage (a
/// malformed or out-of-domain flag value, bad input text or ids), 1 for a runtime failure (a
/// missing or malformed file).
struct command_error {
  int exit_code;
  std::string message;
};

inline command_error usage_error(std::string message) {
  return {2, std::move(message)};
}

inline command_error runtime_failure(std::string message) {
  return {1, std::move(message)};
}

/// Runs a command's `body` (returning its exit code); a `command_error` it throws becomes
/// "rlforge NAME: MESSAGE" on stderr and its exit code, any other exception the same with 1.
template <class Body> int run_reporting(const char* name, Body body) {
  try {
    return body();
  } catch (const command_error& e) {
    std::cerr << "rlforge " << name << ": " << e.message << "\n";
    return e.exit_code;
  } catch (const std::exception& e) {
    std::cerr << "rlforge " << name << ": " << e.what() << "\n";
    return 1;
  }
}

/// Small flag parser for `--name value` and `--flag` arguments. Unknown flags are an error.
class flag_parser {
public:
  /// `value_flags` take a value, `bool_flags` do not.
  flag_parser(std::vector<std::string> value_flags, std::vector<std::string> bool_flags = {});

  /// Parses `a`; on failure returns false and sets `error()`.
  bool parse(const args& a);

  const std::string& error() const { return error_; }
  bool has(const std::string& name) const;
  std::optional<std::string> get(const std::string& name) const;

private:
  std::vector<std::string> value_flags_;
  std::vector<std::string> bool_flags_;
  std::map<std::string, std::string> values_;
  std::string error_;
};

} // namespace rlforge::cli
