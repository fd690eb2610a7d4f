// The `rlforge` binary: one subcommand per capability (`rlforge --help` lists them), its command
// line parsed by CLI11 from the declarations in cli/*_command.cpp (cli/command.hpp).
#include "cli/command.hpp"

#include <CLI/CLI.hpp>

#include <iostream>
#include <map>

namespace rlforge::cli {

std::map<std::string, command>& commands() {
  static std::map<std::string, command> table;
  return table;
}

namespace {

/// The node and cluster options of runtime::system_config, as --help describes them.
const std::map<std::string, std::pair<std::string, std::string>>& node_option_help() {
  static const std::map<std::string, std::pair<std::string, std::string>> help = {
      {"--gpus", {"GPUs this node declares (virtual ones, computing on the CPU, without CUDA)", "0"}},
      {"--cpus", {"CPUs this node declares (0 = the machine's cores)", "0"}},
      {"--memory-gb", {"memory this node declares, GiB (0 = the machine's)", "0"}},
      {"--node-id", {"this node's id", "node0; <host>-<pid> for rlforge node"}},
      {"--pg-timeout", {"seconds a placement group may wait for resources", "180"}},
      {"--call-timeout", {"seconds a call to a rank may take", "600"}},
      {"--log-level", {"trace, debug, info, warn, error or off", "info"}},
      {"--log-format", {"log lines: text, or json (one object per line)", "text"}},
      {"--cluster", {"HOST:PORT of the cluster head (env RLFORGE_CLUSTER)", ""}},
      {"--tls", {"directory with the cluster's TLS files (rlforge head --init-tls DIR)", ""}},
      {"--heartbeat-ms", {"heartbeat interval between cluster processes, ms", "200"}},
      {"--dead-after-ms", {"a peer silent this long is declared dead, ms", "1000"}},
      {"--head-grace-ms",
       {"how long nodes keep their ranks while the head is away, and a restarted head waits "
        "for its nodes and drivers, ms (0 = not at all)",
        "30000"}},
  };
  return help;
}

/// Adds `cmd`'s flags to `sub`, writing what the command line gives into `p`.
void declare(CLI::App& sub, const command& cmd, parsed_flags& p) {
  sub.footer("example:\n  " + cmd.example);
  for (const auto& f : cmd.flags) {
    if (f.type == flag::kind::toggle) {
      sub.add_flag_callback(f.name, [&p, n = f.name] { p.set(n, "true"); }, f.help);
      continue;
    }
    auto* o = sub.add_option_function<std::string>(
        f.name, [&p, n = f.name](const std::string& v) { p.set(n, v); }, f.help);
    o->type_name("VALUE");
    if (f.type == flag::kind::required)
      o->required();
    if (!f.default_text.empty())
      o->default_str(f.default_text);
  }
  for (const auto& n : cmd.node.names) {
    const auto& [help, def] = node_option_help().at(n);
    auto* o = sub.add_option_function<std::string>(
        n, [&p, n](const std::string& v) { p.add_node_arg(n + "=" + v); }, help);
    o->type_name("VALUE")->group("Node and cluster options");
    if (!def.empty())
      o->default_str(def);
  }
  if (cmd.node.caf_options)
    sub.allow_extras();
}

} // namespace
} // namespace rlforge::cli

int main(int argc, char** argv) {
  using namespace rlforge::cli;
  CLI::App app{"rlforge: an actor runtime for RL post-training of language models"};
  app.set_version_flag("--version", [] { return version_text(); });
  app.require_subcommand(0, 1);
  app.footer("`rlforge COMMAND --help` describes a command's flags, with an example.");
  std::map<std::string, parsed_flags> parsed;
  std::map<std::string, CLI::App*> subs;
  for (auto& [name, cmd] : commands()) {
    subs[name] = app.add_subcommand(name, cmd.summary);
    declare(*subs[name], cmd, parsed[name]);
  }
  if (argc < 2) {
    std::cout << app.help();
    return 2;
  }
  const std::string first = argv[1];
  if (first == "help") {
    std::cout << app.help();
    return 0;
  }
  if (first.rfind("-", 0) != 0 && commands().count(first) == 0) {
    std::cerr << "rlforge: unknown command '" << first << "' (see rlforge --help)\n";
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string where = "rlforge";
    for (auto* s : app.get_subcommands())
      where += " " + s->get_name();
    std::cerr << where << ": " << e.what() << " (see `" << where << " --help`)\n";
    return 2;
  }
  for (auto& [name, sub] : subs) {
    if (!sub->parsed())
      continue;
    auto& p = parsed[name];
    for (auto& extra : sub->remaining())
      p.add_node_arg(extra);
    return commands().at(name).run(p);
  }
  std::cout << app.help();
  return 2;
}
