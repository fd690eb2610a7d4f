#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "placement/error.hpp"
#include "placement/request.hpp"
#include "placement/resources.hpp"

namespace rlforge::placement {

/// A node as it joins the cluster.
struct node_spec {
  /// Unique, non-empty node id.
  std::string id;
  /// Total resources. A "GPU" entry, if present, must equal the sum of `gpu_devices`; when
  /// `gpu_devices` is empty, a whole "GPU: k" declares k whole devices.
  resource_set resources;
  /// Capacity of each GPU device in fixed-point units, each in (0, 10000]; device i has id i.
  std::vector<units> gpu_devices;
};

/// Builds a node with `gpus` whole GPU devices, `cpus` CPUs and `extra` resources (which must
/// not name GPU or CPU). Fails on an empty id, negative counts or bad amounts.
result<node_spec> make_node(std::string id, int gpus, double cpus, resource_set extra = {});

/// A snapshot of one node: what it has, what is free, per device.
struct node_status {
  std::string id;
  resource_set total;
  resource_set available;
  std::vector<units> device_capacity;
  std::vector<units> device_free;
};

namespace detail {

/// Dense amounts of one node: one slot per cluster column (column 0 is GPU, 1 is CPU) and one
/// per GPU device. Internal.
struct node_amounts {
  std::vector<units> columns;
  std::vector<units> devices;
};

/// A node's totals and what is free of them. Internal.
struct node_entry {
  std::string id;
  node_amounts total;
  node_amounts free;
};

} // namespace detail

/// The resources of every node and the reservations of every placed group. A plain value: the
/// scheduler reads it, `placement_table` mutates it; not thread-safe.
///
/// Invariant: for every node, total = free + the sum of reservations on it, per resource and
/// per device, exactly.
class cluster_state {
public:
  cluster_state();

  /// Adds a node. Fails on an empty or duplicate id, a device capacity outside (0, 1], or a
  /// GPU total that disagrees with the devices.
  result<void> add_node(const node_spec& node);

  /// Removes a node. Every group holding a bundle on it is released entirely (creation and
  /// removal are atomic); their ids are returned in id order.
  result<std::vector<std::string>> remove_node(std::string_view node_id);

  /// Reserves placed bundles for `group_id`, all or nothing. Fails when the group id is empty
  /// or taken, a node is unknown, device ids do not match the bundle's GPU amount, or what is
  /// asked is not free.
  result<void> reserve(const std::string& group_id, std::vector<placed_bundle> bundles);

  /// Frees every reservation of `group_id` and returns its bundles; fails for unknown groups.
  result<std::vector<placed_bundle>> release(std::string_view group_id);

  /// The bundles of a placed group, or null.
  const std::vector<placed_bundle>* find_group(std::string_view group_id) const;

  /// Number of nodes.
  std::size_t node_count() const noexcept { return nodes_.size(); }

  /// True when a node with this id exists.
  bool has_node(std::string_view node_id) const;

  /// A snapshot of one node, or `unknown_node`.
  result<node_status> node(std::string_view node_id) const;

  /// Snapshots of every node, in the order they joined.
  std::vector<node_status> nodes() const;

  /// Ids of the groups holding reservations, in id order.
  std::vector<std::string> group_ids() const;

  /// Number of groups holding reservations.
  std::size_t group_count() const noexcept { return groups_.size(); }

  /// A multi-line table: per node, used/total per resource and which group bundle holds each
  /// GPU device, e.g. "  gpu 1: 0.4/1 used by g2[1] 0.2, g3[0] 0.2".
  std::string describe() const;

  /// Internal, for the scheduler: dense node amounts in join order.
  const std::vector<detail::node_entry>& entries() const noexcept { return nodes_; }

  /// Internal, for the scheduler: the column of each resource name (0 GPU, 1 CPU).
  const std::vector<std::string>& columns() const noexcept { return columns_; }

  /// Internal: the column of `name`, or -1 when no node ever declared it.
  int column(std::string_view name) const noexcept;

  /// Internal: the join-order index of a node.
  std::optional<std::size_t> node_index(std::string_view node_id) const;

  /// Internal: every placed group's bundles.
  const std::map<std::string, std::vector<placed_bundle>, std::less<>>& groups() const noexcept {
    return groups_;
  }

private:
  std::size_t ensure_column(std::string_view name);
  result<void> take(const placed_bundle& bundle);
  void give(const placed_bundle& bundle);
  resource_set to_resources(const std::vector<units>& columns) const;

  std::vector<std::string> columns_;
  std::vector<detail::node_entry> nodes_;
  std::unordered_map<std::string, std::size_t> node_index_;
  std::map<std::string, std::vector<placed_bundle>, std::less<>> groups_;
};

} // namespace rlforge::placement
