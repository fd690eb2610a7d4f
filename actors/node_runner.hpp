#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>

#include <caf/actor_system.hpp>

#include "actors/node_agent.hpp"
#include "runtime/cluster_endpoint.hpp"

namespace rlforge::actors {

/// How `run_node` runs a node.
struct node_runner_options {
  runtime::endpoint head;             ///< where the head listens
  node_agent_options agent;           ///< the node's resources and advertised address
  uint16_t port = 0;                  ///< where to publish the agent (0: the OS picks)
  /// Pause between attempts to reach the head.
  std::chrono::milliseconds retry{500};
  /// How long the FIRST join may take before the node gives up (an unreachable head is an error
  /// then); after a successful join a lost head is retried for ever.
  std::chrono::milliseconds first_join_timeout{15000};
  /// Set (by a signal handler's thread) to make the node leave and return.
  const std::atomic<bool>* stop = nullptr;
  /// Receives one line per event (joined, head lost, rejoined, ...).
  std::function<void(const std::string&)> report;
};

/// Runs a node agent (node_agent.hpp) in `sys` until `*opts.stop` is set: sets this process's
/// advertised address (weight_sync.hpp), publishes the agent on `agent.address:port` (TLS when
/// the system loaded CAF's openssl module), connects to the head (its interface is checked),
/// joins it and then watches it. When the head is lost the agent stops every rank and the node
/// joins again as soon as the head is back (a restarted head), retrying every `retry`. On stop
/// it leaves the head cleanly and stops its ranks. Blocking; returns the exit status: 0 after a
/// clean stop, 1 when the first join failed (the head unreachable within `first_join_timeout`,
/// or the join refused: the reason is reported) or the agent could not be published.
int run_node(caf::actor_system& sys, node_runner_options opts);

} // namespace rlforge::actors
