#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "placement/bundle_allocator.hpp"
#include "placement/cluster.hpp"
#include "placement/error.hpp"
#include "placement/request.hpp"
#include "placement/scheduler.hpp"

namespace rlforge::placement {

/// Where a known group stands.
enum class group_state {
  placed,  ///< its bundles hold reservations
  pending, ///< queued until resources free up (or a node joins)
};

/// Returns "placed" or "pending".
const char* to_string(group_state x) noexcept;

/// What becomes of the placed groups that had a bundle on a node being removed.
enum class evicted_groups {
  requeue, ///< released and queued again (to be placed on the remaining nodes)
  drop,    ///< released and forgotten (a node died: their actors are gone, the groups failed)
};

/// What removing a node did.
struct node_removal {
  /// Placed groups that had a bundle on the node, released entirely (in id order). With
  /// `evicted_groups::requeue` they are queued again, ahead of the groups that were already
  /// pending; with `evicted_groups::drop` they no longer exist.
  std::vector<std::string> evicted;
  /// Pending groups (evicted ones included) placed again on the remaining nodes, in the order
  /// they were placed.
  std::vector<std::string> placed;
};

/// The placement groups of one cluster: nodes, placed groups with their reservations, and a
/// FIFO queue of pending groups. Pure state: no threads, no clocks (the caller owns timeouts
/// and calls `cancel_pending` when one expires); not thread-safe, meant to be owned by one
/// actor. Every operation is atomic: on failure nothing changes.
///
/// Whenever resources free up (`remove`, `add_node`, `remove_node`), pending groups are tried
/// in FIFO order; each one that fits is placed, a group that does not fit does not block the
/// ones behind it.
class placement_table {
public:
  /// Adds a node (see `cluster_state::add_node`) and returns the pending groups it let place,
  /// in FIFO order.
  result<std::vector<std::string>> add_node(const node_spec& node);

  /// Removes a node: groups with a bundle on it are released and queued again (or dropped, see
  /// `evicted_groups`); then pending groups are retried. Fails with `unknown_node` for ids not in
  /// the cluster.
  result<node_removal> remove_node(std::string_view node_id,
                                   evicted_groups evicted = evicted_groups::requeue);

  /// Creates group `group_id`: placed (reserved at once), pending (queued; `reason` says what
  /// is held by whom), infeasible (not queued; `reason` names the bundle and what no node can
  /// provide) or invalid (an empty or already used group id, or a malformed request; `error`
  /// says which).
  schedule_result create(const std::string& group_id, placement_request request);

  /// Removes a placed or pending group, freeing its resources, and returns the pending groups
  /// placed as a result, in FIFO order. Fails with `unknown_group` for ids not known.
  result<std::vector<std::string>> remove(std::string_view group_id);

  /// Drops a pending group from the queue (its timeout expired). Fails with `unknown_group`,
  /// or `not_pending` when the group is placed (use `remove`).
  result<void> cancel_pending(std::string_view group_id);

  /// The state of a group, or nullopt when it is unknown.
  std::optional<group_state> state(std::string_view group_id) const;

  /// A placed group's bundles, ordered by (node join order, first device id, request index).
  /// Fails with `unknown_group`, or `not_placed` while the group is pending.
  result<std::vector<placed_bundle>> bundles(std::string_view group_id) const;

  /// Why a pending group is still waiting, computed against the cluster now (what is held and
  /// by which groups), or why it has become infeasible. Fails for unknown or placed groups.
  result<std::string> pending_reason(std::string_view group_id) const;

  /// The request a known group was created with.
  result<placement_request> request(std::string_view group_id) const;

  /// Pending group ids in FIFO order.
  const std::vector<std::string>& pending() const noexcept { return pending_; }

  /// Placed group ids in id order.
  std::vector<std::string> placed() const { return cluster_.group_ids(); }

  /// Reserves `request` inside bundle `bundle_index` (request index) of placed group
  /// `group_id`, for one actor (see `bundle_allocator::reserve`). Reservations are dropped with
  /// the group.
  result<actor_reservation> reserve_in_bundle(std::string_view group_id, std::size_t bundle_index,
                                              const resource_set& request);

  /// Returns a reservation made with `reserve_in_bundle`.
  result<void> release_in_bundle(std::string_view group_id, std::uint64_t reservation_id);

  /// The allocator of a placed group (read-only view of its actor reservations), built on
  /// first use. The pointer stays valid until the group is removed or evicted.
  result<const bundle_allocator*> allocator(std::string_view group_id);

  /// The nodes and reservations.
  const cluster_state& cluster() const noexcept { return cluster_; }

  /// The cluster table (see `cluster_state::describe`) followed by the groups: placed ones
  /// with their bundles' nodes and devices, then pending ones in FIFO order.
  std::string describe() const;

private:
  struct group_entry {
    placement_request request;
    group_state state = group_state::pending;
    std::optional<bundle_allocator> allocator; ///< built on first `reserve_in_bundle`
  };

  std::vector<std::string> place_pending();
  group_entry* find(std::string_view group_id);
  const group_entry* find(std::string_view group_id) const;
  result<group_entry*> placed_entry(std::string_view group_id);

  cluster_state cluster_;
  std::unordered_map<std::string, group_entry> groups_;
  std::vector<std::string> pending_;
};

} // namespace rlforge::placement
