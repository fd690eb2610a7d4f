#include "runtime/system_config.hpp"

#include <cmath>
#include <cstdlib>
#include <sstream>
#include <thread>

#include <unistd.h>

#include <caf/io/middleman.hpp>
#include <caf/openssl/manager.hpp>

#include "runtime/errc.hpp"
#include "runtime/cluster_endpoint.hpp"
#include "runtime/logging.hpp"
#include "runtime/openssl_error_queue.hpp"
#include "runtime/tls.hpp"
#include "runtime/type_registry.hpp"

namespace rlforge::runtime {

namespace {

size_t hardware_cores() {
  auto n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : n;
}

template <class T>
caf::error read_env(const char* name, T& out) {
  const char* raw = std::getenv(name);
  if (raw == nullptr || *raw == '\0')
    return caf::none;
  std::istringstream in{raw};
  T value{};
  in >> value;
  if (in.fail() || !in.eof())
    return make_error(errc::invalid_argument,
                      std::string{"environment variable "} + name + "='" + raw
                        + "' is not a valid value");
  out = value;
  return caf::none;
}

} // namespace

system_config::system_config() {
  load<caf::io::middleman>();
  register_types(*this);
  set("scheduler.policy", caf::atom("sharing"));
  set("scheduler.max-threads", hardware_cores());
  opt_group{custom_options_, "rlforge"}
    .add(gpus, "gpus", "number of (virtual) GPUs this node declares")
    .add(cpus, "cpus", "number of CPUs this node declares (0 = hardware)")
    .add(memory_gb, "memory-gb", "memory this node declares in GiB (0 = physical)")
    .add(node_id, "node-id", "this node's id")
    .add(pg_timeout_s, "pg-timeout", "seconds a placement group may stay pending")
    .add(call_timeout_s, "call-timeout", "default deadline of a group call in seconds")
    .add(log_level, "log-level", "default log level (trace, debug, info, warn, error)")
    .add(log_format, "log-format", "log lines: text or json (one object per line)")
    .add(cluster, "cluster", "HOST:PORT of a cluster head to attach to (empty: embedded)")
    .add(tls_dir, "tls", "directory with the cluster's ca.pem, cert.pem and key.pem")
    .add(heartbeat_ms, "heartbeat-ms", "heartbeat interval of cluster connections in ms")
    .add(dead_after_ms, "dead-after-ms", "silence in ms after which a cluster peer is dead")
    .add(head_grace_ms, "head-grace-ms",
         "ms nodes keep their ranks and drivers wait while the head is away");
}

void system_config::enable_cluster_transport() {
  set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds{heartbeat_ms}});
  set("middleman.connection-timeout", caf::timespan{std::chrono::milliseconds{dead_after_ms}});
}

caf::error system_config::apply_tls() {
  if (tls_dir.empty() || tls_loaded_)
    return caf::none;
  if (auto err = check_tls(tls_dir))
    return err;
  keep_openssl_error_queue_clean();
  auto files = tls_files_in(tls_dir);
  openssl_certificate = files.cert;
  openssl_key = files.key;
  openssl_cafile = files.ca_cert;
  load<caf::openssl::manager>();
  tls_loaded_ = true;
  return caf::none;
}

caf::error system_config::apply_environment() {
  if (auto err = read_env("RLFORGE_GPUS", gpus))
    return err;
  if (auto err = read_env("RLFORGE_CPUS", cpus))
    return err;
  if (auto err = read_env("RLFORGE_MEMORY_GB", memory_gb))
    return err;
  if (auto err = read_env("RLFORGE_NODE_ID", node_id))
    return err;
  if (auto err = read_env("RLFORGE_PG_TIMEOUT_S", pg_timeout_s))
    return err;
  if (auto err = read_env("RLFORGE_CALL_TIMEOUT_S", call_timeout_s))
    return err;
  if (auto err = read_env("RLFORGE_CLUSTER", cluster))
    return err;
  if (auto err = read_env("RLFORGE_TLS_DIR", tls_dir))
    return err;
  if (auto err = read_env("RLFORGE_HEARTBEAT_MS", heartbeat_ms))
    return err;
  if (auto err = read_env("RLFORGE_DEAD_AFTER_MS", dead_after_ms))
    return err;
  if (auto err = read_env("RLFORGE_HEAD_GRACE_MS", head_grace_ms))
    return err;
  if (auto err = read_env("RLFORGE_LOG_FORMAT", log_format))
    return err;
  return caf::none;
}

