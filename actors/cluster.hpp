#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "runtime/cluster_protocol.hpp"
#include "runtime/system_config.hpp"

namespace rlforge::actors {

/// A driver's attachment to a cluster: its session actor (which the head and the nodes monitor:
/// when it ends, the driver's placement groups are removed and its ranks stopped), the head, and
/// the driver's id.
struct cluster_session_info {
  caf::actor session;
  head_actor head;
  std::string driver_id;
  std::string endpoint; ///< the head's HOST:PORT
};

/// Attaches this process, as a driver, to the head at `cfg.cluster` (TLS when `cfg.tls()`):
/// connects (CAF checks the head's interface), spawns the session actor, and sends the head this
/// build's version and wire signature (refused, with the difference named, by a head of another
/// build). The session is registered in `sys`, so `actor_group::spawn` places ranks on the
/// cluster's nodes and `placement_manager_for` returns it. Blocking; errors name the head.
///
/// When the head is lost, the session tries to attach again to the same address (every 300 ms,
/// off its own thread, under the same driver id) for `cfg.head_grace_ms`: a head restarted from
/// its state file takes it back and everything goes on. Meanwhile, and for good when the head
/// does not come back or comes back as another cluster (restarted without its state file), the
/// changes it forwards (placement group create/remove, reserve/release) fail at once with an
/// error saying that the head at HOST:PORT is lost and why; reads (placement group get and
/// table, node lookup, status) wait while it tries, and go to the head once it is back.
caf::expected<caf::actor> attach_cluster(caf::actor_system& sys,
                                         const runtime::system_config& cfg);

/// The session of `sys` (set by `attach_cluster`), or nullopt in the embedded default. Blocking
/// (one local round trip). An error when the session exists but the head is lost.
caf::expected<std::optional<cluster_session_info>> cluster_session(caf::actor_system& sys);

/// The placement-group manager a driver talks to, the same code either way: with `cfg.cluster`
/// empty a new local manager owning `local_node(cfg)` (the embedded default); otherwise the
/// cluster's, through the driver's session (attaching first). Its protocol is the manager's
/// (placement_manager.hpp); `placement_client` works with both.
caf::expected<caf::actor> placement_manager_for(caf::actor_system& sys,
                                                const runtime::system_config& cfg,
                                                std::chrono::milliseconds pg_timeout);

/// Stops what `placement_manager_for` returned: the local manager, or the session (the driver
/// detaches: the head removes its placement groups, the nodes stop its ranks). Stop the groups
/// first.
void stop_placement_manager(const caf::actor& manager);

/// Spawns the ranks of `plan` (actor_group.hpp `plan_ranks`) on the nodes their bundles are on,
/// one request per node agent; returns the rank actors in rank order. Each node's agent is
/// reached directly (a connection to its advertised address; its interface is checked), not
/// through the head. On a failure the ranks already spawned are stopped and the error names the
/// node.
caf::expected<std::vector<caf::actor>>
spawn_cluster_ranks(caf::actor_system& sys, const cluster_session_info& cluster,
                    const std::string& kind, const std::vector<rank_info>& plan,
                    std::chrono::milliseconds timeout);

/// Tells the head (through the session) that this driver runs actor group `record` / stopped
/// the group `name` (for `rlforge status`). Asynchronous.
void announce_group(const caf::actor& session, const group_record& record);
void retire_group(const caf::actor& session, const std::string& name);

} // namespace rlforge::actors
