#pragma once
// An episode producer's state (episode_producer.hpp) as JSON, for the --env job's checkpoints:
// the groups not finished (their resets), the finished ones with every episode's tokens,
// masks, behaviour log-probs and versions, and the accounting. Plain C++ on nlohmann-json;
// reentrant.
#include <nlohmann/json.hpp>

#include "examples/grpo/episode_producer.hpp"

namespace rlforge::examples::grpo {

nlohmann::json to_json(const producer_state& s);

/// The state `to_json` wrote. Throws std::invalid_argument naming the path of the first member
/// that is missing or of the wrong type, and an episode whose per-token lists differ in length
/// from its response.
producer_state producer_state_from_json(const nlohmann::json& j);

} // namespace rlforge::examples::grpo
