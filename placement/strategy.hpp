#pragma once

#include <string>
#include <string_view>

#include "placement/error.hpp"

namespace rlforge::placement {

/// How the bundles of one placement group are laid out over nodes (Ray semantics).
enum class placement_strategy {
  pack,          ///< as few nodes as possible, best effort: may spill onto more nodes
  spread,        ///< distinct nodes, best effort: reuses nodes when there are not enough
  strict_pack,   ///< all bundles on one node, or not placed at all
  strict_spread, ///< every bundle on its own node, or not placed at all
};

/// Returns the strategy's name: "pack", "spread", "strict_pack" or "strict_spread".
const char* to_string(placement_strategy x) noexcept;

/// Parses a strategy name, case-insensitively ("pack", "STRICT_SPREAD"). Unknown names fail
/// with `unknown_strategy`, a message naming the value and listing the valid names.
result<placement_strategy> parse_strategy(std::string_view name);

} // namespace rlforge::placement
