#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "placement/error.hpp"
#include "placement/resources.hpp"
#include "placement/strategy.hpp"

namespace rlforge::placement {

/// A placement group to create: bundles (each must fit on ONE node) and a strategy.
struct placement_request {
  placement_strategy strategy = placement_strategy::pack;
  std::vector<resource_set> bundles;
};

/// Checks one bundle: it must hold at least one resource, every amount must be positive, and a
/// GPU amount of 1 or more must be a whole number (whole devices). `index` names the bundle in
/// messages.
result<void> validate_bundle(const resource_set& bundle, std::size_t index);

/// Checks a request: at least one bundle, every bundle valid (see `validate_bundle`), a known
/// strategy value.
result<void> validate_request(const placement_request& request);

/// Parses `strategy` and validates the bundles; the convenient way to build a request.
result<placement_request> make_request(std::string_view strategy,
                                       std::vector<resource_set> bundles);

/// One bundle of a placed group: where it landed and what it holds.
struct placed_bundle {
  /// Position of the bundle in the request (Ray's bundle index).
  std::size_t request_index = 0;
  /// The node holding it.
  std::string node_id;
  /// GPU devices of that node given to the bundle, ascending. A whole-GPU bundle (GPU: k) gets
  /// k devices, each entirely; a fractional one (GPU < 1) gets one device, sharing it; a bundle
  /// without GPU gets none.
  std::vector<int> device_ids;
  /// The bundle's resources, as requested.
  resource_set resources;
};

/// GPU units the bundle holds on each of its devices: 10000 for whole-GPU bundles, the GPU
/// amount for a fractional bundle, 0 without GPU.
units per_device_share(const placed_bundle& bundle) noexcept;

} // namespace rlforge::placement
