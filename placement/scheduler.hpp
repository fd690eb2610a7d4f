#pragma once

#include <string>
#include <vector>

#include "placement/cluster.hpp"
#include "placement/error.hpp"
#include "placement/request.hpp"

namespace rlforge::placement {

/// What the scheduler decided for a request.
enum class schedule_kind {
  placed,     ///< every bundle has a node (and devices); nothing is reserved yet by `schedule`
  pending,    ///< the request fits an empty cluster of these nodes, but not now
  infeasible, ///< no state of this cluster could ever hold it
  invalid,    ///< the request (or group id) is malformed; see `error`
};

/// Returns "placed", "pending", "infeasible" or "invalid".
const char* to_string(schedule_kind x) noexcept;

/// The outcome of scheduling one placement request.
struct schedule_result {
  schedule_kind kind = schedule_kind::invalid;
  /// placed: one entry per bundle, ordered by (node join order, first device id, request
  /// index), so rank i of a group lands on a predictable node and device. Each entry keeps its
  /// request index.
  std::vector<placed_bundle> bundles;
  /// pending: what does not fit and what is held by which groups; infeasible: which bundle
  /// needs what no node can ever provide; invalid: the error message. Empty when placed.
  std::string reason;
  /// invalid: the error code; `none` otherwise.
  placement_errc error = placement_errc::none;

  bool placed() const noexcept { return kind == schedule_kind::placed; }
  bool pending() const noexcept { return kind == schedule_kind::pending; }
  bool infeasible() const noexcept { return kind == schedule_kind::infeasible; }
  bool invalid() const noexcept { return kind == schedule_kind::invalid; }
};

/// Decides where the bundles of `request` go on `cluster`, without changing it: a pure
/// function of its arguments (no clocks, no threads, deterministic). Strategies:
/// - pack: repeatedly picks the node that can hold the most remaining bundles (ties: the most
///   loaded node, then join order) until all are placed;
/// - spread: gives bundles distinct nodes (a maximum matching preferring the least-loaded
///   nodes); bundles left over go to the nodes holding the fewest bundles of the group;
/// - strict_pack: the most loaded node that holds every bundle;
/// - strict_spread: a matching of bundles to distinct nodes, or nothing.
/// Within a node, a whole-GPU bundle (GPU: k) takes the k lowest-numbered entirely free
/// devices; a fractional bundle takes the most-used device that still has room.
/// A request that fails now is `infeasible` when it would also fail on the same nodes with
/// nothing reserved, otherwise `pending`.
schedule_result schedule(const cluster_state& cluster, const placement_request& request);

namespace detail {

/// `schedule` for retries of pending groups, where only success matters: the kind is placed,
/// invalid, or pending for every other outcome (no infeasibility check, no explanation).
schedule_result schedule_quiet(const cluster_state& cluster, const placement_request& request);

} // namespace detail

} // namespace rlforge::placement
