#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "runtime/messages.hpp"

namespace rlforge::actors {

/// Spawns the placement-group manager: an event-based actor owning the cluster's placement
/// table (placement/table.hpp). It never blocks. Protocol (atoms in protocol.hpp):
///  - (pg_create_atom, placement_group_request) → placement_group_info. Placed at once when
///    the resources are free; infeasible requests fail at once (errc::infeasible, naming the
///    bundle and what no node can provide); feasible ones wait until resources free up or a
///    node joins, at most the request's timeout (default `default_timeout`), then fail with
///    errc::timeout naming what is held and by whom.
///  - (pg_remove_atom, name) → (): frees the group (placed or pending) and places waiting ones.
///  - (pg_get_atom, name) → placement_group_info of a placed group.
///  - (pg_table_atom) → std::string: the cluster's placement table for printing.
///  - (add_node_atom, node_resources) → (): a node joins; waiting groups may be placed.
///  - (remove_node_atom, node_id, reason) → std::vector<std::string>: a node is gone (it died or
///    left). Its resources leave the cluster; every placed group with a bundle on it FAILS (its
///    other bundles are freed; waiting groups may be placed) and is returned. A failed group
///    answers `pg_get` and `reserve` with errc::rank_failed naming the node and `reason`;
///    `pg_remove` forgets it, and creating a group of that name replaces it.
///  - (pg_status_atom) → std::string: JSON {nodes: [{id, total, available}], groups: [{name,
///    state placed|pending|failed, strategy, bundles: [{index, node, devices, resources}],
///    reason}]}.
///  - (reserve_atom, group, uint32 bundle, resource_amounts) → uint64 reservation id: an actor's
///    share of one bundle (exact fixed point: five 0.2-GPU shares fit a 1-GPU bundle, a sixth
///    does not). (release_atom, group, uint64 id) → () gives it back.
/// Bad input (zero, negative or NaN amounts, empty bundles, unknown strategies, bundle indexes
/// out of range, duplicate names, unknown groups, a zero or negative timeout) is an error
/// naming the value; the manager stays up with its state unchanged.
caf::actor spawn_placement_manager(caf::actor_system& sys, std::vector<node_resources> nodes,
                                   std::chrono::milliseconds default_timeout);

/// Blocking driver-side client of the manager.
class placement_client {
public:
  placement_client(caf::actor_system& sys, caf::actor manager);

  /// Creates a group; blocks while it is pending (up to its timeout).
  caf::expected<placement_group_info> create(const placement_group_request& request);
  caf::expected<void> remove(const std::string& name);
  caf::expected<placement_group_info> get(const std::string& name);
  caf::expected<std::string> table();
  caf::expected<void> add_node(const node_resources& node);
  caf::expected<uint64_t> reserve(const std::string& group, uint32_t bundle,
                                  const resource_amounts& amounts);
  caf::expected<void> release(const std::string& group, uint64_t reservation);

  /// Places group `request.name` again after a loss, within `timeout`: removes the old group
  /// (failed with its node, or gone), creates it anew (waiting for room with the time left) and
  /// hands it to `accept`, which returns "" to keep it or why it will not do (e.g. it landed on
  /// the lost node, which the head has not declared dead yet, or spawning on it failed); a group
  /// turned down or not placed is placed again after 200 ms. Returns the kept group, or
  /// `errc::timeout` whose message is the last attempt's failure ("no attempt" when no time was
  /// given); then no group of that name is left. The one re-placement loop of the job's
  /// recoveries (examples/grpo/group_replacement) and the Tinker backend's healing
  /// (tinker_healing). Blocks the calling thread.
  caf::expected<placement_group_info>
  place_again(placement_group_request request, std::chrono::milliseconds timeout,
              const std::function<std::string(const placement_group_info&)>& accept);

  const caf::actor& handle() const { return manager_; }

private:
  caf::actor_system* sys_;
  caf::actor manager_;
};

} // namespace rlforge::actors
