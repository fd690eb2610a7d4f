#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/actor_system_config.hpp>
#include <caf/error.hpp>

#include "runtime/messages.hpp"

namespace rlforge::runtime {

/// The actor-system configuration of every rlforge process.
///
/// Sources, lowest precedence first: built-in defaults, CAF's INI file (`caf-application.ini`
/// in the working directory or `--config-file=F`), environment variables, command-line flags.
/// rlforge's own options live in the `rlforge` group (`--rlforge.gpus=4` or the short
/// `--gpus=4`); CAF's are used as CAF documents them (`--scheduler.max-threads=2`).
///
/// Environment: `RLFORGE_GPUS`, `RLFORGE_CPUS`, `RLFORGE_MEMORY_GB`, `RLFORGE_NODE_ID`,
/// `RLFORGE_PG_TIMEOUT_S`, `RLFORGE_CALL_TIMEOUT_S`, `RLFORGE_CLUSTER`, `RLFORGE_TLS_DIR`,
/// `RLFORGE_HEARTBEAT_MS`, `RLFORGE_DEAD_AFTER_MS`, `SPDLOG_LEVEL`.
///
/// Cluster settings (DESIGN.md "Cluster"): `cluster` (HOST:PORT of a head) makes a driver attach
/// to that cluster instead of running the embedded one-process default; `tls_dir` loads CAF's
/// openssl module with the directory's certificate, key and CA (runtime/tls.hpp), so every
/// connection this process makes or accepts is mutual TLS; `heartbeat_ms` / `dead_after_ms` turn
/// on CAF's connection heartbeats (a peer silent for `dead_after_ms` is disconnected, which every
/// monitor of its actors sees as a `down_msg`). They apply when `cluster` is set or a cluster
/// process calls `enable_cluster_transport()`.
///
/// Defaults that differ from CAF's: the `sharing` scheduler with one worker per core (CAF's
/// default work-stealing scheduler with 4 workers makes a blocking round trip ~5x slower on
/// small machines), and the io middleman loaded. Every message type and the `rlforge` error
/// category are registered in the constructor.
class system_config : public caf::actor_system_config {
public:
  system_config();

  /// Parses flags, the environment and the INI file, then validates. The returned error names
  /// the offending option and value.
  caf::error parse_all(int argc, char** argv);

  /// Parses a list of arguments (as `parse_all`, for tests and embedded use).
  caf::error parse_args(std::vector<std::string> args);

  /// Checks every rlforge option; errors name the option and the value.
  caf::error validate() const;

  /// Declared GPUs: virtual ones (compute on CPU) unless the build has CUDA and finds devices.
  int32_t gpus = 0;
  /// Declared CPUs; 0 = the hardware's count.
  int32_t cpus = 0;
  /// Declared memory in GiB; 0 = the machine's physical memory.
  double memory_gb = 0;
  /// This node's id in placement tables and logs.
  std::string node_id = "node0";
  /// How long a placement group may stay pending before creation fails.
  double pg_timeout_s = 180;
  /// Default deadline of a call to an actor group.
  double call_timeout_s = 600;
  /// Default log level for loggers not named in SPDLOG_LEVEL.
  std::string log_level = "info";
  /// How log lines are written: "text" or "json" (runtime/logging.hpp; RLFORGE_LOG_FORMAT).
  std::string log_format = "text";
  /// HOST:PORT of the head to attach to; empty = the embedded one-process default.
  std::string cluster;
  /// Directory of the cluster's TLS files (ca.pem, cert.pem, key.pem); empty = plain TCP.
  std::string tls_dir;
  /// Interval of the heartbeats on cluster connections, in ms.
  int64_t heartbeat_ms = 200;
  /// A cluster peer silent for this long is declared dead (its connection closed), in ms.
  int64_t dead_after_ms = 1000;
  /// How long a node keeps its ranks and a driver waits for the head while the head is away,
  /// and how long a head restarted from its state file waits for its nodes and drivers, in ms
  /// (0: a node stops its ranks and a driver gives up at once).
  int64_t head_grace_ms = 30000;

  /// Turns on what cluster connections need: CAF's heartbeats and connection timeout from
  /// `heartbeat_ms` / `dead_after_ms`. Called by `parse_args` when `cluster` is set and by the
  /// head and node programs; must run before the actor system is created. Idempotent.
  void enable_cluster_transport();

  /// True when the openssl module is loaded (a TLS directory was given and checked).
  bool tls() const { return tls_loaded_; }

private:
  caf::error apply_environment();
  caf::error apply_tls();

  bool tls_loaded_ = false;
};

/// This node's resources from the configuration and the machine (CPUs from the hardware,
/// physical memory, `gpus` virtual devices).
node_resources local_node_resources(const system_config& cfg);

} // namespace rlforge::runtime
