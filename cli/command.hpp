#pragma once

#include <exception>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

/// The `rlforge` binary's subcommands and their flags, declared once and parsed with CLI11
/// (cli/main.cpp builds the command tree from these declarations): every command answers
/// `--help` with its flags, their meaning and defaults, and one example, and exits 0.
namespace rlforge::cli {

/// One flag of a command: `--name VALUE` (or `--name=VALUE`), or a switch without a value.
/// Made by `required_flag`, `optional_flag` and `switch_flag`.
struct flag {
  enum class kind { required, optional, toggle };
  std::string name;         ///< with the dashes: "--model"
  std::string help;         ///< what it means, shown by --help
  std::string default_text; ///< the default --help shows ("" = none)
  kind type = kind::optional;
};

/// A flag the command cannot run without (missing: refused, naming it).
inline flag required_flag(std::string name, std::string help) {
  return {std::move(name), std::move(help), "", flag::kind::required};
}
/// A flag with a value and, where it has one, the default --help shows.
inline flag optional_flag(std::string name, std::string help, std::string default_text = "") {
  return {std::move(name), std::move(help), std::move(default_text), flag::kind::optional};
}
/// A switch: present or not.
inline flag switch_flag(std::string name, std::string help) {
  return {std::move(name), std::move(help), "", flag::kind::toggle};
}

/// The rlforge node and cluster options a command accepts beyond its own flags, handed to
/// `runtime::system_config` (same validation, environment variables and INI file as every
/// rlforge process): any of "--gpus", "--cpus", "--memory-gb", "--node-id", "--pg-timeout",
/// "--call-timeout", "--log-level", "--log-format", "--cluster", "--tls", "--heartbeat-ms",
/// "--dead-after-ms".
/// With `caf_options`, CAF's own options (`--scheduler.max-threads=2`, ...) pass through too.
struct node_options {
  std::vector<std::string> names;
  bool caf_options = false;
};

/// What the command line gave a command: its flags by name, and the node options (and CAF's)
/// as `--name=value` arguments for `system_config::parse_args`.
class parsed_flags {
public:
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::optional<std::string> get(const std::string& name) const {
    auto i = values_.find(name);
    return i == values_.end() ? std::nullopt : std::optional<std::string>(i->second);
  }
  const std::vector<std::string>& node_args() const { return node_args_; }

  void set(const std::string& name, std::string value) { values_[name] = std::move(value); }
  void add_node_arg(std::string arg) { node_args_.push_back(std::move(arg)); }

private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> node_args_;
};

/// A subcommand returns the process exit code: 0 ok, 1 runtime failure, 2 bad usage. Errors are
/// printed to stderr as one line naming what was wrong.
using command_fn = std::function<int(const parsed_flags&)>;

struct command {
  std::string summary;        ///< one line for `rlforge --help`
  std::vector<flag> flags;    ///< its own flags
  std::string example;        ///< one example command line, shown by its --help
  node_options node;          ///< the node/cluster options it also takes
  command_fn run;
};

/// All subcommands, by name. Each `cli/*_command.cpp` registers its own with a
/// `command_registrar` at static-initialisation time.
std::map<std::string, command>& commands();

struct command_registrar {
  command_registrar(std::string name, command c) { commands()[std::move(name)] = std::move(c); }
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

/// `rlforge --version`: the version, the build's features and the wire signature's digest.
std::string version_text();

} // namespace rlforge::cli
