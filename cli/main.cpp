// The `rlforge` binary: one subcommand per capability (`rlforge --help` lists them).
#include "cli/command.hpp"

#include <algorithm>
#include <iostream>

namespace rlforge::cli {

std::map<std::string, command>& commands() {
  static std::map<std::string, command> table;
  return table;
}

flag_parser::flag_parser(std::vector<std::string> value_flags, std::vector<std::string> bool_flags)
  : value_flags_(std::move(value_flags)), bool_flags_(std::move(bool_flags)) {
}

bool flag_parser::parse(const args& a) {
  auto contains = [](const std::vector<std::string>& xs, const std::string& x) {
    return std::find(xs.begin(), xs.end(), x) != xs.end();
  };
  for (size_t i = 0; i < a.size(); ++i) {
    std::string name = a[i];
    std::string value;
    bool has_inline_value = false;
    if (auto eq = name.find('='); name.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_inline_value = true;
    }
    if (contains(bool_flags_, name)) {
      if (has_inline_value) {
        error_ = "flag " + name + " takes no value";
        return false;
      }
      values_[name] = "true";
    } else if (contains(value_flags_, name)) {
      if (!has_inline_value) {
        if (i + 1 >= a.size()) {
          error_ = "flag " + name + " needs a value";
          return false;
        }
        value = a[++i];
      }
      values_[name] = value;
    } else {
      error_ = "unknown argument '" + a[i] + "'";
      return false;
    }
  }
  return true;
}

bool flag_parser::has(const std::string& name) const {
  return values_.count(name) > 0;
}

std::optional<std::string> flag_parser::get(const std::string& name) const {
  auto i = values_.find(name);
  if (i == values_.end())
    return std::nullopt;
  return i->second;
}

} // namespace rlforge::cli

int main(int argc, char** argv) {
  using namespace rlforge::cli;
  auto usage = [] {
    std::cout << "usage: rlforge <command> [flags]\n\ncommands:\n";
    for (auto& [name, cmd] : commands())
      std::cout << "  " << name << std::string(name.size() < 14 ? 14 - name.size() : 1, ' ')
                << cmd.summary << "\n";
  };
  if (argc < 2) {
    usage();
    return 2;
  }
  std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    usage();
    return 0;
  }
  auto i = commands().find(name);
  if (i == commands().end()) {
    std::cerr << "rlforge: unknown command '" << name << "' (see rlforge --help)\n";
    return 2;
  }
  args rest(argv + 2, argv + argc);
  return i->second.run(rest);
}