caf::error system_config::parse_args(std::vector<std::string> args) {
  if (auto err = apply_environment())
    return err;
  // Short forms of rlforge's options: `--gpus=4` / `--gpus 4` mean `--rlforge.gpus=4`.
  static const char* short_names[] = {"gpus",         "cpus",      "memory-gb", "node-id",
                                      "pg-timeout",   "call-timeout", "log-level", "log-format",
                                      "cluster", "tls", "heartbeat-ms", "dead-after-ms",
                                      "head-grace-ms"};
  std::vector<std::string> rewritten;
  for (size_t i = 0; i < args.size(); ++i) {
    auto arg = args[i];
    bool matched = false;
    for (auto* name : short_names) {
      auto flag = std::string{"--"} + name;
      if (arg == flag && i + 1 < args.size()) {
        rewritten.push_back("--rlforge." + std::string{name} + "=" + args[++i]);
        matched = true;
      } else if (arg.rfind(flag + "=", 0) == 0) {
        rewritten.push_back("--rlforge." + arg.substr(2));
        matched = true;
      }
      if (matched)
        break;
    }
    if (!matched)
      rewritten.push_back(arg);
  }
  if (auto err = parse(std::move(rewritten)))
    return make_error(errc::invalid_argument, "bad command line or INI file: " + to_string(err));
  if (!remainder.empty())
    return make_error(errc::invalid_argument, "unknown argument '" + remainder.front() + "'");
  if (auto err = validate())
    return err;
  if (auto err = apply_tls())
    return err;
  if (!cluster.empty())
    enable_cluster_transport();
  init_logging(log_level, log_format);
  return caf::none;
}

caf::error system_config::parse_all(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i)
    args.emplace_back(argv[i]);
  return parse_args(std::move(args));
}

caf::error system_config::validate() const {
  auto bad = [](const std::string& what) { return make_error(errc::invalid_argument, what); };
  if (gpus < 0)
    return bad("gpus must be >= 0, got " + std::to_string(gpus));
  if (cpus < 0)
    return bad("cpus must be >= 0, got " + std::to_string(cpus));
  if (!std::isfinite(memory_gb) || memory_gb < 0)
    return bad("memory-gb must be a finite number >= 0, got " + std::to_string(memory_gb));
  if (node_id.empty())
    return bad("node-id must not be empty");
  if (!std::isfinite(pg_timeout_s) || pg_timeout_s <= 0)
    return bad("pg-timeout must be a finite number of seconds > 0, got "
               + std::to_string(pg_timeout_s));
  if (!std::isfinite(call_timeout_s) || call_timeout_s <= 0)
    return bad("call-timeout must be a finite number of seconds > 0, got "
               + std::to_string(call_timeout_s));
  if (!cluster.empty())
    if (auto at = parse_endpoint(cluster); !at)
      return bad("cluster: " + error_message(at.error()));
  if (heartbeat_ms < 10 || heartbeat_ms > 60000)
    return bad("heartbeat-ms must be in 10..60000, got " + std::to_string(heartbeat_ms));
  if (dead_after_ms < 2 * heartbeat_ms || dead_after_ms > 600000)
    return bad("dead-after-ms must be at least twice heartbeat-ms (" + std::to_string(heartbeat_ms)
               + ") and at most 600000, got " + std::to_string(dead_after_ms));
  if (head_grace_ms < 0 || head_grace_ms > 3600000)
    return bad("head-grace-ms must be in 0..3600000, got " + std::to_string(head_grace_ms));
  if (auto why = check_log_level(log_level); !why.empty())
    return bad(why);
  if (auto why = check_log_format(log_format); !why.empty())
    return bad(why);
  return caf::none;
}

node_resources local_node_resources(const system_config& cfg) {
  node_resources res;
  res.node_id = cfg.node_id;
  res.cpus = cfg.cpus > 0 ? cfg.cpus : static_cast<int32_t>(hardware_cores());
  if (cfg.memory_gb > 0) {
    res.memory_bytes = static_cast<int64_t>(cfg.memory_gb * 1024.0 * 1024.0 * 1024.0);
  } else {
    auto pages = sysconf(_SC_PHYS_PAGES);
    auto page_size = sysconf(_SC_PAGE_SIZE);
    res.memory_bytes = pages > 0 && page_size > 0 ? int64_t{pages} * page_size : 0;
  }
  res.gpus = cfg.gpus;
  res.virtual_gpus = true;
  return res;
}

} // namespace rlforge::runtime
