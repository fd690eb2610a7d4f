#pragma once

#include <cstdint>
#include <string>

#include <caf/actor_system.hpp>

#include "runtime/cluster_protocol.hpp"

namespace rlforge::actors {

/// What a node agent announces and how it behaves.
struct node_agent_options {
  node_resources resources;           ///< what the node declares (its id included)
  std::string address = "127.0.0.1";  ///< the node's advertised address
  std::chrono::milliseconds join_timeout{10000}; ///< bound on one join round trip
  /// How long the ranks outlive a lost head (`--head-grace-ms`): a head restarted from its
  /// state file within it takes them back; 0 stops them at once.
  std::chrono::milliseconds head_grace{0};
};

/// Spawns a node agent: the event-based actor (typed `node_agent_actor`,
/// runtime/cluster_protocol.hpp) through which a cluster uses one node. It never blocks.
///
///  - It joins the head its runner hands it (`use_head_atom`, only accepted from its own
///    process), announcing its resources, address and port, version, wire signature and actor
///    kinds, then
///    sends a heartbeat with its census every `heartbeat_ms` the head asked for.
///  - `spawn_ranks_atom` spawns ranks of a registered kind (rank_actor.hpp) for a driver's
///    session actor (the owner); every rank must be placed on this node. Refused before the node
///    joined a head, for an unknown kind or bad rank infos (naming them); on a failure nothing
///    stays spawned.
///  - Ranks are stopped (exit reason user_shutdown) when their owner goes away (the driver
///    ended or its process died: the connection's down message), when the head expels the node,
///    and when the head is lost: at once without a `head_grace`; with one, when the node has
///    not joined a head again within it, or joins a head of another cluster (a head restarted
///    without its state file). A head of the same cluster (restarted from its state file) takes
///    the node back with its ranks. The node joins again through its runner meanwhile.
///  - Exit messages from other processes are ignored (all but exit_reason::kill, which CAF 0.17
///    makes unconditional; with TLS only certificate holders connect): only this process stops
///    its agent. On its own exit the agent stops every rank.
///
/// Thread-safety: an actor; talk to it with messages only.
node_agent_actor spawn_node_agent(caf::actor_system& sys, node_agent_options opts);

} // namespace rlforge::actors
