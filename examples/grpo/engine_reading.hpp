#pragma once
// Reads the GRPO job's engines' activity (engine_activity.hpp) from every engine rank's `stats`
// op, for the step records of both jobs (task_job.hpp, env_job.hpp). Called from the driver's
// thread; each reading is one request to every rank.
#include <optional>

#include "actors/actor_group.hpp"
#include "examples/grpo/engine_activity.hpp"

namespace rlforge::examples::grpo {

/// The engines' counters now; nullopt when a rank does not answer within 10 s or answers what
/// `sum_engine_stats` refuses (that reason goes to stderr). A lost engine is the recoveries'
/// business, not the metrics': the step records the figure as unmeasured.
std::optional<engine_activity> read_engine_activity(actors::actor_group& engines);

} // namespace rlforge::examples::grpo
