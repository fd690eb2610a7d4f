#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "placement/error.hpp"
#include "placement/request.hpp"
#include "placement/resources.hpp"

namespace rlforge::placement {

/// A share of one bundle held by one actor.
struct actor_reservation {
  /// Unique within its allocator; never reused.
  std::uint64_t id = 0;
  /// The bundle's request index.
  std::size_t bundle_index = 0;
  /// The node holding the bundle.
  std::string node_id;
  /// GPU devices the share lives on (node device ids, ascending); empty without GPU.
  std::vector<int> device_ids;
  /// What the actor holds.
  resource_set resources;
};

/// Splits the bundles of one placed group among actors: an actor may take a fraction of its
/// bundle's GPU (0.2 when five actors are colocated) and CPUs. Accounting is exact fixed point:
/// five reservations of GPU 0.2 fill a bundle of GPU 1, a sixth fails. Within a bundle, a GPU
/// share below 1 goes to the most-used device of the bundle that still has room; a share of k
/// GPUs takes k entirely free devices of the bundle. A value type; not thread-safe.
class bundle_allocator {
public:
  bundle_allocator() = default;

  /// An allocator over a placed group's bundles (any order). Fails unless the request indices
  /// are exactly 0..n-1 and the device ids match each bundle's GPU amount.
  static result<bundle_allocator> make(const std::vector<placed_bundle>& bundles);

  /// Reserves `request` inside bundle `bundle_index` (its request index). An empty request
  /// holds nothing but still names the bundle's node. Fails with `index_out_of_range` for a
  /// bad index and `insufficient_resources` (naming what is asked and what is left) when the
  /// bundle cannot hold it; nothing changes on failure.
  result<actor_reservation> reserve(std::size_t bundle_index, const resource_set& request);

  /// Reserves `fraction` of bundle `bundle_index`'s GPU (e.g. 0.2), as `reserve` with
  /// {GPU: fraction}. The fraction must be positive (rounded to 1/10000).
  result<actor_reservation> reserve_gpu(std::size_t bundle_index, double fraction);

  /// Returns a reservation's share to its bundle; `unknown_reservation` for ids not held.
  result<void> release(std::uint64_t reservation_id);

  /// What is left of bundle `bundle_index`.
  result<resource_set> available(std::size_t bundle_index) const;

  /// Free GPU share of each device of bundle `bundle_index`, in the order of its device ids.
  result<std::vector<units>> device_available(std::size_t bundle_index) const;

  /// The reservation with this id, or null.
  const actor_reservation* find(std::uint64_t reservation_id) const;

  /// Number of bundles.
  std::size_t bundle_count() const noexcept { return slots_.size(); }

  /// Number of reservations held.
  std::size_t reservation_count() const noexcept { return reservations_.size(); }

private:
  struct slot {
    placed_bundle bundle;
    resource_set free;
    std::vector<units> device_free; ///< parallel to bundle.device_ids
    std::size_t holders = 0;
  };

  result<void> check_index(std::size_t bundle_index) const;

  std::vector<slot> slots_;
  std::map<std::uint64_t, actor_reservation> reservations_;
  std::uint64_t next_id_ = 1;
};

} // namespace rlforge::placement
