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
/// `RLFORGE_PG_TIMEOUT_S`, `RLFORGE_CALL_TIMEOUT_S`, `SPDLOG_LEVEL`.
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
  std::string log_level = "warn";

private:
  caf::error apply_environment();
};

/// This node's resources from the configuration and the machine (CPUs from the hardware,
/// physical memory, `gpus` virtual devices).
node_resources local_node_resources(const system_config& cfg);

} // namespace rlforge::runtime
