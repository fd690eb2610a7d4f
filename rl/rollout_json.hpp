#pragma once
// JSON form of a rollout producer's snapshot (runtime/messages.hpp `rollout_state`), the part of
// an RL loop checkpoint that holds the rollouts: what was waiting, what was finished and not yet
// trained on, and the staleness accounting. Plain data conversion; reentrant.
#include <nlohmann/json.hpp>

#include "runtime/messages.hpp"

namespace rlforge::rl {

nlohmann::json to_json(const rollout_state& s);

/// Reads what `to_json` wrote. Throws std::invalid_argument naming the first missing or
/// mistyped member (by its JSON path) or a negative count.
rollout_state rollout_state_from_json(const nlohmann::json& j);

} // namespace rlforge::rl
