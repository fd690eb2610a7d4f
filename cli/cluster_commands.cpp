// `rlforge head`, `rlforge node` and `rlforge status`: a cluster over CAF's io middleman
// (DESIGN.md "Cluster"). README "A cluster of machines" shows how to start one by hand.
#include "cli/command.hpp"
#include "runtime/stop_signals.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <thread>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/engine.hpp"
#include "actors/head.hpp"
#include "actors/local_exit.hpp"
#include "actors/node.hpp"
#include "actors/node_agent.hpp"
#include "actors/node_runner.hpp"
#include "actors/weight_sync.hpp"
#include "actors/worker.hpp"
#include "runtime/cluster_endpoint.hpp"
#include "runtime/errc.hpp"
#include "runtime/system_config.hpp"
#include "runtime/tls.hpp"
#include "service/metrics_server.hpp"

namespace rlforge::cli {
namespace {

/// True when the node option `flag` is among `node_args` ("--flag=value") or `env` is set.
bool given(const std::vector<std::string>& node_args, const std::string& flag, const char* env) {
  for (auto& x : node_args)
    if (x.rfind(flag + "=", 0) == 0)
      return true;
  const char* v = std::getenv(env);
  return v != nullptr && *v != '\0';
}

std::string render(const caf::error& err) {
  auto msg = error_message(err);
  return msg.empty() ? caf::to_string(err) : msg;
}

/// Parses a port flag (0..65535).
bool parse_port(const std::string& text, uint16_t& out, std::string& error,
                const char* flag = "--port") {
  if (text.empty() || text.size() > 5 || text.find_first_not_of("0123456789") != std::string::npos
      || std::stoul(text) > 65535) {
    error = std::string(flag) + " expects an integer in 0..65535, got '" + text + "'";
    return false;
  }
  out = static_cast<uint16_t>(std::stoul(text));
  return true;
}

/// The TLS policy every cluster process applies to the address it listens on: loopback is
/// always allowed; any other address needs TLS, or --insecure (with a warning).
bool check_bind(const char* prog, const std::string& address, bool tls, bool insecure) {
  if (insecure && tls) {
    std::cerr << prog << ": --insecure and --tls contradict each other; drop one\n";
    return false;
  }
  if (runtime::is_loopback(address) || tls)
    return true;
  if (!insecure) {
    std::cerr << prog << ": listening on " << address
              << " without TLS would let anyone who reaches it run code in the cluster (the "
                 "ShadowRay attack, CVE-2023-48022); use --tls DIR (`rlforge head --init-tls "
                 "DIR` writes one) or, on a trusted network only, --insecure\n";
    return false;
  }
  std::cerr << prog << ": WARNING: listening on " << address
            << " WITHOUT TLS OR AUTHENTICATION (--insecure): anyone who can reach this port can "
               "join the cluster and run code on it\n";
  return true;
}

// -- rlforge head -------------------------------------------------------------------------------

int run_head(const parsed_flags& f) {
  const char* prog = "rlforge head";
  if (auto dir = f.get("--init-tls")) {
    if (f.has("--port") || f.has("--bind") || f.has("--insecure") || f.has("--metrics-port") ||
        f.has("--metrics-bind") || !f.node_args().empty()) {
      std::cerr << prog << ": --init-tls DIR takes no other flags\n";
      return 2;
    }
    if (auto err = runtime::init_tls(*dir)) {
      std::cerr << prog << ": " << render(err) << "\n";
      return 1;
    }
    std::cout << "rlforge head: wrote the cluster CA (ca.pem, ca-key.pem) and certificate "
                 "(cert.pem, key.pem) to "
              << *dir
              << "; copy the directory to every machine of the cluster (keep ca-key.pem "
                 "off them) and start every head, node and driver with --tls "
              << *dir << "\n";
    return 0;
  }
  uint16_t port = 6380;
  std::string error;
  if (auto p = f.get("--port"); p && !parse_port(*p, port, error)) {
    std::cerr << prog << ": " << error << "\n";
    return 2;
  }
  auto bind = f.get("--bind").value_or("127.0.0.1");
  // Prometheus metrics over plain HTTP, loopback unless told otherwise (they read state only).
  uint16_t metrics_port = 0;
  const bool metrics = f.has("--metrics-port");
  if (metrics && !parse_port(*f.get("--metrics-port"), metrics_port, error, "--metrics-port")) {
    std::cerr << prog << ": " << error << "\n";
    return 2;
  }
  if (!metrics && f.has("--metrics-bind")) {
    std::cerr << prog << ": --metrics-bind needs --metrics-port (see `rlforge head --help`)\n";
    return 2;
  }
  auto metrics_bind = f.get("--metrics-bind").value_or("127.0.0.1");
  bool local_node = given(f.node_args(), "--gpus", "RLFORGE_GPUS") ||
                    given(f.node_args(), "--cpus", "RLFORGE_CPUS");
  auto stop_signals = runtime::block_stop_signals();
  runtime::system_config cfg;
  if (auto err = cfg.parse_args(f.node_args())) {
    std::cerr << prog << ": " << render(err) << " (see `rlforge head --help`)\n";
    return 2;
  }
  if (!check_bind(prog, bind, cfg.tls(), f.has("--insecure")))
    return 2;
  cfg.enable_cluster_transport();
  actors::register_worker_kinds();
  actors::register_engine_kind();
  actors::set_advertised_address(bind);
  caf::actor_system sys{cfg};
  actors::head_options opts;
  opts.heartbeat = std::chrono::milliseconds{cfg.heartbeat_ms};
  opts.dead_after = std::chrono::milliseconds{cfg.dead_after_ms};
  opts.pg_timeout = std::chrono::milliseconds{static_cast<int64_t>(cfg.pg_timeout_s * 1000)};
  opts.state_path = f.get("--state").value_or("");
  opts.rejoin_grace = std::chrono::milliseconds{cfg.head_grace_ms};
  auto spawned = actors::spawn_head(sys, opts);
  if (!spawned) {
    std::cerr << prog << ": --state: " << render(spawned.error()) << "\n";
    return 2;
  }
  auto head = *spawned;
  auto bound = runtime::publish_actor(sys, head, port, bind);
  if (!bound) {
    std::cerr << prog << ": cannot listen on " << bind << ":" << port << ": "
              << sys.render(bound.error()) << "\n";
    actors::stop_from_this_process(sys, head);
    return 1;
  }
  std::cerr << "rlforge head: listening on " << runtime::to_string({bind, *bound}) << " ("
            << (cfg.tls() ? "TLS, cluster CA " + runtime::tls_files_in(cfg.tls_dir).ca_cert
                          : std::string{"plain TCP"})
            << ")" << std::endl;
  std::unique_ptr<service::metrics_server> metrics_http;
  if (metrics) {
    metrics_http = std::make_unique<service::metrics_server>([&sys, head] {
      caf::scoped_actor self{sys};
      std::string text;
      caf::error failure;
      self->request(head, std::chrono::seconds(10), cluster_metrics_atom::value)
        .receive([&](std::string& t) { text = std::move(t); },
                 [&](caf::error& err) { failure = std::move(err); });
      if (failure)
        throw std::runtime_error(render(failure));
      return text;
    });
    try {
      auto at = metrics_http->start(metrics_bind, metrics_port);
      std::cerr << "rlforge head: metrics on http://" << runtime::to_string({metrics_bind,
                                                                             uint16_t(at)})
                << "/metrics" << std::endl;
    } catch (const std::exception& e) {
      std::cerr << prog << ": --metrics-port: " << e.what() << "\n";
      actors::stop_from_this_process(sys, head);
      return 1;
    }
  }
  node_agent_actor agent;
  if (local_node) {
    actors::node_agent_options ao;
    ao.resources = actors::local_node(cfg);
    ao.address = bind;
    agent = actors::spawn_node_agent(sys, ao);
    caf::scoped_actor self{sys};
    caf::error failure;
    self->request(agent, std::chrono::seconds(15), use_head_atom::value,
                  caf::actor_cast<caf::actor>(head), uint16_t{0})
      .receive([](join_reply&) {}, [&](caf::error& err) { failure = std::move(err); });
    if (failure) {
      std::cerr << prog << ": the head's own node cannot join: " << render(failure) << "\n";
      actors::stop_from_this_process(sys, agent);
      actors::stop_from_this_process(sys, head);
      return 2;
    }
    std::cerr << "rlforge head: with its own node '" << ao.resources.node_id << "' ("
              << ao.resources.gpus << " GPUs, " << ao.resources.cpus << " CPUs)" << std::endl;
  }
  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::cerr << "rlforge head: signal " << sig << ", stopping\n";
  if (metrics_http)
    metrics_http->stop();
  if (agent)
    actors::stop_from_this_process(sys, agent);
  actors::stop_from_this_process(sys, head);
  return 0;
}

// -- rlforge node -------------------------------------------------------------------------------

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

int run_node(const parsed_flags& f) {
  const char* prog = "rlforge node";
  auto head = runtime::parse_endpoint(*f.get("--head"));
  if (!head) {
    std::cerr << prog << ": --head: " << render(head.error()) << "\n";
    return 2;
  }
  uint16_t port = 0;
  std::string error;
  if (auto p = f.get("--port"); p && !parse_port(*p, port, error)) {
    std::cerr << prog << ": " << error << "\n";
    return 2;
  }
  double connect_timeout = 15;
  if (auto c = f.get("--connect-timeout")) {
    char* end = nullptr;
    connect_timeout = std::strtod(c->c_str(), &end);
    if (end == c->c_str() || *end != '\0' || !(connect_timeout > 0) || connect_timeout > 86400) {
      std::cerr << prog << ": --connect-timeout expects seconds in (0, 86400], got '" << *c
                << "'\n";
      return 2;
    }
  }
  auto address = f.get("--node-ip").value_or("127.0.0.1");
  bool named = given(f.node_args(), "--node-id", "RLFORGE_NODE_ID");
  auto stop_signals = runtime::block_stop_signals();
  runtime::system_config cfg;
  if (auto err = cfg.parse_args(f.node_args())) {
    std::cerr << prog << ": " << render(err) << " (see `rlforge node --help`)\n";
    return 2;
  }
  if (!named)
    cfg.node_id = host_name() + "-" + std::to_string(::getpid());
  if (!check_bind(prog, address, cfg.tls(), f.has("--insecure")))
    return 2;
  cfg.enable_cluster_transport();
  actors::register_worker_kinds();
  actors::register_engine_kind();
  caf::actor_system sys{cfg};
  runtime::stop_watcher watcher{stop_signals};
  actors::node_runner_options o;
  o.head = *head;
  o.agent.resources = actors::local_node(cfg);
  o.agent.address = address;
  o.agent.head_grace = std::chrono::milliseconds{cfg.head_grace_ms};
  o.port = port;
  o.first_join_timeout =
    std::chrono::milliseconds{static_cast<int64_t>(connect_timeout * 1000)};
  o.stop = &watcher.stop;
  o.report = [](const std::string& line) { std::cerr << "rlforge " << line << std::endl; };
  return actors::run_node(sys, o);
}

// -- rlforge status -----------------------------------------------------------------------------

std::string amounts(const nlohmann::json& used_from, const nlohmann::json& total,
                    const std::string& name) {
  auto t = total.contains(name) ? total[name].get<double>() : 0.0;
  auto free = used_from.contains(name) ? used_from[name].get<double>() : 0.0;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%g/%g", t - free, t);
  return buf;
}

void print_table(const nlohmann::json& s) {
  std::cout << "cluster " << s["cluster_id"].get<std::string>() << " at "
            << s["endpoint"].get<std::string>() << " (rlforge " << s["version"].get<std::string>()
            << ")\n\nnodes:\n";
  std::printf("  %-20s %-6s %-22s %-9s %-9s %-6s %s\n", "id", "state", "address", "GPU used",
              "CPU used", "ranks", "last heartbeat");
  for (auto& n : s["nodes"]) {
    auto addr = n["address"].get<std::string>() + ":" + std::to_string(n["port"].get<int>());
    auto total = n.value("total", nlohmann::json::object());
    auto avail = n.value("available", nlohmann::json::object());
    bool alive = n["alive"].get<bool>();
    std::printf("  %-20s %-6s %-22s %-9s %-9s %-6d %s\n", n["id"].get<std::string>().c_str(),
                alive ? "alive" : "dead", addr.c_str(),
                alive ? amounts(avail, total, "GPU").c_str() : "-",
                alive ? amounts(avail, total, "CPU").c_str() : "-", n["ranks"].get<int>(),
                (std::to_string(n["last_heartbeat_ms"].get<int64_t>()) + " ms ago"
                 + (alive ? "" : " (" + n["death"].get<std::string>() + ")"))
                  .c_str());
  }
  std::cout << "\nplacement groups:\n";
  if (s["placement_groups"].empty())
    std::cout << "  none\n";
  for (auto& g : s["placement_groups"]) {
    std::string where;
    for (auto& b : g.value("bundles", nlohmann::json::array())) {
      where += (where.empty() ? "" : " ") + b["node"].get<std::string>();
      for (auto& d : b["devices"])
        where += ":gpu" + std::to_string(d.get<int>());
    }
    std::printf("  %-20s %-8s %-14s owner %-28s %s\n", g["name"].get<std::string>().c_str(),
                g["state"].get<std::string>().c_str(), g.value("strategy", "").c_str(),
                g.value("owner", "").c_str(),
                g.contains("reason") && !g["reason"].get<std::string>().empty()
                  ? g["reason"].get<std::string>().c_str()
                  : where.c_str());
  }
  std::cout << "\nactor groups:\n";
  if (s["actor_groups"].empty())
    std::cout << "  none\n";
  for (auto& g : s["actor_groups"]) {
    std::string nodes;
    for (auto& n : g["rank_nodes"])
      nodes += (nodes.empty() ? "" : ",") + n.get<std::string>();
    std::printf("  %-20s kind %-8s owner %-28s ranks on %s: %s\n",
                g["name"].get<std::string>().c_str(), g["kind"].get<std::string>().c_str(),
                g["owner"].get<std::string>().c_str(), nodes.c_str(),
                g["state"].get<std::string>().c_str());
  }
  std::cout << "\ndrivers:\n";
  if (s["drivers"].empty())
    std::cout << "  none\n";
  for (auto& d : s["drivers"])
    std::cout << "  " << d["id"].get<std::string>() << "\n";
}

int run_status(const parsed_flags& f) {
  const char* prog = "rlforge status";
  runtime::system_config cfg;
  if (auto err = cfg.parse_args(f.node_args())) {
    std::cerr << prog << ": " << render(err) << " (see `rlforge status --help`)\n";
    return 2;
  }
  if (cfg.cluster.empty()) {
    std::cerr << prog << ": --cluster HOST:PORT (or RLFORGE_CLUSTER) is required\n";
    return 2;
  }
  caf::actor_system sys{cfg};
  auto at = *runtime::parse_endpoint(cfg.cluster);
  auto head = runtime::connect_actor<head_actor>(sys, at, "the cluster head at " + cfg.cluster);
  if (!head) {
    std::cerr << prog << ": " << render(head.error()) << "\n";
    return 1;
  }
  caf::scoped_actor self{sys};
  int rc = 0;
  self->request(*head, std::chrono::seconds(10), cluster_status_atom::value)
    .receive(
      [&](std::string& text) {
        auto doc = nlohmann::json::parse(text, nullptr, false);
        if (doc.is_discarded()) {
          std::cerr << prog << ": the head answered something that is not JSON\n";
          rc = 1;
        } else if (f.has("--json")) {
          doc["endpoint"] = cfg.cluster;
          std::cout << doc.dump(2) << "\n";
        } else {
          doc["endpoint"] = cfg.cluster;
          print_table(doc);
        }
      },
      [&](caf::error& err) {
        std::cerr << prog << ": " << render(err) << "\n";
        rc = 1;
      });
  return rc;
}

const flag insecure_flag = switch_flag(
    "--insecure", "listen on a non-loopback address without TLS (trusted networks only)");

const command_registrar head_reg{
    "head",
    {"run a cluster head (placement and node registry); with --gpus/--cpus also a node",
     {optional_flag("--port", "port to listen on (0 = an ephemeral one)", "6380"),
      optional_flag("--bind", "address to listen on (not loopback: needs --tls or --insecure)",
                    "127.0.0.1"),
      insecure_flag,
      optional_flag("--init-tls", "write a cluster CA and certificate into DIR, then exit"),
      optional_flag("--metrics-port", "serve Prometheus metrics on this port (0 = ephemeral)"),
      optional_flag("--metrics-bind", "address of the metrics endpoint", "127.0.0.1"),
      optional_flag("--state", "SQLite file where the head keeps its registry: a head restarted "
                               "on it takes its nodes, placement groups and drivers back")},
     "rlforge head --port 6380 --tls ~/rlforge-tls --metrics-port 9090",
     {{"--gpus", "--cpus", "--memory-gb", "--node-id", "--pg-timeout", "--log-level",
       "--log-format", "--tls", "--heartbeat-ms", "--dead-after-ms", "--head-grace-ms"},
      true},
     run_head}};

const command_registrar node_reg{
    "node",
    {"run a node that joins a cluster head and hosts ranks",
     {required_flag("--head", "HOST:PORT of the head"),
      optional_flag("--node-ip", "the address this node advertises (and binds)", "127.0.0.1"),
      optional_flag("--port", "port of the node's agent (0 = an ephemeral one)", "0"),
      insecure_flag,
      optional_flag("--connect-timeout", "seconds to wait for the head at start (0..86400]",
                    "15")},
     "rlforge node --head 10.0.0.1:6380 --node-ip 10.0.0.2 --gpus 8 --tls ~/rlforge-tls",
     {{"--gpus", "--cpus", "--memory-gb", "--node-id", "--log-level", "--log-format", "--tls",
       "--heartbeat-ms", "--dead-after-ms", "--head-grace-ms"},
      true},
     run_node}};

const command_registrar status_reg{
    "status",
    {"show a cluster's nodes, placement groups and actor groups",
     {switch_flag("--json", "print the head's status document as JSON")},
     "rlforge status --cluster 10.0.0.1:6380 --tls ~/rlforge-tls",
     {{"--cluster", "--tls", "--log-level", "--log-format"}, true},
     run_status}};

} // namespace
} // namespace rlforge::cli
