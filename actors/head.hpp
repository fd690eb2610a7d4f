#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <caf/actor_system.hpp>

#include "runtime/cluster_protocol.hpp"

namespace rlforge::actors {

/// How a head behaves.
struct head_options {
  /// How often nodes send heartbeats (told to each node when it joins).
  std::chrono::milliseconds heartbeat{200};
  /// A node whose connection drops, or that sends no heartbeat for this long, is dead.
  std::chrono::milliseconds dead_after{1000};
  /// Default time a placement group may stay pending.
  std::chrono::milliseconds pg_timeout{180000};
  /// Where the head keeps its registry across its own restarts (`rlforge head --state FILE`,
  /// head_store.hpp); empty = nowhere: a restarted head starts a new cluster.
  std::string state_path;
  /// After a restart from `state_path`: how long the saved nodes have to join again and the
  /// saved drivers to attach again before they are declared dead / gone.
  std::chrono::milliseconds rejoin_grace{30000};
};

/// Spawns the head of a cluster (typed `head_actor`, runtime/cluster_protocol.hpp): an
/// event-based actor that never blocks. It owns a placement-group manager
/// (placement_manager.hpp) that starts without nodes, and:
///
///  - registers nodes (`join_atom`): a node is refused, with a message naming the difference,
///    when its rlforge version or wire signature differs from the head's, when its actor kinds
///    differ, when its id is in use by a live node, or when its resources are nonsense (negative
///    or non-finite amounts, an empty id); on success its resources join the placement table.
///    A dead node may join again under its id (a restarted node).
///  - declares a node dead when its connection drops (a killed process: at once; a hung one:
///    after CAF's connection timeout) or when no heartbeat came for `dead_after` +
///    `heartbeat`: its resources leave, every placement group with a bundle on it fails
///    (`placement_manager.hpp`, remove_node_atom), its actor groups are shown failed, and a node
///    that is still talking is told (leave_atom) so it stops its ranks and joins again.
///    `leave_atom` from a node itself is a clean leave (same effect, reason "left").
///  - attaches drivers (`attach_atom` with the driver's session actor; versions checked as for
///    nodes) and monitors their sessions: when a driver ends or dies, its placement groups are
///    removed (their reservations freed) and its actor-group records dropped; the nodes stop its
///    ranks themselves (they monitor the same session).
///  - forwards the placement-group operations to its manager, noting which driver created each
///    group; answers `lookup_atom` with a live node's endpoint and agent; keeps the actor-group
///    records drivers announce (`group_up_atom` / `group_down_atom`) for `cluster_status_atom`,
///    a JSON text: {cluster_id, version, nodes: [{id, alive, address, port, host, pid,
///    declared, total, available, ranks, last_heartbeat_ms, death}], placement_groups: [{name,
///    state, strategy, owner, bundles, reason}], actor_groups: [{name, kind, owner,
///    placement_group, rank_nodes, state}], drivers: [{id, host, pid}]}.
///  - ignores exit messages from other processes (all but exit_reason::kill, which CAF 0.17
///    makes unconditional; only peers holding the cluster certificate can connect at all).
///  - with `state_path`, saves its registry and the placement operations after every change
///    (head_store.hpp). A head started on a file that holds a registry takes the cluster back:
///    the same cluster id, its placement groups placed where they were with the same
///    reservations, its actor-group records and owners. The saved nodes count as alive but
///    "rejoining" until they join again (their resources stay reserved; no new rank goes
///    there), the saved drivers may attach again under their ids; those not back within
///    `rejoin_grace` are declared dead / gone as if they had died. A file written by another
///    build is refused.
///
/// Errors (the state file cannot be opened or read, or was written by another build) name the
/// file; nothing is spawned then.
caf::expected<head_actor> spawn_head(caf::actor_system& sys, head_options opts);

} // namespace rlforge::actors
