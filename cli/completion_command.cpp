// `rlforge completion --shell bash`: a bash completion script for rlforge, generated from the
// same declarations the command line is parsed with (cli/command.hpp), so it never drifts.
#include "cli/command.hpp"

#include <iostream>
#include <string>

namespace rlforge::cli {
namespace {

std::string bash_script() {
  std::string names, cases;
  for (const auto& [name, cmd] : commands()) {
    names += (names.empty() ? "" : " ") + name;
    std::string flags = "--help";
    for (const auto& f : cmd.flags)
      flags += " " + f.name;
    for (const auto& n : cmd.node.names)
      flags += " " + n;
    cases += "    " + name + ") words=\"" + flags + "\" ;;\n";
  }
  return "# bash completion for rlforge (rlforge completion --shell bash)\n"
         "_rlforge() {\n"
         "  local cur=${COMP_WORDS[COMP_CWORD]} words\n"
         "  if [ \"$COMP_CWORD\" -eq 1 ]; then\n"
         "    COMPREPLY=($(compgen -W \"" + names + " --help --version\" -- \"$cur\"))\n"
         "    return\n"
         "  fi\n"
         "  case ${COMP_WORDS[1]} in\n" + cases +
         "    *) words=\"\" ;;\n"
         "  esac\n"
         "  case $cur in\n"
         "    -*) COMPREPLY=($(compgen -W \"$words\" -- \"$cur\")) ;;\n"
         "    *) COMPREPLY=($(compgen -f -- \"$cur\")) ;;\n"
         "  esac\n"
         "}\n"
         "complete -F _rlforge rlforge\n";
}

int run_completion(const parsed_flags& flags) {
  const auto shell = *flags.get("--shell");
  if (shell != "bash") {
    std::cerr << "rlforge completion: --shell must be bash, got '" << shell << "'\n";
    return 2;
  }
  std::cout << bash_script();
  return 0;
}

const command_registrar reg{
    "completion",
    {"print a shell completion script for rlforge's commands and flags",
     {required_flag("--shell", "the shell: bash")},
     "source <(rlforge completion --shell bash)",
     {},
     run_completion}};

} // namespace
} // namespace rlforge::cli
