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
head_actor spawn_head(caf::actor_system& sys, head_options opts);

} // namespace rlforge::actors
